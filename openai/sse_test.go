package openai

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
)

type sseEvent struct {
	Raw, Data string
	DataNil   bool
	Comment   bool
	Err       error
}

func (e sseEvent) String() string {
	return fmt.Sprintf("{Raw:%q Data:%q nil:%v Comment:%v Err:%v}", e.Raw, e.Data, e.DataNil, e.Comment, e.Err)
}

// readAll reads every event of r, stopping at the first error (recorded as the last event).
func readAll(r io.Reader, max int) []sseEvent {
	er := NewEventReader(r, max)
	var out []sseEvent
	for {
		ev, err := er.Next()
		if err == io.EOF {
			return out
		}
		out = append(out, sseEvent{string(ev.Raw), string(ev.Data), ev.Data == nil, ev.Comment, err})
		if err != nil {
			return out
		}
	}
}

func TestEventReader(t *testing.T) {
	tests := []struct {
		name   string
		stream string
		max    int
		want   []sseEvent
	}{
		{"openai stream", "data: {\"a\":1}\n\ndata: [DONE]\n\n", 0, []sseEvent{
			{Raw: "data: {\"a\":1}\n\n", Data: `{"a":1}`}, {Raw: "data: [DONE]\n\n", Data: "[DONE]"}}},
		{"crlf", "data: x\r\n\r\ndata:y\r\n\r\n", 0, []sseEvent{
			{Raw: "data: x\r\n\r\n", Data: "x"}, {Raw: "data:y\r\n\r\n", Data: "y"}}},
		{"cr only", "data: x\r\rdata: y\r\r", 0, []sseEvent{
			{Raw: "data: x\r\r", Data: "x"}, {Raw: "data: y\r\r", Data: "y"}}},
		{"multi-line data", "data: a\ndata:  b\ndata\n\n", 0, []sseEvent{
			{Raw: "data: a\ndata:  b\ndata\n\n", Data: "a\n b\n"}}},
		{"comments", ": ping\n\n: a\n: b\n\ndata: x\n: inline\n\n", 0, []sseEvent{
			{Raw: ": ping\n\n", DataNil: true, Comment: true}, {Raw: ": a\n: b\n\n", DataNil: true, Comment: true},
			{Raw: "data: x\n: inline\n\n", Data: "x"}}},
		{"other fields", "event: message\nid: 7\ndata: x\n\nretry: 10\n\n", 0, []sseEvent{
			{Raw: "event: message\nid: 7\ndata: x\n\n", Data: "x"}, {Raw: "retry: 10\n\n", DataNil: true}}},
		{"not data fields", "datum: x\ndata_: y\n\n", 0, []sseEvent{{Raw: "datum: x\ndata_: y\n\n", DataNil: true}}},
		{"empty data", "data:\n\n", 0, []sseEvent{{Raw: "data:\n\n", Data: ""}}},
		{"blank lines between events are skipped", "\n\r\n\ndata: x\n\n\n\ndata: y\n\n", 0, []sseEvent{
			{Raw: "data: x\n\n", Data: "x"}, {Raw: "data: y\n\n", Data: "y"}}},
		{"final event without blank line", "data: x\n\ndata: [DONE]\n", 0, []sseEvent{
			{Raw: "data: x\n\n", Data: "x"}, {Raw: "data: [DONE]\n", Data: "[DONE]"}}},
		{"final event without line end", "data: [DONE]", 0, []sseEvent{{Raw: "data: [DONE]", Data: "[DONE]"}}},
		{"final JSON event without line end", `data: {"a":[1]}`, 0, []sseEvent{{Raw: `data: {"a":[1]}`, Data: `{"a":[1]}`}}},
		{"final CR", "data: x\n\r", 0, []sseEvent{{Raw: "data: x\n\r", Data: "x"}}},
		{"cut mid-event", "data: {\"a\":1}\n\ndata: {\"choices\":[", 0, []sseEvent{
			{Raw: "data: {\"a\":1}\n\n", Data: `{"a":1}`},
			{Raw: "data: {\"choices\":[", Data: `{"choices":[`, Err: io.ErrUnexpectedEOF}}},
		{"cut comment", ": pi", 0, []sseEvent{{Raw: ": pi", DataNil: true, Comment: true}}},
		{"empty stream", "", 0, nil},
		{"at the bound", "data: 12345\n\n", 13, []sseEvent{{Raw: "data: 12345\n\n", Data: "12345"}}},
		{"over the bound", "data: 12345\n\ndata: 123456\n\ndata: x\n\n", 13, []sseEvent{
			{Raw: "data: 12345\n\n", Data: "12345"}, {DataNil: true, Err: ErrEventTooLarge}}},
		{"over the bound, never terminated", "data: " + strings.Repeat("x", 100), 13, []sseEvent{{DataNil: true, Err: ErrEventTooLarge}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for _, split := range []string{"whole", "bytes"} {
				var r io.Reader = strings.NewReader(tc.stream)
				if split == "bytes" {
					r = iotest.OneByteReader(r)
				}
				got := readAll(r, tc.max)
				if fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Errorf("%s:\n got %v\nwant %v", split, got, tc.want)
				}
			}
		})
	}
}

