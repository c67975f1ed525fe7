package proxy

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/routing"
)

// upstreams holds one connection pool per backend URL, connect timeout and CA bundle, shared by every
// routing.Backend with them across reloads.
//
// The gateway speaks HTTP/1.1 to its engines itself (this file) rather than through fasthttp's HostClient, for
// what an open stream holds while it waits (docs/design.md, "Upstream connections"): a HostClient reads a
// streamed body through a bufio.Reader of its own, held with its buffer for as long as the stream is open, and
// behind a chunked decoder of its own. Here the buffer that reads a response's headers goes back to a pool as
// soon as the bytes it read past them are taken, and the body is read from the socket straight into the SSE
// reader's buffer, its chunked coding removed in place (chunked.go). Owning the connection also gives the relay
// its deadlines (first event, then idle between events) and the watchdog a way to interrupt a blocked read,
// which fasthttp's single read deadline and hidden connection did not.
//
// Concurrency: safe for concurrent use.
type upstreams struct {
	mu      sync.Mutex
	clients map[upstreamKey]*upstream
}

type upstreamKey struct {
	url     string
	connect time.Duration
	ca      [32]byte // routing.CABundle.Sum; zero for the system roots
}

// upstreamReadBuffer is the buffer a response's headers are read into, taken from a pool for each response and
// given back once the bytes read past the headers are consumed (for a stream, with its first events), so an
// open stream does not hold it. It is also the bound on an engine's response headers (read whole into it; more
// fails the attempt), which engines and hosted APIs keep to one or two KiB; nginx bounds them by one memory page
// (proxy_buffer_size).
const upstreamReadBuffer = 8 << 10

// upstreamWriteBuffer is the buffer a request is written through (pooled, held only while it is written): a
// request whose headers and body fit goes out in one write.
const upstreamWriteBuffer = 16 << 10

// The idle connections of a pool.
const (
	// maxIdleConns bounds the idle connections one pool keeps; one released beyond it is closed.
	maxIdleConns = 1024
	// idleTimeout closes a connection idle this long (as fasthttp's MaxIdleConnDuration did).
	idleTimeout = 90 * time.Second
	// idleCheck: a connection idle longer than this is checked before it is reused (rawSocket.stale), since
	// engines close idle connections on their own schedule (uvicorn, which serves vLLM and SGLang, after 5 s;
	// a proxy in between may be quicker), and a request sent on a closed one fails. The check is one system
	// call; under load connections are idle for microseconds and skip it.
	idleCheck = 100 * time.Millisecond
	// maxInterim bounds the 1xx responses read before the final one.
	maxInterim = 8
)

// upstream is the pool for one backend URL.
type upstream struct {
	host   string // Host header value
	base   string // path prefix from the backend URL, without a trailing slash
	tls    bool
	addr   string // host:port to dial
	dialer net.Dialer
	tlsCfg *tls.Config

	mu   sync.Mutex
	idle []*upConn   // the most recently used last
	reap *time.Timer // armed while idle is not empty
}

var (
	upReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, upstreamReadBuffer) }}
	upWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, upstreamWriteBuffer) }}
)

// upConn is one connection to a backend and the state of the response being read from it. Its Read reads that
// response's body (without its transfer coding); the watchdog may set its read deadline from another goroutine,
// nothing else of it is shared.
type upConn struct {
	net.Conn // the TCP connection, or TLS over it
	up       *upstream
	sock     rawSocket // reads and writes as raw system calls (rawio.go), when the connection is plain TCP
	idleAt   time.Time // when it went back to the pool

	br     *bufio.Reader // the header buffer, while it holds bytes read past the headers
	body   bodyMode
	remain int64 // bodyLength: bytes of the body not read yet
	chunk  chunkDecoder
	reuse  bool // the response allows the connection to carry another request
	broken bool // a read or write failed, or the peer sent more than the body: never reused
	polled bool // the socket is in the parker's set (park_linux.go), until release
}

