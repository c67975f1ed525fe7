package admission

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

const pred = 100 * time.Millisecond

// newDetector returns a detector of names plus a healthy backend "peer" with a full window of good
// observations: the rules judge a backend against its peers, so a test of one bad backend needs a healthy pool.
func newDetector(t *testing.T, names ...string) (*OutlierDetector, *fakeClock, *metrics.Gateway) {
	t.Helper()
	clk := newFakeClock()
	m := metrics.New(prometheus.NewRegistry())
	d := NewOutlierDetector(OutlierParams{}, clk, m, nil)
	d.Update(append(names, "peer"))
	feed(d.Get("peer"), 20, 0, 0)
	return d, clk, m
}

// feed records good observations, then slow ones (4x the prediction), then errors.
func feed(o *Outlier, good, slow, errors int) {
	for range good {
		o.Observe(true, pred, pred)
	}
	for range slow {
		o.Observe(true, 4*pred, pred)
	}
	for range errors {
		o.Observe(false, 0, 0)
	}
}

func TestOutlierEjection(t *testing.T) {
	for _, tc := range []struct {
		name             string
		good, slow, errs int
		want             OutlierState
		reason           string
	}{
		{"healthy", 100, 0, 0, Serving, ""},
		{"p90 of the ratio above 3", 25, 5, 0, Ejected, "slow"},
		{"exactly 10% slow is not an outlier", 18, 2, 0, Serving, ""},
		{"three slow of twenty may be chance", 17, 3, 0, Serving, ""},
		{"error rate above 5%", 18, 0, 2, Ejected, "errors"},
		{"exactly 5% errors is not an outlier", 19, 0, 1, Serving, ""},
		{"too few observations to judge", 0, 10, 9, Serving, ""},
		{"slow without a prediction does not count", 0, 0, 0, Serving, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, _, m := newDetector(t, "a", "b")
			o := d.Get("a")
			feed(o, tc.good, tc.slow, tc.errs)
			if tc.name == "slow without a prediction does not count" {
				for range 30 {
					o.Observe(true, 10*pred, 0)
				}
			}
			if o.State() != tc.want {
				t.Fatalf("state %v, want %v", o.State(), tc.want)
			}
			if tc.want == Ejected {
				if o.Available() || o.Acquire() {
					t.Error("an ejected backend is available")
				}
				if got := value(t, m.OutlierEjections.WithLabelValues("a", tc.reason)); got != 1 {
					t.Errorf("ejections{%s} = %v", tc.reason, got)
				}
				if got := value(t, m.OutlierState.WithLabelValues("a")); got != float64(Ejected) {
					t.Errorf("state gauge = %v", got)
				}
			} else if !o.Available() || !o.Acquire() {
				t.Error("a serving backend is not available")
			}
		})
	}
}

// TestOutlierBack: an engine found answering again after failed scrapes ends an ejection for errors at once,
// and the backend is probed (a failed probe ejects it again, for longer); an ejection for slowness ends so only
// for another process. Serving and probing backends are left as they are.
func TestOutlierBack(t *testing.T) {
	for _, tc := range []struct {
		name       string
		slow, errs int
		restarted  bool
		want       OutlierState
	}{
		{"errors, the same process", 0, 20, false, Probing},
		{"errors, another process", 0, 20, true, Probing},
		{"slow, the same process", 5, 0, false, Ejected},
		{"slow, another process", 5, 0, true, Probing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, clk, m := newDetector(t, "a", "b")
			o := d.Get("a")
			feed(o, 20, tc.slow, tc.errs)
			if o.State() != Ejected {
				t.Fatalf("not ejected: %v", o.State())
			}
			clk.Advance(time.Second)
			o.Back(tc.restarted)
			if o.State() != tc.want {
				t.Fatalf("after Back(%v): %v, want %v", tc.restarted, o.State(), tc.want)
			}
			if tc.want == Ejected {
				if o.Available() {
					t.Error("still ejected, yet available")
				}
				return
			}
			if got := value(t, m.OutlierState.WithLabelValues("a")); got != float64(Probing) {
				t.Errorf("state gauge = %v, want probing", got)
			}
			if !o.Available() || !o.Acquire() {
				t.Fatal("no probe granted")
			}
			// The probe fails: ejected again, for 60 s (the second ejection in a row), not for 30 s less the second.
			o.Observe(false, 0, 0)
			clk.Advance(59 * time.Second)
			if o.State() != Ejected {
				t.Fatalf("a failed probe after Back: %v 59 s later, want ejected", o.State())
			}
			// An engine back again ends that one too (if it was for errors); three good probes then return it.
			o.Back(true)
			for i := range 3 {
				if !o.Acquire() {
					t.Fatalf("probe %d not granted (%v)", i+1, o.State())
				}
				o.Observe(true, pred, pred)
			}
			if o.State() != Serving {
				t.Fatalf("after three good probes: %v", o.State())
			}
			o.Back(true) // nothing to end
			if o.State() != Serving || d.out.Load() != 0 {
				t.Fatalf("Back on a serving backend: %v, %d out of service", o.State(), d.out.Load())
			}
		})
	}
}

