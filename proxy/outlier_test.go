package proxy

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// The tests in this file check the seam between the request path and the passive outlier detector
// (admission.OutlierDetector): the first tokens the gateway sees, judged against the routing model's predictions
// captured at dispatch, eject a backend whose first tokens are late (exchange.won, Observe), and an ejected
// backend is filtered out of the picks (chooseFrom, Available). They run the real gateway against simulated
// engines over loopback.

// TestOutlierEjectsSlowBackend: once the routing model has learned three equal backends, one of them starts
// holding every first token for 500 ms more (about nine times its prediction). The requests already dispatched to
// it were predicted at the old speed, so their first tokens are judged slow, its slow share jumps far above its
// peers' and the detector ejects it; the following requests go to the other two.
func TestOutlierEjectsSlowBackend(t *testing.T) {
	t.Parallel()
	// A 60 ms overhead before the engine queue (tokenization, in the simulator's terms) makes a first token take
	// about what the routing model's prior predicts, so that neither the first requests nor scheduler jitter on a
	// loaded machine come near 3x the prediction on the healthy backends.
	//
	// The gateway runs a Monitor, as `switchyard serve` does: the stalled requests are not in the engine's queue
	// (vllm:num_requests_waiting stays 0), so their first tokens are judged. (Before the simulator stopped counting
	// requests in their overhead or stall as waiting, they looked queued and the stalled backend was never
	// ejected.)
	var urls []string
	var sims []*sim.Backend
	for _, name := range []string{"a", "b", "c"} {
		be := startSim(t, name, func(c *sim.Config) { c.Overhead = 60 * time.Millisecond; c.ITL = 5 * time.Millisecond })
		sims = append(sims, be)
		urls = append(urls, be.URL())
	}
	snap := snapshotOf(&routing.RoundRobin{}, 2, urls...)
	monitored(t, snap, routing.MonitorOptions{ScrapeInterval: 50 * time.Millisecond, IdleProbeAfter: -1})
	gw := startGateway(t, snap, Options{})
	var seq atomic.Int64

	// Warm up: 7 waves of 9 concurrent requests give each backend 21 first tokens in the window (round robin over
	// 3 backends), one more than MinRequests, so every backend has a slow share the others are compared with.
	for range 7 {
		for _, a := range outlierWave(t, gw.url, "sim-model", 9, 2, &seq) {
			if a.backend == "" {
				t.Fatalf("no X-Switchyard-Backend on a warm-up answer")
			}
		}
	}
	slow := gw.s.outliers.Get("b2")
	if slow == nil {
		t.Fatal("the gateway's outlier detector does not track b2")
	}
	for _, name := range []string{"b0", "b1", "b2"} {
		if st := gw.s.outliers.Get(name).State(); st != admission.Serving {
			t.Fatalf("%s is %v after the warm-up; the healthy pool must all be serving", name, st)
		}
	}

	// b2 becomes slow. A wave of 24 sends it 8 requests at once, all predicted at its old speed (the routing
	// model learns the slowdown only from their first tokens): its slow share passes 10% at its third first token
	// (3 of 24) and reaches 28% (8 of 29), against about 0 for its peers; it stands out even if jitter made a
	// peer's share 9%.
	control(t, sims[2].URL(), `{"stall":"500ms"}`)
	waves := 0
	waitFor(t, 20*time.Second, func() bool {
		waves++
		outlierWave(t, gw.url, "sim-model", 24, 2, &seq)
		return slow.State() == admission.Ejected
	})
	t.Logf("b2 ejected after %d slow wave(s)", waves)
	if waves > 1 {
		t.Errorf("b2 was ejected only after %d waves; the first, all predicted at its old speed, should do", waves)
	}
	if v := gaugeValue(t, gw, "switchyard_outlier_state", "b2"); v != 2 {
		t.Errorf("switchyard_outlier_state{backend=b2} = %v, want 2 (ejected)", v)
	}
	if n := ejections(t, gw, "b2", "slow"); n != 1 {
		t.Errorf(`switchyard_outlier_ejections_total{backend="b2",reason="slow"} = %v, want 1`, n)
	}
	for _, st := range NewAdmin(gw.s, gw.reg).Backends() {
		want := "serving"
		if st.Name == "b2" {
			want = "ejected"
		}
		if st.Outlier != want {
			t.Errorf("admin status of %s: outlier %q, want %q", st.Name, st.Outlier, want)
		}
	}

	// Ejected for BaseEjection (30 s): the next requests all go to the other two, and none fails.
	seen := map[string]int{}
	for range 2 {
		for _, a := range outlierWave(t, gw.url, "sim-model", 9, 2, &seq) {
			seen[a.backend]++
		}
	}
	if seen["b2"] != 0 || seen["b0"] == 0 || seen["b1"] == 0 {
		t.Errorf("requests after the ejection went to %v; want b0 and b1 only", seen)
	}
}