// park asks the parker to wake wd when the response's next bytes arrive; false when the caller must read (and
// wait) itself: the connection is not a plain socket, or bytes are held already, or the body has ended.
func (c *upConn) park(p *parker, wd *watchdog) bool {
	if p == nil || !c.sock.ready() || c.br != nil || c.body == bodyDone {
		return false
	}
	fd := c.sock.sysfd()
	if fd < 0 || !p.arm(fd, c.polled, wd) {
		return false
	}
	c.polled = true
	return true
}

// unpark takes the socket out of the parker's set.
func (c *upConn) unpark() {
	if c.polled {
		c.polled = false
		getParker().remove(c.sock.sysfd())
	}
}

type bodyMode uint8

const (
	bodyDone    bodyMode = iota // no body, or all of it read
	bodyLength                  // Content-Length
	bodyChunked                 // Transfer-Encoding: chunked
	bodyClose                   // to the end of the connection (HTTP/1.0 style)
)

// sockIO is the connection's socket itself: what the header buffer reads from and requests are written to.
type sockIO upConn

// Read reads the socket: raw when it can (rawio.go).
func (s *sockIO) Read(p []byte) (int, error) {
	if s.sock.ready() {
		return s.sock.Read(p)
	}
	return s.Conn.Read(p)
}

// Write writes the socket: raw when it can.
func (s *sockIO) Write(p []byte) (int, error) {
	if s.sock.ready() {
		return s.sock.Write(p)
	}
	return s.Conn.Write(p)
}

// readWire reads what follows the response's headers on the connection: first the bytes the header read took
// past them.
func (c *upConn) readWire(p []byte) (int, error) {
	if c.br != nil {
		n, _ := c.br.Read(p) // only what it holds: it is dropped before it would read the socket
		if c.br.Buffered() == 0 {
			c.dropReader()
		}
		return n, nil
	}
	return (*sockIO)(c).Read(p)
}

func (c *upConn) dropReader() {
	if c.br != nil {
		c.br.Reset(nil)
		upReaders.Put(c.br)
		c.br = nil
	}
}

// Read reads the response body, without its transfer coding: io.EOF at its end, io.ErrUnexpectedEOF when the
// connection ends inside it.
func (c *upConn) Read(p []byte) (int, error) {
	for len(p) > 0 {
		switch c.body {
		case bodyDone:
			return 0, io.EOF
		case bodyLength:
			if c.remain == 0 {
				c.body = bodyDone
				return 0, io.EOF
			}
			if int64(len(p)) > c.remain {
				p = p[:c.remain]
			}
			n, err := c.readWire(p)
			c.remain -= int64(n)
			if c.remain == 0 && err == nil {
				c.body = bodyDone // whole: the connection may carry the next request without another read
			}
			if err == io.EOF && c.remain > 0 {
				err = io.ErrUnexpectedEOF
			}
			if err != nil && err != io.EOF {
				c.broken = true
			}
			return n, err
		case bodyClose:
			n, err := c.readWire(p)
			if err == io.EOF {
				c.body = bodyDone
			} else if err != nil {
				c.broken = true
			}
			return n, err
		case bodyChunked:
			n, err := c.readWire(p)
			k, used, derr := c.chunk.decode(p[:n])
			if derr != nil {
				c.broken = true
				return k, derr
			}
			if used < n {
				c.broken = true // bytes past the body: the connection is out of step
			}
			if c.chunk.done() {
				c.body = bodyDone
				if k == 0 {
					return 0, io.EOF
				}
				return k, nil
			}
			if err != nil {
				if err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				c.broken = true
				return k, err
			}
			if k > 0 {
				return k, nil
			}
			// a read of framing alone: read on
		}
	}
	return 0, nil
}

func newUpstreams() *upstreams {
	return &upstreams{clients: make(map[upstreamKey]*upstream)}
}

