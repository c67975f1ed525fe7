package proxy

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

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
	sims := []*sim.Backend{startSim(t, "use-0", slow), startSim(t, "use-1", slow),
		startSim(t, "euw-0", remote), startSim(t, "euw-1", remote)}
	regionOf := map[string]string{"use-0": "us-east", "use-1": "us-east", "euw-0": "eu-west", "euw-1": "eu-west"}
	m := metrics.New(prometheus.NewRegistry())
	strategy, err := routing.NewStrategy(routing.StrategyRoundRobin, routing.StrategyEnv{Region: "us-east",
		Failover: []string{"eu-west"}, Model: "sim-model", Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	snap := &Snapshot{Region: "us-east", Models: map[string]*Model{}, ModelNames: []string{"sim-model"},
		Loaded: time.Now(), Hash: "test"}
	model := &Model{Name: "sim-model", Strategy: strategy, StrategyName: routing.StrategyRoundRobin, Retries: 2, Created: 1}
	for _, s := range sims {
		b := routing.NewBackend(&routing.BackendConfig{Name: s.Config().Name, URL: s.URL(),
			Region: regionOf[s.Config().Name], Engine: routing.EngineVLLM, Models: []string{"sim-model"}})
		snap.Backends = append(snap.Backends, b)
		model.Targets = append(model.Targets, routing.Target{Backend: b, Model: "sim-model"})
	}
	snap.Models["sim-model"] = model
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
