package proxy

import (
	"io"
	"net"
	"sync/atomic"
	"time"
)

// Lingering close. When the gateway closes a connection whose client is still sending (a request refused
// from its headers while its body is on the way), closing at once makes the kernel answer the unread bytes
// with a reset, and the reset destroys the refusal in the client's receive buffer: the client sees "connection
// reset" instead of its 401 or 413. So a closed connection first shuts down its write side (the client gets
// the answer and then end-of-stream) and reads and discards what the client still sends, for at most
// lingerTime and lingerBytes, before it really closes; nginx's lingering_close does the same.

const (
	// lingerTime bounds how long a closed connection is read from. A client's write that was in flight ends
	// well within it on any network that carries its request at all.
	lingerTime = time.Second
	// lingerBytes bounds what is discarded: a refused upload's body, up to the largest the gateway accepts.
	lingerBytes = 64 << 20
)

// lingerListener gives every accepted TCP connection a lingering close.
type lingerListener struct {
	net.Listener
}

func (l lingerListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return c, err
	}
	if tc, ok := c.(*net.TCPConn); ok {
		lc := &lingerConn{TCPConn: tc}
		lc.initRead() // clientread.go
		return lc, nil
	}
	return c, nil
}

// lingerConn is a client connection with a lingering close. It embeds the *net.TCPConn, so that the peek in
// clientGone (which needs syscall.Conn) still reaches the socket. Its reads hold a buffer only while a request
// is being read (clientread.go).
type lingerConn struct {
	*net.TCPConn
	closed atomic.Bool
	rd     clientRead // clientread.go
	sock   rawSocket  // rawio.go
}

// Close shuts the write side down and discards what the client still sends, on a goroutine of its own that
// touches nothing but the connection and ends within lingerTime (its read deadline), whoever called Close.
// Shutdown does not wait for it: the listener is closed, and nothing of the gateway is left for it to reach.
func (c *lingerConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	if err := c.CloseWrite(); err != nil {
		return c.TCPConn.Close()
	}
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(lingerTime))
		_, _ = io.CopyN(io.Discard, c.TCPConn, lingerBytes)
		_ = c.TCPConn.Close()
	}()
	return nil
}
