package proxy

import (
	"crypto/sha256"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/internal/redistest"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/routing"
)

// redisBenchGateway is a gateway in front of backendURL whose one API key has (practically unlimited) rate
// limits: decided in process (shared false), or with everything docs/design.md, "State shared through Redis" lists
// on: the Redis rate limiter on the request path (5 ms budget, the policy's default), and breaker sharing and
// load and prefix hints running in the background.
func redisBenchGateway(tb testing.TB, backendURL string, shared bool) string {
	tb.Helper()
	m := metrics.New(prometheus.NewRegistry())
	reg := routing.NewRegistry(routing.WithMetrics(m))
	backends := reg.Sync([]*routing.BackendConfig{{Name: "b0", URL: backendURL, Engine: routing.EngineOpenAI,
		Models: []string{"sim-model"}}})
	snap := &Snapshot{Region: "local", Models: map[string]*Model{}, Backends: backends, Loaded: time.Now(), Hash: "bench",
		Priorities: admission.DefaultPriorities()}
	snap.Models["sim-model"] = &Model{Name: "sim-model", Strategy: &routing.RoundRobin{}, Retries: 2,
		Targets: []routing.Target{{Backend: backends[0], Model: "sim-model"}}}
	snap.ModelNames = []string{"sim-model"}
	keys, err := admission.NewKeys([]admission.KeyConfig{{Name: "bench", Hash: sha256.Sum256([]byte("sk-bench")),
		RequestsPerMinute: 1 << 40, TokensPerMinute: 1 << 50}})
	if err != nil {
		tb.Fatal(err)
	}
	snap.Keys = keys
	local := admission.NewLocalLimiter(keys, nil, nil, m)
	snap.Limiter = local
	opts := Options{Metrics: m}
	if shared {
		c := redistest.Client(tb, redistest.Addr(tb))
		prefix := redistest.Prefix(tb)
		onErr := func(op string, err error) { m.RedisErrors.WithLabelValues(op).Inc() }
		limits := admission.NewRedisLimiter(c, admission.RedisLimiterOptions{Prefix: prefix, Local: local,
			OnError: onErr, Metrics: m})
		limits.Start() // settlements off the request path, as serve runs it
		tb.Cleanup(limits.Stop)
		snap.Limiter = limits
		opts.SharedBreakers = NewSharedBreakers(c, SharedBreakersOptions{Prefix: prefix, OnError: onErr})
		peers := routing.NewPeers(c, reg, routing.PeersOptions{Prefix: prefix, OnError: onErr})
		peers.Start()
		tb.Cleanup(peers.Stop)
	}
	s, err := New(Static{snap}, opts)
	if err != nil {
		tb.Fatal(err)
	}
	if opts.SharedBreakers != nil {
		opts.SharedBreakers.Start()
		tb.Cleanup(opts.SharedBreakers.Stop)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	go func() { _ = s.Serve(ln) }()
	tb.Cleanup(func() { _ = s.srv.Shutdown() })
	return "http://" + ln.Addr().String()
}

// BenchmarkRedisOverhead measures what sharing state through Redis adds to a request: the same small streamed
// request, sent one at a time with a key that has rate limits, through a gateway on embedded state and through
// one sharing everything through Redis (bench/results/redis-overhead.md). It reports the p50 and p99 of the
// request's latency; run the two in one invocation so that they share the machine's conditions:
//
//	go test -run '^$' -bench RedisOverhead -benchtime 20000x ./proxy/
func BenchmarkRedisOverhead(b *testing.B) {
	be := cannedBackend(b, 16)
	for _, tc := range []struct {
		name   string
		shared bool
	}{{"embedded", false}, {"redis", true}} {
		b.Run(tc.name, func(b *testing.B) {
			rt := newRoundTripper(redisBenchGateway(b, be, tc.shared), true)
			rt.req.Header.Set("Authorization", "Bearer sk-bench")
			for range 200 { // warm connections, pools and the script cache
				rt.do(b)
			}
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			for b.Loop() {
				start := time.Now()
				rt.do(b)
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}
