package routing

import (
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a virtual Clock: time moves only when a test advances it.
type fakeClock struct{ ns atomic.Int64 }

func newFakeClock() *fakeClock {
	c := &fakeClock{}
	c.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	return c
}

func (c *fakeClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// law is a known linear TTFT law in the model's units (seconds; tokens and sequences unscaled).
type law struct{ a, perTok, perQueued, perRun float64 }

func (l law) at(u, q, r float64) float64 { return l.a + l.perTok*u + l.perQueued*q + l.perRun*r }

func (l law) scaled(k float64) law {
	return law{l.a * k, l.perTok * k, l.perQueued * k, l.perRun * k}
}

// features draws a plausible dispatch state.
func features(rng *rand.Rand) (u, q, r float64) {
	return float64(16 + rng.IntN(4000)), float64(rng.IntN(3) * rng.IntN(3000)), float64(rng.IntN(64))
}

// noisy multiplies v by log-normal noise of the given sigma.
func noisy(rng *rand.Rand, v, sigma float64) float64 { return v * math.Exp(sigma*rng.NormFloat64()) }

// relErrOnGrid returns the largest relative error of l's mean prediction against truth over a grid of states.
func relErrOnGrid(l *latency, truth law) float64 {
	worst := 0.0
	for _, u := range []float64{64, 500, 2000, 4000} {
		for _, q := range []float64{0, 1000, 4000} {
			for _, r := range []float64{0, 16, 48} {
				want := truth.at(u, q, r)
				worst = max(worst, math.Abs(l.ttftMean(u, q, r)-want)/want)
			}
		}
	}
	return worst
}

func TestTTFTModelConvergesToLinearLaw(t *testing.T) {
	for _, tc := range []struct {
		name  string
		truth law
	}{
		{"H100-like", law{a: 0.025, perTok: 0.00008, perQueued: 0.00009, perRun: 0.0002}},
		{"L4-like", law{a: 0.060, perTok: 0.0009, perQueued: 0.0008, perRun: 0.001}},
		// Queued prefill drains at half the request's own prefill rate: the floor of c (see rlsSpec.queueFloor).
		{"cheap queue", law{a: 0.040, perTok: 0.0003, perQueued: 0.00015, perRun: 0.0005}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			var l latency
			l.init()
			for range 400 {
				u, q, r := features(rng)
				l.observeTTFT(u, q, r, noisy(rng, tc.truth.at(u, q, r), 0.05))
			}
			if e := relErrOnGrid(&l, tc.truth); e > 0.15 {
				t.Fatalf("worst relative error after 400 observations = %.3f, want <= 0.15 (theta %v)", e, l.ttft.theta)
			}
			for i, v := range l.ttft.theta {
				if v < 0 {
					t.Fatalf("coefficient %d = %v < 0", i, v)
				}
			}
		})
	}
}

func TestTTFTModelSeesA5xSlowdownWithinSeconds(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	truth := law{a: 0.030, perTok: 0.0001, perQueued: 0.0001, perRun: 0.0002}
	var l latency
	l.init()
	for range 300 {
		u, q, r := features(rng)
		l.observeTTFT(u, q, r, noisy(rng, truth.at(u, q, r), 0.05))
	}
	slow := truth.scaled(5)
	// At 10 requests per second, 20 observations are two seconds of traffic.
	for range 20 {
		u, q, r := features(rng)
		l.observeTTFT(u, q, r, noisy(rng, slow.at(u, q, r), 0.05))
	}
	if e := relErrOnGrid(&l, slow); e > 0.3 {
		t.Fatalf("20 observations after a 5x slowdown: worst relative error %.3f, want <= 0.3", e)
	}
	// And back: the recovery is seen as fast.
	for range 20 {
		u, q, r := features(rng)
		l.observeTTFT(u, q, r, noisy(rng, truth.at(u, q, r), 0.05))
	}
	if e := relErrOnGrid(&l, truth); e > 0.3 {
		t.Fatalf("20 observations after recovery: worst relative error %.3f, want <= 0.3", e)
	}
}

func TestTTFTModelShrugsOffTwoOutliers(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	truth := law{a: 0.030, perTok: 0.0002, perQueued: 0.0002, perRun: 0.0003}
	var l latency
	l.init()
	for range 300 {
		u, q, r := features(rng)
		l.observeTTFT(u, q, r, noisy(rng, truth.at(u, q, r), 0.05))
	}
	l.observeTTFT(1000, 0, 8, 10*truth.at(1000, 0, 8))  // a stall...
	l.observeTTFT(300, 500, 8, 8*truth.at(300, 500, 8)) // ...that caught two requests
	if e := relErrOnGrid(&l, truth); e > 0.3 {
		t.Fatalf("after two consecutive ~10x outliers: worst relative error %.3f, want <= 0.3", e)
	}
}

func TestTTFTP90CoversNinetyPercent(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	truth := law{a: 0.030, perTok: 0.0002, perQueued: 0.0002, perRun: 0.0003}
	var l latency
	l.init()
	for range 500 {
		u, q, r := features(rng)
		l.observeTTFT(u, q, r, noisy(rng, truth.at(u, q, r), 0.25))
	}
	below := 0
	const n = 2000
	for range n {
		u, q, r := features(rng)
		obs := noisy(rng, truth.at(u, q, r), 0.25)
		if obs <= l.ttftMean(u, q, r)*l.ttftSpread.load() {
			below++
		}
	}
	if share := float64(below) / n; share < 0.82 || share > 0.96 {
		t.Fatalf("p90 covers %.3f of observations, want about 0.9", share)
	}
}

func TestTTFTModelKeepsCoefficientsInBounds(t *testing.T) {
	var l latency
	l.init()
	rng := rand.New(rand.NewPCG(9, 10))
	// A perverse law: longer prompts answer faster. The model must not go negative.
	for range 300 {
		u, q, r := features(rng)
		l.observeTTFT(u, q, r, max(0.5-0.0001*u, 0.01))
	}
	for i := range 4 {
		if v := l.ttft.theta[i]; v < ttftPrior.lo[i] || v > ttftPrior.hi[i] {
			t.Fatalf("coefficient %d = %v outside [%v, %v]", i, v, ttftPrior.lo[i], ttftPrior.hi[i])
		}
	}
	if p := l.ttftMean(4000, 0, 0); p <= 0 {
		t.Fatalf("prediction %v <= 0", p)
	}
}

func TestITLModelConverges(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	e, f := 0.012, 0.0004 // 12 ms + 0.4 ms per running sequence
	var l latency
	l.init()
	for range 300 {
		run := float64(1 + rng.IntN(128))
		l.observeITL(run, noisy(rng, e+f*run, 0.03))
	}
	for _, run := range []float64{1, 32, 128} {
		want := e + f*run
		if got := l.itlMean(run); math.Abs(got-want)/want > 0.1 {
			t.Fatalf("ITL at %v running = %v, want %v", run, got, want)
		}
	}
}

func TestPriorIsUsableAtOnce(t *testing.T) {
	var l latency
	l.init()
	// The simulator's defaults: 10 ms overhead, 20 ms steps, 10,000 prefill tokens/s. 1,000 tokens: ~130 ms.
	if p := l.ttftMean(1000, 0, 0); p < 0.05 || p > 0.5 {
		t.Fatalf("prior TTFT for 1,000 tokens = %v s, want a plausible 0.05-0.5 s", p)
	}
	if p := l.itlMean(1); p < 0.005 || p > 0.1 {
		t.Fatalf("prior ITL = %v s", p)
	}
}

// A fit deferred to the end of a stream (the engine reports cached_tokens) may land after a regime change that
// its first token preceded. Such an old-regime observation must not pull the rescaled model back: when it did,
// the per-token coefficient went to zero and long prompts looked cheap on the slowed backend.
func TestTTFTLateFitsOfTheOldRegimeDoNotUndoAChange(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	var l latency
	l.init()
	for range 300 {
		u, q, r := features(rng)
		l.observeTTFT(u, q, r, noisy(rng, simLaw.at(u, q, r), 0.05))
	}
	type obs struct {
		u, q, r, y float64
		s          seen
	}
	// Streams that had their first tokens before the slowdown, of all prompt lengths, still decoding.
	var old []obs
	for range 6 {
		u, q, r := features(rng)
		y := noisy(rng, simLaw.at(u, q, r), 0.05)
		old = append(old, obs{u, q, r, y, l.detectTTFT(u, q, r, y)})
	}
	// The slowdown, seen at the first tokens of three short prompts: the detector fires.
	slow := simLaw.scaled(5)
	var fresh []obs
	for _, u := range []float64{40, 79, 390} {
		y := slow.at(u, 0, 8)
		fresh = append(fresh, obs{u, 0, 8, y, l.detectTTFT(u, 0, 8, y)})
	}
	if l.ttftE.level == 0 {
		t.Fatal("three 5x errors did not fire the regime detector")
	}
	// The old streams end first, then the slow ones.
	for _, o := range append(old, fresh...) {
		l.fitTTFT(o.u, o.q, o.r, o.y, &o.s)
	}
	if e := relErrOnGrid(&l, slow); e > 0.35 {
		t.Fatalf("after the change and the old regime's late fits: worst relative error %.3f against the 5x law, "+
			"want <= 0.35 (theta %v)", e, l.ttft.theta)
	}
}

// The sequence sim-a saw in a run of bench/scenarios/routing-slow-backend.yaml where adaptive then sent it three
// long documents (4,235 to 8,023 prompt tokens) whose first tokens took 2.3 to 5.1 s: every request to sim-a from
// the start of the run to that first document, as the gateway logged it (dispatch, TTFT and end in ms from the
// first dispatch; prompt and completion tokens). sim-a became 5x slower at about 14.2 s; the requests dispatched
// before that answered at the normal speed and ended, their fits deferred to their usage, after the change.
var slowBackendRun = []struct{ start, ttft, in, out, end int }{
	{0, 38, 268, 196, 4429}, {593, 54, 80, 113, 3178}, {625, 56, 148, 56, 1994}, {1007, 236, 1973, 124, 3795},
	{2481, 68, 314, 137, 5547}, {2979, 56, 169, 31, 3653}, {3345, 44, 59, 763, 37484}, {4017, 58, 199, 36, 4950},
	{4145, 199, 1478, 33, 5010}, {4856, 52, 146, 53, 5993}, {5185, 66, 195, 147, 8407}, {5328, 56, 105, 65, 6831},
	{6141, 143, 1078, 156, 9519}, {6523, 57, 117, 32, 7241}, {6657, 49, 42, 478, 34695}, {6692, 57, 220, 295, 13027},
	{7736, 54, 191, 247, 13068}, {8956, 50, 87, 78, 10659}, {9569, 66, 141, 25, 10163}, {9718, 74, 343, 176, 13657},
	{10554, 63, 237, 106, 12902}, {10714, 92, 463, 514, 39291}, {11809, 82, 133, 79, 13679},
	{12120, 68, 292, 165, 31735}, {12466, 60, 243, 427, 39152}, {12964, 62, 207, 67, 16988},
	{13367, 145, 921, 64, 18648},
	{14252, 209, 40, 90, 32460}, {14898, 223, 79, 25, 17820}, {15141, 383, 390, 45, 28615}, // 5x slower
}

func TestTTFTModelReplaysTheSlowBackendRun(t *testing.T) {
	f := newFleet(t, local(1)...)
	b := f.b("b0")
	epoch := f.clk.Now()
	at := func(ms int) time.Time { return epoch.Add(time.Duration(ms) * time.Millisecond) }
	type event struct {
		at    time.Time
		i     int
		a     *Attempt
		first bool
	}
	var events []event
	push := func(e event) {
		i, _ := slices.BinarySearchFunc(events, e, func(x, y event) int { return x.at.Compare(y.at) })
		events = slices.Insert(events, i, e)
	}
	advanceTo := func(t time.Time) {
		for len(events) > 0 && !events[0].at.After(t) {
			e := events[0]
			events = events[1:]
			f.clk.ns.Store(e.at.UnixNano())
			r := slowBackendRun[e.i]
			if e.first {
				e.a.FirstToken()
				push(event{at: at(r.end), i: e.i, a: e.a})
			} else {
				e.a.ObserveUsage(Usage{PromptTokens: r.in, CompletionTokens: r.out, HasCached: true})
				e.a.End(false)
			}
		}
		f.clk.ns.Store(t.UnixNano())
	}
	const doc = 4235 // the first long document, dispatched at 18,731 ms
	var before float64
	for i, r := range slowBackendRun {
		advanceTo(at(r.start))
		if r.start == 14252 {
			before = b.lat.ttftMean(doc, 0, 0)
		}
		a := b.Begin(r.in)
		push(event{at: at(r.start + r.ttft), i: i, a: &a, first: true})
	}
	advanceTo(at(18731))
	// The three short prompts came back 4.1x, 4.1x and 4.6x slower than predicted; a slowdown is multiplicative,
	// so the document's prediction must have grown by about as much, not only by the short prompts' fixed cost.
	if after := b.lat.ttftMean(doc, 0, 0); after < 3*before {
		t.Fatalf("a %d-token prompt on the slowed backend: predicted %.0f ms, %.2fx the %.0f ms before the slowdown; "+
			"want >= 3x (theta %v)", doc, after*1e3, after/before, before*1e3, b.lat.ttft.theta)
	}
}

// TestModelStatusStatesItsError: the coefficients /debug/backends shows are within a few of their standard errors
// of the law the engine follows, the standard errors are neither zero nor wider than the values, and the recent
// prediction errors centre on 1 with a spread like the noise.
func TestModelStatusStatesItsError(t *testing.T) {
	truth := law{a: 0.025, perTok: 0.0001, perQueued: 0.0001, perRun: 0.0004}
	const sigma = 0.1
	rng := rand.New(rand.NewPCG(7, 8))
	var l latency
	l.init()
	for range 600 {
		u, q, r := features(rng)
		l.observeTTFT(u, q, r, noisy(rng, truth.at(u, q, r), sigma))
	}
	st, _ := l.status()
	want := []float64{truth.a * 1e3, truth.perTok * 1e6, truth.perQueued * 1e6, truth.perRun * 1e5}
	if st.Samples != 600 || len(st.Coefficients) != 4 {
		t.Fatalf("status %+v", st)
	}
	for i, c := range st.Coefficients {
		t.Logf("%s = %.4g ± %.4g %s (law %.4g)", c.Name, c.Value, c.StdErr, c.Unit, want[i])
		if c.StdErr <= 0 || c.StdErr > c.Value {
			t.Errorf("%s: standard error %.4g of %.4g", c.Name, c.StdErr, c.Value)
		}
		if d := math.Abs(c.Value - want[i]); d > 4*c.StdErr {
			t.Errorf("%s = %.4g ± %.4g %s, the law has %.4g", c.Name, c.Value, c.StdErr, c.Unit, want[i])
		}
	}
	t.Logf("errors p10 %.3f p50 %.3f p90 %.3f, sigma %.3f", st.ErrorP10, st.ErrorP50, st.ErrorP90, st.Sigma)
	if st.ErrorP50 < 0.95 || st.ErrorP50 > 1.05 || st.ErrorP10 > 0.95 || st.ErrorP90 < 1.05 || st.ErrorP90 > 1.4 {
		t.Errorf("prediction errors p10 %.3f p50 %.3f p90 %.3f for log-normal noise of sigma %.2f", st.ErrorP10, st.ErrorP50, st.ErrorP90, sigma)
	}
	if st.Sigma < sigma/2 || st.Sigma > 2*sigma {
		t.Errorf("sigma %.3f for noise %.2f", st.Sigma, sigma)
	}
}
