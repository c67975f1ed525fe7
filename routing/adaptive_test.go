package routing

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/switchyard/switchyard/cache"
)

// fleet is a registry of backends on a virtual clock, with helpers to put them in a known state.
type fleet struct {
	t       testing.TB
	reg     *Registry
	clk     *fakeClock
	targets []Target
}

func newFleet(t testing.TB, cfgs ...*BackendConfig) *fleet {
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	f := &fleet{t: t, reg: reg, clk: clk}
	for _, b := range reg.Sync(cfgs) {
		f.targets = append(f.targets, Target{Backend: b, Model: "m"})
	}
	return f
}

// local returns n backend configs named b0..b(n-1) in region us-east.
func local(n int) []*BackendConfig {
	cfgs := make([]*BackendConfig, n)
	for i := range cfgs {
		cfgs[i] = &BackendConfig{Name: fmt.Sprint("b", i), URL: fmt.Sprint("http://b", i), Region: "us-east",
			Engine: EngineVLLM}
	}
	return cfgs
}

func (f *fleet) b(name string) *Backend {
	for _, t := range f.targets {
		if t.Backend.Name() == name {
			return t.Backend
		}
	}
	f.t.Fatalf("no backend %q", name)
	return nil
}

// train feeds n observations of truth to b's TTFT model.
func (f *fleet) train(name string, truth law, n int) {
	b := f.b(name)
	rng := rand.New(rand.NewPCG(uint64(n), 99))
	for range n {
		u, q, r := features(rng)
		b.lat.observeTTFT(u, q, r, truth.at(u, q, r))
	}
}

// engine publishes a fresh engine snapshot on b.
func (f *fleet) engine(name string, waiting, running, kv float64) {
	b := f.b(name)
	b.engine.Store(&EngineStats{Waiting: waiting, Running: running, KVUsage: kv,
		Has: HasWaiting | HasRunning | HasKVUsage, At: f.clk.Now(), begun: b.requests.Load(), ended: b.ended.Load()})
}

// hold makes the prefix index believe b holds prompt.
func (f *fleet) hold(name string, prompt []byte) {
	f.b(name).prefixOwner().Confirm(cache.AppendHashes(nil, cache.Seed("m"), prompt, 0), f.clk.Now())
}

// picks runs n picks of a request for prompt and counts the backends chosen.
func (f *fleet) picks(s Strategy, prompt []byte, n int) map[string]int {
	got := map[string]int{}
	for range n {
		r := &Request{Model: "m", Prompt: prompt}
		t, err := s.Pick(r, f.targets)
		if err != nil {
			f.t.Fatal(err)
		}
		if r.Decision().Backend != t.Backend {
			f.t.Fatal("Decision().Backend is not the pick")
		}
		got[t.Backend.Name()]++
		r.Reset()
	}
	return got
}

func text(seed uint64, n int) []byte {
	rng := rand.New(rand.NewPCG(seed, 7))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + rng.IntN(26))
	}
	return b
}

var (
	fastLaw = law{a: 0.020, perTok: 0.00005, perQueued: 0.00005, perRun: 0.0001} // H200-like: 20k tok/s
	slowLaw = law{a: 0.050, perTok: 0.0010, perQueued: 0.0010, perRun: 0.0010}   // L4-like: 1k tok/s
	simLaw  = law{a: 0.030, perTok: 0.0001, perQueued: 0.0001, perRun: 0.0002}   // the simulator's defaults
)

