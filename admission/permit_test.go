package admission

import (
	"errors"
	"testing"
	"time"
)

// fakeBreaker is a Breaker that refuses while open and records every outcome reported to it.
type fakeBreaker struct {
	open     bool
	outcomes []error
}

func (b *fakeBreaker) Allow() (func(error), error) {
	if b.open {
		return nil, errors.New("open")
	}
	return func(err error) { b.outcomes = append(b.outcomes, err) }, nil
}

// signals counts Signal calls.
type signals int

func (s *signals) Signal() { *s++ }

// obsWindow sums an outlier's observations: requests, errors, slow first tokens, and those with a prediction.
func obsWindow(o *Outlier) (requests, errs, slow, ratios int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, b := range o.buckets {
		requests, errs, slow, ratios = requests+b.requests, errs+b.errors, slow+b.slow, ratios+b.ratios
	}
	return
}

// permitRig is one backend "a" with every protection, on a virtual clock, and the fleet it belongs to.
type permitRig struct {
	clk     *fakeClock
	brk     *fakeBreaker
	cap     *Cap
	out     *Outlier
	reserve *SeatReserve
	queue   *signals
	retries *RetryBudget
	end     Endpoint
	fleet   Fleet
}

func newPermitRig(t *testing.T, maxConcurrency int) *permitRig {
	t.Helper()
	d, clk, _ := newDetector(t, "a")
	caps := NewCaps(CapParams{}, nil)
	caps.Update([]CapConfig{{Name: "a", MaxConcurrency: maxConcurrency}})
	r := &permitRig{clk: clk, brk: &fakeBreaker{}, cap: caps.Get("a"), out: d.Get("a"),
		reserve: NewSeatReserve(clk), queue: new(signals), retries: NewRetryBudget(20, 3, nil)}
	r.end = Endpoint{Breaker: r.brk, Cap: r.cap, Outlier: r.out}
	r.fleet = Fleet{Reserve: r.reserve, Queue: r.queue}
	return r
}

func TestPermitAcquireAllOrNone(t *testing.T) {
	t.Run("breaker open", func(t *testing.T) {
		r := newPermitRig(t, 1)
		r.brk.open = true
		var p Permit
		if err := p.Acquire(&r.end, &r.fleet, Claim{}); err != ErrOutOfService {
			t.Fatalf("Acquire = %v, want ErrOutOfService", err)
		}
		if p.Held() || r.cap.Inflight() != 0 {
			t.Fatalf("held %v, cap inflight %d: a refusal holds nothing", p.Held(), r.cap.Inflight())
		}
	})
	t.Run("cap full", func(t *testing.T) {
		r := newPermitRig(t, 1)
		var first, second Permit
		if err := first.Acquire(&r.end, &r.fleet, Claim{}); err != nil {
			t.Fatal(err)
		}
		if err := second.Acquire(&r.end, &r.fleet, Claim{}); err != ErrCapFull {
			t.Fatalf("Acquire on a full cap = %v, want ErrCapFull", err)
		}
		if len(r.brk.outcomes) != 1 || r.brk.outcomes[0] != ErrNotSent {
			t.Fatalf("breaker outcomes %v, want the refused attempt's permission back as ErrNotSent", r.brk.outcomes)
		}
		if err := second.Acquire(&r.end, &r.fleet, Claim{Force: true}); err != nil || !second.Slot() {
			t.Fatalf("forced Acquire = %v (slot %v), want a permit with a slot past the limit", err, second.Slot())
		}
		// The forced attempt runs on the engine: the cap counts it, and no seat looks free while it runs.
		if r.cap.Inflight() != 2 || !r.cap.Full() {
			t.Fatalf("cap inflight %d (full %v) with a forced attempt past a limit of 1, want 2 and full", r.cap.Inflight(), r.cap.Full())
		}
		if free, known := r.cap.Free(); known && free != 0 {
			t.Fatalf("free seats %d with the cap past its limit, want 0", free)
		}
		var third Permit
		if err := third.Acquire(&r.end, &r.fleet, Claim{Class: Critical, Guard: true}); err != ErrCapFull {
			t.Fatalf("critical Acquire while a forced attempt holds the seat = %v, want ErrCapFull", err)
		}
		second.End(&Outcome{})
		if r.cap.Inflight() != 1 {
			t.Fatalf("cap inflight %d after the forced permit ended, want 1", r.cap.Inflight())
		}
		if n := r.reserve.done.count(r.clk.Now(), ReserveLongWindow); n != 1 {
			t.Fatalf("reserve completions %d, want 1: the forced attempt's end frees an engine seat", n)
		}
		first.End(&Outcome{})
		if r.cap.Inflight() != 0 || r.reserve.done.count(r.clk.Now(), ReserveLongWindow) != 2 {
			t.Fatalf("cap inflight %d, completions %d after End, want 0 and 2", r.cap.Inflight(), r.reserve.done.count(r.clk.Now(), ReserveLongWindow))
		}
	})
	t.Run("outlier ejected", func(t *testing.T) {
		r := newPermitRig(t, 4)
		feed(r.out, 18, 0, 2)
		if r.out.State() != Ejected {
			t.Fatalf("state %v, want ejected", r.out.State())
		}
		var p Permit
		if err := p.Acquire(&r.end, &r.fleet, Claim{}); err != ErrOutOfService {
			t.Fatalf("Acquire = %v, want ErrOutOfService", err)
		}
		if r.cap.Inflight() != 0 || len(r.brk.outcomes) != 1 || r.brk.outcomes[0] != ErrNotSent {
			t.Fatalf("cap inflight %d, breaker %v: the slot and the permission must be given back", r.cap.Inflight(), r.brk.outcomes)
		}
		r.clk.Advance(31 * time.Second) // the ejection ends: one probe at a time
		if err := p.Acquire(&r.end, &r.fleet, Claim{}); err != nil {
			t.Fatalf("probe Acquire = %v", err)
		}
		var q Permit
		if err := q.Acquire(&r.end, &r.fleet, Claim{}); err != ErrOutOfService {
			t.Fatalf("second probe Acquire = %v, want ErrOutOfService", err)
		}
		p.End(&Outcome{Reached: false}) // the probe ended without evidence: its slot frees
		if err := q.Acquire(&r.end, &r.fleet, Claim{}); err != nil {
			t.Fatalf("Acquire after the probe ended = %v", err)
		}
	})
	t.Run("no protections", func(t *testing.T) {
		var p Permit
		if err := p.Acquire(&Endpoint{}, nil, Claim{}); err != nil {
			t.Fatal(err)
		}
		p.First(&First{Content: true, TTFT: time.Millisecond})
		p.End(&Outcome{Reached: true})
	})
}

