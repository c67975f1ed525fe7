package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http/httputil"
	"testing"
)

// decodeAll feeds coded to a fresh decoder in pieces of at most step bytes (each decoded in place in a copy, as a
// socket read would be) and returns the data, whether the body ended, and the bytes after its end.
func decodeAll(coded []byte, step int) (data []byte, done bool, rest []byte, err error) {
	var d chunkDecoder
	for off := 0; off < len(coded); {
		k := min(step, len(coded)-off)
		piece := append([]byte(nil), coded[off:off+k]...)
		n, used, err := d.decode(piece)
		data = append(data, piece[:n]...)
		if err != nil {
			return data, false, nil, err
		}
		off += used
		if d.done() {
			return data, true, coded[off:], nil
		}
	}
	return data, d.done(), nil, nil
}

func TestChunkDecoder(t *testing.T) {
	cases := []struct {
		name, coded, data, rest string
		done, bad               bool
	}{
		{name: "two chunks", coded: "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n", data: "hello world", done: true},
		{name: "upper-case hex and an extension", coded: "A;name=\"v;x\"\r\n0123456789\r\n0\r\n\r\n", data: "0123456789", done: true},
		{name: "whitespace before the line end", coded: "3 \t\r\nabc\r\n0\r\n\r\n", data: "abc", done: true},
		{name: "bare LF line ends", coded: "3\nabc\n0\n\n", data: "abc", done: true},
		{name: "trailer fields", coded: "1\r\nx\r\n0\r\nX-A: 1\r\nX-B: 2\r\n\r\n", data: "x", done: true},
		{name: "bytes after the body", coded: "1\r\nx\r\n0\r\n\r\nHTTP/1.1", data: "x", done: true, rest: "HTTP/1.1"},
		{name: "a body not ended yet", coded: "5\r\nhel", data: "hel"},
		{name: "no digits", coded: "\r\nabc", bad: true},
		{name: "not hex", coded: "g\r\n", bad: true},
		{name: "too many digits", coded: "10000000000000000\r\n", bad: true},
		{name: "no line end after data", coded: "1\r\nxy\r\n", data: "x", bad: true},
		{name: "CR without LF after data", coded: "1\r\nx\rx", data: "x", bad: true},
		{name: "control byte in the size line", coded: "1\x00\r\nx\r\n", bad: true},
		{name: "CR without LF after the size", coded: "1\rx", bad: true},
	}
	for _, c := range cases {
		for _, step := range []int{1, 2, 3, 7, 1 << 20} {
			data, done, rest, err := decodeAll([]byte(c.coded), step)
			if (err != nil) != c.bad || string(data) != c.data || done != c.done || string(rest) != c.rest {
				t.Errorf("%s, pieces of %d: data %q done %v rest %q err %v; want %q %v %q bad %v",
					c.name, step, data, done, rest, err, c.data, c.done, c.rest, c.bad)
			}
		}
	}
	long := "1" + string(bytes.Repeat([]byte(" "), maxChunkLine+1)) + "\r\nx\r\n0\r\n\r\n"
	if _, _, _, err := decodeAll([]byte(long), 100); err == nil {
		t.Errorf("a size line over maxChunkLine was accepted")
	}
}

// FuzzChunkDecoder: a body coded the way servers code one (any chunk sizes, extensions, trailers) decodes to its
// data when read in any pieces; and on any input the decoder never reports more data than it was given, and
// where both it and net/http's chunked reader take a body whole, they agree on its data.
func FuzzChunkDecoder(f *testing.F) {
	f.Add([]byte("5\r\nhello\r\n0\r\n\r\n"), []byte("hello world"), uint8(1), uint8(3))
	f.Add([]byte("3;ext\r\nabc\r\n10\r\n0123456789abcdef\r\n0\r\n\r\n"), []byte{}, uint8(4), uint8(0))
	f.Add([]byte("0\r\nA: b\r\n\r\n"), bytes.Repeat([]byte("x"), 300), uint8(2), uint8(200))
	f.Fuzz(func(t *testing.T, raw, data []byte, step, chunk uint8) {
		got, done, _, err := decodeAll(raw, int(step)+1)
		if len(got) > len(raw) {
			t.Fatalf("%d bytes of data from %d coded", len(got), len(raw))
		}
		if err == nil && done {
			want, werr := io.ReadAll(httputil.NewChunkedReader(bytes.NewReader(raw)))
			if werr == nil && !bytes.Equal(got, want) {
				t.Fatalf("data %q, net/http %q", got, want)
			}
		}

		var coded []byte
		for rest, i := data, 0; len(rest) > 0; i++ {
			k := min(len(rest), int(chunk)+1+i%3)
			coded = fmt.Appendf(coded, "%x", k)
			if i%2 == 1 {
				coded = append(coded, ";a=\"b\""...)
			}
			coded = append(append(append(coded, "\r\n"...), rest[:k]...), "\r\n"...)
			rest = rest[k:]
		}
		coded = append(coded, "0\r\nX-T: 1\r\n\r\n"...)
		got, done, rest, err := decodeAll(coded, int(step)+1)
		if err != nil || !done || len(rest) != 0 || !bytes.Equal(got, data) {
			t.Fatalf("coded %q: data %q done %v rest %q err %v", coded, got, done, rest, err)
		}
	})
}