func adaptive(t testing.TB, f *fleet, region string) *Adaptive {
	s, err := NewAdaptive(StrategyEnv{Region: region, Clock: f.clk}, DefaultAdaptiveParams())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAdaptiveChoices(t *testing.T) {
	far := func(cfgs []*BackendConfig) []*BackendConfig {
		return append(cfgs, &BackendConfig{Name: "far", URL: "http://far", Region: "eu-west", Engine: EngineVLLM})
	}
	for _, tc := range []struct {
		name   string
		cfgs   []*BackendConfig
		setup  func(f *fleet)
		prompt []byte
		itlSLO time.Duration
		want   []string // every pick must be one of these
	}{
		{
			name: "heterogeneous speeds: the fast GPU takes a long prompt",
			cfgs: local(2),
			setup: func(f *fleet) {
				f.train("b0", slowLaw, 200)
				f.train("b1", fastLaw, 200)
			},
			prompt: text(1, 8000),
			want:   []string{"b1"},
		},
		{
			name: "heterogeneous speeds: a busy fast GPU loses to an idle slow one",
			cfgs: local(2),
			setup: func(f *fleet) {
				f.train("b0", slowLaw, 200)
				f.train("b1", fastLaw, 200)
				f.b("b1").Begin(400_000) // 400k prefill tokens queued: 20 s of work at 20k tok/s
			},
			prompt: text(2, 400),
			want:   []string{"b0"},
		},
		{
			name:   "a prefix held by one backend",
			cfgs:   local(4),
			setup:  func(f *fleet) { f.hold("b2", text(3, 8192)) },
			prompt: text(3, 8192),
			want:   []string{"b2"},
		},
		{
			name: "a saturated owner must spill",
			cfgs: local(4),
			setup: func(f *fleet) {
				f.hold("b2", text(3, 8192))
				f.engine("b2", 10, 40, 0.5) // 10 waiting: 2.5x the queue threshold
			},
			prompt: text(3, 8192),
			want:   []string{"b0", "b1", "b3"},
		},
		{
			name: "an owner whose KV cache is full must spill",
			cfgs: local(2),
			setup: func(f *fleet) {
				f.hold("b0", text(3, 8192))
				f.engine("b0", 0, 40, 0.99)
			},
			prompt: text(3, 8192),
			want:   []string{"b1"},
		},
		{
			name: "an owner keeps its prefix while its queue costs less than the prefill saved",
			cfgs: local(2),
			setup: func(f *fleet) {
				f.hold("b0", text(4, 16384))
				f.b("b0").Begin(2000) // 0.2 s queued vs 0.4 s of prefill saved
			},
			prompt: text(4, 16384),
			want:   []string{"b0"},
		},
		{
			name: "a hot prefix spreads once its owner's queue costs more than the prefill saved",
			cfgs: local(2),
			setup: func(f *fleet) {
				f.hold("b0", text(4, 16384))
				f.b("b0").Begin(20000) // 2 s queued vs 0.4 s of prefill saved
			},
			prompt: text(4, 16384),
			want:   []string{"b1"},
		},
		{
			name: "a far backend is not chosen while local ones have room",
			cfgs: far(local(2)),
			setup: func(f *fleet) {
				f.b("far").observeProbe(80 * time.Millisecond)
				f.engine("b0", 0, 10, 0.5)
				f.engine("b1", 1, 10, 0.5)
			},
			prompt: text(5, 2000),
			want:   []string{"b0", "b1"},
		},
		{
			name: "a far backend holding the prefix loses to local prefill of a short prompt",
			cfgs: far(local(2)),
			setup: func(f *fleet) {
				f.b("far").observeProbe(80 * time.Millisecond)
				f.hold("far", text(6, 1024))
			},
			prompt: text(6, 1024),
			want:   []string{"b0", "b1"},
		},
		{
			name: "a far backend is chosen when local ones are saturated",
			cfgs: far(local(2)),
			setup: func(f *fleet) {
				f.b("far").observeProbe(80 * time.Millisecond)
				f.engine("b0", 12, 200, 0.9)
				f.engine("b1", 12, 200, 0.9)
			},
			prompt: text(7, 2000),
			want:   []string{"far"},
		},
		{
			name: "a backend at its MaxConcurrency is saturated",
			cfgs: func() []*BackendConfig {
				c := local(2)
				c[0].MaxConcurrency = 1
				return c
			}(),
			setup: func(f *fleet) {
				f.hold("b0", text(8, 8192))
				f.b("b0").Begin(10)
			},
			prompt: text(8, 8192),
			want:   []string{"b1"},
		},
		{
			name: "a backend far more loaded than the others is avoided whatever its model says",
			cfgs: local(2),
			setup: func(f *fleet) {
				f.train("b0", law{a: 0.001}, 300) // a model that learned the backend is free
				f.hold("b0", text(15, 8192))
				for range 70 {
					f.b("b0").Begin(0)
				}
			},
			prompt: text(15, 8192),
			want:   []string{"b1"},
		},
		{
			name: "an ITL objective avoids a backend with a big decode batch",
			cfgs: local(2),
			setup: func(f *fleet) {
				f.engine("b0", 0, 250, 0.5) // 20 ms + 250 x 0.1 ms = 45 ms per token
				f.engine("b1", 0, 10, 0.5)
				f.hold("b0", text(9, 8192))
			},
			prompt: text(9, 8192),
			itlSLO: 40 * time.Millisecond,
			want:   []string{"b1"},
		},
		{
			name: "unhealthy backends are skipped even when they hold the prefix",
			cfgs: local(3),
			setup: func(f *fleet) {
				f.hold("b1", text(10, 8192))
				f.b("b1").SetHealthy(false)
			},
			prompt: text(10, 8192),
			want:   []string{"b0", "b2"},
		},
		{
			name: "stale engine metrics are ignored",
			cfgs: local(2),
			setup: func(f *fleet) {
				f.hold("b0", text(11, 8192))
				f.engine("b0", 50, 50, 0.99)
				f.clk.Advance(time.Second) // now older than DefaultStaleAfter
			},
			prompt: text(11, 8192),
			want:   []string{"b0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, tc.cfgs...)
			tc.setup(f)
			s := adaptive(t, f, "us-east")
			for range 50 {
				r := &Request{Model: "m", Prompt: tc.prompt, ITLSLO: tc.itlSLO}
				got, err := s.Pick(r, f.targets)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Contains(tc.want, got.Backend.Name()) {
					t.Fatalf("picked %s, want one of %v (decision %+v)", got.Backend.Name(), tc.want, r.Decision())
				}
				r.Reset()
			}
		})
	}
}

func TestAdaptiveDecision(t *testing.T) {
	f := newFleet(t, local(2)...)
	p := text(12, 8192+30)
	f.hold("b1", p)
	r := &Request{Model: "m", Prompt: p}
	if _, err := adaptive(t, f, "").Pick(r, f.targets); err != nil {
		t.Fatal(err)
	}
	d := r.Decision()
	if d.Backend.Name() != "b1" || d.CachedTokens != 2048 || d.TTFT <= 0 || d.Cost <= 0 || d.Saturated {
		t.Fatalf("decision %+v, want b1 with 2048 cached tokens", d)
	}
}

func TestAdaptiveAllSaturatedFailsOpen(t *testing.T) {
	f := newFleet(t, local(2)...)
	f.engine("b0", 20, 0, 0)
	f.engine("b1", 10, 0, 0)
	r := &Request{Model: "m", Prompt: text(13, 500)}
	got, err := adaptive(t, f, "").Pick(r, f.targets)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Decision().Saturated || got.Backend.Name() != "b1" {
		t.Fatalf("picked %s (decision %+v), want the less loaded b1 flagged saturated", got.Backend.Name(), r.Decision())
	}
}

func TestAdaptiveNoBackend(t *testing.T) {
	f := newFleet(t, local(2)...)
	for _, tg := range f.targets {
		tg.Backend.SetHealthy(false)
	}
	s := adaptive(t, f, "")
	if _, err := s.Pick(&Request{Model: "m"}, f.targets); !errors.Is(err, ErrNoBackend) {
		t.Fatalf("err = %v", err)
	}
	if _, err := s.Pick(&Request{Model: "m"}, nil); !errors.Is(err, ErrNoBackend) {
		t.Fatalf("no targets: err = %v", err)
	}
}

// TestAdaptiveReplicasAgreeOnColdPrefixes builds two independent gateways (registries, indexes, strategies)
// over the same backend names listed in different orders: for prompts no backend holds, both pick the same
// backend, and different prompts spread over the fleet.
func TestAdaptiveReplicasAgreeOnColdPrefixes(t *testing.T) {
	cfgs := local(8)
	rev := slices.Clone(cfgs)
	slices.Reverse(rev)
	g1, g2 := newFleet(t, cfgs...), newFleet(t, rev...)
	s1, s2 := adaptive(t, g1, "us-east"), adaptive(t, g2, "us-east")
	seen := map[string]bool{}
	for i := range 64 {
		p := text(uint64(100+i), 3000)
		r1, r2 := &Request{Model: "m", Prompt: p}, &Request{Model: "m", Prompt: p}
		a, err1 := s1.Pick(r1, g1.targets)
		b, err2 := s2.Pick(r2, g2.targets)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if a.Backend.Name() != b.Backend.Name() {
			t.Fatalf("prompt %d: replicas disagree: %s vs %s", i, a.Backend.Name(), b.Backend.Name())
		}
		seen[a.Backend.Name()] = true
	}
	if len(seen) < 6 {
		t.Fatalf("cold prompts went to only %d of 8 backends: %v", len(seen), seen)
	}
}

// TestAdaptiveNearTiedOwners: when several backends hold a prefix and cost about the same, two replicas (whose
// registries list the backends in different orders) pick the same owner every time, so the prefix's traffic does
// not alternate between caches; once that owner's queue pushes it out of the near-tie band, the next owner takes
// the traffic, so a hot prefix still spreads.
func TestAdaptiveNearTiedOwners(t *testing.T) {
	cfgs := local(3)
	rev := slices.Clone(cfgs)
	slices.Reverse(rev)
	f1, f2 := newFleet(t, cfgs...), newFleet(t, rev...)
	p := text(14, 4096)
	for _, n := range []string{"b0", "b1", "b2"} {
		f1.hold(n, p)
		f2.hold(n, p)
	}
	s1, s2 := adaptive(t, f1, ""), adaptive(t, f2, "")
	got1, got2 := f1.picks(s1, p, 50), f2.picks(s2, p, 50)
	if len(got1) != 1 || !maps.Equal(got1, got2) {
		t.Fatalf("three equal owners: replica 1 picked %v, replica 2 %v; want one owner, the same for both", got1, got2)
	}
	var owner string
	for n := range got1 {
		owner = n
	}
	// The owner's queue now costs far more than the band allows (4,096 queued tokens on a 10k tokens/s law):
	// both replicas move to the same next owner.
	f1.b(owner).Begin(4096)
	f2.b(owner).Begin(4096)
	next1, next2 := f1.picks(s1, p, 50), f2.picks(s2, p, 50)
	if len(next1) != 1 || next1[owner] != 0 || !maps.Equal(next1, next2) {
		t.Fatalf("owner %s loaded: replica 1 picked %v, replica 2 %v; want one other owner, the same for both",
			owner, next1, next2)
	}
}

// TestAdaptiveSeesSlowdownWithinSeconds serves open-loop traffic (10 requests per second, each decoding for 2 s)
// through Dispatch/FirstToken/ObserveUsage/End on a virtual clock, with TTFTs drawn from the simulator's law under
// the load each backend carries. b0 and b1 are equal and share the load until b0 becomes 5x slower; within three
// seconds of traffic b0's model shows it and b0 gets a small share.
func TestAdaptiveSeesSlowdownWithinSeconds(t *testing.T) {
	f := newFleet(t, local(2)...)
	s := adaptive(t, f, "")
	factor := map[string]float64{"b0": 1, "b1": 1}
	type event struct {
		at    time.Time
		a     *Attempt
		first bool
	}
	var events []event // pending, kept sorted by time
	push := func(e event) {
		i, _ := slices.BinarySearchFunc(events, e, func(x, y event) int { return x.at.Compare(y.at) })
		events = slices.Insert(events, i, e)
	}
	advanceTo := func(t time.Time) {
		for len(events) > 0 && !events[0].at.After(t) {
			e := events[0]
			events = events[1:]
			f.clk.ns.Store(e.at.UnixNano())
			if e.first {
				e.a.FirstToken()
				push(event{at: e.at.Add(2 * time.Second), a: e.a})
			} else {
				e.a.ObserveUsage(Usage{PromptTokens: 500, CompletionTokens: 100, HasCached: true})
				e.a.End(false)
			}
		}
		f.clk.ns.Store(t.UnixNano())
	}
	rng := rand.New(rand.NewPCG(5, 5))
	arrive := func(i int) string {
		r := &Request{Model: "m", Prompt: text(uint64(1000+i), 2000)}
		tg, err := s.Pick(r, f.targets)
		if err != nil {
			t.Fatal(err)
		}
		b := tg.Backend
		_, queued := b.Prefilling()
		a := b.Dispatch(r)
		ttft := noisy(rng, simLaw.scaled(factor[b.Name()]).at(500, float64(queued), float64(b.Decoding())), 0.05)
		push(event{at: f.clk.Now().Add(duration(ttft)), a: &a, first: true})
		return b.Name()
	}
	run := func(from, n int) map[string]int {
		count := map[string]int{}
		for i := range n {
			advanceTo(f.clk.Now().Add(100 * time.Millisecond))
			count[arrive(from+i)]++
		}
		return count
	}
	c := run(0, 100)
	t.Logf("before: %v", c)
	if c["b0"] < 25 || c["b1"] < 25 {
		t.Fatalf("equal backends: %v", c)
	}
	factor["b0"] = 5
	run(100, 30) // three seconds
	// Once b0 looks slower it gets little traffic, so its model sees few slow observations: it need not have
	// learned the whole 5x (TestTTFTModelSeesA5xSlowdownWithinSeconds checks that), only enough to be avoided.
	if m, _ := f.b("b0").PredictTTFT(500, 0); m < duration(1.5*simLaw.at(500, 0, 0)) {
		t.Fatalf("3 s after a 5x slowdown, b0's predicted TTFT is %v, want >= 1.5x %v", m, duration(simLaw.at(500, 0, 0)))
	}
	c = run(130, 50)
	m, _ := f.b("b0").PredictTTFT(500, 0)
	t.Logf("after: %v; b0 predicted %v", c, m)
	if c["b0"] > 10 {
		t.Fatalf("after b0 slowed 5x: %v, want b0 to get a small share", c)
	}
}

func TestCacheAware(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(f *fleet)
		want  []string
	}{
		{"follows a match over 30% despite more load", func(f *fleet) {
			f.hold("b2", text(20, 2048)) // 2 KiB of a 4 KiB prompt: 50%
			for range 10 {
				f.b("b2").Begin(1)
			}
		}, []string{"b2"}},
		{"ignores a match under 30%", func(f *fleet) {
			f.hold("b2", text(20, 1024)) // 25%
			f.b("b2").Begin(1)
		}, []string{"b0", "b1", "b3"}},
		{"imbalance beats the cache", func(f *fleet) {
			f.hold("b2", text(20, 4096))
			for range 100 {
				f.b("b2").Begin(1)
			}
			for _, n := range []string{"b0", "b1"} {
				for range 20 {
					f.b(n).Begin(1)
				}
			}
		}, []string{"b3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, local(4)...)
			tc.setup(f)
			prompt := text(20, 4096)
			for n := range f.picks(NewCacheAware(StrategyEnv{}), prompt, 40) {
				if !slices.Contains(tc.want, n) {
					t.Fatalf("picked %s, want one of %v", n, tc.want)
				}
			}
		})
	}
}

