package proxy

import (
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// Parked streams (docs/design.md, "Parked streams"). fasthttp serves each connection in a goroutine of its own,
// and a streamed answer relayed through fasthttp (streamBody) keeps that goroutine, and its stack of some 8 KiB
// that the runtime never shrinks, for the stream's whole life: most of what an open stream cost. Most of that
// life is spent waiting for the engine's next token.
//
// So a streamed answer to an HTTP/1.1 client, from an engine reached over plain TCP, takes its connection from
// fasthttp (Hijack) once the answer is committed: fasthttp gives back its request context and write buffer, and
// the relay writes the response headers and the chunked body itself (clientStream). Whenever the relay must wait
// for the engine, it parks: the engine connection's socket is armed on the parker (park_linux.go) for one
// readiness report, and the goroutine returns. The watchdog resumes the relay in a new goroutine at the first of
// the socket becoming readable, the read's deadline (the idle or total bound, which the watchdog's timer now
// also keeps), or an abort (client gone, drain, shutdown); the read that follows finds what woke it, data, a
// deadline passed or an error, exactly as a read that had waited would have. At the end the relay writes the
// last chunk and serves the connection's next requests (fasthttp's ServeConn), or closes it.
//
// Anything else streams as before, in fasthttp's goroutine: HTTP/1.0 clients, TLS on either side, and a stream
// the parker cannot take.

// clientStream writes a hijacked stream's body to the client in HTTP/1.1 chunked coding, one chunk per write,
// each in one system call with the response headers before the first. The watchdog's lock serialises its writes.
type clientStream struct {
	conn net.Conn
	hdr  *[]byte // the response headers, until the first write takes them
}

// frameBufs holds the buffers a chunk is framed in: taken for one write, so that a waiting stream holds none.
var frameBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// maxFrameBuf bounds the frame buffers kept in the pool (a batch is at most maxBatch).
const maxFrameBuf = maxBatch + 64

// Write frames b as one chunk and writes it, after the response headers if they are not written yet.
func (cs *clientStream) Write(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil // an empty chunk would end the body
	}
	bp := cs.hdr
	cs.hdr = nil
	if bp == nil {
		bp = frameBufs.Get().(*[]byte)
	}
	buf := strconv.AppendInt(*bp, int64(len(b)), 16)
	buf = append(buf, "\r\n"...)
	buf = append(buf, b...)
	buf = append(buf, "\r\n"...)
	_, err := cs.conn.Write(buf)
	putFrame(bp, buf)
	if err != nil {
		return 0, err
	}
	return len(b), nil
}

// flushHeader writes the response headers if no chunk took them.
func (cs *clientStream) flushHeader() error {
	bp := cs.hdr
	if bp == nil {
		return nil
	}
	cs.hdr = nil
	_, err := cs.conn.Write(*bp)
	putFrame(bp, *bp)
	return err
}

// release gives back the headers' buffer of a stream that wrote nothing.
func (cs *clientStream) release() {
	if bp := cs.hdr; bp != nil {
		cs.hdr = nil
		putFrame(bp, *bp)
	}
	cs.conn = nil
}

func putFrame(bp *[]byte, buf []byte) {
	if cap(buf) > maxFrameBuf {
		return
	}
	*bp = buf[:0]
	frameBufs.Put(bp)
}

// lastChunk ends a chunked body with no trailers.
var lastChunk = []byte("0\r\n\r\n")

// parkable reports whether the streamed answer ex commits to can be relayed on a hijacked connection: an
// HTTP/1.1 client on a plain TCP connection of the gateway's listener, an engine on a plain TCP connection, and
// a parker.
func (s *Server) parkable(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	a := ex.cur
	if a == nil || !a.sse || a.conn == nil || !a.conn.sock.ready() || !ctx.Request.Header.IsHTTP11() {
		return false
	}
	if lc := clientSocket(ctx.Conn()); lc == nil || !lc.sock.ready() {
		return false
	}
	return getParker() != nil
}

// clientSocket returns the gateway's own connection under c (linger.go), or nil for any other.
func clientSocket(c net.Conn) *lingerConn {
	switch c := c.(type) {
	case *lingerConn:
		return c
	case *prefixConn:
		return c.lingerConn
	}
	return nil
}

// hijack hands the committed stream's connection over from fasthttp: ex.hijacked runs once the handler
// returned, in a goroutine fasthttp starts for it.
//
// fasthttp skips the hijack handler only when, after the handler, it fails to flush a response it held back for
// a pipelined request or to clear the connection's deadlines. Neither can happen here: with ReduceMemoryUsage
// (server.go) every response is flushed and its writer released as it is written, and the deadlines of an open
// socket can always be set. So the handler always runs, and with it the stream's end.
func (ex *exchange) hijack(ctx *fasthttp.RequestCtx) {
	ex.hctx = ctx
	ctx.HijackSetNoResponse(true) // the relay writes the headers itself, with the first events
	ctx.Hijack(ex.hijackFn)
}

