package routing

import (
	"math"
	"math/rand/v2"
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
