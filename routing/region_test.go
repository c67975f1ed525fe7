package routing

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard/switchyard/metrics"
)

// regions returns backend configs: per region name, n backends named <region initial letters><i> (us-east:
// use0, use1; eu-west: euw0; ap-south: aps0).
func regions(n int, names ...string) []*BackendConfig {
	var cfgs []*BackendConfig
	for _, reg := range names {
		parts := strings.Split(reg, "-")
		short := parts[0] + string(parts[1][0])
		for i := range n {
			cfgs = append(cfgs, &BackendConfig{Name: fmt.Sprint(short, i), URL: fmt.Sprint("http://", short, i),
				Region: reg, Engine: EngineVLLM})
		}
	}
	return cfgs
}

// regional builds strategy name for a gateway in us-east with the failover order given, on f's clock.
func regional(t testing.TB, f *fleet, name string, m *metrics.Gateway, failover ...string) Strategy {
	t.Helper()
	s, err := NewStrategy(name, StrategyEnv{Region: "us-east", Failover: failover, Clock: f.clk, Model: "m", Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*Regional); !ok {
		t.Fatalf("NewStrategy with a region returned %T, want *Regional", s)
	}
	return s
}

// regionOf returns the region of the backends picked (all picks must be in one region, else it fails).
func (f *fleet) regionOf(s Strategy, n int) string {
	f.t.Helper()
	got := map[string]int{}
	for name, k := range f.picks(s, text(1, 300), n) {
		got[f.b(name).Config().Region] += k
	}
	if len(got) != 1 {
		f.t.Fatalf("picks spread over regions %v", got)
	}
	for r := range got {
		return r
	}
	return ""
}

// setHealthy marks the backends of region healthy or not.
func (f *fleet) setHealthy(region string, ok bool) {
	for _, t := range f.targets {
		if t.Backend.Config().Region == region {
			t.Backend.SetHealthy(ok)
		}
	}
}

// saturate publishes fresh engine metrics on region's backends: a queue of 10 (over 4 x 1.2) when on, else idle.
func (f *fleet) saturate(region string, on bool) {
	for _, t := range f.targets {
		if t.Backend.Config().Region == region {
			waiting := 0.0
			if on {
				waiting = 10
			}
			f.engine(t.Backend.Name(), waiting, 4, 0.3)
		}
	}
}

func TestRegionTiers(t *testing.T) {
	for _, name := range StrategyNames() {
		t.Run(name, func(t *testing.T) {
			for _, tc := range []struct {
				name     string
				failover []string
				setup    func(f *fleet)
				want     string
			}{
				{"the gateway's region first", []string{"eu-west", "ap-south"}, func(*fleet) {}, "us-east"},
				{"local all unhealthy: the first failover region", []string{"eu-west", "ap-south"},
					func(f *fleet) { f.setHealthy("us-east", false) }, "eu-west"},
				{"the failover order, not the fleet's order", []string{"ap-south", "eu-west"},
					func(f *fleet) { f.setHealthy("us-east", false) }, "ap-south"},
				{"local and the first failover region down: the second", []string{"eu-west", "ap-south"},
					func(f *fleet) { f.setHealthy("us-east", false); f.setHealthy("eu-west", false) }, "ap-south"},
				{"local saturated: spill", []string{"eu-west", "ap-south"},
					func(f *fleet) { f.saturate("us-east", true) }, "eu-west"},
				{"local half saturated: stays", []string{"eu-west"},
					func(f *fleet) { f.engine("use0", 10, 4, 0.3) }, "us-east"},
				{"regions outside the order come last", []string{"ap-south"},
					func(f *fleet) { f.setHealthy("us-east", false); f.saturate("ap-south", true) }, "eu-west"},
				{"everything saturated: the gateway's region (fail open)", []string{"eu-west", "ap-south"},
					func(f *fleet) {
						f.saturate("us-east", true)
						f.saturate("eu-west", true)
						f.saturate("ap-south", true)
					}, "us-east"},
				{"a backend at its MaxConcurrency is saturated", []string{"eu-west"},
					func(f *fleet) {
						for _, n := range []string{"use0", "use1"} {
							f.b(n).cfg.Store(&BackendConfig{Name: n, URL: "http://" + n, Region: "us-east", Engine: EngineVLLM, MaxConcurrency: 1})
							f.b(n).Begin(10)
						}
					}, "eu-west"},
			} {
				t.Run(tc.name, func(t *testing.T) {
					f := newFleet(t, regions(2, "eu-west", "ap-south", "us-east")...)
					for _, n := range []string{"euw0", "euw1", "aps0", "aps1"} {
						f.b(n).observeProbe(80 * time.Millisecond)
					}
					tc.setup(f)
					if got := f.regionOf(regional(t, f, name, nil, tc.failover...), 60); got != tc.want {
						t.Fatalf("picks went to %s, want %s", got, tc.want)
					}
				})
			}
		})
	}
}

// TestRegionAdaptiveMargin: adaptive sees the later tiers too, and a remote backend wins only when it is
// cheaper by more than the region margin.
func TestRegionAdaptiveMargin(t *testing.T) {
	for _, tc := range []struct {
		name   string
		queued int // prefill tokens queued on each local backend (0.15 ms each by the prior)
		want   string
	}{
		{"a short local queue: local", 200, "us-east"},                     // 30 ms of queue < 80 ms RTT + 100 ms margin
		{"a local queue under RTT + margin: still local", 1000, "us-east"}, // 150 ms
		{"a local queue costing more than RTT + margin: remote", 20000, "eu-west"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, regions(2, "us-east", "eu-west")...)
			f.b("euw0").observeProbe(80 * time.Millisecond)
			f.b("euw1").observeProbe(80 * time.Millisecond)
			f.b("use0").Begin(tc.queued)
			f.b("use1").Begin(tc.queued)
			if got := f.regionOf(regional(t, f, StrategyAdaptive, nil, "eu-west"), 40); got != tc.want {
				t.Fatalf("picks went to %s, want %s", got, tc.want)
			}
		})
	}
}