// get returns the pool for the backend cfg describes, creating it on first use. An https backend's certificate
// must chain to cfg.CA when it is set, else to the system roots.
func (u *upstreams) get(cfg *routing.BackendConfig, connectTimeout time.Duration) (*upstream, error) {
	rawURL := cfg.URL
	k := upstreamKey{url: rawURL, connect: connectTimeout}
	if cfg.CA != nil {
		k.ca = cfg.CA.Sum
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if up, ok := u.clients[k]; ok {
		return up, nil // every attempt: nothing is allocated before this
	}
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CA != nil {
		tlsCfg.RootCAs = cfg.CA.Pool
	}
	parsed, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("proxy: backend url: %w", err)
	}
	if parsed.Scheme != "http" && parsed.Scheme != "https" {
		return nil, fmt.Errorf("proxy: backend url %q: scheme must be http or https", rawURL)
	}
	isTLS := parsed.Scheme == "https"
	addr := parsed.Host
	if parsed.Port() == "" {
		if isTLS {
			addr += ":443"
		} else {
			addr += ":80"
		}
	}
	tlsCfg.ServerName = parsed.Hostname()
	up := &upstream{
		host:   parsed.Host,
		base:   trimSlash(parsed.Path),
		tls:    isTLS,
		addr:   addr,
		dialer: net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second},
		tlsCfg: tlsCfg,
	}
	u.clients[k] = up
	return up, nil
}

// acquire returns an idle connection of the pool, or a new one dialled by deadline (zero: the connect timeout
// alone bounds it). now is the caller's clock reading.
func (up *upstream) acquire(now, deadline time.Time) (*upConn, error) {
	up.mu.Lock()
	for n := len(up.idle); n > 0; n = len(up.idle) {
		c := up.idle[n-1]
		up.idle[n-1] = nil
		up.idle = up.idle[:n-1]
		up.mu.Unlock()
		idle := now.Sub(c.idleAt)
		if idle < idleCheck || idle < idleTimeout && !c.stale() {
			return c, nil
		}
		_ = c.Conn.Close()
		up.mu.Lock()
	}
	up.mu.Unlock()
	return up.dial(deadline)
}

// stale reports whether an idle connection can no longer carry a request (rawSocket.stale); a TLS connection
// cannot be looked at without reading a record, and is taken as it is.
func (c *upConn) stale() bool { return c.sock.ready() && c.sock.stale() }

func (up *upstream) dial(deadline time.Time) (*upConn, error) {
	d := up.dialer
	d.Deadline = deadline
	raw, err := d.Dial("tcp", up.addr)
	if err != nil {
		return nil, err
	}
	c := &upConn{Conn: raw, up: up}
	if !up.tls {
		if tc, ok := raw.(*net.TCPConn); ok {
			c.sock.init(tc)
		}
		return c, nil
	}
	tc := tls.Client(raw, up.tlsCfg)
	hs := deadline
	if up.dialer.Timeout > 0 {
		if t := time.Now().Add(up.dialer.Timeout); hs.IsZero() || t.Before(hs) {
			hs = t
		}
	}
	_ = raw.SetDeadline(hs)
	if err := tc.Handshake(); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("proxy: tls handshake: %w", err)
	}
	_ = raw.SetDeadline(time.Time{})
	c.Conn = tc
	return c, nil
}

// roundTrip writes req and reads the response's headers into resp (after any 1xx ones), leaving the body to
// Read. The caller has set the connection's deadlines. An error leaves the connection broken.
func (c *upConn) roundTrip(req *fasthttp.Request, resp *fasthttp.Response) error {
	c.body, c.remain, c.reuse, c.broken = bodyDone, 0, false, false
	c.chunk.reset()
	bw := upWriters.Get().(*bufio.Writer)
	bw.Reset((*sockIO)(c))
	err := req.Write(bw)
	if err == nil {
		err = bw.Flush()
	}
	bw.Reset(nil)
	upWriters.Put(bw)
	if err != nil {
		c.broken = true
		return err
	}
	c.br = upReaders.Get().(*bufio.Reader)
	c.br.Reset((*sockIO)(c))
	resp.Reset()
	for interim := 0; ; interim++ {
		if err := resp.Header.Read(c.br); err != nil {
			c.broken = true
			return err
		}
		if code := resp.StatusCode(); code >= 200 || code == fasthttp.StatusSwitchingProtocols {
			break
		}
		if interim == maxInterim {
			c.broken = true
			return errors.New("proxy: too many interim (1xx) responses from the backend")
		}
		resp.Header.Reset()
	}
	code := resp.StatusCode()
	c.reuse = !resp.Header.ConnectionClose() && code != fasthttp.StatusSwitchingProtocols
	switch cl := resp.Header.ContentLength(); {
	case req.Header.IsHead() || code == fasthttp.StatusNoContent || code == fasthttp.StatusNotModified:
		c.body = bodyDone
	case code == fasthttp.StatusSwitchingProtocols:
		c.body = bodyClose
	case cl >= 0:
		c.body, c.remain = bodyLength, int64(cl)
	case cl == -1:
		c.body = bodyChunked
	default:
		c.body, c.reuse = bodyClose, false
	}
	if c.br.Buffered() == 0 {
		c.dropReader()
	}
	return nil
}

