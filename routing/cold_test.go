package routing

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestPriorCalibration: on a fleet whose engines are three times as fast as the prior, a backend no request has
// reached yet is predicted at the fleet's speed once another backend has been observed, not at the prior's, and
// its own model starts from there; outside a registry nothing calibrates it.
func TestPriorCalibration(t *testing.T) {
	truth := law{a: 0.010, perTok: 0.00005, perQueued: 0.00005, perRun: 0.00007} // a third of the prior
	f := newFleet(t, local(4)...)
	fresh := f.b("b3")
	loose := NewBackend(&BackendConfig{Name: "x", URL: "http://x"})
	const u = 700.0
	want := truth.at(u, 0, 0)
	prior := fresh.lat.ttftMean(u, 0, 0)
	if r := prior / want; r < 2.5 {
		t.Fatalf("before any observation: predicted %.1f ms, %.2fx the engines' %.1f ms; want the prior's 3x",
			prior*1e3, r, want*1e3)
	}
	f.train("b0", truth, 40)
	got := fresh.lat.ttftMean(u, 0, 0)
	if r := got / want; r < 0.7 || r > 1.4 {
		t.Fatalf("after 40 observations of b0: unobserved b3 predicted %.1f ms, %.2fx the engines' %.1f ms; want within 0.7-1.4x",
			got*1e3, r, want*1e3)
	}
	if l := loose.lat.ttftMean(u, 0, 0); math.Abs(l-prior) > 1e-12 {
		t.Fatalf("a backend outside the registry moved from the prior: %.1f -> %.1f ms", prior*1e3, l*1e3)
	}
	// One observation of a prompt of another length: b3 starts from the calibrated prior, the loose backend
	// from the fixed one, so b3 predicts the first length better.
	rng := rand.New(rand.NewPCG(1, 2))
	y := truth.at(3000, 0, 0) * math.Exp(0.05*rng.NormFloat64())
	fresh.lat.observeTTFT(3000, 0, 0, y)
	loose.lat.observeTTFT(3000, 0, 0, y)
	e1 := math.Abs(math.Log(fresh.lat.ttftMean(u, 0, 0) / want))
	e2 := math.Abs(math.Log(loose.lat.ttftMean(u, 0, 0) / want))
	if e1 >= e2 || e1 > math.Log(1.4) {
		t.Fatalf("after one observation: log error %.2f from the calibrated start, %.2f from the fixed prior", e1, e2)
	}
}

// TestKnownFactor: the doubt about a model's mean is the prior's p90 factor before any observation and shrinks
// with the observations behind it, down to what the forgetting keeps.
func TestKnownFactor(t *testing.T) {
	v := priorSigma * priorSigma
	if k := knownFactor(v, 0); math.Abs(k-math.Exp(z90*priorSigma)) > 1e-12 {
		t.Fatalf("no observation: %.3f, want the prior's p90 factor %.3f", k, math.Exp(z90*priorSigma))
	}
	last := math.Inf(1)
	for _, n := range []int{0, 1, 3, 10, 100, rlsMemory} {
		k := knownFactor(v, n)
		if k >= last || k <= 1 {
			t.Fatalf("n=%d: %.3f after %.3f", n, k, last)
		}
		last = k
	}
	if knownFactor(v, 10*rlsMemory) != knownFactor(v, rlsMemory) {
		t.Fatal("more observations than the forgetting keeps still narrowed it")
	}
	if knownFactor(4, 0) != knownFactor(maxSigma*maxSigma, 0) {
		t.Fatal("the spread is not capped as the p90 factor's is")
	}
}

