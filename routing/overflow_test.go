package routing

import (
	"testing"
	"time"
)

// overflowFleet is two dedicated backends in us-east and three overflow ones: a cheap, a dear and a dearer.
func overflowFleet(t *testing.T) *fleet {
	cfgs := regions(2, "us-east")
	for _, o := range []struct {
		name string
		p    Price
	}{{"ovc", Price{Input: 0.2, Output: 0.6}}, {"ovd", Price{Input: 1, Output: 3}}, {"ove", Price{Input: 2, Output: 6}}} {
		cfgs = append(cfgs, &BackendConfig{Name: o.name, URL: "http://" + o.name, Region: "us-east", Engine: EngineVLLM,
			Tier: TierOverflow, Price: o.p})
	}
	return newFleet(t, cfgs...)
}

// TestOverflowTier: overflow backends take nothing while a dedicated backend has room, whatever the strategy
// (adaptive included, though the overflow ones look faster), the cheapest available one takes the spill, and
// the traffic leaves them once the dedicated tier has room again (after the region hysteresis).
func TestOverflowTier(t *testing.T) {
	p := DefaultRegionParams()
	for _, name := range StrategyNames() {
		t.Run(name, func(t *testing.T) {
			f := overflowFleet(t)
			s, err := NewStrategy(name, StrategyEnv{Overflow: true, Clock: f.clk, Model: "m"})
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range []string{"ovc", "ovd", "ove"} { // faster than the dedicated pair
				f.train(n, law{a: 0.01}, 200)
			}
			f.train("use0", law{a: 0.3}, 200)
			f.train("use1", law{a: 0.3}, 200)
			count := func() map[string]int { return f.picks(s, text(1, 300), 60) }
			if got := count(); got["use0"]+got["use1"] != 60 {
				t.Fatalf("with room in the dedicated tier, picks went to %v", got)
			}
			f.engine("use0", 10, 4, 0.3) // one dedicated backend saturated: the tier has room
			if got := count(); got["use0"]+got["use1"] != 60 || (name == StrategyAdaptive && got["use1"] != 60) {
				t.Fatalf("with one dedicated backend free, picks went to %v", got)
			}
			f.engine("use1", 10, 4, 0.3)
			if got := count(); got["ovc"] != 60 {
				t.Fatalf("with the dedicated tier saturated, picks went to %v, want the cheapest overflow (ovc)", got)
			}
			f.engine("ovc", 10, 4, 0.3)
			if got := count(); got["ovd"] != 60 {
				t.Fatalf("with ovc saturated too, picks went to %v, want the next cheapest (ovd)", got)
			}
			f.clk.Advance(2 * p.Debounce) // full for long: not a failure, no Hold
			count()
			f.engine("use0", 0, 4, 0.3)
			f.engine("use1", 0, 4, 0.3)
			f.engine("ovc", 0, 4, 0.3)
			if got := count(); got["use0"]+got["use1"] != 60 {
				t.Fatalf("once the dedicated tier has room again, picks went to %v, want it at once", got)
			}
			// Unhealthy is a failure: the return is held and ramped as for regions.
			f.setHealthy("us-east", false)
			for _, n := range []string{"ovc", "ovd", "ove"} {
				f.b(n).SetHealthy(true)
			}
			count()
			f.clk.Advance(p.Debounce)
			count()
			f.setHealthy("us-east", true)
			if got := count(); got["ovc"] != 60 {
				t.Fatalf("during Hold after a failure the dedicated tier got picks: %v", got)
			}
			f.clk.Advance(p.Hold + p.Ramp + time.Millisecond)
			for _, n := range []string{"use0", "use1", "ovc"} {
				f.engine(n, 0, 4, 0.3)
			}
			if got := count(); got["use0"]+got["use1"] != 60 {
				t.Fatalf("after Hold and Ramp, picks went to %v, want the dedicated tier only", got)
			}
		})
	}
}

// TestOverflowAllDown: with every dedicated backend unhealthy the overflow tier serves at once.
func TestOverflowAllDown(t *testing.T) {
	f := overflowFleet(t)
	s, err := NewStrategy(StrategyAdaptive, StrategyEnv{Overflow: true, Clock: f.clk, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*Regional); !ok {
		t.Fatalf("NewStrategy with overflow targets returned %T, want *Regional", s)
	}
	f.b("use0").SetHealthy(false)
	f.b("use1").SetHealthy(false)
	if got := f.picks(s, text(2, 300), 30); got["ovc"] != 30 {
		t.Fatalf("with the dedicated tier down, picks went to %v, want ovc", got)
	}
	st := s.(*Regional).Status()
	if last := st[len(st)-1]; !last.Overflow {
		t.Fatalf("Status's last tier is %+v, want the overflow tier", last)
	}
}

func TestPriceOf(t *testing.T) {
	p := Price{Input: 3, CachedInput: 0.3, Output: 15}
	for _, tc := range []struct {
		name string
		u    Usage
		want float64
	}{
		{"no cache report: the whole prompt at input", Usage{PromptTokens: 1000, CompletionTokens: 200, CachedTokens: 900}, (1000*3 + 200*15) / 1e6},
		{"cached at their price", Usage{PromptTokens: 1000, CompletionTokens: 200, CachedTokens: 600, HasCached: true}, (400*3 + 600*0.3 + 200*15) / 1e6},
		{"cached beyond the prompt is capped", Usage{PromptTokens: 100, CachedTokens: 500, HasCached: true}, 100 * 0.3 / 1e6},
		{"nothing", Usage{}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.Of(tc.u); abs(got-tc.want) > 1e-12 {
				t.Fatalf("Of(%+v) = %v, want %v", tc.u, got, tc.want)
			}
		})
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// TestOverflowForTheSLO: with a TTFT objective, adaptive sends a request to overflow when the dedicated backend
// with room is predicted to miss it, and to the dedicated one when it meets it.
func TestOverflowForTheSLO(t *testing.T) {
	f := newFleet(t, &BackendConfig{Name: "slow", URL: "http://slow", Engine: EngineVLLM},
		&BackendConfig{Name: "ov", URL: "http://ov", Engine: EngineVLLM, Tier: TierOverflow, Price: Price{Input: 5, Output: 15}})
	f.train("slow", law{a: 0.8}, 300)
	f.train("ov", law{a: 0.05}, 300)
	s, err := NewStrategy(StrategyAdaptive, StrategyEnv{Overflow: true, Clock: f.clk, Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		slo  time.Duration
		want string
	}{{0, "slow"}, {2 * time.Second, "slow"}, {300 * time.Millisecond, "ov"}} {
		got := map[string]int{}
		for i := range 30 {
			r := &Request{Model: "m", Prompt: text(uint64(i), 300), TTFTSLO: tc.slo}
			b, err := s.Pick(r, f.targets)
			if err != nil {
				t.Fatal(err)
			}
			got[b.Backend.Name()]++
			r.Reset()
		}
		if got[tc.want] != 30 {
			t.Errorf("TTFT objective %v: picks %v, want all on %s", tc.slo, got, tc.want)
		}
	}
}