func TestPermitFirstToken(t *testing.T) {
	const ttft = 10 * pred // far slower than predicted: slow if judged with the prediction
	for _, tc := range []struct {
		name             string
		first            First
		revised          time.Duration // > 0: the usage's revision arrives before End
		wantAtFirst      int           // observations after First
		wantRatios       int           // observations with a prediction, at the end
		wantSlow         int
		wantPendingFirst bool
	}{
		{"judged at once", First{Content: true, TTFT: ttft, Predicted: pred}, 0, 1, 1, 1, false},
		{"engine queued: no prediction", First{Content: true, TTFT: ttft, Predicted: pred, Waiting: 1}, 0, 1, 0, 0, false},
		{"predicted hit: revised at the usage", First{Content: true, TTFT: ttft, Predicted: pred, Hit: true}, ttft, 0, 1, 0, true},
		{"predicted hit: no usage, the dispatch prediction", First{Content: true, TTFT: ttft, Predicted: pred, Hit: true}, 0, 0, 1, 1, true},
		{"no content: judged at the end, neutral", First{}, 0, 0, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newPermitRig(t, 4)
			if !r.retries.Allow() {
				t.Fatal("retry budget refused")
			}
			var p Permit
			if err := p.Acquire(&r.end, &r.fleet, Claim{Retries: r.retries}); err != nil {
				t.Fatal(err)
			}
			before, _, _, _ := obsWindow(r.out)
			p.First(&tc.first)
			if len(r.brk.outcomes) != 1 || r.brk.outcomes[0] != nil {
				t.Fatalf("breaker outcomes %v, want one success at the first token", r.brk.outcomes)
			}
			if r.retries.Retries() != 0 || *r.queue != 1 {
				t.Fatalf("retries in flight %d, signals %d: First gives back the retry slot and signals", r.retries.Retries(), *r.queue)
			}
			if n, _, _, _ := obsWindow(r.out); n-before != tc.wantAtFirst || p.Pending() != tc.wantPendingFirst {
				t.Fatalf("observations at First %d, pending %v; want %d, %v", n-before, p.Pending(), tc.wantAtFirst, tc.wantPendingFirst)
			}
			if tc.revised > 0 {
				p.Revised(tc.revised)
			}
			p.End(&Outcome{Reached: tc.first.Content})
			n, _, slow, ratios := obsWindow(r.out)
			if n-before != 1 || ratios != tc.wantRatios || slow != tc.wantSlow {
				t.Fatalf("observations %d, with a prediction %d, slow %d; want 1, %d, %d", n-before, ratios, slow,
					tc.wantRatios, tc.wantSlow)
			}
			if len(r.brk.outcomes) != 1 || r.retries.Retries() != 0 || *r.queue != 2 || r.cap.Inflight() != 0 {
				t.Fatalf("after End: breaker %v, retries %d, signals %d, inflight %d", r.brk.outcomes, r.retries.Retries(),
					*r.queue, r.cap.Inflight())
			}
		})
	}
}