func TestEventReaderErrors(t *testing.T) {
	boom := errors.New("connection reset")
	er := NewEventReader(io.MultiReader(strings.NewReader("data: x\n\ndata: y"), iotest.ErrReader(boom)), 0)
	if ev, err := er.Next(); err != nil || string(ev.Data) != "x" {
		t.Fatalf("first event: %q, %v", ev.Data, err)
	}
	if _, err := er.Next(); err != boom {
		t.Fatalf("got %v, want the read error", err)
	}
	if _, err := er.Next(); err != boom {
		t.Fatalf("error not sticky: %v", err)
	}
	er.Reset(strings.NewReader("data: z\n\n"))
	if ev, err := er.Next(); err != nil || string(ev.Data) != "z" {
		t.Fatalf("after Reset: %q, %v", ev.Data, err)
	}
	if _, err := er.Next(); err != io.EOF {
		t.Fatalf("got %v, want io.EOF", err)
	}
	if _, err := er.Next(); err != io.EOF {
		t.Fatalf("io.EOF not sticky: %v", err)
	}
}

// chunkedReader returns its data in reads of the given sizes (cycling), to split a stream at chosen places.
type chunkedReader struct {
	data  []byte
	sizes []int
	k     int
}

func (r *chunkedReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(r.sizes) > 0 {
		n = max(1, r.sizes[r.k%len(r.sizes)])
		r.k++
	}
	n = min(n, len(p), len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

func TestEventReaderSplitAnywhere(t *testing.T) {
	stream := "data: {\"id\":\"x\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\r\n\r\n: ping\n\ndata: a\ndata: b\n\n" +
		"event: e\rdata: c\r\rdata: [DONE]\n\n"
	want := fmt.Sprint(readAll(strings.NewReader(stream), 64))
	for i := 0; i <= len(stream); i++ {
		r := &chunkedReader{data: []byte(stream), sizes: []int{i, len(stream)}}
		if got := fmt.Sprint(readAll(r, 64)); got != want {
			t.Fatalf("split at %d:\n got %s\nwant %s", i, got, want)
		}
	}
}

// cycleReader serves the same stream forever.
type cycleReader struct {
	data []byte
	off  int
}

func (r *cycleReader) Read(p []byte) (int, error) {
	n := copy(p, r.data[r.off:])
	r.off = (r.off + n) % len(r.data)
	return n, nil
}

func TestEventReaderAllocs(t *testing.T) {
	stream := []byte("data: {\"choices\":[{\"delta\":{\"content\":\"token\"}}]}\n\n: ping\n\ndata: a\ndata: b\n\n")
	er := NewEventReader(&cycleReader{data: stream}, 0)
	for range 10 {
		er.Next()
	}
	if n := testing.AllocsPerRun(100, func() {
		if _, err := er.Next(); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Next: %v allocs, want 0", n)
	}
}

func FuzzEventReader(f *testing.F) {
	f.Add([]byte("data: {\"a\":1}\n\ndata: [DONE]\n\n"), []byte{3, 1, 7}, uint16(64))
	f.Add([]byte("data: x\r\n\r\n: c\r\rdata: a\ndata: b\n\n"), []byte{1}, uint16(10))
	f.Add([]byte("\r\n\rdata: {\"x\":[1,\"\\n\"]}\r"), []byte{2, 5}, uint16(0))
	f.Fuzz(func(t *testing.T, stream, sizes []byte, max uint16) {
		m := int(max)
		want := readAll(bytes.NewReader(stream), m)
		s := make([]int, len(sizes))
		for i, b := range sizes {
			s[i] = int(b)
		}
		got := readAll(&chunkedReader{data: stream, sizes: s}, m)
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%q split %v:\n got %v\nwant %v", stream, sizes, got, want)
		}
		oneByte := readAll(iotest.OneByteReader(bytes.NewReader(stream)), m)
		if fmt.Sprint(oneByte) != fmt.Sprint(want) {
			t.Fatalf("%q one byte at a time:\n got %v\nwant %v", stream, oneByte, want)
		}
		// Raw events reproduce the stream, less the blank lines between events.
		var raw strings.Builder
		for _, ev := range want {
			if ev.Err == nil || ev.Err == io.ErrUnexpectedEOF {
				raw.WriteString(ev.Raw)
				if strings.TrimLeft(ev.Raw, "\r\n") != ev.Raw {
					t.Fatalf("event starts with a blank line: %v", ev)
				}
			}
		}
		if len(want) == 0 || want[len(want)-1].Err == nil {
			if strip(raw.String()) != strip(string(stream)) {
				t.Fatalf("%q: raw events %q do not reproduce the stream", stream, raw.String())
			}
		}
	})
}

// strip removes line endings, the only bytes the reader may drop (blank lines between events).
func strip(s string) string { return strings.NewReplacer("\r", "", "\n", "").Replace(s) }

// TestEventReaderResetBytes reads the same events in place as from a reader, leaves the bytes as they were, and
// goes back to a buffer of its own on Reset.
func TestEventReaderResetBytes(t *testing.T) {
	stream := "data: {\"a\":1}\n\n: ping\n\ndata: [DONE]\n\ndata: {\"tail\":true}"
	orig := []byte(stream)
	src := append([]byte(nil), orig...)
	var want []string
	ref := NewEventReader(strings.NewReader(stream), 0)
	for {
		ev, err := ref.Next()
		if err != nil {
			want = append(want, err.Error())
			break
		}
		want = append(want, string(ev.Raw))
	}
	er := NewEventReader(nil, 0)
	for round := range 2 {
		er.ResetBytes(src)
		var got []string
		for {
			ev, err := er.Next()
			if err != nil {
				got = append(got, err.Error())
				break
			}
			got = append(got, string(ev.Raw))
		}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d: got %q, want %q", round, got, want)
		}
	}
	if !bytes.Equal(src, orig) {
		t.Fatalf("ResetBytes changed its input: %q", src)
	}
	er.Reset(strings.NewReader("data: x\n\n"))
	if ev, err := er.Next(); err != nil || string(ev.Data) != "x" {
		t.Fatalf("after Reset: %q, %v", ev.Data, err)
	}
	if &er.buf[0] == &src[0] {
		t.Fatal("Reset kept the borrowed buffer")
	}
}

// readsCounted counts the reads that reach the underlying stream.
type readsCounted struct {
	r     io.Reader
	reads int
}

func (c *readsCounted) Read(p []byte) (int, error) {
	c.reads++
	return c.r.Read(p)
}

// TestEventReaderReady: Ready reports a buffered event without reading, Next then returns it, and the event
// Next returned before stays valid.
func TestEventReaderReady(t *testing.T) {
	src := &readsCounted{r: strings.NewReader("data: a\n\n: ping\n\ndata: partial")}
	er := NewEventReader(src, 0)
	ev, err := er.Next()
	if err != nil || string(ev.Data) != "a" {
		t.Fatalf("first: %q, %v", ev.Data, err)
	}
	reads := src.reads
	if !er.Ready() {
		t.Fatal("the ping is buffered, Ready says it is not")
	}
	if !er.Ready() {
		t.Fatal("a second Ready forgot the event the first found")
	}
	if src.reads != reads {
		t.Fatal("Ready read from the stream")
	}
	if string(ev.Raw) != "data: a\n\n" {
		t.Fatalf("Ready changed the event returned before: %q", ev.Raw)
	}
	ev, err = er.Next()
	if err != nil || !ev.Comment || string(ev.Raw) != ": ping\n\n" {
		t.Fatalf("after Ready, Next returned %q, %v; want the ping", ev.Raw, err)
	}
	if er.Ready() {
		t.Fatal("only part of an event is buffered, Ready says one is ready")
	}
	if src.reads != reads {
		t.Fatal("Ready read from the stream")
	}
	ev, err = er.Next() // reads on: the stream ends inside an event that is not whole
	if err != io.ErrUnexpectedEOF {
		t.Fatalf("last: %q, %v; want io.ErrUnexpectedEOF", ev.Raw, err)
	}
	if er.Ready() {
		t.Fatal("Ready at the end of the stream")
	}
	er.ResetBytes([]byte("data: x\n\ndata: y\n\n"))
	if !er.Ready() {
		t.Fatal("ResetBytes: Ready says no event is ready")
	}
	if ev, err := er.Next(); err != nil || string(ev.Data) != "x" {
		t.Fatalf("ResetBytes: %q, %v", ev.Data, err)
	}
	if !er.Ready() { // y, found and held
		t.Fatal("ResetBytes: the second event is not ready")
	}
	er.Reset(strings.NewReader(""))
	if er.Ready() {
		t.Fatal("Reset keeps the event Ready found")
	}
}

// scripted is a reader that returns its pieces one per Read, then io.EOF.
type scripted struct{ pieces []string }

func (s *scripted) Read(p []byte) (int, error) {
	if len(s.pieces) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.pieces[0])
	s.pieces[0] = s.pieces[0][n:]
	if s.pieces[0] == "" {
		s.pieces = s.pieces[1:]
	}
	return n, nil
}

// TestEventReaderRelease: a reader that holds nothing gives its buffer back and reads on with another; one that
// holds part of an event keeps it.
func TestEventReaderRelease(t *testing.T) {
	er := NewEventReader(&scripted{pieces: []string{"data: a\n\n", "data: b\n\n", "data: c\n\ndata: par", "tial\n\n"}}, 0)
	next := func(want string) {
		t.Helper()
		if ev, err := er.Next(); err != nil || string(ev.Data) != want {
			t.Fatalf("event %q: got %q, %v", want, ev.Data, err)
		}
	}
	next("a")
	if !er.WouldRead() {
		t.Fatal("WouldRead is false with nothing buffered")
	}
	er.Release()
	if er.Buffered() != 0 {
		t.Fatalf("a reader holding nothing kept a buffer of %d bytes", er.Buffered())
	}
	next("b") // with a buffer taken back from the pool
	er.Release()
	next("c") // the same read brought half of the next event
	if !er.WouldRead() {
		t.Fatal("WouldRead is false with half an event buffered")
	}
	er.Release()
	if er.Buffered() == 0 {
		t.Fatal("Release dropped a buffer that held half an event")
	}
	next("partial")
}
