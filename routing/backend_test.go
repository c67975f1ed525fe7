package routing

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/cache"
	"github.com/switchyard/switchyard/metrics"
)

// matched returns how many blocks of prompt the index believes b holds.
func matched(f *fleet, name string, prompt []byte) int {
	hs := cache.AppendHashes(nil, cache.Seed("m"), prompt, 0)
	var c [1]int
	f.reg.Index().Lookup(hs, []*cache.Owner{f.b(name).prefixOwner()}, c[:])
	return c[0]
}

func TestDispatchInsertsSpeculativelyAndFirstTokenConfirms(t *testing.T) {
	f := newFleet(t, local(2)...)
	p := text(1, 4096) // 64 blocks, 1,024 tokens
	r := &Request{Model: "m", Prompt: p}
	tg, err := adaptive(t, f, "").Pick(r, f.targets)
	if err != nil {
		t.Fatal(err)
	}
	a := tg.Backend.Dispatch(r)
	name := tg.Backend.Name()
	if got := matched(f, name, p); got != 64 {
		t.Fatalf("after Dispatch: %d blocks indexed, want 64 (speculative)", got)
	}
	if req, tok := tg.Backend.Prefilling(); req != 1 || tok != 1024 {
		t.Fatalf("prefilling %d/%d, want 1/1024", req, tok)
	}
	// A second request with the same prompt, dispatched there before the first answers, is charged the prompt
	// less specPrior of the hit it would have once the first is prefilled (engines always compute the last
	// token): whether the engine lets it share a prefill still running is not known yet.
	r2 := &Request{Model: "m", Prompt: p}
	r2.hashes(cache.DefaultMaxBlocks)
	a2 := tg.Backend.Dispatch(r2)
	spec := 1023
	hit := int(specPrior * float64(spec))
	if want := 1024 + 1024 - hit; a2.hitTok != hit || tg.Backend.prefillTok.Load() != int64(want) {
		t.Fatalf("queued prefill %d (hit %d), want %d (hit %d)", tg.Backend.prefillTok.Load(), a2.hitTok, want, hit)
	}
	if a2.confTok != 0 || a2.specTok != 1023 {
		t.Fatalf("confirmed %d, speculative %d tokens: want 0 and 1023", a2.confTok, a2.specTok)
	}
	f.clk.Advance(100 * time.Millisecond)
	a.FirstToken()
	f.clk.Advance(3 * time.Second) // past the speculative TTL
	f.reg.Index().Sweep(f.clk.Now())
	if got := matched(f, name, p); got != 64 {
		t.Fatalf("confirmed entries expired: %d blocks", got)
	}
	a2.End(false)
	a.End(false)
	if tg.Backend.Inflight() != 0 {
		t.Fatalf("inflight %d", tg.Backend.Inflight())
	}
	r.Reset()
	r2.Reset()
}

func TestFailureBeforeFirstTokenDropsSpeculativeEntries(t *testing.T) {
	f := newFleet(t, local(1)...)
	p := text(2, 2048)
	r := &Request{Model: "m", Prompt: p}
	if _, err := adaptive(t, f, "").Pick(r, f.targets); err != nil {
		t.Fatal(err)
	}
	a := f.b("b0").Dispatch(r)
	a.End(true)
	if got := matched(f, "b0", p); got != 0 {
		t.Fatalf("after a failure before the first token: %d blocks still indexed", got)
	}
	if f.b("b0").Failures() != 1 {
		t.Fatal("failure not counted")
	}
}

func TestDispatchWithoutPickLooksUpItsBackend(t *testing.T) {
	f := newFleet(t, local(2)...)
	p := text(3, 2048)
	f.hold("b1", p)
	r := &Request{Model: "m", Prompt: p}
	if _, err := (&RoundRobin{}).Pick(r, f.targets); err != nil { // round_robin does not hash
		t.Fatal(err)
	}
	r.hashes(cache.DefaultMaxBlocks)
	a := f.b("b1").Dispatch(r)
	if a.hitTok != 511 { // 32 blocks of 16 tokens, capped at the prompt minus one token
		t.Fatalf("hit tokens %d, want 511", a.hitTok)
	}
	a.End(false)
}