func TestPrefixHash(t *testing.T) {
	cfgs := local(6)
	rev := slices.Clone(cfgs)
	slices.Reverse(rev)
	f1, f2 := newFleet(t, cfgs...), newFleet(t, rev...)
	s1, s2 := NewPrefixHash(StrategyEnv{}), NewPrefixHash(StrategyEnv{})
	system := text(30, 1024) // a shared system prompt longer than the 8 key blocks
	seen := map[string]bool{}
	var owner string
	for i := range 20 {
		p := append(slices.Clone(system), text(uint64(31+i), 200)...)
		a, _ := s1.Pick(&Request{Model: "m", Prompt: p}, f1.targets)
		b, _ := s2.Pick(&Request{Model: "m", Prompt: p}, f2.targets)
		if a.Backend.Name() != b.Backend.Name() {
			t.Fatalf("instances disagree: %s vs %s", a.Backend.Name(), b.Backend.Name())
		}
		owner = a.Backend.Name()
		seen[owner] = true
	}
	if len(seen) != 1 {
		t.Fatalf("one system prompt went to %v", seen)
	}
	// Bounded load: once the owner carries more than 1.25x the mean, the key moves on.
	for range 10 {
		f1.b(owner).Begin(1)
	}
	if got, _ := s1.Pick(&Request{Model: "m", Prompt: system}, f1.targets); got.Backend.Name() == owner {
		t.Fatalf("overloaded owner %s still chosen", owner)
	}
	// Different prompts spread.
	spread := map[string]bool{}
	for i := range 60 {
		got, _ := s2.Pick(&Request{Model: "m", Prompt: text(uint64(500+i), 600)}, f2.targets)
		spread[got.Backend.Name()] = true
	}
	if len(spread) < 5 {
		t.Fatalf("60 prompts on %d of 6 backends", len(spread))
	}
}

