package proxy

import (
	"bufio"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/routing"
)

// cannedBackend is a fasthttp server that answers every request with the same SSE stream of n content chunks
// (and the usage chunk), as fast as it can: it isolates the gateway's own cost.
func cannedBackend(tb testing.TB, n int) string {
	tb.Helper()
	var stream []byte
	chunk := func(s string) { stream = append(stream, "data: "+s+"\n\n"...) }
	chunk(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`)
	for i := range n {
		chunk(fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":[{"index":0,"delta":{"content":" w%d"},"logprobs":null,"finish_reason":null}]}`, i))
	}
	chunk(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}`)
	chunk(fmt.Sprintf(`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":%d,"total_tokens":%d}}`, n, n+12))
	stream = append(stream, "data: [DONE]\n\n"...)
	srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
		ctx.SetContentType("text/event-stream")
		ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
			// One write per event, flushed, as an engine does.
			for off := 0; off < len(stream); {
				end := off
				for end+1 < len(stream) && !(stream[end] == '\n' && stream[end+1] == '\n') {
					end++
				}
				end += 2
				_, _ = w.Write(stream[off:end])
				_ = w.Flush()
				off = end
			}
		})
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	tb.Cleanup(func() { _ = srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

func benchGateway(tb testing.TB, backendURL string) string {
	tb.Helper()
	s, err := New(Static{snapshotOf(&routing.RoundRobin{}, 2, backendURL)}, Options{Metrics: metrics.New(prometheus.NewRegistry())})
	if err != nil {
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	tb.Cleanup(func() { _ = s.srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

// roundTripper posts one chat request per call with a keep-alive fasthttp client and reads the whole answer.
type roundTripper struct {
	hc   *fasthttp.HostClient
	req  *fasthttp.Request
	resp *fasthttp.Response
}

func newRoundTripper(base string, stream bool) *roundTripper {
	rt := &roundTripper{
		hc:   &fasthttp.HostClient{Addr: base[len("http://"):], MaxConns: 64},
		req:  fasthttp.AcquireRequest(),
		resp: fasthttp.AcquireResponse(),
	}
	rt.req.SetRequestURI(base + "/v1/chat/completions")
	rt.req.Header.SetMethod(fasthttp.MethodPost)
	rt.req.Header.SetContentType("application/json")
	rt.req.SetBodyString(fmt.Sprintf(`{"model":"sim-model","stream":%v,"max_tokens":16,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"How far is the moon?"}]}`, stream))
	return rt
}

func (rt *roundTripper) do(tb testing.TB) {
	if err := rt.hc.DoTimeout(rt.req, rt.resp, 10*time.Second); err != nil {
		tb.Fatal(err)
	}
	if rt.resp.StatusCode() != 200 || len(rt.resp.Body()) == 0 {
		tb.Fatalf("status %d body %q", rt.resp.StatusCode(), rt.resp.Body())
	}
}

// BenchmarkRoundTrip compares one small request sent straight to a canned backend with the same request through
// the gateway, in the same run: the difference is the gateway's cost (latency and allocations per request).
func BenchmarkRoundTrip(b *testing.B) {
	be := cannedBackend(b, 16)
	gw := benchGateway(b, be)
	for _, tc := range []struct {
		name, base string
		stream     bool
	}{
		{"direct/stream", be, true},
		{"gateway/stream", gw, true},
		{"gateway/non-stream", gw, false},
	} {
		b.Run(tc.name, func(b *testing.B) {
			rt := newRoundTripper(tc.base, tc.stream)
			b.ReportAllocs()
			for b.Loop() {
				rt.do(b)
			}
		})
	}
}

// BenchmarkRelayChunk measures the gateway's cost per streamed chunk: a 1,000-chunk stream through the gateway
// against the same stream direct, reported per chunk.
func BenchmarkRelayChunk(b *testing.B) {
	const chunks = 1000
	be := cannedBackend(b, chunks)
	gw := benchGateway(b, be)
	for _, tc := range []struct{ name, base string }{{"direct", be}, {"gateway", gw}} {
		b.Run(tc.name, func(b *testing.B) {
			rt := newRoundTripper(tc.base, true)
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				rt.do(b)
			}
			b.ReportMetric(float64(time.Since(start).Nanoseconds())/float64(b.N*chunks), "ns/chunk")
		})
	}
}

// allocBudget is the most allocations a proxied request may add over the direct path. Issue 16 asks for at most
// 8; the gateway adds 5 (streamed) and 3 (not): it speaks HTTP/1.1 to engines itself (upstream.go), and a
// streamed answer takes its connection from fasthttp (hijack.go), whose hijack allocates twice (the goroutine's
// closure and its connection wrapper) where the body stream it replaces allocated once. The budget keeps that,
// with one to spare.
const allocBudget = 6

// TestAllocationsPerRequest pins the gateway's allocations per proxied request: the process-wide allocations
// of a request through the gateway minus those of the same request straight to the backend (client and
// backend allocate the same in both).
func TestAllocationsPerRequest(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	be := cannedBackend(t, 16)
	gw := benchGateway(t, be)
	for _, tc := range []struct {
		name   string
		stream bool
		budget float64
	}{
		{"stream", true, allocBudget},
		{"non-stream", false, allocBudget},
	} {
		t.Run(tc.name, func(t *testing.T) {
			direct, via := newRoundTripper(be, true), newRoundTripper(gw, tc.stream)
			for range 50 { // warm pools and connections
				direct.do(t)
				via.do(t)
			}
			d := testing.AllocsPerRun(200, func() { direct.do(t) })
			g := testing.AllocsPerRun(200, func() { via.do(t) })
			t.Logf("allocations per request: direct %.1f, through the gateway %.1f: the gateway adds %.1f", d, g, g-d)
			if g-d > tc.budget {
				t.Errorf("the gateway adds %.1f allocations per request, budget %.0f", g-d, tc.budget)
			}
		})
	}
}