// TestOutlierEjectionEndsWhenTheEngineIsBack: a backend ejected for errors before its circuit breaker opened
// (two failures eject it against peers with none; the breaker opens at three) gets no traffic, so neither a
// probe of the breaker nor of the detector can bring it back before the ejection's 30 s are over. When its
// engine goes down and comes back, the Monitor's first good scrape after the failed ones ends the ejection
// (MonitorOptions.OnBack, Server.EngineBack, admission.Outlier.Back), and probes return the backend to service
// within seconds. Scrapes that merely keep succeeding while it is ejected do not.
func TestOutlierEjectionEndsWhenTheEngineIsBack(t *testing.T) {
	t.Parallel()
	var urls []string
	var sims []*sim.Backend
	for _, name := range []string{"a", "b", "c"} {
		be := startSim(t, name, func(c *sim.Config) { c.ITL = 5 * time.Millisecond })
		sims = append(sims, be)
		urls = append(urls, be.URL())
	}
	var srv atomic.Pointer[Server]
	var failedScrapes atomic.Int64 // of b2
	snap := snapshotOf(&routing.RoundRobin{}, 2, urls...)
	monitored(t, snap, routing.MonitorOptions{ScrapeInterval: 50 * time.Millisecond, IdleProbeAfter: -1,
		OnScrape: func(b *routing.Backend, err error) {
			if err != nil && b.Name() == "b2" {
				failedScrapes.Add(1)
			}
		},
		OnBack: func(b *routing.Backend, restarted bool) {
			if s := srv.Load(); s != nil {
				s.EngineBack(b, restarted)
			}
		}})
	var logs syncBuffer
	gw := startGateway(t, snap, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	srv.Store(gw.s)
	var seq atomic.Int64
	for range 7 { // 21 first tokens each: every backend has an error share the others are compared with
		outlierWave(t, gw.url, "sim-model", 9, 2, &seq)
	}
	o := gw.s.outliers.Get("b2")

	// b2 answers every completion with a 500. One request at a time (each failure retried elsewhere, so every
	// answer is a 200), its second failure ejects it: 2 of 23 is over 5%, against 0 for its peers.
	control(t, sims[2].URL(), `{"fail_rate":1}`)
	waitFor(t, 20*time.Second, func() bool {
		outlierWave(t, gw.url, "sim-model", 1, 2, &seq)
		return o.State() == admission.Ejected
	})
	if n := ejections(t, gw, "b2", "errors"); n != 1 {
		t.Fatalf(`switchyard_outlier_ejections_total{backend="b2",reason="errors"} = %v, want 1`, n)
	}
	if b := gw.s.src.Snapshot().Backends[2]; !b.Healthy() {
		t.Fatal("b2's breaker opened: the case under test is an ejection with the breaker closed")
	}
	// Its engine keeps answering scrapes: that alone ends nothing.
	time.Sleep(300 * time.Millisecond)
	for range 3 {
		for _, a := range outlierWave(t, gw.url, "sim-model", 6, 2, &seq) {
			if a.backend == "b2" {
				t.Fatal("an ejected backend got a request")
			}
		}
	}
	if st := o.State(); st != admission.Ejected {
		t.Fatalf("b2 is %v after good scrapes alone; want still ejected", st)
	}

	// The engine goes down, then comes back healthy.
	control(t, sims[2].URL(), `{"down":true}`)
	waitFor(t, 10*time.Second, func() bool { return failedScrapes.Load() > 0 })
	control(t, sims[2].URL(), `{}`)
	served := 0
	waitFor(t, 10*time.Second, func() bool {
		for _, a := range outlierWave(t, gw.url, "sim-model", 3, 2, &seq) {
			if a.backend == "b2" {
				served++
			}
		}
		return o.State() == admission.Serving
	})
	if served < 3 {
		t.Errorf("b2 served %d requests on its way back; its three probes should be among them", served)
	}
	// The detector writes to the gateway's logger, as the breaker does.
	for _, want := range []string{`msg="outlier: backend ejected" backend=b2 reason=errors`,
		`msg="outlier: engine back, ejection ended early" backend=b2`, `msg="outlier: backend back in service" backend=b2`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the gateway's log has no %s:\n%s", want, logs.String())
		}
	}
}

