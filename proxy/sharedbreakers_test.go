package proxy

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/redistest"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// TestSharedBreakerHonouredWithinASecond: replica 1 finds backend a dead and opens its breaker; replica 2, which
// sent a nothing, keeps a out of rotation within 1 s, until replica 1's OpenFor ends.
func TestSharedBreakerHonouredWithinASecond(t *testing.T) {
	t.Parallel()
	a := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	b := startSim(t, "b", func(c *sim.Config) { c.ITL = time.Millisecond })
	addr, prefix := redistest.Addr(t), redistest.Prefix(t)
	const openFor = 3 * time.Second
	var errs atomic.Int64
	replica := func() (*gateway, *Snapshot) {
		sb := NewSharedBreakers(redistest.Client(t, addr), SharedBreakersOptions{Prefix: prefix, Interval: 100 * time.Millisecond,
			OnError: func(string, error) { errs.Add(1) }})
		snap := snapshotOf(&routing.RoundRobin{}, 2, a.URL(), b.URL())
		gw := startGateway(t, snap, Options{Breakers: BreakerSettings{OpenFor: openFor}, SharedBreakers: sb})
		sb.Start()
		t.Cleanup(sb.Stop)
		return gw, snap
	}
	gw1, snap1 := replica()
	_, snap2 := replica()

	control(t, a.URL(), `{"down":true}`)
	body := `{"model":"sim-model","max_tokens":3,"messages":[{"role":"user","content":"breaker"}]}`
	for i := 0; snap1.Backends[0].Healthy(); i++ {
		resp, err := http.Post(gw1.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d while b was up", i, resp.StatusCode)
		}
		if i > 50 {
			t.Fatal("replica 1's breaker did not open")
		}
	}
	opened := time.Now()
	waitFor(t, time.Second, func() bool { return !snap2.Backends[0].Healthy() })
	t.Logf("replica 2 avoided the backend replica 1 found dead after %v", time.Since(opened).Round(time.Millisecond))
	if !snap2.Backends[1].Healthy() {
		t.Fatal("replica 2 took out the healthy backend too")
	}
	// It comes back when replica 1's open period ends (the backend is up again by then).
	control(t, a.URL(), `{}`)
	waitFor(t, openFor+2*time.Second, func() bool { return snap2.Backends[0].Healthy() })
	if d := time.Since(opened); d < openFor-500*time.Millisecond {
		t.Errorf("replica 2 let the backend back after %v, before the %v replica 1 opened it for", d, openFor)
	}
	if errs.Load() != 0 {
		t.Errorf("%d Redis errors", errs.Load())
	}
}