// hijacked starts relaying a hijacked stream, in the goroutine fasthttp started for it.
func (ex *exchange) hijacked(c net.Conn) {
	if ex.takeOver(c) {
		ex.runHijacked()
	}
}

// takeOver sets the hijacked stream up: the connection to serve on afterwards, the response headers, the body
// writer. ctx is still fasthttp's here, and is given back once hijacked returns: nothing of it is kept. A panic
// here (nothing of the answer is written yet) is recovered as the relay's are (recover.go): the request is
// recorded as failed, the exchange discarded, and the connection closed; it returns false then.
func (ex *exchange) takeOver(c net.Conn) (ok bool) {
	defer func() {
		if r := recover(); r != nil {
			s := ex.s
			s.recovered(stageHijack, r)
			ex.poisoned = true
			s.discard(ex)
			s.active.Done()
			_ = c.Close()
			ok = false
		}
	}()
	ctx := ex.hctx
	ex.hctx = nil
	lc := clientSocket(ex.client) // never nil: parkable
	ex.keep = lc
	if left := ex.takeUnread(c, lc); len(left) > 0 {
		ex.keep = &prefixConn{lingerConn: lc, pending: left}
	}
	h := &ctx.Response.Header
	h.SetContentLength(-1) // chunked
	ex.closeAfter = h.ConnectionClose()
	bp := frameBufs.Get().(*[]byte)
	*bp = h.AppendBytes((*bp)[:0])
	ex.cw = clientStream{conn: ex.client, hdr: bp}
	ex.parking = true
	ex.s.testPanic(stageHijack)
	_ = ex.wd.commit(&ex.cw, ex.resumeFn)
	ex.wd.watch(lc.sock.sysfd())
	return true
}

// takeUnread reads out what the client sent past this request and fasthttp's reader or the connection's
// read-ahead already holds (a pipelined request): the connection's reads report errNoWait instead of reading
// the socket meanwhile, so nothing waits. It is at most those two buffers. They are served first when the
// connection serves again.
func (ex *exchange) takeUnread(c net.Conn, lc *lingerConn) []byte {
	lc.noWait = true
	var left []byte
	buf := ex.scratch[:cap(ex.scratch)]
	if len(buf) < 512 {
		buf = make([]byte, 512)
		ex.scratch = buf[:0]
	}
	for len(left) <= 2*clientReadBuffer {
		n, err := c.Read(buf)
		left = append(left, buf[:n]...)
		if err != nil || n == 0 {
			break
		}
	}
	lc.noWait = false
	return left
}

// resumed continues a parked stream: the watchdog's wake, in a goroutine of its own.
func (ex *exchange) resumed() {
	ex.woke = true
	ex.runHijacked()
}

// runHijacked relays until the stream parks or ends; at its end it closes the connection or serves it on.
func (ex *exchange) runHijacked() {
	parked, fail := ex.safePump()
	if parked {
		return // the exchange is the watchdog's to resume now
	}
	s := ex.s
	conn := ex.keep
	keep := fail == nil && !ex.closeAfter && !s.draining.Load()
	if fail == nil {
		if err := ex.cw.flushHeader(); err != nil {
			keep = false
		} else if conn.SetWriteDeadline(time.Now().Add(s.opts.WriteTimeout)) != nil {
			keep = false
		} else if _, err := conn.Write(lastChunk); err != nil {
			keep = false
		}
	}
	ex.cw.release()
	ex.keep = nil
	func() {
		defer s.active.Done()
		defer func() {
			if r := recover(); r != nil {
				s.recovered(stageRelay, r)
			}
		}()
		_ = ex.Close()
	}()
	if !keep {
		_ = conn.Close()
		return
	}
	_ = conn.SetWriteDeadline(time.Time{})
	_ = s.srv.ServeConn(conn) // the connection's next requests, in this goroutine, as fasthttp's own would
}

// park parks the stream (ex.parking): it writes what is still to be written, sets the read's deadline and,
// unless the watchdog or the parker refuses, returns true with the stream parked; the caller returns at once.
// An error is the client's: the write failed.
func (ex *exchange) park() (bool, error) {
	if err := ex.flush(); err != nil {
		return false, err
	}
	if ex.cw.flushHeader() != nil {
		return false, errClientGone
	}
	a := ex.cur
	deadline := a.idleDeadline()
	ex.deadlineSet = true
	// The event reader holds nothing now (mustWait): its buffer waits in a pool, not in the stream. The last
	// event's bytes were written or copied by step.
	a.events.Release()
	return ex.wd.park(a, deadline), nil
}

// prefixConn is a client connection that still has bytes read past a hijacked stream's request (a pipelined
// request): its reads return them first.
type prefixConn struct {
	*lingerConn
	pending []byte
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			c.pending = nil
		}
		return n, nil
	}
	return c.lingerConn.Read(p)
}