func TestUsageCalibratesTheIndex(t *testing.T) {
	f := newFleet(t, local(1)...)
	b := f.b("b0")
	p := text(4, 4096)
	f.hold("b0", p)
	capBefore := b.prefixOwner().Capacity()
	for range 10 {
		r := &Request{Model: "m", Prompt: p}
		if _, err := adaptive(t, f, "").Pick(r, f.targets); err != nil {
			t.Fatal(err)
		}
		a := b.Dispatch(r)
		f.clk.Advance(50 * time.Millisecond)
		a.FirstToken()
		// The engine says it had nothing cached: the index is too optimistic.
		a.ObserveUsage(Usage{PromptTokens: 1024, CompletionTokens: 5, CachedTokens: 0, HasCached: true})
		a.End(false)
		r.Reset()
	}
	if c := b.prefixOwner().Capacity(); c >= capBefore*7/10 {
		t.Fatalf("capacity %d after 10 false hits, want well below %d", c, capBefore)
	}
	if s := b.hitScale.load(); s > 0.5 {
		t.Fatalf("hit scale %v after 10 false hits, want < 0.5", s)
	}
	if st := b.Status(); st.PrefixHitRate > 0.01 {
		t.Fatalf("prefix hit rate %v, want the engine's 0", st.PrefixHitRate)
	}
}

func TestTimeoutBeforeFirstTokenTeachesTheModel(t *testing.T) {
	f := newFleet(t, local(1)...)
	b := f.b("b0")
	before, _ := b.PredictTTFT(500, 0)
	for range 3 {
		a := b.Begin(500)
		f.clk.Advance(10 * time.Second) // a first-byte timeout
		a.End(true)
	}
	if after, _ := b.PredictTTFT(500, 0); after < 5*before {
		t.Fatalf("after three 10 s timeouts the prediction moved from %v to %v only", before, after)
	}
	// A fast failure (connection refused) says nothing about TTFT.
	g := newFleet(t, local(1)...)
	gb := g.b("b0")
	before, _ = gb.PredictTTFT(500, 0)
	a := gb.Begin(500)
	a.End(true)
	if after, _ := gb.PredictTTFT(500, 0); after != before {
		t.Fatalf("a fast failure moved the prediction from %v to %v", before, after)
	}
}

func TestEndTrainsTheITLModel(t *testing.T) {
	f := newFleet(t, local(1)...)
	b := f.b("b0")
	for range 100 {
		a := b.Begin(100)
		f.clk.Advance(50 * time.Millisecond)
		a.FirstToken()
		f.clk.Advance(99 * 8 * time.Millisecond) // 100 tokens, 8 ms apart
		a.ObserveUsage(Usage{PromptTokens: 100, CompletionTokens: 100})
		a.End(false)
	}
	if m, _ := b.PredictITL(); m < 7*time.Millisecond || m > 9*time.Millisecond {
		t.Fatalf("ITL %v, want about 8ms", m)
	}
}

// errorSamples returns the number of series of switchyard_ttft_prediction_error_ratio and their total count.
func errorSamples(t *testing.T, g prometheus.Gatherer) (series int, count uint64) {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == "switchyard_ttft_prediction_error_ratio" {
			for _, m := range f.GetMetric() {
				series++
				count += m.GetHistogram().GetSampleCount()
			}
		}
	}
	return series, count
}

func TestTTFTPredictionErrorIsExported(t *testing.T) {
	pr := prometheus.NewRegistry()
	m := metrics.New(pr)
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk), WithMetrics(m))
	b := reg.Sync(local(1))[0]
	for range 5 {
		a := b.Begin(1000)
		clk.Advance(200 * time.Millisecond)
		a.FirstToken()
		a.End(false)
	}
	if series, n := errorSamples(t, pr); series != 1 || n != 5 {
		t.Fatalf("%d series with %d observations, want 1 with 5", series, n)
	}
	// A backend removed by a reload takes its series with it.
	reg.Sync(nil)
	if series, _ := errorSamples(t, pr); series != 0 {
		t.Fatalf("%d series after removal, want 0", series)
	}
}

func TestRegistryRemovalDropsPrefixShare(t *testing.T) {
	f := newFleet(t, local(2)...)
	p := text(5, 1024)
	f.hold("b0", p)
	old := f.b("b0")
	kept := f.reg.Sync(local(2)[1:])
	if kept[0] != f.b("b1") {
		t.Fatal("b1 was not kept")
	}
	if old.prefixOwner() != nil {
		t.Fatal("a removed backend kept its prefix share")
	}
	// Its attempts still end cleanly.
	r := &Request{Model: "m", Prompt: p}
	r.hashes(cache.DefaultMaxBlocks)
	a := old.Dispatch(r)
	a.FirstToken()
	a.End(false)
}

