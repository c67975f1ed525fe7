package proxy

import (
	"context"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// otlpCollector is an OTLP/HTTP trace receiver on loopback: it decodes each POST /v1/traces (protobuf, as the
// SDK's exporter sends it) and keeps the spans.
type otlpCollector struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*tracepb.Span
}

func newOTLPCollector(t *testing.T) *otlpCollector {
	c := &otlpCollector{}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/traces" {
			http.Error(w, "not an OTLP trace export", http.StatusNotFound)
			return
		}
		body, err := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(body, &req)
		}
		if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("collector: content type %q, decode: %v", r.Header.Get("Content-Type"), err)
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		c.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				c.spans = append(c.spans, ss.Spans...)
			}
		}
		c.mu.Unlock()
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *otlpCollector) received() []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*tracepb.Span(nil), c.spans...)
}

// tracerTo returns a tracer provider that exports to c over OTLP/HTTP, shut down at the end of the test.
func tracerTo(t *testing.T, c *otlpCollector) *sdktrace.TracerProvider {
	exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(c.URL+"/v1/traces"))
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithBatchTimeout(20*time.Millisecond)),
		sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tp.Shutdown(ctx)
	})
	return tp
}

// headerRecorder serves a simulator's API through a handler that keeps each request's trace headers.
type headerRecorder struct {
	*httptest.Server
	mu     sync.Mutex
	parent []string
	state  []string
}

func recordTraceHeaders(t *testing.T, be *sim.Backend) *headerRecorder {
	hr := &headerRecorder{}
	hr.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hr.mu.Lock()
		hr.parent = append(hr.parent, r.Header.Get("Traceparent"))
		hr.state = append(hr.state, r.Header.Get("Tracestate"))
		hr.mu.Unlock()
		be.ServeHTTP(w, r)
	}))
	t.Cleanup(hr.Close)
	return hr
}

func (hr *headerRecorder) got() (parent, state []string) {
	hr.mu.Lock()
	defer hr.mu.Unlock()
	return append([]string(nil), hr.parent...), append([]string(nil), hr.state...)
}

