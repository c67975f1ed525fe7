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

// TestSeatReserveFollowsCriticalDemand: at a steady demand, the reserve is the smallest R with rho^R <=
// ReserveMiss, rho the critical arrivals (the short window's, raised by one standard error) over the
// completions, or the critical share of arrivals if that is more; nothing without critical traffic.
func TestSeatReserveFollowsCriticalDemand(t *testing.T) {
	clk := newFakeClock()
	r := NewSeatReserve(clk)
	if got := r.Seats(32, 64); got != 0 {
		t.Fatalf("reserve %d before any traffic, want 0", got)
	}
	play(r, clk, 60, 0, 20, 16)
	if got := r.Seats(32, 64); got != 0 || r.Active() {
		t.Errorf("reserve %d (active %v) without critical traffic, want 0: nothing held idle", got, r.Active())
	}
	for _, tc := range []struct {
		crit, done, want int
	}{
		{4, 10, 7},  // the protect-overload fleet: rho 0.426 (below), 0.426^7 = 0.0026 (0.426^6 = 0.006)
		{2, 10, 4},  // 0.218^4 = 0.0023 > 0.218^3 = 0.010
		{1, 200, 3}, // the share 1/11 wins over 1.14/197: 0.091^3 = 0.00075 (0.091^2 = 0.0083)
		{10, 10, 16},
		{30, 10, 16}, // critical demand alone beyond the completions: the whole allowance
	} {
		clk := newFakeClock()
		r := NewSeatReserve(clk)
		play(r, clk, 60, tc.crit, 5, tc.done)
		got := r.Seats(16, 0)
		if !r.Active() {
			t.Errorf("%d critical per %d completions: not active", tc.crit, tc.done)
		}
		if got != tc.want {
			t.Errorf("%d critical per %d completions: reserve %d, want %d", tc.crit, tc.done, got, tc.want)
		}
		// The clock stands at the start of a second without events: the long window holds 59 seconds of them,
		// and wins over the short one, which holds 2.
		c, n := float64(tc.crit), 59*float64(tc.crit)
		if rho := max((n+math.Sqrt(n))/60/(59*float64(tc.done)/60), c/(c+10)); rho < 1 &&
			(math.Pow(rho, float64(got)) > ReserveMiss || got > 1 && math.Pow(rho, float64(got-1)) <= ReserveMiss) {
			t.Errorf("%d critical per %d completions: %d is not the smallest reserve that runs dry at most %v of the time",
				tc.crit, tc.done, got, ReserveMiss)
		}
		// Critical traffic stops: the reserve is released once the long window has passed.
		play(r, clk, 61, 0, 5, tc.done)
		if got := r.Seats(16, 0); got != 0 || r.Active() {
			t.Errorf("reserve %d (active %v) a minute after the last critical request, want 0", got, r.Active())
		}
	}
}

// TestSeatReserveForecast: the short window sizes the reserve within a spike's first seconds; the long one
// keeps it through a lull between two spikes.
func TestSeatReserveForecast(t *testing.T) {
	clk := newFakeClock()
	r := NewSeatReserve(clk)
	play(r, clk, 60, 0, 10, 10) // a quiet minute without critical traffic
	play(r, clk, 2, 4, 10, 10)  // a spike of critical traffic begins
	if f := r.Forecast(); f < 2.5 {
		t.Errorf("forecast %.2f/s two seconds into a spike of 4/s, want the short window's (>= 2.5)", f)
	}
	if got := r.Seats(16, 0); got < 4 {
		t.Errorf("reserve %d two seconds into the spike, want >= 4 (a minute's mean would give 1)", got)
	}
	play(r, clk, 58, 4, 10, 10) // the spike lasts a minute
	if got := r.Seats(16, 0); got != 7 {
		t.Fatalf("reserve %d at 4 critical per 10 completions, want 7 (0.426^7 = 0.0026)", got)
	}
	play(r, clk, 20, 0, 10, 10) // a lull
	if f := r.Forecast(); f < 2.5 {
		t.Errorf("forecast %.2f/s after 20 s of lull, want the long window's 40/60 of 4/s", f)
	}
	if got := r.Seats(16, 0); got != 5 { // rho (160 + sqrt(160))/60/10 = 0.288: 0.288^5 = 0.0020
		t.Errorf("reserve %d after a 20 s lull, want 5: the next spike finds its seats kept", got)
	}
}

