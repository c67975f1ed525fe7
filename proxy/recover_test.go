package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// panicOnce is a strategy whose first pick panics; later picks take the first candidate.
type panicOnce struct{ n atomic.Int32 }

func (p *panicOnce) Pick(_ *routing.Request, ts []routing.Target) (routing.Target, error) {
	if n := p.n.Add(1); n == 1 {
		var picked []routing.Target
		_ = picked[n] // an index out of range: a real runtime panic, as a bug in a strategy would cause
	}
	if len(ts) == 0 {
		return routing.Target{}, routing.ErrNoBackend
	}
	return ts[0], nil
}

// conn is one client connection to the gateway, on which requests are sent one after the other (HTTP/1.1
// keep-alive), so a test can tell that the connection survived a request.
type conn struct {
	t  *testing.T
	c  net.Conn
	rd *bufio.Reader
}

func dial(t *testing.T, url string) *conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return &conn{t: t, c: c, rd: bufio.NewReader(c)}
}

// post sends one request on the connection and reads its whole response.
func (c *conn) post(path, body string) (*http.Response, []byte) {
	c.t.Helper()
	_ = c.c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c.c, "POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body)
	resp, err := http.ReadResponse(c.rd, nil)
	if err != nil {
		c.t.Fatalf("reading the answer on the same connection: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("reading the body: %v", err)
	}
	_ = resp.Body.Close()
	return resp, b
}

const shortChat = `{"model":"sim-model","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`
const shortStream = `{"model":"sim-model","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`

// counterWith sums the counter name over its series whose label has value.
func counterWith(t *testing.T, gw *gateway, name, label, value string) float64 {
	t.Helper()
	fams, err := gw.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

func panics(t *testing.T, gw *gateway, stage string) float64 {
	t.Helper()
	return counterWith(t, gw, "switchyard_panics_total", "stage", stage)
}

// TestPanicInHandlerKeepsServing: a panic in one request's handler (here in its routing strategy) answers that
// request 500 and nothing else: the next request on the same connection succeeds, and nothing is left held.
func TestPanicInHandlerKeepsServing(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	snap := snapshotOf(&panicOnce{}, 0, be.URL())
	gw := startGateway(t, snap, Options{})
	c := dial(t, gw.url)
	resp, body := c.post("/v1/chat/completions", shortChat)
	if resp.StatusCode != 500 || !bytes.Contains(body, []byte(`"internal_error"`)) {
		t.Fatalf("panicking request: %d %s, want 500 internal_error", resp.StatusCode, body)
	}
	resp, body = c.post("/v1/chat/completions", shortChat)
	if resp.StatusCode != 200 || !bytes.Contains(body, []byte(`"chat.completion"`)) {
		t.Fatalf("next request on the same connection: %d %s", resp.StatusCode, body)
	}
	if got := panics(t, gw, stageHandler); got != 1 {
		t.Errorf("switchyard_panics_total{stage=handler} = %v, want 1", got)
	}
	if n := snap.Backends[0].Inflight(); n != 0 {
		t.Errorf("backend in flight after both requests: %d", n)
	}
}

// TestPanicInEveryStage makes each stage of the request path panic once and checks the answer the client gets
// for it, that the next request on the same connection succeeds, and the count by stage.
func TestPanicInEveryStage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		stage  string
		body   string
		status int
		want   string // in the panicking request's answer
	}{
		// A panic while reading a backend's answer counts as that backend's protocol error: with no retry
		// left, the client gets the gateway's internal error.
		{stageAttempt, shortChat, 500, `"internal_error"`},
		// Once the stream is committed, the client gets an error event and [DONE] in a 200 stream.
		{stageRelay, shortStream, 200, "event: error"},
	} {
		t.Run(tc.stage, func(t *testing.T) {
			t.Parallel()
			be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
			snap := snapshotOf(&routing.RoundRobin{}, 0, be.URL())
			reg := startGateway(t, snap, Options{})
			var fired atomic.Bool
			reg.s.panicAt = func(stage string) {
				if stage == tc.stage && fired.CompareAndSwap(false, true) {
					panic("test panic in " + stage)
				}
			}
			c := dial(t, reg.url)
			resp, body := c.post("/v1/chat/completions", tc.body)
			if resp.StatusCode != tc.status || !bytes.Contains(body, []byte(tc.want)) && !bytes.Contains(body, []byte(`"internal_error"`)) {
				t.Fatalf("panicking request: %d %s", resp.StatusCode, body)
			}
			if tc.stage == stageRelay && !bytes.HasSuffix(body, []byte("data: [DONE]\n\n")) {
				t.Errorf("stream after a relay panic does not end with [DONE]: %q", body)
			}
			resp, body = c.post("/v1/chat/completions", shortChat)
			if resp.StatusCode != 200 {
				t.Fatalf("next request on the same connection: %d %s", resp.StatusCode, body)
			}
			if got := panics(t, reg, tc.stage); got != 1 {
				t.Errorf("switchyard_panics_total{stage=%s} = %v, want 1", tc.stage, got)
			}
			waitFor(t, 5*time.Second, func() bool { return snap.Backends[0].Inflight() == 0 })
		})
	}
}

// TestEmbeddingsFromAnEngineThatChunks is the crash of issue 13: an engine that sends its embeddings answer
// with chunked transfer encoding (as engines behind most HTTP stacks do) made the gateway read on an SSE reader
// it never set up. The answer must come through whole, twice on one connection.
func TestEmbeddingsFromAnEngineThatChunks(t *testing.T) {
	t.Parallel()
	answer := `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.25,-0.5,0.125]}],"model":"sim-model","usage":{"prompt_tokens":2,"total_tokens":2},"x_engine":{"kept":true}}`
	be := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		half := len(answer) / 2
		_, _ = io.WriteString(w, answer[:half])
		w.(http.Flusher).Flush() // the body goes out chunked, with no Content-Length
		_, _ = io.WriteString(w, answer[half:])
	}))
	t.Cleanup(be.Close)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, be.URL), Options{})
	c := dial(t, gw.url)
	for i := range 2 {
		resp, body := c.post("/v1/embeddings", `{"model":"sim-model","input":"hello"}`)
		if resp.StatusCode != 200 || string(body) != answer {
			t.Fatalf("request %d: %d %s, want 200 and the engine's body byte for byte", i, resp.StatusCode, body)
		}
	}
	if got := counterValue(t, gw.reg, "switchyard_panics_total"); got != 0 {
		t.Errorf("%v panics recovered, want none", got)
	}
}
