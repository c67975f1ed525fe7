package admission

import (
	"math"
	"sync"
	"testing"
	"time"
)

// play plays seconds of traffic on the reserve's clock: per second, crit critical arrivals, other arrivals of
// other classes and done completions.
func play(r *SeatReserve, clk *fakeClock, seconds, crit, other, done int) {
	for range seconds {
		for range crit {
			r.Arrive(Critical)
		}
		for range other {
			r.Arrive(Standard)
			r.Arrive(Sheddable)
		}
		for range done {
			r.Done()
		}
		clk.Advance(time.Second)
	}
}

// TestSeatReserveFollowsCriticalDemand: the reserve is the smallest R with rho^R <= ReserveMiss, rho the critical
// arrivals over the completions of the last ten seconds; nothing without critical traffic.
func TestSeatReserveFollowsCriticalDemand(t *testing.T) {
	clk := newFakeClock()
	r := NewSeatReserve(clk)
	if got := r.Seats(32); got != 0 {
		t.Fatalf("reserve %d before any traffic, want 0", got)
	}
	play(r, clk, 10, 0, 20, 16)
	if got := r.Seats(32); got != 0 || r.Active() {
		t.Errorf("reserve %d (active %v) without critical traffic, want 0: nothing held idle", got, r.Active())
	}
	for _, tc := range []struct {
		crit, done, want int
	}{
		{4, 10, 6},  // the protect-overload fleet: 0.4^6 = 0.004 <= 1% < 0.4^5
		{2, 10, 3},  // 0.2^3 = 0.008
		{1, 200, 1}, // 0.005
		{10, 10, 16},
		{30, 10, 16}, // critical demand alone beyond the completions: the whole allowance
	} {
		play(r, clk, 10, tc.crit, 5, tc.done) // ten seconds replace the window
		got := r.Seats(16)
		if !r.Active() {
			t.Errorf("%d critical per %d completions: not active", tc.crit, tc.done)
		}
		if got != tc.want {
			t.Errorf("%d critical per %d completions: reserve %d, want %d", tc.crit, tc.done, got, tc.want)
		}
		if rho := float64(tc.crit) / float64(tc.done); rho < 1 &&
			(math.Pow(rho, float64(got)) > ReserveMiss || got > 1 && math.Pow(rho, float64(got-1)) <= ReserveMiss) {
			t.Errorf("%d critical per %d completions: %d is not the smallest reserve that runs dry at most %v of the time",
				tc.crit, tc.done, got, ReserveMiss)
		}
	}
	// Critical traffic stops: the reserve is released once the window has passed.
	play(r, clk, 10, 0, 5, 10)
	if got := r.Seats(16); got != 0 || r.Active() {
		t.Errorf("reserve %d (active %v) ten seconds after the last critical request, want 0", got, r.Active())
	}
}

// TestSeatReserveConcurrent: counting from many goroutines loses at most what races with a bucket's reset.
func TestSeatReserveConcurrent(t *testing.T) {
	clk := newFakeClock()
	r := NewSeatReserve(clk)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				r.Arrive(Critical)
				r.Done()
				r.Done()
				_ = r.Seats(10)
			}
		})
	}
	wg.Wait()
	if c, d := r.critical.count(clk.Now()), r.done.count(clk.Now()); c != 8000 || d != 16000 {
		t.Errorf("counted %d critical arrivals and %d completions, want 8000 and 16000 (no reset raced)", c, d)
	}
	if got := r.Seats(10); got != 7 { // 0.5^7 = 0.0078
		t.Errorf("reserve %d at rho 0.5, want 7", got)
	}
}

func TestSeatReserveDoesNotAllocate(t *testing.T) {
	r := NewSeatReserve(nil)
	if n := testing.AllocsPerRun(100, func() {
		r.Arrive(Critical)
		r.Done()
		_ = r.Seats(8)
	}); n != 0 {
		t.Errorf("%v allocations per arrival, completion and sizing; want 0", n)
	}
}
