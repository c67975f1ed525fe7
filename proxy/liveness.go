package proxy

import (
	"net"
	"syscall"
)

// clientGone reports whether the client has closed (or reset) its side of c, without consuming any byte: it
// peeks at the socket with MSG_PEEK|MSG_DONTWAIT. fasthttp offers no disconnect signal (RequestCtx.Done fires only
// at server shutdown; valyala/fasthttp#468, #965), and an idle client sends nothing, so a zero-byte peek (FIN)
// or a reset is the only cheap way to notice that nobody waits for a response that has not started yet.
//
// It must not run concurrently with a reader of c; the request path calls it while the connection's server
// goroutine is inside the handler or the body writer, which do not read. Connections that are not plain
// sockets (TLS, in-memory listeners in tests) are reported alive. A client that half-closes its write side
// while still reading looks gone; OpenAI clients do not do that.
func clientGone(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	_ = raw.Read(func(fd uintptr) bool {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		switch {
		case err == syscall.EAGAIN || err == syscall.EINTR:
		case err != nil:
			gone = true // ECONNRESET and friends
		case n == 0:
			gone = true // orderly shutdown
		}
		return true // never wait for readability
	})
	return gone
}