func attrs(s *tracepb.Span) map[string]*commonpb.AnyValue {
	m := make(map[string]*commonpb.AnyValue, len(s.Attributes))
	for _, kv := range s.Attributes {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestTraceSpansOverOTLP(t *testing.T) {
	t.Parallel()
	col := newOTLPCollector(t)
	tp := tracerTo(t, col)
	failing := recordTraceHeaders(t, startSim(t, "failing", func(c *sim.Config) { c.FailRate = 1 }))
	good := recordTraceHeaders(t, startSim(t, "good", func(c *sim.Config) { c.ITL = time.Millisecond }))
	// firstHealthy tries the failing backend first: the request is retried once, on the good one.
	gw := startGateway(t, snapshotOf(firstHealthy{}, 2, failing.URL, good.URL), Options{Tracer: tp.Tracer(TracerName)})

	const clientTrace, clientSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	for _, stream := range []string{"true", "false"} {
		resp, body := rawPost(t, gw.url, "/v1/chat/completions",
			[]byte(`{"model":"sim-model","stream":`+stream+`,"max_tokens":5,"messages":[{"role":"user","content":"trace me"}]}`),
			map[string]string{"Traceparent": "00-" + clientTrace + "-" + clientSpan + "-01", "Tracestate": "vendor=opaque"})
		if resp.StatusCode != 200 {
			t.Fatalf("stream=%s: status %d: %s", stream, resp.StatusCode, body)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tp.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	spans := col.received()
	var servers []*tracepb.Span
	children := map[string][]*tracepb.Span{} // by parent span id
	for _, s := range spans {
		if hex.EncodeToString(s.TraceId) != clientTrace {
			t.Errorf("span %q is in trace %x, not the client's", s.Name, s.TraceId)
		}
		switch s.Kind {
		case tracepb.Span_SPAN_KIND_SERVER:
			servers = append(servers, s)
		case tracepb.Span_SPAN_KIND_CLIENT:
			children[hex.EncodeToString(s.ParentSpanId)] = append(children[hex.EncodeToString(s.ParentSpanId)], s)
		}
	}
	if len(servers) != 2 || len(spans) != 6 {
		t.Fatalf("got %d spans, %d of them server spans; want 2 requests of a server span and two attempts each", len(spans), len(servers))
	}
	// The streamed request's span says how its stream ended (streamend.go); the other has no stream.
	ends := map[string]int{}
	for _, srv := range servers {
		if v, ok := attrs(srv)["switchyard.stream.end"]; ok {
			ends[v.GetStringValue()]++
		}
	}
	if len(ends) != 1 || ends["complete"] != 1 {
		t.Errorf("switchyard.stream.end on the server spans: %v, want complete on the streamed one alone", ends)
	}
	attemptIDs := map[string]bool{}
	for _, srv := range servers {
		if srv.Name != "chat sim-model" || hex.EncodeToString(srv.ParentSpanId) != clientSpan {
			t.Errorf("server span %q with parent %x; want \"chat sim-model\" under the client's span", srv.Name, srv.ParentSpanId)
		}
		a := attrs(srv)
		for k, want := range map[string]string{"gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai",
			"gen_ai.request.model": "sim-model", "gen_ai.response.model": "sim-model",
			"switchyard.routing.strategy": "test", "switchyard.backend": "b1", "switchyard.backend.region": "local"} {
			if got := a[k].GetStringValue(); got != want {
				t.Errorf("server span %s = %q, want %q", k, got, want)
			}
		}
		for k, want := range map[string]int64{"gen_ai.request.max_tokens": 5, "gen_ai.usage.output_tokens": 5,
			"switchyard.attempts": 2, "http.response.status_code": 200} {
			if got := a[k].GetIntValue(); got != want {
				t.Errorf("server span %s = %d, want %d", k, got, want)
			}
		}
		if a["gen_ai.usage.input_tokens"].GetIntValue() <= 0 || a["switchyard.ttft"].GetDoubleValue() <= 0 ||
			a["switchyard.routing.observed_ttft"].GetDoubleValue() <= 0 || a["switchyard.routing.reason"].GetStringValue() != "test" {
			t.Errorf("server span lacks its usage, TTFT or routing reason: %v", srv.Attributes)
		}
		kids := children[hex.EncodeToString(srv.SpanId)]
		if len(kids) != 2 {
			t.Fatalf("server span has %d attempt spans, want 2", len(kids))
		}
		if kids[0].StartTimeUnixNano > kids[1].StartTimeUnixNano {
			kids[0], kids[1] = kids[1], kids[0]
		}
		first, retry := attrs(kids[0]), attrs(kids[1])
		if first["switchyard.backend"].GetStringValue() != "b0" || first["switchyard.attempt.outcome"].GetStringValue() != "status" ||
			first["error.type"].GetStringValue() != "status" || first["switchyard.attempt.retry"].GetBoolValue() ||
			first["http.response.status_code"].GetIntValue() != 500 || kids[0].Status.GetCode() != tracepb.Status_STATUS_CODE_ERROR {
			t.Errorf("first attempt span: %v, status %v", kids[0].Attributes, kids[0].Status)
		}
		if retry["switchyard.backend"].GetStringValue() != "b1" || retry["switchyard.attempt.outcome"].GetStringValue() != "answered" ||
			!retry["switchyard.attempt.retry"].GetBoolValue() || retry["switchyard.attempt.hedge"].GetBoolValue() ||
			retry["gen_ai.provider.name"].GetStringValue() != "vllm" || retry["switchyard.routing.candidates"].GetIntValue() != 1 {
			t.Errorf("retry attempt span: %v", kids[1].Attributes)
		}
		attemptIDs[hex.EncodeToString(kids[0].SpanId)+"@b0"] = true
		attemptIDs[hex.EncodeToString(kids[1].SpanId)+"@b1"] = true
	}
	// Each backend got a traceparent in the client's trace whose parent is the attempt's own span.
	for name, hr := range map[string]*headerRecorder{"b0": failing, "b1": good} {
		parents, states := hr.got()
		if len(parents) != 2 {
			t.Fatalf("%s received %d requests, want 2", name, len(parents))
		}
		for i, tp := range parents {
			parts := strings.Split(tp, "-")
			if len(parts) != 4 || parts[0] != "00" || parts[1] != clientTrace || parts[3] != "01" || !attemptIDs[parts[2]+"@"+name] {
				t.Errorf("%s received traceparent %q; want the client's trace with an attempt span of %s as parent", name, tp, name)
			}
			if states[i] != "vendor=opaque" {
				t.Errorf("%s received tracestate %q, want the client's", name, states[i])
			}
		}
	}
}

// TestTracingOffForwardsTraceparent: without a tracer the gateway is invisible in the trace, and the client's
// headers go upstream as they came.
func TestTracingOffForwardsTraceparent(t *testing.T) {
	t.Parallel()
	be := recordTraceHeaders(t, startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond }))
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, be.URL), Options{})
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if resp, body := rawPost(t, gw.url, "/v1/chat/completions", []byte(small), map[string]string{"Traceparent": tp}); resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	if parents, _ := be.got(); len(parents) != 1 || parents[0] != tp {
		t.Errorf("backend received traceparent %q, want the client's %q", parents, tp)
	}
}

