package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/valyala/fasthttp"
)

// CPUOptions configures CPUOverhead, the protocol of issue 16: each proxy pinned to one core, a near-zero mock
// backend and the load generator (this process) pinned to the other, a fixed rate of small non-streaming
// requests, alternating rounds, CPU time per request from /proc; then a closed loop at saturation.
type CPUOptions struct {
	Env
	// Model is the model name the requests carry. Default "sim-model".
	Model string
	// Strategy is the gateway's routing strategy. Default "adaptive" (routing by measurement).
	Strategy string
	// Proxies are the reference proxies (each must be installed): default nginx.
	Proxies []string
	// Rate is the open-loop arrival rate in requests/s. Default 1,000.
	Rate float64
	// Warmup and Duration are each round's unmeasured and measured open-loop windows. Defaults 2s and 10s.
	Warmup, Duration time.Duration
	// Rounds is how many times each proxy is measured, alternating. Default 3.
	Rounds int
	// Capacity is the closed-loop window per proxy and round; 0 skips the closed loop.
	Capacity time.Duration
	// Conns is the closed loop's concurrency (connections, each with one request at a time). Default 64.
	Conns int
	// ProxyCPU and LoadCPU are the cores of the proxies and of this process (load and mock backend). Defaults
	// 0 and 1; LoadCPU < 0 leaves this process unpinned.
	ProxyCPU, LoadCPU int
	// BaselineExe, when set, is another switchyard binary measured as the gateway column "baseline" in the same
	// rounds (a before/after comparison on a noisy machine); its serve gets no GatewayArgs.
	BaselineExe string
	// Gateway is deep-merged into the generated gateway config. Default: the access log off, as nginx's is
	// (access_log off); measurement, admission and routing stay as the gateway's defaults have them.
	Gateway map[string]any
}

// CPURound is one proxy's figures in one round.
type CPURound struct {
	Proxy string `json:"proxy"`
	Round int    `json:"round"`
	// Requests and Errors count the measured open-loop requests.
	Requests int `json:"requests"`
	Errors   int `json:"errors"`
	// CPUMicros is the proxy's user+system CPU time per measured request, µs.
	CPUMicros float64 `json:"cpu_us_per_request"`
	// Capacity is the closed-loop rate at saturation, requests/s (0 when not measured), and CapacityCPU the
	// proxy's CPU per request during it, µs.
	Capacity    float64 `json:"capacity_rps"`
	CapacityCPU float64 `json:"capacity_cpu_us_per_request"`
	CapErrors   int     `json:"capacity_errors"`
}

// CPUSummary is the median of a proxy's rounds and its ratios to the first reference proxy's medians (nginx's
// by default).
type CPUSummary struct {
	Proxy         string  `json:"proxy"`
	CPUMicros     float64 `json:"cpu_us_per_request"`
	Capacity      float64 `json:"capacity_rps"`
	CPURatio      float64 `json:"cpu_ratio"`
	CapacityRatio float64 `json:"capacity_ratio"`
}

func (o *CPUOptions) defaults() {
	if o.Model == "" {
		o.Model = "sim-model"
	}
	if o.Strategy == "" {
		o.Strategy = "adaptive"
	}
	if len(o.Proxies) == 0 {
		o.Proxies = []string{"nginx"}
	}
	if o.Rate <= 0 {
		o.Rate = 1000
	}
	if o.Warmup <= 0 {
		o.Warmup = 2 * time.Second
	}
	if o.Duration <= 0 {
		o.Duration = 10 * time.Second
	}
	if o.Rounds <= 0 {
		o.Rounds = 3
	}
	if o.Gateway == nil {
		o.Gateway = map[string]any{"access_log": map[string]any{"enabled": false}}
	}
	if o.Conns <= 0 {
		o.Conns = 64
	}
	if o.ProxyCPU == o.LoadCPU && o.LoadCPU >= 0 {
		o.ProxyCPU, o.LoadCPU = 0, 1
	}
}