// TestOutlierIgnoresEngineQueue: a backend whose first tokens are late only because they waited in its engine's
// own queue (the scrape the gateway holds shows vllm:num_requests_waiting > 0) is not ejected, although they
// come many times later than the routing model predicts. It runs a Monitor, as `switchyard serve` does, so the
// request path sees the engine's queue.
func TestOutlierIgnoresEngineQueue(t *testing.T) {
	t.Parallel()
	// No overhead, so that the late first tokens are the queue's doing alone. A 2,000 tokens/s prefill makes a
	// first token take about 30 ms for a 60-token prompt, close to the routing model's prior and far from 3x it.
	// b0 runs one sequence at a time.
	cfg := func(seqs int) func(*sim.Config) {
		return func(c *sim.Config) {
			c.Overhead = 0
			c.PrefillTPS = 2000
			c.ITL = 10 * time.Millisecond
			c.MaxNumSeqs = seqs
		}
	}
	queue := startSim(t, "queue", cfg(1))
	b := startSim(t, "b", cfg(256))
	c := startSim(t, "c", cfg(256))
	snap := snapshotOf(&routing.RoundRobin{}, 2, queue.URL(), b.URL(), c.URL())
	// A second public model served by b0 alone, to load its engine without loading the others.
	snap.Models["queue-model"] = &Model{Name: "queue-model", Strategy: &routing.RoundRobin{}, StrategyName: "test",
		Retries: 2, Created: 1700000000, Targets: []routing.Target{{Backend: snap.Backends[0], Model: "sim-model"}}}
	snap.ModelNames = append(snap.ModelNames, "queue-model")
	monitored(t, snap, routing.MonitorOptions{ScrapeInterval: 50 * time.Millisecond, IdleProbeAfter: -1})
	gw := startGateway(t, snap, Options{})
	b0 := snap.Backends[0]
	var seq atomic.Int64

	// Warm up one request per backend at a time, with empty engine queues: every first token is judged, and
	// each backend gets 22 of them, more than MinRequests, all on time. So the peers are evidence enough, and
	// b0 would be ejected if the detector judged the late first tokens below (with the `waiting > 0` branch
	// of exchange.won removed, it is, at about its fourth).
	for range 22 {
		outlierWave(t, gw.url, "sim-model", 3, 1, &seq)
	}
	for _, name := range []string{"b0", "b1", "b2"} {
		if st := gw.s.outliers.Get(name).State(); st != admission.Serving {
			t.Fatalf("%s is %v after the warm-up with empty queues", name, st)
		}
	}

	// 8 requests at once to b0, which runs one at a time: the k-th waits for k-1 others of about 300 ms each in
	// the engine's queue, several times its prediction, and the scrapes show them waiting.
	var maxWaiting atomic.Int64
	stop := make(chan struct{})
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			if es := b0.Engine(); es != nil && !es.Stale && int64(es.Waiting) > maxWaiting.Load() {
				maxWaiting.Store(int64(es.Waiting))
			}
		}
	}()
	burst := outlierWave(t, gw.url, "queue-model", 8, 30, &seq)
	close(stop)
	<-watched
	for _, a := range burst {
		if a.backend != "b0" {
			t.Fatalf("queue-model answered by %q, want b0", a.backend)
		}
	}
	if w := maxWaiting.Load(); w < 2 {
		t.Fatalf("the scrapes never showed b0's engine queue (max waiting %d): the test proves nothing", w)
	}
	t.Logf("b0's scrapes showed up to %d requests waiting", maxWaiting.Load())

	if st := gw.s.outliers.Get("b0").State(); st != admission.Serving {
		t.Errorf("b0 is %v: first tokens late because of the engine's own queue must not eject it", st)
	}
	if n := ejections(t, gw, "b0", "slow"); n != 0 {
		t.Errorf(`switchyard_outlier_ejections_total{backend="b0",reason="slow"} = %v, want 0`, n)
	}
	// It keeps its share of traffic.
	seen := map[string]int{}
	for _, a := range outlierWave(t, gw.url, "sim-model", 6, 1, &seq) {
		seen[a.backend]++
	}
	if seen["b0"] == 0 {
		t.Errorf("b0 got no traffic after the queue drained: %v", seen)
	}
}

