package routing

import (
	"testing"
	"time"
)

// TestObjectives: a fast dear backend and a slow cheap one. Latency takes the fast one; cost takes the cheap one
// while it meets the TTFT objective, and the fast one when it does not.
func TestObjectives(t *testing.T) {
	cfgs := []*BackendConfig{
		{Name: "dear", URL: "http://dear", Region: "us-east", Engine: EngineVLLM, Price: Price{Input: 3, CachedInput: 3, Output: 15}},
		{Name: "cheap", URL: "http://cheap", Region: "us-east", Engine: EngineVLLM, Price: Price{Input: 0.3, CachedInput: 0.3, Output: 1.5}},
	}
	for _, tc := range []struct {
		name string
		obj  Objective
		slo  time.Duration
		want string
	}{
		{"latency", ObjectiveLatency, 0, "dear"},
		{"cost within the SLO", ObjectiveCost, 2 * time.Second, "cheap"},
		{"cost without an SLO", ObjectiveCost, 0, "cheap"},
		{"cost: the cheap one misses the SLO", ObjectiveCost, 300 * time.Millisecond, "dear"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, cfgs...)
			f.train("dear", law{a: 0.05}, 300)
			f.train("cheap", law{a: 0.6}, 300)
			s, err := NewAdaptive(StrategyEnv{Clock: f.clk, Model: "m"}, DefaultAdaptiveParams())
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]int{}
			for i := range 50 {
				r := &Request{Model: "m", Prompt: text(uint64(i), 400), MaxTokens: 256, Objective: tc.obj,
					SecondsPerDollar: 2000, TTFTSLO: tc.slo}
				b, err := s.Pick(r, f.targets)
				if err != nil {
					t.Fatal(err)
				}
				got[b.Backend.Name()]++
				r.Reset()
			}
			if got[tc.want] < 48 {
				t.Fatalf("picks %v, want (nearly) all on %s", got, tc.want)
			}
		})
	}
}

func TestParseObjective(t *testing.T) {
	for i, n := range ObjectiveNames {
		if o, ok := ParseObjective(n); !ok || o != Objective(i) || o.String() != n {
			t.Errorf("ParseObjective(%q) = %v, %v", n, o, ok)
		}
	}
	if _, ok := ParseObjective("cheap"); ok {
		t.Error("ParseObjective accepted an unknown name")
	}
}

// TestThroughputObjective: two backends with the same first-token time, one decoding three times faster. Latency
// cannot tell them apart; throughput sends a long generation to the fast decoder.
func TestThroughputObjective(t *testing.T) {
	f := newFleet(t, local(2)...)
	for _, n := range []string{"b0", "b1"} {
		f.train(n, law{a: 0.1}, 300)
	}
	for range 200 {
		f.b("b0").lat.observeITL(4, 0.036)
		f.b("b1").lat.observeITL(4, 0.012)
	}
	s, err := NewAdaptive(StrategyEnv{Clock: f.clk, Model: "m"}, DefaultAdaptiveParams())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for i := range 40 {
		r := &Request{Model: "m", Prompt: text(uint64(i), 400), MaxTokens: 1000, Objective: ObjectiveThroughput}
		b, err := s.Pick(r, f.targets)
		if err != nil {
			t.Fatal(err)
		}
		got[b.Backend.Name()]++
		r.Reset()
	}
	if got["b1"] < 39 {
		t.Fatalf("throughput picks %v, want the fast decoder b1", got)
	}
}