// TestSeatReserveResumeWait: a stream that yields its seat expects it back after the completions the critical
// requests still waiting need, at the rate of completions that critical arrivals leave (1 - rho of them); a spike
// whose first half second of arrivals brings critical demand beyond the completions leaves none. Nothing is
// known before a completion is.
func TestSeatReserveResumeWait(t *testing.T) {
	clk := newFakeClock()
	r := NewSeatReserve(clk)
	r.Arrive(Critical)
	if _, ok := r.ResumeWait(1, 0); ok {
		t.Error("a resume wait before any completion was counted")
	}
	clk = newFakeClock()
	r = NewSeatReserve(clk)
	play(r, clk, 60, 2, 4, 20) // critical requests a fifth of the arrivals and a tenth of the completions
	st := r.Status(0, 0)
	w1, ok := r.ResumeWait(1, 0)
	want := time.Duration(float64(time.Second) / (st.CompletionsPerSecond * (1 - st.Rho)))
	if !ok || st.Rho < 0.19 || st.Rho > 0.21 || w1 != want {
		t.Errorf("steady: wait %v (ok %v) at rho %.3f and %.1f completions/s, want %v at rho 0.2 (the share)", w1, ok,
			st.Rho, st.CompletionsPerSecond, want)
	}
	if w4, _ := r.ResumeWait(4, 0); w4 < 4*w1-time.Microsecond || w4 > 4*w1+time.Microsecond {
		t.Errorf("four seats wanted: wait %v, want four times %v", w4, w1)
	}
	// A spike's first arrivals, within a tenth of a second: 250 of every class, 50 of them critical.
	for range 50 {
		r.Arrive(Critical)
		for range 2 {
			r.Arrive(Standard)
			r.Arrive(Sheddable)
		}
	}
	if w, ok := r.ResumeWait(1, 0); !ok || w != time.Duration(math.MaxInt64) {
		t.Errorf("spike: wait %v (ok %v, rho %.2f), want the longest: critical requests take every seat that frees",
			w, ok, r.Status(0, 0).Rho)
	}
}

// TestSeatReserveAdmits: as the fleet's free seats fall towards the reserve, sheddable requests stop first
// (at twice the reserve), then standard ones (at the reserve); critical ones take any seat.
func TestSeatReserveAdmits(t *testing.T) {
	clk := newFakeClock()
	r := NewSeatReserve(clk)
	play(r, clk, 60, 4, 5, 10) // reserve 7 of a 64-seat fleet (Seats(32, 64)), on the completion rate
	if got := r.Seats(32, 64); got != 7 {
		t.Fatalf("reserve %d, want 7", got)
	}
	for _, tc := range []struct {
		free                          int
		critical, standard, sheddable bool
	}{
		{free: 20, critical: true, standard: true, sheddable: true},
		{free: 15, critical: true, standard: true, sheddable: true},
		{free: 14, critical: true, standard: true, sheddable: false},
		{free: 8, critical: true, standard: true, sheddable: false},
		{free: 7, critical: true, standard: false, sheddable: false},
		{free: 1, critical: true, standard: false, sheddable: false},
	} {
		for _, c := range []struct {
			class Class
			want  bool
		}{{Critical, tc.critical}, {Standard, tc.standard}, {Sheddable, tc.sheddable}} {
			if got := r.Admits(c.class, tc.free, 64); got != c.want {
				t.Errorf("%d free: Admits(%v) = %v, want %v", tc.free, c.class, got, c.want)
			}
		}
	}
	quiet := NewSeatReserve(clk)
	play(quiet, clk, 5, 0, 5, 10)
	if !quiet.Admits(Sheddable, 1, 64) {
		t.Error("without critical demand a sheddable request was refused the last free seat")
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
				r.Arrive(Standard)
				r.Done()
				r.Done()
				_ = r.Seats(10, 20)
			}
		})
	}
	wg.Wait()
	if c, d := r.critical.count(clk.Now(), time.Second), r.done.count(clk.Now(), time.Second); c != 8000 || d != 16000 {
		t.Errorf("counted %d critical arrivals and %d completions, want 8000 and 16000 (no reset raced)", c, d)
	}
	// Past Surge's windows (every arrival came at one instant), rho comes from the rates alone.
	clk.Advance(2 * time.Second)
	if got := r.Seats(10, 0); got != 8 { // (8000 + 89)/16000 = 0.506: 0.506^8 = 0.0043 (0.506^7 = 0.0085)
		t.Errorf("reserve %d at rho 0.506, want 8", got)
	}
}

