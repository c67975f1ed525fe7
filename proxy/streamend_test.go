package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/routing"
)

// A committed stream that ends other than with its answer says whose timeout or failure it was: in
// switchyard_stream_ends_total{cause}, the access log's stream_end, one warn line, and the error event the
// client gets when it is still there (streamend.go). Each case below makes one cause happen on loopback: a
// hand-written engine that misbehaves on purpose, a client that does, or the gateway itself (drain, panic),
// with its timeouts scaled down to a few hundred milliseconds.

const endToken = `data: {"id":"c1","object":"chat.completion.chunk","model":"sim-model","choices":[{"index":0,"delta":{"content":"tok "}}]}` + "\n\n"

const endRequest = `{"model":"sim-model","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"break"}]}`

// sseEngine answers every request with the SSE headers, then runs script with a writer that flushes each write.
func sseEngine(t *testing.T, script func(w io.Writer, r *http.Request)) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		script(flusher{w}, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

type flusher struct{ w http.ResponseWriter }

func (f flusher) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	f.w.(http.Flusher).Flush()
	return n, err
}

// tokens writes n content events, every gap apart.
func tokens(w io.Writer, n int, gap time.Duration) {
	for i := range n {
		if i > 0 && gap > 0 {
			time.Sleep(gap)
		}
		_, _ = io.WriteString(w, endToken)
	}
}

// endsOf reads switchyard_stream_ends_total{backend, cause}.
func endsOf(t testing.TB, g prometheus.Gatherer, backend, cause string) float64 {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "switchyard_stream_ends_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["backend"] == backend && l["cause"] == cause {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// readStream posts a streaming chat request and returns the whole body.
func readStream(t *testing.T, gw *gateway) string {
	t.Helper()
	resp, err := http.Post(gw.url+"/v1/chat/completions", "application/json", strings.NewReader(endRequest))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// readFirstToken posts a streaming chat request and returns once its first token arrived, with the response.
func readFirstToken(t *testing.T, gw *gateway) (*http.Response, *bufio.Reader) {
	t.Helper()
	resp, err := http.Post(gw.url+"/v1/chat/completions", "application/json", strings.NewReader(endRequest))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			resp.Body.Close()
			t.Fatalf("the stream ended before its first token: %v", err)
		}
		if strings.Contains(line, `"content":"tok `) {
			return resp, br
		}
	}
}

// errorEvent returns the message of the first error event in an SSE body, "" when there is none.
func errorEvent(body string) string {
	for _, line := range strings.Split(body, "\n") {
		if strings.HasPrefix(line, `data: {"error":`) {
			return line
		}
	}
	return ""
}

// hasLine reports whether a JSON log holds a line with message msg whose field key is value.
func hasLine(t *testing.T, buf *syncBuffer, msg, key, value string) bool {
	for _, l := range buf.lines(t) {
		if l["msg"] == msg && l[key] == value {
			return true
		}
	}
	return false
}

