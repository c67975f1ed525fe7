package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// TestBreakerOpensAndRecovers: a backend that goes down is taken out of rotation within a second (its breaker
// opens; clients see no error as long as another backend answers), and comes back once it recovers.
func TestBreakerOpensAndRecovers(t *testing.T) {
	t.Parallel()
	a := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	b := startSim(t, "b", func(c *sim.Config) { c.ITL = time.Millisecond })
	snap := snapshotOf(&routing.RoundRobin{}, 2, a.URL(), b.URL())
	gw := startGateway(t, snap, Options{Breakers: BreakerSettings{OpenFor: 500 * time.Millisecond}})
	backendA := snap.Backends[0]
	body := `{"model":"sim-model","max_tokens":3,"messages":[{"role":"user","content":"breaker"}]}`
	send := func() (int, string) {
		resp, err := http.Post(gw.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode, resp.Header.Get("X-Switchyard-Backend")
	}
	control(t, a.URL(), `{"down":true}`)
	start := time.Now()
	for i := 0; backendA.Healthy(); i++ {
		if code, _ := send(); code != 200 {
			t.Fatalf("request %d failed with %d while another backend was up", i, code)
		}
		if time.Since(start) > time.Second {
			t.Fatalf("the breaker of the dead backend did not open within 1 s (%d requests)", i)
		}
	}
	if st := gw.s.brk.state(backendA).String(); st != "open" {
		t.Fatalf("breaker state %s, want open", st)
	}
	if v := gaugeValue(t, gw, "switchyard_breaker_state", "b0"); v != 2 {
		t.Errorf("switchyard_breaker_state{backend=b0} = %v, want 2", v)
	}
	for range 10 {
		if code, be := send(); code != 200 || be != "b1" {
			t.Fatalf("while a is out: status %d backend %s", code, be)
		}
	}
	control(t, a.URL(), `{}`)
	waitFor(t, 5*time.Second, func() bool {
		send()
		return gw.s.brk.state(backendA).String() == "closed"
	})
	seen := map[string]int{}
	for range 10 {
		_, be := send()
		seen[be]++
	}
	if seen["b0"] == 0 {
		t.Errorf("the recovered backend gets no traffic: %v", seen)
	}
}

// TestBreakerIgnoresClientHangUps: clients leaving never count against the backend.
func TestBreakerIgnoresClientHangUps(t *testing.T) {
	t.Parallel()
	a := startSim(t, "a", nil)
	snap := snapshotOf(&routing.RoundRobin{}, 2, a.URL())
	gw := startGateway(t, snap, Options{})
	for range 6 {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gw.url+"/v1/chat/completions",
			strings.NewReader(`{"model":"sim-model","stream":true,"max_tokens":500,"messages":[{"role":"user","content":"x"}]}`))
		if resp, err := http.DefaultClient.Do(req); err == nil {
			buf := make([]byte, 1<<10)
			for {
				if _, err := resp.Body.Read(buf); err != nil {
					break
				}
			}
			resp.Body.Close()
		}
		cancel()
	}
	waitFor(t, 3*time.Second, func() bool { return snap.Backends[0].Inflight() == 0 })
	if st := gw.s.brk.state(snap.Backends[0]).String(); st != "closed" || !snap.Backends[0].Healthy() {
		t.Errorf("after client hang-ups the breaker is %s (healthy %v), want closed", st, snap.Backends[0].Healthy())
	}
}

func gaugeValue(t *testing.T, gw *gateway, name, backend string) float64 {
	t.Helper()
	fams, err := gw.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "backend" && l.GetValue() == backend {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("%s{backend=%q} not found", name, backend)
	return 0
}