func TestNewStrategy(t *testing.T) {
	for _, name := range StrategyNames() {
		s, err := NewStrategy(name, StrategyEnv{})
		if err != nil || s == nil {
			t.Fatalf("%s: %v", name, err)
		}
		f := newFleet(t, local(3)...)
		if _, err := s.Pick(&Request{Model: "m", Prompt: text(1, 300)}, f.targets); err != nil {
			t.Fatalf("%s: pick: %v", name, err)
		}
	}
	if s, err := NewStrategy("", StrategyEnv{}); err != nil {
		t.Fatal(err)
	} else if _, ok := s.(*Adaptive); !ok {
		t.Fatalf("default strategy is %T", s)
	}
	if _, err := NewStrategy("fastest", StrategyEnv{}); !errors.Is(err, ErrUnknownStrategy) {
		t.Fatalf("err = %v", err)
	}
	bad := DefaultAdaptiveParams()
	bad.KVThreshold = 2
	if _, err := NewStrategy(StrategyAdaptive, StrategyEnv{Adaptive: &bad}); err == nil {
		t.Fatal("kv_threshold 2 accepted")
	}
	want := []string{"adaptive", "cache_aware", "least_request", "prefix_hash", "random", "round_robin"}
	if got := StrategyNames(); !slices.Equal(got, want) {
		t.Fatalf("names %v, want %v", got, want)
	}
}