// monitored replaces snap's backends with the same configurations held by a routing.Registry, and runs a Monitor
// scraping their engine metrics (vllm:num_requests_waiting and the rest) until the test ends, as `switchyard
// serve` does; it returns when every backend has been scraped once. Call it before the snapshot is served.
func monitored(t *testing.T, snap *Snapshot, opts routing.MonitorOptions) *routing.Registry {
	t.Helper()
	reg := routing.NewRegistry()
	cfgs := make([]*routing.BackendConfig, len(snap.Backends))
	for i, b := range snap.Backends {
		cfgs[i] = b.Config()
	}
	held := reg.Sync(cfgs)
	by := make(map[*routing.Backend]*routing.Backend, len(held))
	for i, b := range snap.Backends {
		by[b] = held[i]
	}
	snap.Backends = held
	for _, m := range snap.Models {
		for i := range m.Targets {
			if nb := by[m.Targets[i].Backend]; nb != nil {
				m.Targets[i].Backend = nb
			}
		}
	}
	mon := routing.NewMonitor(reg, opts)
	mon.Start()
	t.Cleanup(mon.Stop)
	waitFor(t, 10*time.Second, func() bool {
		for _, b := range held {
			if es := b.Engine(); es == nil || es.Stale {
				return false
			}
		}
		return true
	})
	return reg
}

// outlierWave sends n streaming chat requests for model at once, each with a prompt of its own (no prefix-cache
// hits) and maxTokens tokens, and returns their answers once all are in. Any status but 200 fails the test.
func outlierWave(t *testing.T, url, model string, n, maxTokens int, seq *atomic.Int64) []answer {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	out := make([]answer, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		// The unique number leads the prompt, so even its first 64-byte block differs from every other request's.
		prompt := fmt.Sprintf("%08d %s", seq.Add(1), strings.Repeat("the outlier detector judges first tokens ", 6))
		body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
			model, maxTokens, prompt)
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(resp.Body)
			if err != nil {
				errs[i] = err
				return
			}
			out[i] = answer{resp.StatusCode, resp.Header.Get("X-Switchyard-Backend"), string(b), resp.Header}
		}()
	}
	wg.Wait()
	for i, a := range out {
		switch {
		case errs[i] != nil:
			t.Fatalf("request %d of %d: %v", i, n, errs[i])
		case a.code != 200 || !bytes.HasSuffix(bytes.TrimSpace([]byte(a.body)), []byte("data: [DONE]")):
			t.Fatalf("request %d of %d: status %d from %q: %s", i, n, a.code, a.backend, a.body)
		}
	}
	return out
}