// TestOutlierWindow: observations older than the window no longer count.
func TestOutlierWindow(t *testing.T) {
	d, clk, _ := newDetector(t, "a", "b")
	o := d.Get("a")
	feed(o, 19, 0, 0)
	clk.Advance(31 * time.Second)
	feed(o, 0, 0, 2)
	if o.State() != Serving {
		t.Fatalf("ejected on 2 errors after the 19 good observations left the window")
	}
	d2, _, _ := newDetector(t, "a", "b")
	o2 := d2.Get("a")
	feed(o2, 19, 0, 2) // the same, within the window: 2 of 21 failed
	if o2.State() != Ejected {
		t.Fatalf("state %v: the control case must eject", o2.State())
	}
}

// TestOutlierProbing: an ejection ends in probing (one request at a time); Probes good ones bring the backend
// back, a bad one ejects it again for longer, up to MaxEjection.
func TestOutlierProbing(t *testing.T) {
	d, clk, m := newDetector(t, "a", "b")
	o := d.Get("a")
	feed(o, 0, 0, 20)
	lengths := []time.Duration{30 * time.Second, 60 * time.Second, 90 * time.Second}
	for i, length := range lengths {
		if o.State() != Ejected {
			t.Fatalf("ejection %d: state %v", i+1, o.State())
		}
		clk.Advance(length - time.Millisecond)
		if o.Available() || o.Acquire() {
			t.Fatalf("ejection %d: available before %v", i+1, length)
		}
		feed(o, 5, 0, 0) // late answers of requests sent before the ejection are ignored
		clk.Advance(time.Millisecond)
		if o.State() != Probing || !o.Available() {
			t.Fatalf("ejection %d: after %v state %v, available %v", i+1, length, o.State(), o.Available())
		}
		if !o.Acquire() {
			t.Fatal("no probe granted")
		}
		if o.Available() || o.Acquire() {
			t.Fatal("a second probe while one is in flight")
		}
		if i < len(lengths)-1 {
			o.Observe(true, 5*pred, pred) // the probe is slow: ejected again, for longer
		}
	}
	if got := value(t, m.OutlierState.WithLabelValues("a")); got != float64(Probing) {
		t.Errorf("state gauge = %v, want probing", got)
	}
	for i := range 3 {
		o.Observe(true, pred, pred)
		if i < 2 {
			if o.State() != Probing || !o.Acquire() {
				t.Fatalf("after %d good probes: %v", i+1, o.State())
			}
		}
	}
	if o.State() != Serving || !o.Available() {
		t.Fatalf("after 3 good probes: %v", o.State())
	}
	if got := value(t, m.OutlierState.WithLabelValues("a")); got != float64(Serving) {
		t.Errorf("state gauge = %v, want serving", got)
	}
	// Ejected again soon: the length keeps growing (4 x 30s)...
	feed(o, 0, 0, 20)
	clk.Advance(119 * time.Second)
	if o.State() != Ejected {
		t.Fatalf("4th ejection shorter than 120s")
	}
	// ...up to MaxEjection, and back to the base after a long good run.
	clk.Advance(time.Second)
	for range 3 {
		o.Acquire()
		o.Observe(true, pred, pred)
	}
	clk.Advance(20 * time.Minute)
	feed(o, 0, 0, 20)
	clk.Advance(30 * time.Second)
	if o.State() != Probing {
		t.Errorf("after a long good run the ejection is not back to 30s: %v", o.State())
	}
}

