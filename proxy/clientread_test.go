package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// acceptPair returns both ends of a loopback TCP connection, the server's accepted through lingerListener.
func acceptPair(t *testing.T) (client net.Conn, server *lingerConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	c, err := lingerListener{Listener: ln}.Accept()
	if err != nil {
		t.Fatal(err)
	}
	lc, ok := c.(*lingerConn)
	if !ok {
		t.Fatalf("accepted %T, want *lingerConn", c)
	}
	t.Cleanup(func() { lc.TCPConn.Close() })
	_ = lc.SetDeadline(time.Now().Add(10 * time.Second)) // bounds every read below
	return client, lc
}

// TestClientReadAhead checks the read path fasthttp's ReduceMemoryUsage takes: a 1-byte read, then reads of
// the rest, return the client's bytes in order, and the pooled buffer is let go once drained.
func TestClientReadAhead(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sizes []int // the client's writes, each read on the server as a 1-byte read and then the rest
		rest  int   // the size of the reads after the first byte
	}{
		{"one request", []int{300}, clientReadBuffer},
		{"one byte", []int{1}, clientReadBuffer},
		{"rest read in small pieces", []int{1000}, 7},
		{"keep-alive requests", []int{200, 5000, 1}, clientReadBuffer},
		{"larger than the buffer", []int{3 * clientReadBuffer}, clientReadBuffer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server := acceptPair(t)
			for i, size := range tc.sizes {
				want := bytes.Repeat([]byte{byte('a' + i)}, size)
				want[0] = 'P'
				if _, err := client.Write(want); err != nil {
					t.Fatal(err)
				}
				got := make([]byte, 0, size)
				var one [1]byte
				if n, err := server.Read(one[:]); n != 1 || err != nil {
					t.Fatalf("first byte: %d, %v", n, err)
				}
				got = append(got, one[0])
				// One system call read the whole request: a single loopback write smaller than the buffer
				// arrives whole, and the rest waits in the read-ahead.
				if held := server.rd.w - server.rd.r; size < clientReadBuffer && held != size-1 && (size > 1 || server.rd.buf != nil) {
					t.Fatalf("request %d: the 1-byte read kept %d bytes of %d", i, held, size-1)
				}
				buf := make([]byte, tc.rest)
				for len(got) < size {
					n, err := server.Read(buf)
					if err != nil {
						t.Fatalf("after %d bytes: %v", len(got), err)
					}
					got = append(got, buf[:n]...)
				}
				if !bytes.Equal(got, want) {
					t.Fatalf("request %d: read %d bytes that differ from the %d sent", i, len(got), size)
				}
				if server.rd.buf != nil {
					t.Fatalf("request %d: the read-ahead still holds a buffer after its bytes were read", i)
				}
			}
		})
	}
}

// TestClientReadAheadEnds checks how a waiting 1-byte read ends: io.EOF when the client closes, the
// connection's deadline when it passes, and no buffer held either way.
func TestClientReadAheadEnds(t *testing.T) {
	t.Run("client closes", func(t *testing.T) {
		client, server := acceptPair(t)
		client.Close()
		var one [1]byte
		if n, err := server.Read(one[:]); n != 0 || err != io.EOF {
			t.Fatalf("got %d, %v; want 0, io.EOF", n, err)
		}
		if server.rd.buf != nil {
			t.Fatal("a buffer is held after EOF")
		}
	})
	t.Run("deadline", func(t *testing.T) {
		_, server := acceptPair(t)
		_ = server.SetReadDeadline(time.Unix(1, 0)) // already passed: no waiting in the test
		var one [1]byte
		if _, err := server.Read(one[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("got %v, want os.ErrDeadlineExceeded", err)
		}
		if server.rd.buf != nil {
			t.Fatal("a buffer is held after a timeout")
		}
	})
}

// TestClientReadAheadAllocs: a keep-alive request read through the read-ahead allocates nothing.
func TestClientReadAheadAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	client, server := acceptPair(t)
	req := bytes.Repeat([]byte("x"), 500)
	buf := make([]byte, clientReadBuffer)
	var one [1]byte
	read := func() {
		if _, err := client.Write(req); err != nil {
			t.Fatal(err)
		}
		if _, err := server.Read(one[:]); err != nil {
			t.Fatal(err)
		}
		for got := 1; got < len(req); {
			n, err := server.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			got += n
		}
	}
	read() // the pool's first buffer
	if n := testing.AllocsPerRun(50, read); n != 0 {
		t.Fatalf("%.1f allocations per request, want 0", n)
	}
}