// CPUOverhead runs the gateway and each reference proxy in alternating rounds and returns every round and the
// medians (gateway first).
func CPUOverhead(ctx context.Context, opt CPUOptions) ([]CPURound, []CPUSummary, error) {
	opt.defaults()
	e := &opt.Env
	if opt.LoadCPU >= 0 {
		if err := PinProcess(opt.LoadCPU); err != nil {
			return nil, nil, err
		}
	}
	e.Pin = strconv.Itoa(opt.ProxyCPU)
	mock, err := StartMockBackend(opt.Model)
	if err != nil {
		return nil, nil, err
	}
	defer mock.Close()
	e.logf("cpu: mock backend %s; proxies on cpu %d, load on cpu %d", mock.URL, opt.ProxyCPU, opt.LoadCPU)
	kinds := []string{"gateway"}
	if opt.BaselineExe != "" {
		kinds = append(kinds, "baseline")
	}
	kinds = append(kinds, opt.Proxies...)
	var rounds []CPURound
	for round := 1; round <= opt.Rounds; round++ {
		for _, kind := range kinds {
			r, err := cpuRound(ctx, e, opt, mock, kind, round)
			if ctx.Err() != nil {
				return rounds, nil, ctx.Err()
			}
			if err != nil {
				return rounds, nil, fmt.Errorf("bench: cpu: %s round %d: %w", kind, round, err)
			}
			e.logf("cpu: round %d %s: %.1f µs/request, %d errors, capacity %.0f/s (%.1f µs/request)",
				round, kind, r.CPUMicros, r.Errors, r.Capacity, r.CapacityCPU)
			rounds = append(rounds, r)
		}
	}
	var sums []CPUSummary
	for _, kind := range kinds {
		var cpu, capa []float64
		for _, r := range rounds {
			if r.Proxy == kind {
				cpu, capa = append(cpu, r.CPUMicros), append(capa, r.Capacity)
			}
		}
		sums = append(sums, CPUSummary{Proxy: kind, CPUMicros: median(cpu), Capacity: median(capa)})
	}
	if i := slices.Index(kinds, opt.Proxies[0]); i >= 0 {
		ref := sums[i]
		for i := range sums {
			sums[i].CPURatio = safeDiv(sums[i].CPUMicros, ref.CPUMicros)
			sums[i].CapacityRatio = safeDiv(sums[i].Capacity, ref.Capacity)
		}
	}
	return rounds, sums, nil
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func cpuRound(ctx context.Context, e *Env, opt CPUOptions, mock *MockBackend, kind string, round int) (CPURound, error) {
	tag := fmt.Sprintf("cpu-%d-%s", round, kind)
	be := FleetBackend{Name: "mock", URL: mock.URL, Model: opt.Model, Region: "local"}
	var p *Proc
	var target string
	var err error
	if kind == "gateway" || kind == "baseline" {
		spec := GatewaySpec{Model: opt.Model, Strategy: opt.Strategy, Backends: []FleetBackend{be}, Gateway: opt.Gateway}
		if kind == "baseline" {
			be := *e
			be.Exe, be.GatewayArgs = opt.BaselineExe, nil
			e = &be
		}
		p, target, err = e.startGateway(ctx, spec, tag)
	} else {
		p, target, err = startReferenceProxy(ctx, e, kind, be, tag)
	}
	if err != nil {
		return CPURound{}, err
	}
	defer p.Stop()
	lg := newLoadGen(target, opt.Model, opt.Conns)
	// Warm-up: connections, pools, the gateway's learned models.
	lg.open(ctx, opt.Rate, opt.Warmup)
	c0, err := p.CPUTime()
	if err != nil {
		return CPURound{}, err
	}
	n, errs := lg.open(ctx, opt.Rate, opt.Duration)
	c1, err := p.CPUTime()
	if err != nil {
		return CPURound{}, err
	}
	r := CPURound{Proxy: kind, Round: round, Requests: n, Errors: errs}
	if n > 0 {
		r.CPUMicros = float64((c1 - c0).Microseconds()) / float64(n)
	}
	if opt.Capacity > 0 {
		lg.closed(ctx, opt.Conns, time.Second) // reach saturation first
		c0, err = p.CPUTime()
		if err != nil {
			return CPURound{}, err
		}
		start := time.Now()
		n, errs := lg.closed(ctx, opt.Conns, opt.Capacity)
		el := time.Since(start)
		c1, err = p.CPUTime()
		if err != nil {
			return CPURound{}, err
		}
		r.Capacity, r.CapErrors = float64(n)/el.Seconds(), errs
		if n > 0 {
			r.CapacityCPU = float64((c1 - c0).Microseconds()) / float64(n)
		}
	}
	if mock.Requests.Load() == 0 {
		return r, errors.New("the mock backend saw no request")
	}
	return r, nil
}

// loadGen sends small non-streaming chat requests with a keep-alive fasthttp client (cheaper per request than
// net/http, so that one core can saturate a proxy on the other).
type loadGen struct {
	hc   *fasthttp.HostClient
	body []byte
	uri  string
}

func newLoadGen(target, model string, conns int) *loadGen {
	addr := target[len("http://"):]
	return &loadGen{
		hc:   &fasthttp.HostClient{Addr: addr, MaxConns: conns * 2, MaxIdleConnDuration: time.Minute},
		body: fmt.Appendf(nil, `{"model":%q,"stream":false,"max_tokens":4,"messages":[{"role":"user","content":"How far is the moon from the earth, roughly, in kilometres?"}]}`, model),
		uri:  target + "/v1/chat/completions",
	}
}

func (g *loadGen) do() error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(g.uri)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(g.body)
	if err := g.hc.DoTimeout(req, resp, 10*time.Second); err != nil {
		return err
	}
	if resp.StatusCode() != fasthttp.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode())
	}
	return nil
}