// TestPickCold drives pickCold's rules one by one on candidates whose costs are set by hand.
func TestPickCold(t *testing.T) {
	f := newFleet(t, local(8)...)
	const key = 0x5eed
	// The backends in rendezvous order for key.
	order := make([]int, len(f.targets))
	for i := range order {
		order[i] = i
	}
	score := func(i int) uint64 { return rendezvous(key, f.targets[i].Backend) }
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && score(order[j]) > score(order[j-1]); j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	first, second := order[0], order[1]
	base := func() []cand {
		cs := make([]cand, len(f.targets))
		for i := range cs {
			cs[i] = cand{i: i, cost: 0.100, pred: 0.080, spread: 1.1, known: 1.01}
		}
		return cs
	}
	band := 0.100*1.1 + 0.010
	name := func(i int) string { return f.targets[i].Backend.Name() }
	pick := func(cs []cand) string { return name(pickCold(cs, band, nearTie{0.1, 0.010}, key, f.targets).i) }
	expect := func(t *testing.T, cs []cand, want int) {
		t.Helper()
		if got := pick(cs); got != name(want) {
			t.Fatalf("picked %s, want %s", got, name(want))
		}
	}

	t.Run("all alike: the rendezvous winner", func(t *testing.T) {
		expect(t, base(), first)
	})
	t.Run("the second is cheaper", func(t *testing.T) {
		cs := base()
		cs[second].cost = 0.095
		expect(t, cs, second)
	})
	t.Run("the first serves a hot prefix", func(t *testing.T) {
		cs := base()
		cs[second].cost = 0.105 // dearer, but within the band
		b := f.targets[first].Backend
		b.warm.Add(2)
		defer b.warm.Add(-2)
		expect(t, cs, second)
	})
	t.Run("fewer requests in flight", func(t *testing.T) {
		cs := base()
		b := f.targets[first].Backend
		a := b.Begin(100)
		defer a.End(false)
		expect(t, cs, second)
	})
	t.Run("fewer in flight, but dearer beyond a near-tie", func(t *testing.T) {
		cs := base()
		cs[first].cost = 0.060 // cheaper by 40 ms: the count does not decide
		a := f.targets[first].Backend.Begin(100)
		defer a.End(false)
		if got := pick(cs); got != name(first) {
			t.Fatalf("picked %s, want the cheaper %s", got, name(first))
		}
	})
	t.Run("out of the band: not in the pair", func(t *testing.T) {
		cs := base()
		cs[first].cost = 0.300
		expect(t, cs, second)
	})
	t.Run("out of the band by its mean, not by what its model knows", func(t *testing.T) {
		// The first is a backend no request has reached (the prior's doubt: 125 ms less 38), the second is busy
		// and near-tied with it.
		a := f.targets[second].Backend.Begin(100)
		defer a.End(false)
		cs := base()
		cs[second].cost = 0.115
		cs[first].cost, cs[first].pred, cs[first].known = 0.125, 0.120, math.Exp(z90*priorSigma)
		if got := pick(cs); got != name(first) {
			t.Fatalf("picked %s, want the unobserved %s", got, name(first))
		}
		cs[first].known = 1.01 // as well known as the others: out of the band
		if got := pick(cs); got == name(first) {
			t.Fatalf("picked %s out of the band", got)
		}
		cs[first].known, cs[first].region = math.Exp(z90*priorSigma), 1 // the doubt does not cross a region
		if got := pick(cs); got == name(first) {
			t.Fatalf("picked %s in the next region by its doubt", got)
		}
	})
	t.Run("one candidate", func(t *testing.T) {
		cs := base()[:1]
		if got := pick(cs); got != name(0) {
			t.Fatalf("picked %s", got)
		}
	})
}

// TestColdPromptsSpreadOverHotOwners: on eight backends of which two serve a hot prefix, new prompts go to the
// other six (each prompt's pair of backends holds at least one of them but for one pair in 28), and without the
// hot traffic they go everywhere.
func TestColdPromptsSpreadOverHotOwners(t *testing.T) {
	f := newFleet(t, local(8)...)
	s := adaptive(t, f, "us-east")
	count := func() map[string]int {
		got := map[string]int{}
		for i := range 400 {
			r := &Request{Model: "m", Prompt: text(uint64(1000+i), 400)}
			tg, err := s.Pick(r, f.targets)
			if err != nil {
				t.Fatal(err)
			}
			got[tg.Backend.Name()]++
		}
		return got
	}
	calm := count()
	if len(calm) != 8 {
		t.Fatalf("without hot traffic, cold prompts reached %d of 8 backends: %v", len(calm), calm)
	}
	for _, n := range []string{"b2", "b5"} {
		f.b(n).warm.Add(3)
	}
	hot := count()
	if n := hot["b2"] + hot["b5"]; n > 400/28*2 {
		t.Fatalf("the two hot owners took %d of 400 cold prompts: %v", n, hot)
	}
}