// TestRegionFailoverAndReturn drives a whole failure on a virtual clock: the local region goes down (traffic
// leaves at the first pick), comes back (nothing for Hold, then a linear ramp over Ramp), with a noisy
// saturation signal during the return that must not make it flap.
func TestRegionFailoverAndReturn(t *testing.T) {
	const (
		step    = 50 * time.Millisecond
		perStep = 10
	)
	p := DefaultRegionParams()
	for _, name := range []string{StrategyRoundRobin, StrategyLeastRequest, StrategyAdaptive, StrategyPrefixHash} {
		t.Run(name, func(t *testing.T) {
			f := newFleet(t, regions(2, "us-east", "eu-west")...)
			f.b("euw0").observeProbe(80 * time.Millisecond)
			f.b("euw1").observeProbe(80 * time.Millisecond)
			s := regional(t, f, name, nil, "eu-west")
			rng := rand.New(rand.NewPCG(3, 4))
			// share runs d of virtual time and returns the local share of each second's picks. noise is the
			// probability that a 50 ms step sees both local backends saturated.
			share := func(d time.Duration, noise float64) []float64 {
				var out []float64
				local, total := 0, 0
				for i := range int(d / step) {
					f.saturate("eu-west", false)
					f.saturate("us-east", rng.Float64() < noise)
					for range perStep {
						r := &Request{Model: "m", Prompt: text(uint64(i), 300)}
						got, err := s.Pick(r, f.targets)
						if err != nil {
							t.Fatal(err)
						}
						if got.Backend.Config().Region == "us-east" {
							local++
						}
						total++
						r.Reset()
					}
					f.clk.Advance(step)
					if (i+1)%int(time.Second/step) == 0 {
						out = append(out, float64(local)/float64(total))
						local, total = 0, 0
					}
				}
				return out
			}
			if got := share(2*time.Second, 0); got[0] != 1 || got[1] != 1 {
				t.Fatalf("before the failure the local share is %v, want 1", got)
			}
			f.setHealthy("us-east", false)
			if got := share(3*time.Second, 0); slices.Max(got) != 0 {
				t.Fatalf("with the local region down its share is %v, want 0 from the first pick", got)
			}
			f.setHealthy("us-east", true)
			got := share(p.Hold+p.Ramp+4*time.Second, 0.15)
			t.Logf("local share per second after recovery: %.2f", got)
			holdSecs := int(p.Hold / time.Second)
			for i := range holdSecs {
				if got[i] != 0 {
					t.Errorf("second %d after recovery (within Hold): local share %.2f, want 0", i, got[i])
				}
			}
			switches, majority := 0, false
			for i, v := range got {
				if i > 0 && v < got[i-1]-0.15 {
					t.Errorf("the local share fell from %.2f to %.2f in second %d: the return is not monotone", got[i-1], v, i)
				}
				if m := v > 0.5; m != majority {
					switches++
					majority = m
				}
			}
			if switches != 1 {
				t.Errorf("the majority switched region %d times during the return, want once: %.2f", switches, got)
			}
			if mid := got[holdSecs+int(p.Ramp/time.Second)/2]; mid < 0.2 || mid > 0.8 {
				t.Errorf("half way through the ramp the local share is %.2f, want about 0.5", mid)
			}
			if end := got[len(got)-1]; end < 0.7 {
				t.Errorf("after Hold + Ramp the local share is %.2f, want most of it despite 15%% noisy saturation", end)
			}
		})
	}
}