func TestSeatReserveDoesNotAllocate(t *testing.T) {
	r := NewSeatReserve(nil)
	if n := testing.AllocsPerRun(100, func() {
		r.Arrive(Critical)
		r.Done()
		r.Served(r.Now())
		_ = r.Seats(8, 16)
	}); n != 0 {
		t.Errorf("%v allocations per arrival, completion and sizing; want 0", n)
	}
}

// TestSeatReserveYoung: a reserve younger than its windows counts from the second of its first event, so that
// a critical request just before a second's turn is not forgotten after it.
func TestSeatReserveYoung(t *testing.T) {
	clk := newFakeClock()
	clk.Advance(900 * time.Millisecond)
	r := NewSeatReserve(clk)
	r.Arrive(Critical)
	for range 7 {
		r.Arrive(Standard)
	}
	for range 8 {
		r.Done()
	}
	clk.Advance(200 * time.Millisecond) // the next second
	if f := r.Forecast(); f != 1 {
		t.Errorf("forecast %v/s, want 1 arrival and its standard error over the 2 seconds since the first = 1", f)
	}
	if got := r.Seats(8, 0); got != 4 { // rho 1/4: 0.25^4 = 0.0039
		t.Errorf("reserve %d, want 4", got)
	}
}

// TestSeatReserveFullFleet: with attempts timed (Served), the completions are the full fleet's, its seats over
// the mean seat time, not the completions of the last minute, which lag a spike: in a spike's first seconds
// the reserve is sized against what the fleet completes once full.
func TestSeatReserveFullFleet(t *testing.T) {
	clk := newFakeClock()
	r := NewSeatReserve(clk)
	// A base load on a 64-seat fleet whose attempts hold a seat 3.2 s: 2 critical and 8 others a second.
	for range 60 {
		for range 2 {
			r.Arrive(Critical)
		}
		for range 8 {
			r.Arrive(Standard)
		}
		for range 10 {
			r.Served(clk.Now().Add(-3200 * time.Millisecond))
		}
		clk.Advance(time.Second)
	}
	if got, want := r.Completions(64), 20.0; math.Abs(got-want) > 1e-9 {
		t.Fatalf("completions %v/s, want 64 seats / 3.2 s = %v", got, want)
	}
	// rho = max((6 + sqrt(6))/3/20 = 0.14, share 0.2) = 0.2: 0.2^4 = 0.0016 (0.2^3 = 0.008).
	if got := r.Seats(32, 64); got != 4 {
		t.Errorf("reserve %d at the base load, want 4: held for the critical share before any spike", got)
	}
	// The spike: 8 critical and 32 others a second, spread over it. Half a second in, the last 0.4 s's arrivals
	// (4 critical, 13 others: 42.5/s) show it: rho = 0.2 x 42.5 / 20 = 0.425, 0.425^7 = 0.0025. Counted over
	// whole seconds, the reserve stayed at its base here, and the fleet's standard requests took the seats it
	// needed.
	for i := range 10 {
		if i == 5 {
			if got := r.Seats(32, 64); got != 7 {
				t.Errorf("reserve %d half a second into the spike, want 7", got)
			}
		}
		if i < 8 {
			r.Arrive(Critical)
		}
		for range 3 + (i%5+4)/8 { // 32 in 10 steps
			r.Arrive(Standard)
		}
		clk.Advance(100 * time.Millisecond)
	}
	// A second in, every class's arrivals (40/s) show the spike: rho = 0.2 x 40 / 20 = 0.4, 0.4^6 = 0.0041, what
	// the spike needs (the short window alone, (2+2+8 + sqrt(12))/3/20 = 0.258, gave 4 here, and still 5 three
	// seconds in).
	if got := r.Seats(32, 64); got != 6 {
		t.Errorf("reserve %d a second into the spike, want 6", got)
	}
	// Two seconds more of the spike: the reserve holds. The short window alone, (8+8 + sqrt(16))/3/20 = 0.33,
	// would give 5.
	for i := range 20 { // 100 ms steps: 8 critical and 32 others a second
		if i%5 < 4 {
			r.Arrive(Critical)
		}
		for range 3 + (i%5+4)/8 {
			r.Arrive(Standard)
		}
		clk.Advance(100 * time.Millisecond)
	}
	if got := r.Seats(32, 64); got != 6 {
		t.Errorf("reserve %d three seconds into the spike, want 6", got)
	}
}

