package proxy

import (
	"net/http"
	"testing"
	"time"

	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// TestEnginePriorityOnTheWire: for an engine that schedules by priority (engines.*.priority), the gateway sends
// each request's class as its "priority" field, replacing the client's own; for the others the body is the
// client's. The simulator runs fcfs here, which refuses any priority but 0 as vLLM does, so the status shows
// what the engine received: critical -1 and sheddable 1 are refused, standard 0 passes.
func TestEnginePriorityOnTheWire(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	for _, tc := range []struct {
		name     string
		priority routing.PriorityOrder
		class    string
		body     string
		want     int
	}{
		{"standard", routing.PriorityLowFirst, "standard", small, http.StatusOK},
		{"critical", routing.PriorityLowFirst, "critical", small, http.StatusBadRequest},
		{"sheddable", routing.PriorityLowFirst, "sheddable", small, http.StatusBadRequest},
		{"client's own replaced", routing.PriorityLowFirst, "standard",
			`{"model":"sim-model","max_tokens":2,"priority":-5,"messages":[{"role":"user","content":"hi"}]}`,
			http.StatusOK},
		{"off: nothing sent", routing.PriorityNone, "critical", small, http.StatusOK},
		{"off: client's passed", routing.PriorityNone, "standard",
			`{"model":"sim-model","max_tokens":2,"priority":-5,"messages":[{"role":"user","content":"hi"}]}`,
			http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 0, be.URL()))
			snap.Models["sim-model"].SLO = SLO{TTFT: time.Minute}
			cfg := *snap.Backends[0].Config()
			spec := *routing.BuiltinEngine(routing.EngineVLLM)
			spec.Priority = tc.priority
			cfg.EngineSpec = routing.NewEngineSpec(spec)
			snap.Backends[0] = routing.NewBackend(&cfg)
			snap.Models["sim-model"].Targets[0].Backend = snap.Backends[0]
			gw := startGateway(t, snap, Options{})
			a := post(t, gw.url, tc.body, map[string]string{"X-Switchyard-Priority": tc.class})
			if a.code != tc.want {
				t.Errorf("status %d, want %d: %s", a.code, tc.want, a.body)
			}
		})
	}
}