func TestRegionHysteresis(t *testing.T) {
	p := DefaultRegionParams()
	newRR := func(t *testing.T) (*fleet, Strategy) {
		f := newFleet(t, regions(2, "us-east", "eu-west")...)
		return f, regional(t, f, StrategyRoundRobin, nil, "eu-west")
	}
	// fail keeps the local region down for d, with a pick every 100 ms.
	fail := func(f *fleet, s Strategy, d time.Duration) {
		f.setHealthy("us-east", false)
		for range int(d / (100 * time.Millisecond)) {
			f.regionOf(s, 1)
			f.clk.Advance(100 * time.Millisecond)
		}
		f.setHealthy("us-east", true)
	}
	t.Run("a dip shorter than Debounce is forgotten", func(t *testing.T) {
		f, s := newRR(t)
		fail(f, s, p.Debounce-100*time.Millisecond)
		if got := f.regionOf(s, 20); got != "us-east" {
			t.Fatalf("after a short dip picks go to %s, want us-east at once", got)
		}
	})
	t.Run("a failure holds the region back, then it ramps", func(t *testing.T) {
		f, s := newRR(t)
		fail(f, s, time.Second)
		f.clk.Advance(p.Hold - 200*time.Millisecond)
		if got := f.regionOf(s, 50); got != "eu-west" {
			t.Fatalf("within Hold picks go to %s, want eu-west", got)
		}
		f.clk.Advance(200*time.Millisecond + p.Ramp)
		if got := f.regionOf(s, 50); got != "us-east" {
			t.Fatalf("after Hold + Ramp picks go to %s, want us-east", got)
		}
	})
	t.Run("a new failure during the ramp starts Hold again", func(t *testing.T) {
		f, s := newRR(t)
		fail(f, s, time.Second)
		f.clk.Advance(p.Hold + p.Ramp/2)
		fail(f, s, time.Second)
		f.clk.Advance(p.Hold - 200*time.Millisecond)
		if got := f.regionOf(s, 50); got != "eu-west" {
			t.Fatalf("within the second Hold picks go to %s, want eu-west", got)
		}
	})
	t.Run("a held-back region is used when nothing else is available", func(t *testing.T) {
		f, s := newRR(t)
		fail(f, s, time.Second)
		f.setHealthy("eu-west", false)
		if got := f.regionOf(s, 20); got != "us-east" {
			t.Fatalf("with eu-west down picks go to %s, want the held-back us-east", got)
		}
	})
	t.Run("a retry without local candidates does not count as a failure", func(t *testing.T) {
		f, s := newRR(t)
		remote := f.targets[2:]
		for range 20 {
			if _, err := s.Pick(&Request{Model: "m"}, remote); err != nil {
				t.Fatal(err)
			}
			f.clk.Advance(100 * time.Millisecond)
		}
		if got := f.regionOf(s, 20); got != "us-east" {
			t.Fatalf("after picks among remote candidates only, picks go to %s, want us-east", got)
		}
	})
	t.Run("a reload keeps the state", func(t *testing.T) {
		f, s := newRR(t)
		fail(f, s, time.Second)
		next, err := NewStrategy(StrategyLeastRequest, StrategyEnv{Region: "us-east", Failover: []string{"eu-west"}, Clock: f.clk, Previous: s})
		if err != nil {
			t.Fatal(err)
		}
		if got := f.regionOf(next, 20); got != "eu-west" {
			t.Fatalf("after a reload within Hold picks go to %s, want eu-west", got)
		}
		fresh, _ := NewStrategy(StrategyLeastRequest, StrategyEnv{Region: "us-east", Failover: []string{"eu-west"}, Clock: f.clk})
		if got := f.regionOf(fresh, 20); got != "us-east" {
			t.Fatalf("a strategy without Previous sends picks to %s, want us-east", got)
		}
	})
}