// ejections reads switchyard_outlier_ejections_total for one backend and reason.
func ejections(t *testing.T, gw *gateway, backend, reason string) float64 {
	t.Helper()
	fams, err := gw.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != "switchyard_outlier_ejections_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["backend"] == backend && labels["reason"] == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// TestOutlierJudgesEvictedPrefixAsMiss: when an engine loses the prefixes the gateway believes it holds (here
// other tenants' traffic evicts them: the simulator's evict_cache), requests routed to it for a prefix hit come
// back as slow as misses, many times their prediction. That is the index's error, not the backend's: their first tokens are judged, once the usage
// says what the engine had cached, against the prediction for the prefill it really did, and the backend stays in
// service.
func TestOutlierJudgesEvictedPrefixAsMiss(t *testing.T) {
	t.Parallel()
	// A 4,000 tokens/s prefill makes a 1,000-token miss take about 250 ms against a few ms for a hit: a miss
	// predicted as a hit is tens of times late.
	cfg := func(c *sim.Config) { c.Overhead = 0; c.PrefillTPS = 4000; c.ITL = 5 * time.Millisecond }
	var sims []*sim.Backend
	var urls []string
	for _, name := range []string{"a", "b", "c"} {
		be := startSim(t, name, cfg)
		sims = append(sims, be)
		urls = append(urls, be.URL())
	}
	snap := snapshotOf(routing.NewCacheAware(routing.StrategyEnv{}), 2, urls...)
	monitored(t, snap, routing.MonitorOptions{ScrapeInterval: 50 * time.Millisecond, IdleProbeAfter: -1})
	gw := startGateway(t, snap, Options{})
	const prefixes = 24
	send := func(k int) string {
		t.Helper()
		content := fmt.Sprintf("prefix %d. ", k) + strings.Repeat(fmt.Sprintf("document %d line. ", k), 220)
		body := fmt.Sprintf(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":%q}]}`, content)
		a := post(t, gw.url, body, nil)
		if a.code != 200 {
			t.Fatalf("prefix %d: status %d %s", k, a.code, a.body)
		}
		return a.backend
	}
	// Every prefix three times: a miss, then hits on the backend that now holds it (cache_aware follows it).
	// Every backend gets about 24 judged first tokens, all on time: enough (20) for the victim's peers to count
	// as evidence of the pool's rate.
	owner := map[int]string{}
	for k := range prefixes {
		owner[k] = send(k)
		for range 2 {
			if again := send(k); again != owner[k] {
				t.Fatalf("prefix %d went to %s, then %s: cache_aware must follow it", k, owner[k], again)
			}
		}
	}
	// The victim is the backend holding the most prefixes: cache_aware places each new one at random among the
	// least loaded, and the owner of prefix 0 held fewer than 5 of 24 in about one run of 40.
	counts := map[string]int{}
	for _, b := range owner {
		counts[b]++
	}
	victim, held := "", 0
	for b, n := range counts {
		if n > held || (n == held && b < victim) {
			victim, held = b, n
		}
	}
	if held < 5 {
		t.Fatalf("%s holds %d prefixes of %d; the test needs it to hold several", victim, held, prefixes)
	}
	// The victim's cached prefixes are evicted; nothing tells the gateway (an engine restart would: it resets the
	// index of a backend whose process_start_time_seconds changes).
	idx := int(victim[1] - '0')
	control(t, sims[idx].URL(), `{"evict_cache":true}`)
	missed := 0
	for k := range prefixes {
		if owner[k] != victim {
			continue
		}
		if got := send(k); got == victim {
			missed++
		}
	}
	if st := gw.s.outliers.Get(victim).State(); st != admission.Serving {
		t.Errorf("%s is %v after first tokens that missed an evicted prefix; a miss is not slowness", victim, st)
	}
	if n := ejections(t, gw, victim, "slow"); n != 0 {
		t.Errorf(`switchyard_outlier_ejections_total{backend=%q,reason="slow"} = %v, want 0`, victim, n)
	}
	if missed < 5 {
		t.Errorf("only %d requests went back to %s for a prefix it no longer holds; the test proves nothing", missed, victim)
	}
}