func TestStreamEndCauses(t *testing.T) {
	t.Parallel()
	stall := func(w io.Writer, r *http.Request) { <-r.Context().Done() }
	for _, tc := range []struct {
		name   string
		cause  string
		engine func(w io.Writer, r *http.Request) // nil: the client or the gateway misbehaves
		opts   Options
		// client reads the stream as the case needs and returns what it got ("" when it left).
		client func(t *testing.T, gw *gateway) string
		event  string // in the client's error event; "" when it gets none
	}{
		{name: "complete", cause: "complete",
			engine: func(w io.Writer, r *http.Request) { tokens(w, 3, 0); _, _ = io.WriteString(w, "data: [DONE]\n\n") }},
		{name: "client gone", cause: "client_gone",
			engine: func(w io.Writer, r *http.Request) {
				for r.Context().Err() == nil {
					tokens(w, 1, 0)
					time.Sleep(20 * time.Millisecond)
				}
			},
			client: func(t *testing.T, gw *gateway) string {
				resp, _ := readFirstToken(t, gw)
				resp.Body.Close()
				return ""
			}},
		{name: "client write timeout", cause: "client_write_timeout", opts: Options{WriteTimeout: 200 * time.Millisecond},
			engine: func(w io.Writer, r *http.Request) {
				big := `data: {"id":"c1","object":"chat.completion.chunk","model":"sim-model","choices":[{"index":0,"delta":{"content":"` +
					strings.Repeat("x", 16<<10) + `"}}]}` + "\n\n"
				for r.Context().Err() == nil {
					if _, err := io.WriteString(w, big); err != nil {
						return
					}
				}
			},
			client: slowClient},
		{name: "upstream idle timeout", cause: "upstream_idle_timeout",
			opts:   Options{Timeouts: routing.Timeouts{Idle: 300 * time.Millisecond}},
			engine: func(w io.Writer, r *http.Request) { tokens(w, 2, 0); stall(w, r) },
			event:  "the backend sent nothing for 300ms (timeouts.idle)"},
		{name: "upstream total timeout", cause: "upstream_total_timeout",
			opts: Options{Timeouts: routing.Timeouts{Idle: 5 * time.Second, Total: 500 * time.Millisecond}},
			engine: func(w io.Writer, r *http.Request) {
				for r.Context().Err() == nil {
					tokens(w, 1, 0)
					time.Sleep(20 * time.Millisecond)
				}
			},
			event: "longer than 500ms (timeouts.total)"},
		{name: "upstream closed", cause: "upstream_closed",
			engine: func(w io.Writer, r *http.Request) { tokens(w, 3, 0) },
			event:  "the backend ended the stream without finishing it"},
		{name: "upstream reset", cause: "upstream_reset",
			engine: func(w io.Writer, r *http.Request) {
				tokens(w, 3, 0)
				c, _, err := w.(flusher).w.(http.Hijacker).Hijack()
				if err != nil {
					return
				}
				_ = c.(*net.TCPConn).SetLinger(0) // close with a RST, as a crashed host's kernel does
				_ = c.Close()
			},
			event: "the connection to the backend failed"},
		{name: "upstream invalid", cause: "upstream_invalid",
			engine: func(w io.Writer, r *http.Request) {
				tokens(w, 2, 0)
				_, _ = io.WriteString(w, "data: {\"choices\": [tok\n\n")
			},
			event: "the backend sent an event the gateway cannot read"},
		{name: "upstream error event", cause: "upstream_error_event",
			engine: func(w io.Writer, r *http.Request) {
				tokens(w, 2, 0)
				_, _ = io.WriteString(w, `data: {"error":{"message":"the engine ran out of KV cache","type":"server_error"}}`+"\n\n")
			},
			event: "the engine ran out of KV cache"},
		{name: "gateway limit", cause: "gateway_limit",
			engine: func(w io.Writer, r *http.Request) {
				tokens(w, 1, 0)
				_, _ = io.WriteString(w, "data: "+strings.Repeat("x", maxEventBytes+1)+"\n\n")
			},
			event: "larger than the gateway accepts"},
		{name: "shutdown", cause: "shutdown",
			engine: func(w io.Writer, r *http.Request) { tokens(w, 1, 0); stall(w, r) },
			client: func(t *testing.T, gw *gateway) string {
				resp, br := readFirstToken(t, gw)
				defer resp.Body.Close()
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				go func() { _ = gw.s.Shutdown(ctx) }()
				rest, _ := io.ReadAll(br)
				return string(rest)
			},
			event: "the gateway is shutting down"},
		{name: "panic", cause: "panic",
			engine: func(w io.Writer, r *http.Request) { tokens(w, 3, 0); _, _ = io.WriteString(w, "data: [DONE]\n\n") },
			event:  "internal error in the gateway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var access, logs syncBuffer
			opts := tc.opts
			opts.CheckInterval = 50 * time.Millisecond
			opts.AccessLog = slog.New(slog.NewJSONHandler(&access, nil))
			opts.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
			gw := startGatewayOn(t, snapshotOf(&routing.RoundRobin{}, 0, sseEngine(t, tc.engine)), opts, tc.name == "client write timeout")
			if tc.cause == "panic" {
				var fired atomic.Bool
				gw.s.panicAt = func(stage string) {
					if stage == stageRelay && fired.CompareAndSwap(false, true) {
						panic("test panic in the relay")
					}
				}
			}
			client := tc.client
			if client == nil {
				client = readStream
			}
			body := client(t, gw)
			waitFor(t, 5*time.Second, func() bool { return endsOf(t, gw.reg, "b0", tc.cause) == 1 })
			waitFor(t, 2*time.Second, func() bool { return hasLine(t, &access, "request", "stream_end", tc.cause) })
			broken := hasLine(t, &logs, "stream ended before its answer did", "cause", tc.cause)
			if want := tc.cause != "complete"; broken != want {
				t.Errorf("a warn line for the stream: %v, want %v; log:\n%s", broken, want, logs.String())
			}
			if tc.event != "" {
				if ev := errorEvent(body); !strings.Contains(ev, tc.event) {
					t.Errorf("the client's error event %q does not say %q; stream ends: ...%s", ev, tc.event, body[max(0, len(body)-300):])
				}
			} else if ev := errorEvent(body); ev != "" {
				t.Errorf("unexpected error event %q", ev)
			}
			if tc.cause == "complete" && !strings.HasSuffix(body, "data: [DONE]\n\n") {
				t.Errorf("a complete stream ends ...%q", body[max(0, len(body)-100):])
			}
		})
	}
}