// value reads a counter's or a gauge's value.
func value(t *testing.T, m prometheus.Metric) float64 {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	if d.Counter != nil {
		return d.Counter.GetValue()
	}
	return d.Gauge.GetValue()
}

func TestRegionMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	f := newFleet(t, regions(2, "us-east", "eu-west", "ap-south")...)
	s := regional(t, f, StrategyRoundRobin, m, "eu-west")
	f.regionOf(s, 10)
	if v := value(t, m.RegionActiveTier.WithLabelValues("m")); v != 0 {
		t.Errorf("active tier %v, want 0", v)
	}
	f.setHealthy("us-east", false)
	for range 10 {
		f.regionOf(s, 3)
		f.clk.Advance(100 * time.Millisecond)
	}
	f.setHealthy("us-east", true)
	f.regionOf(s, 1)
	if v := value(t, m.RegionSpills.WithLabelValues("m", "us-east", "eu-west")); v != 31 {
		t.Errorf("spills to eu-west %v, want 31", v)
	}
	if v := value(t, m.RegionActiveTier.WithLabelValues("m")); v != 1 {
		t.Errorf("active tier during Hold %v, want 1", v)
	}
	if v := value(t, m.RegionShare.WithLabelValues("m", "us-east")); v != 0 {
		t.Errorf("us-east share during Hold %v, want 0", v)
	}
	f.setHealthy("eu-west", false)
	f.setHealthy("us-east", false)
	f.regionOf(s, 2)
	if v := value(t, m.RegionSpills.WithLabelValues("m", "us-east", "ap-south")); v != 2 {
		t.Errorf("spills to ap-south (outside the order) %v, want 2", v)
	}
	f.setHealthy("eu-west", true)
	f.setHealthy("us-east", true)
	f.clk.Advance(DefaultRegionParams().Hold + DefaultRegionParams().Ramp/2)
	f.regionOf(s, 1) // may land in either region
	if v := value(t, m.RegionShare.WithLabelValues("m", "us-east")); v < 0.4 || v > 0.6 {
		t.Errorf("us-east share half way through the ramp %v, want about 0.5", v)
	}
	f.clk.Advance(DefaultRegionParams().Ramp)
	f.regionOf(s, 10)
	if v := value(t, m.RegionActiveTier.WithLabelValues("m")); v != 0 {
		t.Errorf("active tier after the return %v, want 0", v)
	}
	if v := value(t, m.RegionShare.WithLabelValues("m", "us-east")); v != 1 {
		t.Errorf("us-east share after the return %v, want 1", v)
	}
}