// release gives the connection back to its pool when its response was read whole and both ends allow another
// request on it, and closes it otherwise: a body left unread (a stream cut short, an error body read in part) is
// how an engine learns to stop generating.
func (c *upConn) release() {
	c.unpark()
	c.dropReader()
	if c.broken || !c.reuse || c.body != bodyDone {
		_ = c.Conn.Close()
		return
	}
	_ = c.Conn.SetDeadline(time.Time{}) // an idle connection past a deadline would look stale to the check
	c.idleAt = time.Now()
	up := c.up
	up.mu.Lock()
	if len(up.idle) >= maxIdleConns {
		up.mu.Unlock()
		_ = c.Conn.Close()
		return
	}
	up.idle = append(up.idle, c)
	if up.reap == nil {
		up.reap = time.AfterFunc(idleTimeout, up.reapIdle)
	} else if len(up.idle) == 1 {
		up.reap.Reset(idleTimeout)
	}
	up.mu.Unlock()
}

// reapIdle closes the connections idle longer than idleTimeout (the oldest are first), and runs again while
// any stay idle.
func (up *upstream) reapIdle() {
	now := time.Now()
	up.mu.Lock()
	k := 0
	for k < len(up.idle) && now.Sub(up.idle[k].idleAt) >= idleTimeout {
		k++
	}
	old := append([]*upConn(nil), up.idle[:k]...)
	n := copy(up.idle, up.idle[k:])
	clear(up.idle[n:])
	up.idle = up.idle[:n]
	if n > 0 {
		up.reap.Reset(idleTimeout - now.Sub(up.idle[0].idleAt))
	}
	up.mu.Unlock()
	for _, c := range old {
		_ = c.Conn.Close()
	}
}

// prepareRequest fills req, which holds the client's forwarded headers (copyRequestHeaders), as the upstream
// request to the backend cfg describes: Host, scheme, the URI (up's path prefix, then cfg.Path expanded for path
// and upstreamModel or, without a template, the client's path; then cfg.Query), Accept-Encoding, cfg.Headers
// (which win over the client's), and the credentials: "Bearer <APIKey>" when the backend has a key, the
// client's own Authorization when cfg.ForwardAuthorization says so, none otherwise. The caller sets the method
// and the content type. scratch is a buffer the caller owns; the grown buffer is returned for reuse.
func (up *upstream) prepareRequest(req *fasthttp.Request, cfg *routing.BackendConfig, path []byte, upstreamModel string, scratch []byte) []byte {
	req.Header.SetHost(up.host)
	uri := req.URI()
	if up.tls {
		uri.SetScheme("https")
	} else {
		uri.SetScheme("http")
	}
	uri.SetHost(up.host)
	scratch = cfg.Path.AppendPath(append(scratch[:0], up.base...), path, upstreamModel)
	uri.SetPathBytes(scratch)
	if cfg.Query != "" {
		uri.SetQueryString(cfg.Query)
	}
	req.Header.Set(fasthttp.HeaderAcceptEncoding, "identity")
	for _, h := range cfg.Headers {
		req.Header.Set(h.Name, h.Value)
	}
	switch {
	case cfg.APIKey != "":
		req.Header.Set(fasthttp.HeaderAuthorization, "Bearer "+cfg.APIKey)
	case !cfg.ForwardAuthorization && !cfg.HasHeader(fasthttp.HeaderAuthorization):
		req.Header.Del(fasthttp.HeaderAuthorization) // the client's credentials are for the gateway
	}
	return scratch
}

func trimSlash(s string) string {
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}
