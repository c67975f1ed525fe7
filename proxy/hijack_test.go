package proxy

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/routing"
)

// Parked streams (hijack.go): a stream waiting for its engine holds no goroutine, its connection serves the
// client's next requests (pipelined ones too) when it ends, and it still counts against the connection bounds.

// heldEngine streams three tokens and [DONE] at once to a request whose prompt is "quick"; to any other it sends
// one token, then waits until release is called, then three more tokens and [DONE].
func heldEngine(t *testing.T) (url string, release func()) {
	t.Helper()
	ch := make(chan struct{})
	var once sync.Once
	url = sseEngine(t, func(w io.Writer, r *http.Request) {
		if r.Header.Get("X-Test-Quick") == "" {
			_, _ = io.WriteString(w, endToken)
			select {
			case <-ch:
			case <-r.Context().Done():
				return
			}
		}
		tokens(w, 3, 0)
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	return url, release
}

// relayGoroutines counts the goroutines inside a stream's relay, in any gateway of the test binary.
func relayGoroutines() int {
	buf := make([]byte, 8<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "proxy.(*exchange).pump") || strings.Contains(g, "proxy.(*exchange).relay(") {
			n++
		}
	}
	return n
}

// rawRequest is a chat request as an HTTP/1.1 client writes it; quick asks heldEngine not to hold it (the
// gateway passes the header on).
func rawRequest(stream, quick bool) string {
	body := strings.Replace(endRequest, `"stream":true`, fmt.Sprintf(`"stream":%v`, stream), 1)
	extra := ""
	if quick {
		extra = "X-Test-Quick: 1\r\n"
	}
	return fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s",
		extra, len(body), body)
}

// clientConn is a raw client connection to the gateway, its reads bounded so that a lost answer fails the test.
type clientConn struct {
	net.Conn
	br *bufio.Reader
}

func dialGateway(t *testing.T, gw *gateway) *clientConn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(gw.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return &clientConn{Conn: c, br: bufio.NewReader(c)}
}

// response reads one response and its whole body (chunked or not).
func (c *clientConn) response(t *testing.T) (int, string) {
	t.Helper()
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return resp.StatusCode, string(b)
}

// firstToken reads a streamed response up to its first token and returns a reader of the rest of its body.
func (c *clientConn) firstToken(t *testing.T) *bufio.Reader {
	t.Helper()
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if te := resp.TransferEncoding; len(te) != 1 || te[0] != "chunked" {
		t.Fatalf("a stream's body is not chunked: %v", te)
	}
	rd := bufio.NewReader(resp.Body)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended before its first token: %v", err)
		}
		if strings.Contains(line, `"content":"tok `) {
			return rd
		}
	}
}