func TestRegionParamsValidate(t *testing.T) {
	if err := DefaultRegionParams().Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := NewStrategy(StrategyRandom, StrategyEnv{Region: "a", Regions: &RegionParams{Hold: -time.Second}}); err == nil || !strings.Contains(err.Error(), "hold") {
		t.Fatalf("a negative hold: %v", err)
	}
	long := make([]string, MaxFailover+1)
	for i := range long {
		long[i] = fmt.Sprint("r", i)
	}
	if _, err := NewStrategy(StrategyRandom, StrategyEnv{Region: "a", Failover: long}); err == nil {
		t.Fatal("a failover order longer than MaxFailover was accepted")
	}
}

// TestRegionalPickAllocatesNothing: region tiers cost no allocation, on the local path and on a spill.
func TestRegionalPickAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool is lossy under the race detector")
	}
	f, p := benchFleet(t)
	m := metrics.New(prometheus.NewRegistry())
	for _, name := range []string{StrategyAdaptive, StrategyRoundRobin, StrategyCacheAware} {
		s := regional(t, f, name, m, "eu-west")
		for _, down := range []bool{false, true} {
			f.setHealthy("us-east", !down)
			var r Request
			n := testing.AllocsPerRun(200, func() {
				r.Reset()
				r.Model, r.Prompt = "m", p
				if _, err := s.Pick(&r, f.targets); err != nil {
					t.Fatal(err)
				}
			})
			if n != 0 {
				t.Errorf("%s (local down %v): %v allocations per pick, want 0", name, down, n)
			}
		}
		f.setHealthy("us-east", true)
	}
}

// BenchmarkPickRegionalAdaptive64 is BenchmarkPickAdaptive64 behind region tiers (48 local, 16 in eu-west).
func BenchmarkPickRegionalAdaptive64(b *testing.B) {
	f, p := benchFleet(b)
	s := regional(b, f, StrategyAdaptive, metrics.New(prometheus.NewRegistry()), "eu-west")
	var r Request
	b.ReportAllocs()
	start := processCPU()
	defer func() { reportCPU(b, start) }()
	for b.Loop() {
		r.Reset()
		r.Model, r.Prompt = "m", p
		if _, err := s.Pick(&r, f.targets); err != nil {
			b.Fatal(err)
		}
	}
}

func TestRegionStatus(t *testing.T) {
	f := newFleet(t, regions(1, "us-east", "eu-west")...)
	s := regional(t, f, StrategyRandom, nil, "eu-west").(*Regional)
	f.setHealthy("us-east", false)
	f.regionOf(s, 1)
	f.clk.Advance(DefaultRegionParams().Debounce)
	f.regionOf(s, 1)
	f.setHealthy("us-east", true)
	f.regionOf(s, 1)
	f.clk.Advance(DefaultRegionParams().Hold + DefaultRegionParams().Ramp/4)
	want := []RegionStatus{{Region: "us-east", Share: 0.25}, {Region: "eu-west", Share: 1}, {Region: "", Share: 1}}
	if got := s.Status(); !slices.Equal(got, want) {
		t.Fatalf("status %+v, want %+v", got, want)
	}
	f.setHealthy("us-east", false)
	f.regionOf(s, 1)
	f.clk.Advance(DefaultRegionParams().Debounce)
	if got := s.Status()[0]; !got.Unavailable || !got.Failed {
		t.Fatalf("status of a region down for Debounce: %+v", got)
	}
}
