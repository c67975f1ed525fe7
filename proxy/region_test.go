package proxy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// regionResult is one request of TestRegionFailover as its client saw it.
type regionResult struct {
	start   time.Duration // since the load began
	backend string        // X-Switchyard-Backend
	ok      bool          // 200, content, [DONE], no error event
	content bool          // at least one content chunk arrived
	detail  string        // why it failed
}

// streamOnce sends one streaming chat request and reads it to the end.
func streamOnce(ctx context.Context, client *http.Client, url string, i int) regionResult {
	body := fmt.Sprintf(`{"model":"sim-model","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"region %d"}]}`, i)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return regionResult{detail: err.Error()}
	}
	defer resp.Body.Close()
	res := regionResult{backend: resp.Header.Get("X-Switchyard-Backend")}
	if resp.StatusCode != http.StatusOK {
		res.detail = fmt.Sprintf("status %d", resp.StatusCode)
		return res
	}
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "data: [DONE]":
			done = true
		case strings.HasPrefix(line, "data: ") && strings.Contains(line, `"error"`):
			res.detail = line
		case strings.HasPrefix(line, "data: ") && strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`):
			res.content = true
		}
	}
	switch {
	case res.detail != "":
	case sc.Err() != nil:
		res.detail = sc.Err().Error()
	case !done:
		res.detail = "no [DONE]"
	case !res.content:
		res.detail = "no content"
	default:
		res.ok = true
	}
	return res
}

// TestRegionFailover runs steady load through the real gateway against two local (us-east) and two remote
// (eu-west, 80 ms away) simulators, takes both local ones down, and brings them back: traffic must move to
// eu-west within 2 s with no failure of a request that had not started streaming, and return to us-east within
// about 10 s (the breaker's open time, then the region's hold and ramp) without flapping.
//
// Three clients: the retry budget (admission.RetryBudget, 20% of the requests in flight) always allows 3
// concurrent retries, and when a whole region fails every request in flight there fails at once and retries at
// once. With more clients than that, some requests that had not started streaming get a 502 when the budget
// refuses their retry: that is the budget's call, not routing's, and this test does not measure it.
//
// It does not run in parallel with the package's other tests: its figures are per second of wall time (the
// breaker's open time, the hold, the ramp), and with the whole package's parallel tests on 2 cores a request
// took seconds, the local backends' first tokens looked like an outage and the shares measured the machine.
func TestRegionFailover(t *testing.T) {
	const (
		workers = 3
		downAt  = 3 * time.Second
		upAt    = 8 * time.Second
		endAt   = 21 * time.Second
	)
	fast := func(c *sim.Config) { c.ITL = 5 * time.Millisecond }
	remote := func(c *sim.Config) { fast(c); c.RTT = 80 * time.Millisecond }
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	sims, regionOf, snap := twoRegions(t, routing.StrategyAdaptive, fast, remote, m)
	gw, err := New(Static{snap}, Options{Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- gw.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = gw.Shutdown(ctx)
		<-served
	})
	url := "http://" + ln.Addr().String()

	var (
		mu      sync.Mutex
		results []regionResult
		wg      sync.WaitGroup
	)
	start := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(endAt))
	defer cancel()
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ctx.Err() == nil; i += workers {
				at := time.Since(start)
				r := streamOnce(ctx, client, url, i)
				if ctx.Err() != nil {
					return // cut by the end of the test, not by the gateway
				}
				r.start = at
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		}()
	}
	// downDone is when both local simulators had taken the outage: a request sent between downAt and then may
	// still have reached one of them alive and be cut by it.
	var downDone time.Duration
	for _, ev := range []struct {
		at   time.Duration
		body string
	}{{downAt, `{"down":true}`}, {upAt, `{}`}} {
		time.Sleep(time.Until(start.Add(ev.at)))
		control(t, sims[0].URL(), ev.body)
		control(t, sims[1].URL(), ev.body)
		if ev.at == downAt {
			downDone = time.Since(start)
		}
	}
	wg.Wait()

	// Per second of start time: the local share of the requests the gateway answered.
	secs := int(endAt / time.Second)
	local, total := make([]int, secs), make([]int, secs)
	for _, r := range results {
		s := int(r.start / time.Second)
		if !r.ok && !r.content {
			t.Errorf("a request sent at %v failed before streaming anything (backend %q): %s", r.start.Round(time.Millisecond), r.backend, r.detail)
		}
		if !r.ok && r.content && (r.start < downAt-time.Second || r.start > downDone) {
			t.Errorf("a request sent at %v failed mid-stream, not at the outage (%v): %s", r.start.Round(time.Millisecond), downAt, r.detail)
		}
		if r.ok && s < secs {
			total[s]++
			if regionOf[r.backend] == "us-east" {
				local[s]++
			}
		}
	}
	share := make([]float64, secs)
	for s := range secs {
		if total[s] == 0 {
			t.Fatalf("no request completed in second %d: %v", s, total)
		}
		share[s] = float64(local[s]) / float64(total[s])
	}
	cut := 0
	for _, r := range results {
		if !r.ok {
			cut++
		}
	}
	t.Logf("%d requests, %d cut mid-stream by the outage; local share per second: %.2f", len(results), cut, share)
	for s := range secs {
		at := time.Duration(s) * time.Second
		switch {
		case at+time.Second <= downAt && share[s] < 0.9:
			t.Errorf("second %d, before the outage: local share %.2f, want the local region", s, share[s])
		case at >= downAt+2*time.Second && at+time.Second <= upAt && share[s] != 0:
			t.Errorf("second %d, 2 s into the outage: local share %.2f, want 0", s, share[s])
		case at >= upAt+10*time.Second && share[s] < 0.9:
			t.Errorf("second %d, 10 s after recovery: local share %.2f, want the local region back", s, share[s])
		}
	}
	switches, majority := 0, true
	for _, v := range share {
		if v > 0.5 != majority {
			switches++
			majority = v > 0.5
		}
	}
	if switches != 2 {
		t.Errorf("the majority region switched %d times, want 2 (out at the outage, back after it): %.2f", switches, share)
	}
	t.Logf("retries denied by the budget: %v", counterValue(t, reg, "switchyard_budget_denied_total"))
	if v := counterValue(t, reg, "switchyard_region_spill_total"); v == 0 {
		t.Error("switchyard_region_spill_total stayed 0")
	}
}

// twoRegions starts us-east (use-0, use-1, configured by local) and eu-west (euw-0, euw-1, by remote) simulators
// and returns them, each one's region, and a snapshot serving sim-model from all four with the named strategy in
// us-east, failing over to eu-west, 2 retries. m receives the strategy's metrics.
func twoRegions(t *testing.T, strategyName string, local, remote func(*sim.Config), m *metrics.Gateway) ([]*sim.Backend, map[string]string, *Snapshot) {
	t.Helper()
	sims := []*sim.Backend{startSim(t, "use-0", local), startSim(t, "use-1", local),
		startSim(t, "euw-0", remote), startSim(t, "euw-1", remote)}
	regionOf := map[string]string{"use-0": "us-east", "use-1": "us-east", "euw-0": "eu-west", "euw-1": "eu-west"}
	strategy, err := routing.NewStrategy(strategyName, routing.StrategyEnv{Region: "us-east",
		Failover: []string{"eu-west"}, Model: "sim-model", Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	snap := &Snapshot{Region: "us-east", Models: map[string]*Model{}, ModelNames: []string{"sim-model"},
		Loaded: time.Now(), Hash: "test"}
	model := &Model{Name: "sim-model", Strategy: strategy, StrategyName: strategyName, Retries: 2, Created: 1}
	for _, s := range sims {
		b := routing.NewBackend(&routing.BackendConfig{Name: s.Config().Name, URL: s.URL(),
			Region: regionOf[s.Config().Name], Engine: routing.EngineVLLM, Models: []string{"sim-model"}})
		snap.Backends = append(snap.Backends, b)
		model.Targets = append(model.Targets, routing.Target{Backend: b, Model: "sim-model"})
	}
	snap.Models["sim-model"] = model
	return sims, regionOf, snap
}

// TestRegionDownMidGeneration: non-streaming requests being generated in the local region when the whole region
// dies are retried whole in the failover region; none fails (their clients have received nothing). A request's
// retry may first meet the region's other backend, dead too but not yet known to be: its 503 must not send the
// next retry to the retry budget, which every request of the region draws on at once. Without that rule one
// request of 16 failed with 502 in about one run of four (a race with the breakers), so this test catches a
// regression only sometimes; with it, none failed in 14 runs.
func TestRegionDownMidGeneration(t *testing.T) {
	t.Parallel()
	slow := func(c *sim.Config) { c.ITL = 20 * time.Millisecond }
	remote := func(c *sim.Config) { slow(c); c.RTT = 40 * time.Millisecond }
	sims, regionOf, snap := twoRegions(t, routing.StrategyRoundRobin, slow, remote, metrics.New(prometheus.NewRegistry()))
	gw := startGateway(t, snap, Options{})
	const n = 16
	var wg sync.WaitGroup
	answers := make([]answer, n)
	for i := range n {
		wg.Go(func() {
			answers[i] = post(t, gw.url, fmt.Sprintf(`{"model":"sim-model","max_tokens":60,"messages":[{"role":"user","content":"cut %d"}]}`, i), nil)
		})
	}
	time.Sleep(500 * time.Millisecond) // every request is generating in us-east
	control(t, sims[0].URL(), `{"down":true}`)
	control(t, sims[1].URL(), `{"down":true}`)
	wg.Wait()
	for i, a := range answers {
		if a.code != 200 {
			t.Errorf("request %d: %d %s", i, a.code, a.body)
		} else if regionOf[a.backend] != "eu-west" {
			t.Errorf("request %d answered by %s, want eu-west after the retry", i, a.backend)
		}
	}
}