func TestOutlierMaxEjection(t *testing.T) {
	d, clk, _ := newDetector(t, "a", "b")
	o := d.Get("a")
	for range 20 { // 20 failed probes in a row
		feed(o, 0, 0, 20)
		clk.Advance(10 * time.Minute)
		o.Acquire()
	}
	o.Observe(false, 0, 0)
	clk.Advance(300*time.Second - time.Millisecond)
	if o.State() != Ejected {
		t.Fatal("ejection shorter than MaxEjection")
	}
	clk.Advance(time.Millisecond)
	if o.State() != Probing {
		t.Fatal("ejection longer than MaxEjection")
	}
}

// TestOutlierProbeTimeout: a probe that never reports frees its slot after ProbeTimeout.
func TestOutlierProbeTimeout(t *testing.T) {
	d, clk, _ := newDetector(t, "a", "b")
	o := d.Get("a")
	feed(o, 0, 0, 20)
	clk.Advance(30 * time.Second)
	if !o.Acquire() {
		t.Fatal("no probe")
	}
	clk.Advance(59 * time.Second)
	if o.Acquire() {
		t.Fatal("second probe before the timeout")
	}
	clk.Advance(time.Second)
	if !o.Available() || !o.Acquire() {
		t.Fatal("the probe slot is stuck")
	}
}

// TestOutlierEjectionCap: at most MaxEjectedPercent of the backends are out at once, and one always may be.
func TestOutlierEjectionCap(t *testing.T) {
	for _, tc := range []struct {
		backends, bad, want int
	}{
		{2, 1, 1}, {3, 2, 1}, {4, 3, 2}, {5, 3, 2}, {10, 3, 3},
	} {
		t.Run(fmt.Sprintf("%d of %d bad", tc.bad, tc.backends), func(t *testing.T) {
			names := make([]string, tc.backends)
			for i := range names {
				names[i] = fmt.Sprint("b", i)
			}
			clk := newFakeClock()
			d := NewOutlierDetector(OutlierParams{}, clk, nil, nil)
			d.Update(names)
			for _, n := range names[tc.bad:] {
				feed(d.Get(n), 20, 0, 0) // the healthy ones the bad ones are judged against
			}
			for _, n := range names[:tc.bad] {
				feed(d.Get(n), 0, 0, 20)
			}
			out := 0
			for _, n := range names {
				if d.Get(n).State() != Serving {
					out++
				}
			}
			if out != tc.want {
				t.Fatalf("%d out of service, want %d", out, tc.want)
			}
			// A recovery makes room for the next bad one.
			first := d.Get(names[0])
			clk.Advance(30 * time.Second)
			for range 3 {
				first.Acquire()
				first.Observe(true, pred, pred)
			}
			if first.State() != Serving {
				t.Fatalf("no recovery: %v", first.State())
			}
			if tc.bad > tc.want {
				for _, n := range names[tc.bad:] {
					feed(d.Get(n), 20, 0, 0) // the healthy peers' window moved on too
				}
				next := d.Get(names[tc.want])
				feed(next, 0, 0, 20) // its earlier errors left the window while it waited for room
				if next.State() != Ejected {
					t.Errorf("the next bad backend is not ejected once there is room")
				}
			}
		})
	}
}

func TestOutlierUpdate(t *testing.T) {
	d, _, _ := newDetector(t, "a", "b", "c", "d")
	a := d.Get("a")
	feed(a, 0, 0, 20)
	feed(d.Get("b"), 0, 0, 20)
	d.Update([]string{"a", "b", "c", "d", "e", "peer"})
	if d.Get("a") != a || a.State() != Ejected {
		t.Fatal("a lost its state across the reload")
	}
	d.Update([]string{"c", "d", "e", "peer"}) // a and b leave: they no longer count against the cap
	feed(d.Get("c"), 0, 0, 20)
	if d.Get("c").State() != Ejected || d.Get("a") != nil {
		t.Errorf("c %v, a %v", d.Get("c").State(), d.Get("a"))
	}
	feed(a, 0, 0, 20) // late answers from requests of the old policy
	if a.State() != Serving || d.out.Load() != 1 {
		t.Errorf("a dropped backend was ejected again: %v, %d out", a.State(), d.out.Load())
	}
}

func TestOutlierServingDoesNotAllocate(t *testing.T) {
	d, _, _ := newDetector(t, "a", "b")
	o := d.Get("a")
	if a := testing.AllocsPerRun(100, func() {
		if o.Available() && o.Acquire() {
			o.Observe(true, pred, pred)
		}
	}); a != 0 {
		t.Errorf("allocates %v times", a)
	}
}