// TestParkedStreamsHoldNoGoroutine: 40 streams whose engine holds them after their first token have no
// goroutine in the gateway's relay while they wait (before hijack.go each had one), then all end whole. Half of
// them go on connections that carried a stream before, so that a connection served on after a hijack is
// hijacked again.
func TestParkedStreamsHoldNoGoroutine(t *testing.T) {
	const n = 40
	url, release := heldEngine(t)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, url), Options{})
	conns := make([]*clientConn, n)
	for i := range conns {
		conns[i] = dialGateway(t, gw)
		if i%2 == 0 {
			_, _ = io.WriteString(conns[i], rawRequest(true, true))
			if code, body := conns[i].response(t); code != 200 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
				t.Fatalf("first stream on connection %d: %d %q", i, code, body)
			}
		}
	}
	rest := make([]*bufio.Reader, n)
	for i, c := range conns {
		_, _ = io.WriteString(c, rawRequest(true, false))
		rest[i] = c.firstToken(t)
	}
	var held int
	deadline := time.Now().Add(5 * time.Second)
	for held = relayGoroutines(); held > 2 && time.Now().Before(deadline); held = relayGoroutines() {
		time.Sleep(20 * time.Millisecond)
	}
	if held > 2 {
		t.Fatalf("%d goroutines in a relay while %d streams wait for their engine; want none", held, n)
	}
	release()
	for i, rd := range rest {
		b, err := io.ReadAll(rd)
		if err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") || strings.Count(string(b), `"content":"tok `) != 3 {
			t.Fatalf("stream %d: %v %q", i, err, b)
		}
	}
	// Each connection serves on after its stream.
	for i, c := range conns {
		_, _ = io.WriteString(c, rawRequest(false, true))
		if code, body := c.response(t); code != 200 || !strings.Contains(body, `"chat.completion"`) {
			t.Fatalf("request after the stream on connection %d: %d %q", i, code, body)
		}
	}
}

// TestPipelinedRequestsAfterAStream: requests a client sends behind a streamed one on the same connection,
// before its answer, are answered in order after it, whether streamed or not.
func TestPipelinedRequestsAfterAStream(t *testing.T) {
	url, _ := heldEngine(t)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, url), Options{})
	c := dialGateway(t, gw)
	_, _ = io.WriteString(c, rawRequest(true, true)+rawRequest(true, true)+rawRequest(false, true)+rawRequest(true, true))
	for i, stream := range []bool{true, true, false, true} {
		code, body := c.response(t)
		if code != 200 {
			t.Fatalf("answer %d: status %d: %s", i, code, body)
		}
		if got := strings.HasSuffix(body, "data: [DONE]\n\n"); got != stream {
			t.Fatalf("answer %d: streamed %v, want %v: %q", i, got, stream, body)
		}
	}
}

// TestConnectionBoundsCountParkedStreams: a hijacked stream's connection is no longer fasthttp's, and still
// counts against MaxConns and MaxConnsPerIP: a connection past them gets 503 too_many_connections, and one is
// accepted again once a counted connection closed.
func TestConnectionBoundsCountParkedStreams(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
		n    int
	}{
		{"MaxConns", Options{MaxConns: 3}, 3},
		{"MaxConnsPerIP", Options{MaxConnsPerIP: 2}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, release := heldEngine(t)
			gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, url), tc.opts)
			conns := make([]*clientConn, tc.n)
			for i := range conns {
				conns[i] = dialGateway(t, gw)
				_, _ = io.WriteString(conns[i], rawRequest(true, false))
				conns[i].firstToken(t)
			}
			over := dialGateway(t, gw)
			_, _ = io.WriteString(over, rawRequest(false, true))
			code, body := over.response(t)
			if code != 503 || !strings.Contains(body, `"too_many_connections"`) || !strings.Contains(body, tc.name) {
				t.Fatalf("a connection past the bound: %d %s", code, body)
			}
			release()
			conns[0].Close()
			waitFor(t, 5*time.Second, func() bool {
				c := dialGateway(t, gw)
				defer c.Close()
				_, _ = io.WriteString(c, rawRequest(false, true))
				code, _ := c.response(t)
				return code == 200
			})
		})
	}
}

// TestDrainEndsAParkedStreamOfFastTokens: a stream that parks every 10 ms, far more often than its watchdog
// would tick, is still ended when the drain's time is up: the drain aborts the streams whose client the parker
// watches itself (watchedSet), since their watchdogs tick only for a ping or a deadline.
func TestDrainEndsAParkedStreamOfFastTokens(t *testing.T) {
	url := sseEngine(t, func(w io.Writer, r *http.Request) {
		for range 1000 { // 10 s of tokens
			if r.Context().Err() != nil {
				return
			}
			_, _ = io.WriteString(w, endToken)
			time.Sleep(10 * time.Millisecond)
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, url), Options{CheckInterval: 100 * time.Millisecond})
	c := dialGateway(t, gw)
	_, _ = io.WriteString(c, rawRequest(true, false))
	rest := c.firstToken(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	go func() { _ = gw.s.Shutdown(ctx) }()
	waitFor(t, 3*time.Second, func() bool { return endsOf(t, gw.reg, "b0", "shutdown") == 1 })
	b, _ := io.ReadAll(rest)
	if !strings.Contains(string(b), "shutting_down") || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("the stream did not end with the drain's error event: %q", b[max(0, len(b)-300):])
	}
}

// TestPanicWhileTakingOverAStream: a panic after fasthttp handed a committed stream's connection over, before
// any of the answer is written, is recovered (hijack.go runs in a goroutine of fasthttp's, which recovers
// nothing): counted, the request failed, its attempt ended, the connection closed, the gateway serving on.
func TestPanicWhileTakingOverAStream(t *testing.T) {
	url, release := heldEngine(t)
	release()
	snap := snapshotOf(&routing.RoundRobin{}, 0, url)
	gw := startGateway(t, snap, Options{})
	var fired atomic.Bool
	gw.s.panicAt = func(stage string) {
		if stage == stageHijack && fired.CompareAndSwap(false, true) {
			panic("test panic in " + stage)
		}
	}
	c := dialGateway(t, gw)
	_, _ = io.WriteString(c, rawRequest(true, true))
	if b, err := io.ReadAll(c.br); err != nil || len(b) != 0 {
		t.Fatalf("the connection sent %q (%v), want it closed with nothing", b, err)
	}
	if got := panics(t, gw, stageHijack); got != 1 {
		t.Errorf("switchyard_panics_total{stage=hijack} = %v, want 1", got)
	}
	waitFor(t, 5*time.Second, func() bool { return snap.Backends[0].Inflight() == 0 })
	c = dialGateway(t, gw)
	_, _ = io.WriteString(c, rawRequest(true, true))
	if code, body := c.response(t); code != 200 || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("the next stream: %d %q", code, body)
	}
}

// TestClientCloseEndsAParkedStreamAtOnce: a hijacked stream learns that its client closed the connection from
// the parker, not from a tick: with the ticks an hour apart, the engine's request is still cancelled at once,
// and the stream's end is counted as the client's.
func TestClientCloseEndsAParkedStreamAtOnce(t *testing.T) {
	cancelled := make(chan struct{})
	url := sseEngine(t, func(w io.Writer, r *http.Request) {
		_, _ = io.WriteString(w, endToken)
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(30 * time.Second):
		}
	})
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, url), Options{CheckInterval: time.Hour})
	c := dialGateway(t, gw)
	_, _ = io.WriteString(c, rawRequest(true, false))
	c.firstToken(t)
	waitFor(t, 5*time.Second, func() bool { return relayGoroutines() == 0 }) // parked
	start := time.Now()
	c.Close()
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the engine's request was not cancelled 10 s after its client closed the connection")
	}
	waitFor(t, 5*time.Second, func() bool { return endsOf(t, gw.reg, "b0", "client_gone") == 1 })
	t.Logf("engine request cancelled %v after the client closed", time.Since(start))
}

// TestHalfCloseBehindAPipelinedRequest: a client that sends its next request during a stream and then closes
// its side of the connection (a half-close) is still there: the parker reports the half-close, and the
// watchdog, finding the client's bytes unread, lets the stream go on, then the next request is answered.
func TestHalfCloseBehindAPipelinedRequest(t *testing.T) {
	url, release := heldEngine(t)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, url), Options{CheckInterval: 50 * time.Millisecond})
	c := dialGateway(t, gw)
	_, _ = io.WriteString(c, rawRequest(true, false))
	rest := c.firstToken(t)
	_, _ = io.WriteString(c, rawRequest(false, true))
	if err := c.Conn.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the report, and several ticks that peek
	release()
	b, err := io.ReadAll(rest)
	if err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") || strings.Count(string(b), `"content":"tok `) != 3 {
		t.Fatalf("the stream after the half-close: %v %q", err, b)
	}
	if code, body := c.response(t); code != 200 || !strings.Contains(body, `"chat.completion"`) {
		t.Fatalf("the pipelined request: %d %q", code, body)
	}
	if n := endsOf(t, gw.reg, "b0", "client_gone"); n != 0 {
		t.Fatalf("%v streams ended as client_gone", n)
	}
}