// benchFleet is 64 backends; 4 hold the whole 8 KiB prompt and all hold its first 8 blocks (a shared system
// prompt), and every backend has fresh engine metrics.
func benchFleet(b testing.TB) (*fleet, []byte) {
	cfgs := local(64)
	for i := 48; i < 64; i++ {
		cfgs[i].Region = "eu-west"
	}
	f := newFleet(b, cfgs...)
	p := text(77, 8192)
	for i, tg := range f.targets {
		n := tg.Backend.Name()
		if i%16 == 0 {
			f.hold(n, p)
		} else {
			f.hold(n, p[:512])
		}
		f.engine(n, float64(i%3), float64(i), 0.3)
	}
	return f, p
}

// BenchmarkPickAdaptive64 is the hot path: hashing an 8 KiB prompt, looking it up among 64 backends and
// choosing one by predicted cost.
func BenchmarkPickAdaptive64(b *testing.B) {
	f, p := benchFleet(b)
	s := adaptive(b, f, "us-east")
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

// BenchmarkPickCacheAware64 is SGLang's rule on the same fleet and prompt.
func BenchmarkPickCacheAware64(b *testing.B) {
	f, p := benchFleet(b)
	s := NewCacheAware(StrategyEnv{})
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

// BenchmarkPickLeastRequest64 is the baseline: least_request on the same fleet (no hashing, no lookup).
func BenchmarkPickLeastRequest64(b *testing.B) {
	f, p := benchFleet(b)
	var r Request
	b.ReportAllocs()
	start := processCPU()
	defer func() { reportCPU(b, start) }()
	for b.Loop() {
		r.Reset()
		r.Model, r.Prompt = "m", p
		if _, err := (LeastRequest{}).Pick(&r, f.targets); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDispatchLifecycle is the per-request bookkeeping after a pick: Dispatch (speculative insert of 128
// blocks), FirstToken (model update, confirm), ObserveUsage and End.
func BenchmarkDispatchLifecycle(b *testing.B) {
	f, p := benchFleet(b)
	s := adaptive(b, f, "us-east")
	var r Request
	b.ReportAllocs()
	start := processCPU()
	defer func() { reportCPU(b, start) }()
	for b.Loop() {
		r.Reset()
		r.Model, r.Prompt = "m", p
		tg, _ := s.Pick(&r, f.targets)
		a := tg.Backend.Dispatch(&r)
		f.clk.Advance(50 * time.Millisecond)
		a.FirstToken()
		a.ObserveUsage(Usage{PromptTokens: 2048, CompletionTokens: 100, CachedTokens: 2032, HasCached: true})
		a.End(false)
	}
}

// TestPickAllocatesNothing holds the hot path to its budget: with a reused Request, hashing, lookup and picking
// among 64 backends allocate nothing.
func TestPickAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool is lossy under the race detector")
	}
	f, p := benchFleet(t)
	for _, s := range []Strategy{adaptive(t, f, "us-east"), NewCacheAware(StrategyEnv{}), NewPrefixHash(StrategyEnv{})} {
		var r Request
		n := testing.AllocsPerRun(200, func() {
			r.Reset()
			r.Model, r.Prompt = "m", p
			if _, err := s.Pick(&r, f.targets); err != nil {
				t.Fatal(err)
			}
		})
		if n != 0 {
			t.Fatalf("%T: %v allocations per pick, want 0", s, n)
		}
	}
}

// TestAdaptiveFullSeatsSaturate: an engine that states its seats is saturated once they are all taken and a request
// waits for one, far below the queue threshold; without stated seats, or with a free seat, it is not.
func TestAdaptiveFullSeatsSaturate(t *testing.T) {
	for _, tc := range []struct {
		name             string
		maxSeqs, running float64
		policySeats      int
		waiting          float64
		saturated        bool
	}{
		{"stated seats full, one waiting", 16, 16, 0, 1, true},
		{"policy's seats full, one waiting", 0, 8, 8, 1, true},
		{"a free seat", 16, 15, 0, 1, false},
		{"full, no queue", 16, 16, 0, 0, false},
		{"seats unknown", 0, 16, 0, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfgs := local(2)
			cfgs[0].MaxNumSeqs = tc.policySeats
			f := newFleet(t, cfgs...)
			e := &EngineStats{Waiting: tc.waiting, Running: tc.running, MaxSeqs: tc.maxSeqs,
				Has: HasWaiting | HasRunning | HasKVUsage, At: f.clk.Now()}
			if tc.maxSeqs > 0 {
				e.Has |= HasMaxSeqs
			}
			f.b("b0").engine.Store(e)
			f.engine("b1", 0, 0, 0)
			sat := saturationOf(DefaultAdaptiveParams())
			b := f.b("b0")
			if got := sat.at(b.Config(), b.loadAt(f.clk.Now())); got != tc.saturated {
				t.Fatalf("saturated = %v, want %v", got, tc.saturated)
			}
			if got := sat.saturated(b, b.Config(), f.clk.Now()); got != tc.saturated {
				t.Fatalf("saturated (no load in hand) = %v, want %v", got, tc.saturated)
			}
		})
	}
}

// TestAdaptiveOwnerKeepsItsPrefix: the backend holding a prompt's prefix keeps it while another is cheaper only
// within the models' own errors, and loses it when its queued prefill really outweighs the prefill it saves.
func TestAdaptiveOwnerKeepsItsPrefix(t *testing.T) {
	prompt := text(21, 6000) // about 1,500 tokens
	truth := law{a: 0.015, perTok: 0.0001, perQueued: 0.0001, perRun: 0.0002}
	for _, tc := range []struct {
		name     string
		queued   int // prefill tokens queued on the owner
		wantKeep bool
	}{
		{"idle owner", 0, true},
		// A neighbour's cold prefill ahead costs about what the prefix saves (150 ms): within the errors.
		{"one prefill ahead", 1500, true},
		// Ten of them cost a second and a half against 150 ms of prefill elsewhere.
		{"a queue of prefills", 15000, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, local(4)...)
			for _, tg := range f.targets {
				f.train(tg.Backend.Name(), truth, 300)
				f.engine(tg.Backend.Name(), 0, 0, 0)
			}
			f.hold("b2", prompt)
			var atts []Attempt
			if tc.queued > 0 {
				atts = append(atts, f.b("b2").Begin(tc.queued))
			}
			got := f.picks(adaptive(t, f, ""), prompt, 50)
			if keep := got["b2"] == 50; keep != tc.wantKeep {
				t.Fatalf("picks %v, want the owner b2 kept: %v", got, tc.wantKeep)
			}
			for i := range atts {
				atts[i].End(false)
			}
		})
	}
}