// slowClient sends a streaming request on a connection with a small receive buffer and then reads nothing, so
// that the gateway's writes to it block until the write timeout; it leaves once the gateway gave up on it.
func slowClient(t *testing.T, gw *gateway) string {
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", strings.TrimPrefix(gw.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(endRequest), endRequest)
	waitFor(t, 5*time.Second, func() bool { return endsOf(t, gw.reg, "b0", "client_write_timeout") == 1 })
	return ""
}

// startGatewayOn is startGateway; with smallSend, the gateway's accepted connections get a small send buffer,
// so that a client that reads nothing blocks the gateway's writes within a few kilobytes.
func startGatewayOn(t *testing.T, snap *Snapshot, opts Options, smallSend bool) *gateway {
	if !smallSend {
		return startGateway(t, snap, opts)
	}
	return startGatewayWith(t, snap, opts, func(ln net.Listener) net.Listener { return smallSendListener{ln} })
}

type smallSendListener struct{ net.Listener }

func (l smallSendListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetWriteBuffer(4096)
	}
	return c, err
}

// TestCauseOf: the cause of an error is read from what it is, through any wrapping, never from its text; a
// failure that says nothing more is the connection's.
func TestCauseOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want endCause
	}{
		{nil, endComplete},
		{errClientGone, endClientGone},
		{errClientSlow, endClientWriteTimeout},
		{fmt.Errorf("relay: %w", errClientSlow), endClientWriteTimeout},
		{errShutdown, endShutdown},
		{errPanic, endPanic},
		{&upstreamError{kind: kindStream, backend: "b", cause: endUpstreamIdle}, endUpstreamIdle},
		{fmt.Errorf("relay: %w", &upstreamError{kind: kindStream, cause: endUpstreamTotal}), endUpstreamTotal},
		{&upstreamError{kind: kindStream, backend: "b", err: io.ErrUnexpectedEOF}, endUpstreamReset},
		{errors.New("the backend's stream broke off: timeouts.idle"), endUpstreamReset},
	} {
		if got := causeOf(tc.err); got != tc.want {
			t.Errorf("causeOf(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	for c := endNone; c < numEndCauses; c++ {
		if endCauseNames[c] == "" {
			t.Errorf("cause %d has no name", c)
		}
	}
}