func TestGapHistQuantiles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		gaps     func(i int) time.Duration
		n        int
		p50, p99 time.Duration
	}{
		{"constant 20ms", func(int) time.Duration { return 20 * time.Millisecond }, 100, 20 * time.Millisecond, 20 * time.Millisecond},
		{"one in a hundred slow", func(i int) time.Duration {
			if i%100 == 99 {
				return time.Second
			}
			return 10 * time.Millisecond
		}, 1000, 10 * time.Millisecond, 10 * time.Millisecond},
		{"two in a hundred slow", func(i int) time.Duration {
			if i%100 >= 98 {
				return time.Second
			}
			return 10 * time.Millisecond
		}, 1000, 10 * time.Millisecond, time.Second},
		{"tiny", func(int) time.Duration { return 500 * time.Nanosecond }, 10, 512, 512},
		{"past the last bucket", func(int) time.Duration { return time.Hour }, 3, 129 * time.Second, 129 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h gapHist
			for i := range tc.n {
				h.add(tc.gaps(i))
			}
			near := func(got, want time.Duration) bool {
				return float64(got) >= 0.875*float64(want) && float64(got) <= 1.125*float64(want)
			}
			if p50, p99 := h.quantile(0.5), h.quantile(0.99); !near(p50, tc.p50) || !near(p99, tc.p99) {
				t.Errorf("p50 %v p99 %v, want about %v and %v", p50, p99, tc.p50, tc.p99)
			}
		})
	}
	var h gapHist
	if h.quantile(0.5) != 0 {
		t.Error("an empty histogram has a quantile")
	}
	for i := range gapBuckets { // every bucket's midpoint falls in the bucket
		if b := gapBucket(gapMid(i)); b != i {
			t.Errorf("midpoint %v of bucket %d falls in bucket %d", gapMid(i), i, b)
		}
	}
}

// discardExporter drops every span: BenchmarkObservability measures the SDK's cost on the request path, not the
// network's.
type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// observedGateway is benchGateway with the given tracing and access log options.
func observedGateway(tb testing.TB, backendURL string, opts Options) string {
	tb.Helper()
	opts.Metrics = metrics.New(prometheus.NewRegistry())
	s, err := New(Static{snapshotOf(&routing.RoundRobin{}, 2, backendURL)}, opts)
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

func observabilityCases(tb testing.TB) []struct {
	name string
	opts Options
} {
	tp := func(s sdktrace.Sampler) *sdktrace.TracerProvider {
		p := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}), sdktrace.WithSampler(s))
		tb.Cleanup(func() { _ = p.Shutdown(context.Background()) })
		return p
	}
	return []struct {
		name string
		opts Options
	}{
		{"off", Options{}},
		{"trace", Options{Tracer: tp(sdktrace.AlwaysSample()).Tracer(TracerName)}},
		{"trace-unsampled", Options{Tracer: tp(sdktrace.NeverSample()).Tracer(TracerName)}},
		{"accesslog", Options{AccessLog: discardLogger()}},
		{"both", Options{Tracer: tp(sdktrace.AlwaysSample()).Tracer(TracerName), AccessLog: discardLogger()}},
	}
}

// BenchmarkObservability is BenchmarkRoundTrip's gateway/stream with traces and the access log off and on.
func BenchmarkObservability(b *testing.B) {
	be := cannedBackend(b, 16)
	for _, tc := range observabilityCases(b) {
		gw := observedGateway(b, be, tc.opts)
		b.Run(tc.name, func(b *testing.B) {
			rt := newRoundTripper(gw, true)
			b.ReportAllocs()
			for b.Loop() {
				rt.do(b)
			}
		})
	}
}

// TestObservabilityOffAllocs pins that traces and the access log, off, add no allocation to a request: the same
// request through a gateway without them allocates no more than TestAllocationsPerRequest's budget allows, and
// exactly as much as through a gateway whose hooks are compiled in but disabled (which is every gateway).
func TestObservabilityOffAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	be := cannedBackend(t, 16)
	direct := newRoundTripper(be, true)
	for _, tc := range observabilityCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			via := newRoundTripper(observedGateway(t, be, tc.opts), true)
			for range 50 {
				direct.do(t)
				via.do(t)
			}
			d := testing.AllocsPerRun(200, func() { direct.do(t) })
			g := testing.AllocsPerRun(200, func() { via.do(t) })
			t.Logf("%s: the gateway adds %.1f allocations per request", tc.name, g-d)
			if tc.name == "off" && g-d > allocBudget {
				t.Errorf("with traces and the access log off the gateway adds %.1f allocations, budget %d", g-d, allocBudget)
			}
		})
	}
}
