package proxy

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"
)

// rawPair returns a connected loopback pair: the near end read and written raw (rawio.go), the far end a plain
// net.Conn.
func rawPair(t *testing.T) (near *rawSocket, nearConn *net.TCPConn, far net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	far, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { far.Close() })
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	nearConn = c.(*net.TCPConn)
	t.Cleanup(func() { nearConn.Close() })
	near = new(rawSocket)
	near.init(nearConn)
	if !near.ready() {
		t.Fatal("a TCP connection is not ready for raw I/O")
	}
	_ = nearConn.SetDeadline(time.Now().Add(20 * time.Second)) // bounds every wait below
	_ = far.SetDeadline(time.Now().Add(20 * time.Second))
	return near, nearConn, far
}

// TestRawSocketMovesBytes: what the far end writes is read in order, and a write far larger than the socket's
// buffers, read slowly at the other end, arrives whole (the writer waits for room on the netpoller, EAGAIN).
func TestRawSocketMovesBytes(t *testing.T) {
	near, _, far := rawPair(t)
	// Reads: several writes, read back into a small buffer.
	want := bytes.Repeat([]byte("0123456789abcdef"), 1000)
	go func() { _, _ = far.Write(want) }()
	got := make([]byte, 0, len(want))
	buf := make([]byte, 1000)
	for len(got) < len(want) {
		n, err := near.Read(buf)
		if err != nil {
			t.Fatalf("read after %d bytes: %v", len(got), err)
		}
		got = append(got, buf[:n]...)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the bytes read differ from those written")
	}
	// Writes: 16 MiB against a reader that takes 64 KiB at a time.
	big := make([]byte, 16<<20)
	for i := range big {
		big[i] = byte(i * 7)
	}
	var wg sync.WaitGroup
	var recv []byte
	var rerr error
	wg.Go(func() {
		b := make([]byte, 64<<10)
		for len(recv) < len(big) {
			n, err := far.Read(b)
			if err != nil {
				rerr = err
				return
			}
			recv = append(recv, b[:n]...)
		}
	})
	n, err := near.Write(big)
	if err != nil || n != len(big) {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(big))
	}
	wg.Wait()
	if rerr != nil || !bytes.Equal(recv, big) {
		t.Fatalf("the far end read %d bytes (%v), not the %d written", len(recv), rerr, len(big))
	}
}

// TestRawSocketEnds: the errors a net.Conn user tells apart come out as net.Conn's do: io.EOF at the far end's
// close, a timeout at the deadline, net.ErrClosed when the connection is closed under a waiting read, and the
// system call's error, wrapped, on a write to a reset connection.
func TestRawSocketEnds(t *testing.T) {
	t.Run("eof", func(t *testing.T) {
		near, _, far := rawPair(t)
		_, _ = far.Write([]byte("last"))
		far.Close()
		b := make([]byte, 16)
		n, err := near.Read(b)
		if err != nil || string(b[:n]) != "last" {
			t.Fatalf("Read = %q, %v; want \"last\", nil", b[:n], err)
		}
		if _, err := near.Read(b); err != io.EOF {
			t.Fatalf("Read at the end = %v, want io.EOF", err)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		near, nearConn, _ := rawPair(t)
		_ = nearConn.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		_, err := near.Read(make([]byte, 16))
		var ne net.Error
		if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
			t.Fatalf("Read past the deadline = %v, want a timeout (os.ErrDeadlineExceeded)", err)
		}
	})
	t.Run("closed while waiting", func(t *testing.T) {
		near, nearConn, _ := rawPair(t)
		done := make(chan error, 1)
		go func() {
			_, err := near.Read(make([]byte, 16))
			done <- err
		}()
		time.Sleep(20 * time.Millisecond)
		nearConn.Close()
		select {
		case err := <-done:
			if !errors.Is(err, net.ErrClosed) {
				t.Fatalf("Read on a closed connection = %v, want net.ErrClosed", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a read waiting on a closed connection did not return")
		}
	})
	t.Run("reset", func(t *testing.T) {
		near, _, far := rawPair(t)
		_ = far.(*net.TCPConn).SetLinger(0) // close with a RST
		far.Close()
		var err error
		for range 100 { // the first write may be taken before the RST is seen
			if _, err = near.Write(make([]byte, 4096)); err != nil {
				break
			}
			time.Sleep(time.Millisecond)
		}
		var oe *net.OpError
		if !errors.As(err, &oe) || oe.Op != "write" ||
			!(errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
			t.Fatalf("Write to a reset connection = %v, want a write *net.OpError with ECONNRESET or EPIPE", err)
		}
	})
}

// TestRawSocketAllocs: a read and a write that find the socket ready allocate nothing.
func TestRawSocketAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's annotations allocate")
	}
	near, _, far := rawPair(t)
	msg := []byte("ping")
	b := make([]byte, 16)
	fb := make([]byte, 16)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := near.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(far, fb[:len(msg)]); err != nil {
			t.Fatal(err)
		}
		if _, err := far.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(near, b[:len(msg)]); err != nil {
			t.Fatal(err)
		}
	})
	// The far end is a plain net.Conn, and io.ReadFull's interface conversions are free: any allocation is ours.
	if allocs > 0 {
		t.Fatalf("%.1f allocations per raw write and read, want 0", allocs)
	}
}
