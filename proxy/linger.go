package proxy

import (
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/openai"
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

// lingerListener gives every accepted TCP connection a lingering close, and bounds the connections held at once
// (connLimits).
type lingerListener struct {
	net.Listener
	lim *connLimits // nil: no bounds
}

func (l lingerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return c, err
		}
		tc, ok := c.(*net.TCPConn)
		if !ok { // not TCP (a test's pipe, a Unix socket): counted, without a lingering close
			if l.lim == nil {
				return c, nil
			}
			ip, why := l.lim.take(c.RemoteAddr())
			if why != "" {
				refuseConn(c, why)
				continue
			}
			return &countedConn{Conn: c, lim: l.lim, ip: ip}, nil
		}
		lc := &lingerConn{TCPConn: tc}
		if l.lim != nil {
			ip, why := l.lim.take(tc.RemoteAddr())
			if why != "" {
				refuseConn(lc, why)
				continue
			}
			lc.lim, lc.ip = l.lim, ip
		}
		lc.initRead() // clientread.go
		return lc, nil
	}
}

// countedConn is a connection that is not TCP, counted by the listener's bounds until it is closed.
type countedConn struct {
	net.Conn
	lim    *connLimits
	ip     netip.Addr
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.lim.give(c.ip)
	}
	return c.Conn.Close()
}

// connLimits bounds the client connections the gateway holds at once, in all and per client address
// (Options.MaxConns, MaxConnsPerIP). They are counted here, from accept to close, and not by fasthttp, since a
// hijacked stream (hijack.go) leaves fasthttp's count while it holds its connection.
type connLimits struct {
	max, perIP int

	mu   sync.Mutex
	open int
	byIP map[netip.Addr]int
}

func newConnLimits(maxConns, perIP int) *connLimits {
	l := &connLimits{max: maxConns, perIP: perIP}
	if perIP > 0 {
		l.byIP = make(map[netip.Addr]int)
	}
	return l
}

// take counts a connection from addr in, with the client address it is counted under, or returns why it is
// refused.
func (l *connLimits) take(addr net.Addr) (netip.Addr, string) {
	var ip netip.Addr
	if l.perIP > 0 {
		if a, ok := addr.(*net.TCPAddr); ok {
			ip = a.AddrPort().Addr().Unmap()
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.max > 0 && l.open >= l.max {
		return ip, "the gateway holds as many client connections as it may (MaxConns)"
	}
	if l.perIP > 0 && l.byIP[ip] >= l.perIP {
		return ip, "the gateway holds as many connections from this address as it may (MaxConnsPerIP)"
	}
	l.open++
	if l.perIP > 0 {
		l.byIP[ip]++
	}
	return ip, ""
}

// give counts a closed connection from ip out.
func (l *connLimits) give(ip netip.Addr) {
	l.mu.Lock()
	l.open--
	if l.perIP > 0 {
		if n := l.byIP[ip] - 1; n > 0 {
			l.byIP[ip] = n
		} else {
			delete(l.byIP, ip)
		}
	}
	l.mu.Unlock()
}

// refuseConn answers a connection over the bounds with 503 and closes it, in the accept loop as fasthttp did, so
// that a flood of connections is refused at the accept loop's own pace rather than piling up a goroutine each.
// The write does not wait: a fresh socket's send buffer takes a few hundred bytes whatever the peer does (the
// deadline is there all the same). A lingerConn's close then lingers on a goroutine of its own, as any close.
func refuseConn(c net.Conn, why string) {
	body := openai.AppendError(nil, why, "server_error", "too_many_connections", "")
	resp := append([]byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: "),
		strconv.Itoa(len(body))...)
	resp = append(resp, "\r\n\r\n"...)
	resp = append(resp, body...)
	_ = c.SetWriteDeadline(time.Now().Add(lingerTime))
	_, _ = c.Write(resp)
	_ = c.Close()
}

// lingerConn is a client connection with a lingering close. It embeds the *net.TCPConn, so that the peek in
// clientGone (which needs syscall.Conn) still reaches the socket. Its reads hold a buffer only while a request
// is being read (clientread.go).
type lingerConn struct {
	*net.TCPConn
	closed atomic.Bool
	rd     clientRead  // clientread.go
	sock   rawSocket   // rawio.go
	lim    *connLimits // counts it while it is open
	ip     netip.Addr  // its client address, when lim counts them
	noWait bool        // reads return what is read ahead, never wait (hijack.go, takeUnread)
}

// Close shuts the write side down and discards what the client still sends, on a goroutine of its own that
// touches nothing but the connection and ends within lingerTime (its read deadline), whoever called Close.
// Shutdown does not wait for it: the listener is closed, and nothing of the gateway is left for it to reach.
func (c *lingerConn) Close() error {
	if !c.closed.CompareAndSwap(false, true) {
		return nil
	}
	if c.lim != nil {
		c.lim.give(c.ip)
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