func TestStatus(t *testing.T) {
	f := newFleet(t, local(1)...)
	b := f.b("b0")
	b.observeProbe(20 * time.Millisecond)
	f.engine("b0", 3, 5, 0.4)
	b.Begin(100)
	s := f.reg.Status()[0]
	if s.Name != "b0" || s.Region != "us-east" || !s.Healthy || s.Inflight != 1 || s.QueueDepth != 3 ||
		s.KVUsage != 0.4 || s.Stale || s.RTTms != 20 {
		t.Fatalf("status %+v", s)
	}
	if s.TTFTms <= s.RTTms || s.TTFTp90ms < s.TTFTms || s.ITLms <= 0 {
		t.Fatalf("predictions %v/%v/%v", s.TTFTms, s.TTFTp90ms, s.ITLms)
	}
	hosted := newFleet(t, &BackendConfig{Name: "h", URL: "https://api.example", Engine: EngineOpenAI})
	if hosted.reg.Status()[0].Stale {
		t.Fatal("a hosted backend, never scraped, reported stale")
	}
}

func TestRTTTakesTheLargerWindowedMinimum(t *testing.T) {
	b := NewBackend(&BackendConfig{Name: "x"})
	for i := range 20 {
		b.ObserveRTT(time.Millisecond)
		// Probes of a far backend: 80 ms, with host delays on top of some of them.
		b.observeProbe(80*time.Millisecond + time.Duration(i%3)*30*time.Millisecond)
	}
	if rtt := b.RTT(); rtt != 80*time.Millisecond {
		t.Fatalf("RTT %v, want 80ms", rtt)
	}
	// The window forgets: after 8 longer probes the old minimum is gone.
	for range 8 {
		b.observeProbe(100 * time.Millisecond)
	}
	if rtt := b.RTT(); rtt != 100*time.Millisecond {
		t.Fatalf("RTT %v after the path got longer, want 100ms", rtt)
	}
}

// TestConcurrentRequestPath runs picks and whole attempts from several goroutines while another publishes
// engine snapshots, reloads the registry and sweeps the index (run it with -race). Accounting must come back
// to zero.
func TestConcurrentRequestPath(t *testing.T) {
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	cfgs := local(6)
	bs := reg.Sync(cfgs)
	targets := make([]Target, len(bs))
	for i, b := range bs {
		targets[i] = Target{Backend: b, Model: "m"}
	}
	strategies := []Strategy{adaptive(t, &fleet{t: t, reg: reg, clk: clk}, "us-east"),
		NewCacheAware(StrategyEnv{}), NewPrefixHash(StrategyEnv{}), &RoundRobin{}}
	prompts := make([][]byte, 8)
	for i := range prompts {
		prompts[i] = text(uint64(i), 500+i*700)
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the Monitor's side
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-done:
				return
			default:
			}
			b := bs[i%len(bs)]
			b.engine.Store(&EngineStats{Waiting: float64(i % 7), Running: float64(i % 30), KVUsage: 0.5,
				Has: HasWaiting | HasRunning | HasKVUsage, At: clk.Now()})
			b.observeProbe(time.Duration(i%5) * time.Millisecond)
			if i%50 == 0 {
				reg.Sync(cfgs) // a reload that keeps every backend
				reg.Index().Sweep(clk.Now())
			}
			_ = reg.Status()
		}
	}()
	var workers sync.WaitGroup
	for g := range 4 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			var r Request
			for i := range 300 {
				r.Reset()
				r.Model, r.Prompt = "m", prompts[(g+i)%len(prompts)]
				tg, err := strategies[(g+i)%len(strategies)].Pick(&r, targets)
				if err != nil {
					t.Error(err)
					return
				}
				a := tg.Backend.Dispatch(&r)
				clk.Advance(time.Millisecond)
				if i%5 == 0 {
					a.End(true)
					continue
				}
				a.FirstToken()
				a.ObserveUsage(Usage{PromptTokens: 300, CompletionTokens: 20, CachedTokens: 64, HasCached: true})
				a.End(false)
			}
			r.Reset()
		}()
	}
	workers.Wait()
	close(done)
	wg.Wait()
	for _, b := range bs {
		if req, tok := b.Prefilling(); b.Inflight() != 0 || req != 0 || tok != 0 || b.Decoding() != 0 {
			t.Fatalf("%s: inflight %d prefilling %d/%d decoding %d", b.Name(), b.Inflight(), req, tok, b.Decoding())
		}
	}
}

