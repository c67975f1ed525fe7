package proxy

import (
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/routing"
)

// upstreams holds one fasthttp.HostClient (a keep-alive connection pool) per backend URL, connect timeout and CA
// bundle, shared by every routing.Backend with them across reloads, and a registry of the pools' live
// connections.
//
// Why the registry: fasthttp applies a request's timeout as one read deadline for the response headers AND the
// streamed body, and hides the connection. Streaming needs different bounds (first event, then idle between
// events) and a way to interrupt a blocked read when the client leaves. The registry maps a response's
// (local, remote) address pair, which fasthttp records, to the connection, so the relay can set its deadlines.
//
// Concurrency: safe for concurrent use.
type upstreams struct {
	mu      sync.Mutex
	clients map[upstreamKey]*upstream
	conns   sync.Map // connKey -> *upConn
}

type upstreamKey struct {
	url     string
	connect time.Duration
	ca      [32]byte // routing.CABundle.Sum; zero for the system roots
}

// upstreamReadBuffer is the read buffer of an upstream connection, taken from fasthttp's pool for each
// response and held until its body is read: for a stream, as long as the stream is open, so it is part of the
// memory per open stream (docs/profiling.md). It is also the bound on an engine's response headers (fasthttp
// reads them whole into it; more fails the attempt), which engines and hosted APIs keep to one or two KiB; nginx
// bounds them by one memory page (proxy_buffer_size). A body is not bounded by it: the SSE reader and a whole
// answer read through it, and large reads bypass it.
const upstreamReadBuffer = 8 << 10

// upstream is the pool for one backend URL.
type upstream struct {
	hc   *fasthttp.HostClient
	host string // Host header value
	base string // path prefix from the backend URL, without a trailing slash
	tls  bool
}

type connKey struct{ local, remote netip.AddrPort }

// upConn is a pooled upstream connection that knows how to leave the registry.
type upConn struct {
	net.Conn
	reg    *upstreams
	key    connKey
	closed atomic.Bool
	sock   rawSocket // reads and writes as raw system calls (rawio.go), when the connection is TCP
}

// Read reads the connection: from the socket raw when it can.
func (c *upConn) Read(p []byte) (int, error) {
	if c.sock.ready() {
		return c.sock.Read(p)
	}
	return c.Conn.Read(p)
}

// Write writes the connection: to the socket raw when it can.
func (c *upConn) Write(p []byte) (int, error) {
	if c.sock.ready() {
		return c.sock.Write(p)
	}
	return c.Conn.Write(p)
}

func (c *upConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.reg.conns.Delete(c.key)
	}
	return c.Conn.Close()
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
	dialer := &net.Dialer{Timeout: connectTimeout, KeepAlive: 30 * time.Second}
	up := &upstream{
		host: parsed.Host,
		base: trimSlash(parsed.Path),
		tls:  isTLS,
	}
	up.hc = &fasthttp.HostClient{
		Addr:  addr,
		IsTLS: isTLS,
		Dial: func(addr string) (net.Conn, error) {
			c, err := dialer.Dial("tcp", addr)
			if err != nil {
				return nil, err
			}
			uc := &upConn{Conn: c, reg: u}
			if tc, ok := c.(*net.TCPConn); ok {
				uc.sock.init(tc)
			}
			if uc.key, err = keyOf(c.LocalAddr(), c.RemoteAddr()); err == nil {
				u.conns.Store(uc.key, uc)
			}
			return uc, nil
		},
		TLSConfig:                     tlsCfg,
		MaxConns:                      1 << 16,
		MaxIdleConnDuration:           90 * time.Second,
		ReadBufferSize:                upstreamReadBuffer,
		WriteBufferSize:               64 << 10,
		StreamResponseBody:            true,
		NoDefaultUserAgentHeader:      true,
		DisableHeaderNamesNormalizing: false,
		// The gateway retries on another backend itself; fasthttp must never resend a POST on its own.
		RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		MaxIdemponentCallAttempts: 1,
	}
	u.clients[k] = up
	return up, nil
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

// conn returns the registered connection a response was read from, or nil.
func (u *upstreams) conn(resp *fasthttp.Response) *upConn {
	k, err := keyOf(resp.LocalAddr(), resp.RemoteAddr())
	if err != nil {
		return nil
	}
	if c, ok := u.conns.Load(k); ok {
		return c.(*upConn)
	}
	return nil
}

func keyOf(local, remote net.Addr) (connKey, error) {
	l, ok1 := local.(*net.TCPAddr)
	r, ok2 := remote.(*net.TCPAddr)
	if !ok1 || !ok2 {
		return connKey{}, fmt.Errorf("proxy: not a TCP connection")
	}
	return connKey{l.AddrPort(), r.AddrPort()}, nil
}

func trimSlash(s string) string {
	for len(s) > 0 && s[len(s)-1] == '/' {
		s = s[:len(s)-1]
	}
	return s
}