// open sends rate requests/s for d on a fixed schedule (each on its own goroutine, so a slow answer does not
// delay the next send) and returns how many were sent and how many failed.
func (g *loadGen) open(ctx context.Context, rate float64, d time.Duration) (int, int) {
	n := int(rate * d.Seconds())
	gap := time.Duration(float64(time.Second) / rate)
	var wg sync.WaitGroup
	var errs atomic.Int64
	start := time.Now()
	for i := range n {
		if wait := time.Until(start.Add(time.Duration(i) * gap)); wait > 0 {
			select {
			case <-ctx.Done():
				return i, int(errs.Load())
			case <-time.After(wait):
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if g.do() != nil {
				errs.Add(1)
			}
		}()
	}
	wg.Wait()
	return n, int(errs.Load())
}

// closed keeps conns requests in flight for d and returns how many completed and how many failed.
func (g *loadGen) closed(ctx context.Context, conns int, d time.Duration) (int, int) {
	var ok, errs atomic.Int64
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil && time.Now().Before(end) {
				if g.do() != nil {
					errs.Add(1)
				} else {
					ok.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return int(ok.Load()), int(errs.Load())
}

// MockBackend is a near-zero OpenAI-compatible backend: it answers every chat request at once with the same
// small non-streaming completion, /health with 200 and /metrics with an idle vLLM engine's gauges, so that
// what a benchmark measures is the proxy in front of it.
type MockBackend struct {
	URL      string
	Requests atomic.Int64
	srv      *fasthttp.Server
	ln       net.Listener
}

// StartMockBackend serves a MockBackend on a free loopback port until Close.
func StartMockBackend(model string) (*MockBackend, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("bench: mock backend: %w", err)
	}
	m := &MockBackend{URL: "http://" + ln.Addr().String(), ln: ln}
	completion := fmt.Appendf(nil, `{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":%q,"choices":[{"index":0,"message":{"role":"assistant","content":"About 384,400 km."},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":4,"total_tokens":24}}`, model)
	// The gateway asks engines for a stream even for a client that does not stream (it measures TTFT and usage
	// from the events): the same answer as SSE, in one write.
	var sse []byte
	for _, ev := range []string{
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":%q,"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":%q,"choices":[{"index":0,"delta":{"content":"About 384,400 km."},"logprobs":null,"finish_reason":null}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":%q,"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}`,
		`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":%q,"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":4,"total_tokens":24}}`,
	} {
		sse = append(sse, "data: "...)
		sse = fmt.Appendf(sse, ev, model)
		sse = append(sse, "\n\n"...)
	}
	sse = append(sse, "data: [DONE]\n\n"...)
	engine := fmt.Appendf(nil, "vllm:num_requests_running{model_name=%q} 0\nvllm:num_requests_waiting{model_name=%q} 0\nvllm:kv_cache_usage_perc{model_name=%q} 0\n", model, model, model)
	m.srv = &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			switch string(ctx.Path()) {
			case "/health":
			case "/metrics":
				ctx.SetContentType("text/plain; version=0.0.4")
				ctx.SetBody(engine)
			case "/v1/models":
				ctx.SetContentType("application/json")
				ctx.SetBodyString(`{"object":"list","data":[{"id":"` + model + `","object":"model"}]}`)
			default:
				m.Requests.Add(1)
				if body := ctx.PostBody(); bytes.Contains(body, []byte(`"stream":true`)) || bytes.Contains(body, []byte(`"stream": true`)) {
					ctx.SetContentType("text/event-stream")
					ctx.SetBody(sse)
					return
				}
				ctx.SetContentType("application/json")
				ctx.SetBody(completion)
			}
		},
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
	}
	go func() { _ = m.srv.Serve(ln) }()
	return m, nil
}

// Close stops the mock backend.
func (m *MockBackend) Close() error { return m.srv.Shutdown() }

// PrintCPU writes every round and the medians.
func PrintCPU(out io.Writer, rounds []CPURound, sums []CPUSummary) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "round\tproxy\trequests\terrors\tCPU µs/req\tcapacity req/s\tCPU µs/req at capacity\tcapacity errors\t")
	for _, r := range rounds {
		fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%.1f\t%.0f\t%.1f\t%d\t\n", r.Round, r.Proxy, r.Requests, r.Errors, r.CPUMicros,
			r.Capacity, r.CapacityCPU, r.CapErrors)
	}
	tw.Flush()
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "median\tCPU µs/req\tx ref\tcapacity req/s\tx ref\t")
	for _, s := range sums {
		fmt.Fprintf(tw, "%s\t%.1f\t%.2f\t%.0f\t%.2f\t\n", s.Proxy, s.CPUMicros, s.CPURatio, s.Capacity, s.CapacityRatio)
	}
	tw.Flush()
}