// TestRevisedTTFT: a request predicted as a prefix hit that the engine reports as a miss has a revised prediction
// for the prefill it really did, larger than the one made at dispatch; one the engine confirms keeps it.
func TestRevisedTTFT(t *testing.T) {
	f := newFleet(t, local(1)...)
	b := f.b("b0")
	f.train("b0", simLaw, 200)
	p := text(5, 4096)
	f.hold("b0", p)
	for _, tc := range []struct {
		name   string
		cached int
		longer bool
	}{{"the engine had evicted the prefix", 0, true}, {"the engine held it", 1008, false}} {
		r := &Request{Model: "m", Prompt: p}
		if _, err := adaptive(t, f, "").Pick(r, f.targets); err != nil {
			t.Fatal(err)
		}
		a := b.Dispatch(r)
		if !a.PredictedHit() {
			t.Fatalf("%s: the dispatch did not count on the held prefix", tc.name)
		}
		pred := a.PredictedTTFT()
		if a.RevisedTTFT() != pred {
			t.Fatalf("%s: revised %v before any usage, want the prediction %v", tc.name, a.RevisedTTFT(), pred)
		}
		f.clk.Advance(50 * time.Millisecond)
		a.FirstToken()
		a.ObserveUsage(Usage{PromptTokens: 1024, CompletionTokens: 5, CachedTokens: tc.cached, HasCached: true})
		rev := a.RevisedTTFT()
		if tc.longer && rev < 3*pred {
			t.Errorf("%s: revised %v, predicted %v; a miss of 1,024 tokens must be judged as one", tc.name, rev, pred)
		}
		if !tc.longer && (rev > pred*11/10 || rev < pred*9/10) {
			t.Errorf("%s: revised %v, predicted %v; a confirmed hit keeps the prediction", tc.name, rev, pred)
		}
		a.End(false)
		r.Reset()
	}
}

// TestPrefillAheadAtThePrefillCost: whatever the model's queued-prefill term learned (here nothing: first tokens
// that never depended on the queue), prefill held or queued ahead delays a first token by at least its tokens at
// the engine's own prefill cost per token; Unhold gives the held tokens back.
func TestPrefillAheadAtThePrefillCost(t *testing.T) {
	b := NewBackend(&BackendConfig{Name: "x"})
	rng := rand.New(rand.NewPCG(1, 2))
	for range 400 {
		u, q := 100+rng.Float64()*1400, rng.Float64()*3000
		b.lat.observeTTFT(u, q, 30, 0.030+u*0.0001) // a cost per prompt token, nothing for the queue
	}
	per := b.lat.prefillPerToken()
	fit := b.lat.ttftMean(300, 2300, 30) - b.lat.ttftMean(300, 0, 30) // the model's queued term alone
	if !(per > 0) || fit >= 2300*per {
		t.Fatalf("learned %.4f ms a prompt token and a queued term of %.1f ms for 2,300 tokens; the test needs "+
			"the queued term below the prompt's cost", per*1000, fit*1000)
	}
	b.Hold(2000)
	ahead, _, queued := b.PrefillAhead(300)
	if want := duration(2300 * per); !queued || ahead < want-time.Microsecond || ahead > want+time.Microsecond {
		t.Errorf("2,000 tokens held: ahead %v, queued %v; want %v (2,300 tokens at the learned %.4f ms; the "+
			"queued term gives %.1f ms), true", ahead, queued, want, per*1000, fit*1000)
	}
	b.Unhold(2000)
	if _, _, queued := b.PrefillAhead(300); queued {
		t.Error("still queued after Unhold")
	}
}

// TestPrefillAhead: nothing queued delays nothing; prefill dispatched and not yet answered delays a new request's
// first token by the model's queued-prefill term, and the delay ends with the first token.
func TestPrefillAhead(t *testing.T) {
	b := NewBackend(&BackendConfig{Name: "x"})
	ahead, idle, queued := b.PrefillAhead(300)
	if queued || idle <= 0 {
		t.Fatalf("idle backend: queued %v, idle first token %v; want false, > 0", queued, idle)
	}
	alone := ahead // the request's own 300 tokens, with nothing before them
	a := b.Begin(2000)
	ahead, idle2, queued := b.PrefillAhead(300)
	if !queued || ahead <= alone || idle2 != idle {
		t.Errorf("2,000 tokens queued: ahead %v (alone %v), queued %v, idle %v (before %v); want more, true, same",
			ahead, alone, queued, idle2, idle)
	}
	// The prior's 0.15 ms per queued token: 2,300 tokens ahead of the next first token are some 345 ms.
	if want := 345 * time.Millisecond; ahead < want*9/10 || ahead > want*11/10 {
		t.Errorf("ahead %v with the prior's coefficient, want about %v", ahead, want)
	}
	a.FirstToken()
	if _, _, queued := b.PrefillAhead(300); queued {
		t.Error("still queued after the first token")
	}
	a.End(false)
}