// TestKeepAlivePings: a stream silent for longer than KeepAliveInterval gets ": ping" comments, about one per
// interval of silence, and none for a shorter silence (before 2026-12-06 every silence of 250 ms got one: a
// write per token gap of a slow stream), hijacked (HTTP/1.1) or not (HTTP/1.0).
func TestKeepAlivePings(t *testing.T) {
	url := sseEngine(t, func(w io.Writer, r *http.Request) {
		_, _ = io.WriteString(w, endToken)
		time.Sleep(450 * time.Millisecond) // four pings' worth of silence at 100 ms
		tokens(w, 2, 0)
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
	for _, tc := range []struct {
		keepalive time.Duration
		min, max  int
	}{
		{100 * time.Millisecond, 2, 5},
		{0, 0, 0}, // the default, 10 s
	} {
		gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, url), Options{KeepAliveInterval: tc.keepalive})
		for _, proto := range []string{"HTTP/1.1", "HTTP/1.0"} {
			t.Run(fmt.Sprintf("%v/%s", tc.keepalive, proto), func(t *testing.T) {
				c := dialGateway(t, gw)
				_, _ = io.WriteString(c, strings.Replace(rawRequest(true, false), "HTTP/1.1", proto, 1))
				resp, err := http.ReadResponse(c.br, nil)
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				if err != nil || !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
					t.Fatalf("%v %q", err, b)
				}
				var pings []int // pings before each token
				n := 0
				for _, ev := range strings.Split(string(b), "\n\n") {
					switch {
					case strings.HasPrefix(ev, ": ping"):
						n++
					case strings.Contains(ev, `"content":"tok `):
						pings = append(pings, n)
						n = 0
					}
				}
				if len(pings) != 3 || pings[0] != 0 || pings[2] != 0 || n != 0 {
					t.Fatalf("pings before each token %v, and %d after: %q", pings, n, b)
				}
				if pings[1] < tc.min || pings[1] > tc.max {
					t.Errorf("%d pings in 450 ms of silence, want %d-%d", pings[1], tc.min, tc.max)
				}
			})
		}
	}
}