func TestPermitEndJudgesFailures(t *testing.T) {
	errBroke := errors.New("backend broke")
	for _, tc := range []struct {
		name              string
		out               Outcome
		wantErrs, wantObs int
		wantSlow          int
	}{
		{"backend's fault before the first token", Outcome{Err: errBroke, Fault: true}, 1, 1, 0},
		{"not its fault", Outcome{Err: errBroke}, 0, 1, 0},
		{"fault after the first token is not judged again", Outcome{Err: errBroke, Fault: true, Reached: true}, 0, 0, 0},
		{"lost a hedge after a long wait", Outcome{Err: errBroke, Lost: true, Waited: 10 * pred, Predicted: pred}, 0, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newPermitRig(t, 4)
			var p Permit
			if err := p.Acquire(&r.end, &r.fleet, Claim{}); err != nil {
				t.Fatal(err)
			}
			before, _, _, _ := obsWindow(r.out)
			p.End(&tc.out)
			n, errs, slow, _ := obsWindow(r.out)
			if n-before != tc.wantObs || errs != tc.wantErrs || slow != tc.wantSlow {
				t.Fatalf("observations %d, errors %d, slow %d; want %d, %d, %d", n-before, errs, slow, tc.wantObs, tc.wantErrs, tc.wantSlow)
			}
			if len(r.brk.outcomes) != 1 || r.brk.outcomes[0] != tc.out.Err {
				t.Fatalf("breaker outcomes %v, want [%v]", r.brk.outcomes, tc.out.Err)
			}
			if p.Held() || r.cap.Inflight() != 0 || *r.queue != 1 {
				t.Fatalf("held %v, inflight %d, signals %d after End", p.Held(), r.cap.Inflight(), *r.queue)
			}
			p.End(&tc.out) // a second End does nothing
			if len(r.brk.outcomes) != 1 || r.cap.Inflight() != 0 || *r.queue != 1 {
				t.Fatal("a second End gave back again")
			}
		})
	}
}

// TestPermitReserveOnVirtualClock checks that the completions a permit reports reach the seat reserve's window,
// which the virtual clock then moves past.
func TestPermitReserveOnVirtualClock(t *testing.T) {
	r := newPermitRig(t, 8)
	for range 3 {
		var p Permit
		if err := p.Acquire(&r.end, &r.fleet, Claim{}); err != nil {
			t.Fatal(err)
		}
		p.End(&Outcome{Reached: true})
	}
	if n := r.reserve.done.count(r.clk.Now(), ReserveLongWindow); n != 3 {
		t.Fatalf("completions %d, want 3", n)
	}
	r.clk.Advance(ReserveLongWindow)
	if n := r.reserve.done.count(r.clk.Now(), ReserveLongWindow); n != 0 {
		t.Fatalf("completions %d a window later, want 0", n)
	}
}

func BenchmarkPermit(b *testing.B) {
	caps := NewCaps(CapParams{}, nil)
	caps.Update([]CapConfig{{Name: "a"}})
	d := NewOutlierDetector(OutlierParams{}, nil, nil, nil)
	d.Update([]string{"a"})
	q := new(signals)
	e := Endpoint{Cap: caps.Get("a"), Outlier: d.Get("a")}
	f := Fleet{Reserve: NewSeatReserve(nil), Queue: q, Calibration: NewCalibration()}
	claim := Claim{Class: Standard, Wait: 200 * time.Millisecond, Waited: 150 * time.Millisecond, Serve: pred}
	b.ReportAllocs()
	for b.Loop() {
		var p Permit
		if err := p.Acquire(&e, &f, claim); err != nil {
			b.Fatal(err)
		}
		p.First(&First{Content: true, TTFT: pred, Predicted: pred, P90: pred})
		p.End(&Outcome{Reached: true})
	}
}