// TestOutlierPeers: the slow and error rules judge a backend against its peers. When every backend looks slow
// (the router's predictions are off for all) nobody is ejected; when one stands out it is.
func TestOutlierPeers(t *testing.T) {
	pool := func(names ...string) *OutlierDetector {
		d := NewOutlierDetector(OutlierParams{}, newFakeClock(), nil, nil)
		d.Update(names)
		return d
	}
	t.Run("all alike", func(t *testing.T) {
		d := pool("a", "b", "c", "d")
		for range 3 {
			for _, n := range []string{"a", "b", "c", "d"} {
				feed(d.Get(n), 7, 3, 0) // 30% slow everywhere
			}
		}
		for _, n := range []string{"a", "b", "c", "d"} {
			if st := d.Get(n).State(); st != Serving {
				t.Errorf("%s is %v although every backend is as slow", n, st)
			}
		}
	})
	t.Run("one stands out", func(t *testing.T) {
		d := pool("a", "b", "c", "d")
		for _, n := range []string{"b", "c", "d"} {
			feed(d.Get(n), 19, 1, 0) // 5% slow
		}
		feed(d.Get("a"), 8, 12, 0) // 60% slow
		if st := d.Get("a").State(); st != Ejected {
			t.Errorf("the outlier is %v, want ejected", st)
		}
		for _, n := range []string{"b", "c", "d"} {
			if st := d.Get(n).State(); st != Serving {
				t.Errorf("%s is %v", n, st)
			}
		}
	})
	t.Run("alone", func(t *testing.T) {
		d := pool("a")
		feed(d.Get("a"), 0, 0, 20)
		if st := d.Get("a").State(); st != Serving {
			t.Errorf("a lone failing backend is %v: ejecting it helps nobody (its breaker opens)", st)
		}
	})
	t.Run("errors against healthy peers", func(t *testing.T) {
		d := pool("a", "b", "c")
		feed(d.Get("b"), 20, 0, 0)
		feed(d.Get("c"), 20, 0, 0)
		feed(d.Get("a"), 16, 0, 4) // 20% errors
		if st := d.Get("a").State(); st != Ejected {
			t.Errorf("a backend failing 20%% among healthy peers is %v", st)
		}
	})
}

// TestOutlierReset: a reset (the circuit breaker changed state) forgets the window and returns an ejected backend
// to service.
func TestOutlierReset(t *testing.T) {
	d, _, _ := newDetector(t, "a", "b")
	a := d.Get("a")
	feed(a, 0, 0, 20)
	if a.State() != Ejected {
		t.Fatalf("state %v, want ejected", a.State())
	}
	a.Reset()
	if a.State() != Serving || !a.Available() || d.out.Load() != 0 {
		t.Fatalf("after reset: %v available %v out %d", a.State(), a.Available(), d.out.Load())
	}
	feed(a, 19, 0, 0)
	if a.State() != Serving {
		t.Errorf("the old failures still count after the reset: %v", a.State())
	}
}

// TestOutlierSlowSlack: a first token several times its prediction but only milliseconds late is not slow, on a
// probe (a backend back from an outage answered its probe in 45 ms against 12 ms predicted and was ejected
// again) or in the serving window; one late by more than SlowSlack is.
func TestOutlierSlowSlack(t *testing.T) {
	const fast = 12 * time.Millisecond
	d, clk, _ := newDetector(t, "a", "b")
	o := d.Get("a")
	for range 30 {
		o.Observe(true, 45*time.Millisecond, fast) // 3.75x, 33 ms late
	}
	if o.State() != Serving {
		t.Fatalf("ejected for first tokens 33 ms late: %v", o.State())
	}
	feed(o, 0, 0, 20)
	clk.Advance(30 * time.Second)
	for i := range 3 {
		if !o.Acquire() {
			t.Fatalf("probe %d not granted: %v", i+1, o.State())
		}
		o.Observe(true, 45*time.Millisecond, fast)
	}
	if o.State() != Serving {
		t.Fatalf("probes 33 ms late on a 12 ms prediction: %v, want serving", o.State())
	}
	feed(d.Get("b"), 20, 0, 0)
	for range 20 {
		o.Observe(true, fast+60*time.Millisecond, fast) // 6x, 60 ms late
	}
	if o.State() != Ejected {
		t.Errorf("first tokens 60 ms late on a 12 ms prediction: %v, want ejected", o.State())
	}
}