// doneWatch is a listener whose connections record the backend's requests in flight at the moment the gateway
// writes an answer's "[DONE]" to its client.
type doneWatch struct {
	net.Listener
	b    *routing.Backend
	seen chan int64
}

func (l doneWatch) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return doneConn{Conn: c, w: l}, nil
}

type doneConn struct {
	net.Conn
	w doneWatch
}

func (c doneConn) Write(p []byte) (int, error) {
	if bytes.Contains(p, []byte("data: [DONE]")) {
		select {
		case c.w.seen <- c.w.b.Inflight():
		default:
		}
	}
	return c.Conn.Write(p)
}

// TestSeatFreeBeforeTheClientReadsTheEnd: the engine's seat is free, in the backend's count, before the client
// reads the end of its answer, so that the next turn of a conversation, sent the moment the answer ended, finds
// the backend without it (before, the count fell only once the exchange was settled, after that write).
func TestSeatFreeBeforeTheClientReadsTheEnd(t *testing.T) {
	url, _ := heldEngine(t)
	snap := snapshotOf(&routing.RoundRobin{}, 0, url)
	w := doneWatch{b: snap.Backends[0], seen: make(chan int64, 1)}
	gw := startGatewayWith(t, snap, Options{}, func(ln net.Listener) net.Listener { w.Listener = ln; return w })
	for _, stream := range []bool{true, false} {
		c := dialGateway(t, gw)
		_, _ = io.WriteString(c, rawRequest(stream, true))
		code, body := c.response(t)
		if code != 200 {
			t.Fatalf("status %d: %s", code, body)
		}
		if !stream {
			waitFor(t, 5*time.Second, func() bool { return snap.Backends[0].Inflight() == 0 })
			continue
		}
		select {
		case n := <-w.seen:
			if n != 0 {
				t.Fatalf("%d requests in flight on the backend when [DONE] was written to the client, want 0", n)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("no [DONE] written")
		}
	}
}