// TestPrefillPaced: only standard and sheddable requests of a model with critical demand wait, and only while
// the prefill queued on the engine would delay a critical first token by more than CriticalDelay of it.
func TestPrefillPaced(t *testing.T) {
	const idle = 100 * time.Millisecond
	for _, tc := range []struct {
		name   string
		class  Class
		guard  bool
		ahead  time.Duration
		queued bool
		want   bool
	}{
		{"standard past the allowance", Standard, true, 60 * time.Millisecond, true, true},
		{"sheddable past the allowance", Sheddable, true, 60 * time.Millisecond, true, true},
		{"standard within it", Standard, true, 50 * time.Millisecond, true, false},
		{"critical never", Critical, true, time.Second, true, false},
		{"no critical demand", Standard, false, time.Second, true, false},
		{"nothing queued: one prefill always goes", Standard, true, time.Second, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := PrefillPaced(tc.class, tc.guard, tc.ahead, idle, tc.queued); got != tc.want {
				t.Errorf("PrefillPaced = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSeatReserveCold: before any attempt has ended, the completions are bounded by the seats over the reserve's
// age, not counted as none, so a fresh gateway does not hold half an idle fleet for critical requests and refuse
// every sheddable one until its first completion; once attempts are timed, their mean seat time counts, and it
// is remembered through a minute without traffic.
func TestSeatReserveCold(t *testing.T) {
	clk := newFakeClock()
	r := NewSeatReserve(clk)
	r.Arrive(Critical) // the first request of a fresh gateway is critical: share 1
	for range 3 {
		r.Arrive(Standard)
		r.Arrive(Sheddable)
	}
	clk.Advance(500 * time.Millisecond)
	if got, want := r.Completions(64), 128.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("completions %v/s half a second into a fresh reserve, want at most 64 seats / 0.5 s = %v", got, want)
	}
	if !r.Admits(Sheddable, 60, 64) {
		t.Errorf("a sheddable request refused with 60 of 64 seats free before the first completion (reserve %d)",
			r.Seats(32, 64))
	}
	// Nothing ends for 10 s: the bound falls with the age, and the reserve grows towards its cap.
	clk.Advance(9500 * time.Millisecond)
	if got, want := r.Completions(64), 6.4; math.Abs(got-want) > 1e-9 {
		t.Errorf("completions %v/s after 10 s without one, want 64 / 10 s = %v", got, want)
	}
	// Attempts of 3.2 s are timed; a minute without traffic later their mean still counts.
	for range 10 {
		r.Served(clk.Now().Add(-3200 * time.Millisecond))
	}
	if got, want := r.Completions(64), 20.0; math.Abs(got-want) > 1e-9 {
		t.Fatalf("completions %v/s, want 64 seats / 3.2 s = %v", got, want)
	}
	clk.Advance(2 * ReserveLongWindow)
	r.Arrive(Critical)
	if got, want := r.Completions(64), 20.0; math.Abs(got-want) > 1e-9 {
		t.Errorf("completions %v/s after two minutes without traffic, want the last mean's %v", got, want)
	}
	// Unknown seats: the measured completion rate, none here.
	if got := r.Completions(0); got != 0 {
		t.Errorf("completions %v/s of a fleet of unknown seats with nothing ended in the window, want 0", got)
	}
}
