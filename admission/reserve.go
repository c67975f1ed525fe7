package admission

import (
	"math"
	"sync/atomic"
	"time"
)

// ReserveMiss is the share of critical requests that may find no free engine seat in a saturated fleet: the
// target SeatReserve sizes its reserve for.
const ReserveMiss = 0.01

// The forecast's windows. A spike of critical traffic shows in the short one within its first seconds; the
// long one remembers the demand of the last minute, so that a lull between two spikes does not give the
// reserve away just before the second.
const (
	// ReserveShortWindow is the short window of the critical-arrival forecast.
	ReserveShortWindow = 3 * time.Second
	// ReserveLongWindow is the long window of the forecast, and of the completion rate.
	ReserveLongWindow = 60 * time.Second
	// reserveBuckets is how many one-second buckets the windows' counters keep.
	reserveBuckets = int(ReserveLongWindow / time.Second)
)

// SeatReserve sizes the engine seats a model's fleet keeps free for critical requests, before a spike rather
// than after it: standard requests may take a seat only while more than Seats remain free across the fleet
// (summed over the backends whose seats the concurrency caps know, Cap.Seats), sheddable ones only while more
// than twice Seats remain (Admits), critical ones any free seat. Under overload a critical request then starts
// at once on whichever backend has a seat, instead of waiting for a running sequence to finish; and as the
// free seats fall towards the reserve, sheddable traffic stops first, then standard.
//
// The size follows a forecast of critical demand. In a full fleet each critical arrival takes a reserved seat
// and each completion anywhere gives one back (a freed seat goes to critical requests first while the reserve
// is short), so the reserve's shortfall is a birth-death queue with ratio rho = critical arrivals /
// completions, and a reserve of R seats runs dry with probability about rho^R. Seats returns the smallest R
// with rho^R <= ReserveMiss: 6 seats when critical traffic is 40% of what the fleet completes, 3 at 20%, 1 at
// 1%, 0 without critical traffic in the last minute (then nothing is held idle). The critical rate is the
// larger of its rates over ReserveShortWindow and ReserveLongWindow (the forecast, Forecast), the completion
// rate that over ReserveLongWindow; a window younger than the reserve counts from the reserve's first event.
//
// Every method is lock-free and allocation-free. A SeatReserve must not be copied.
type SeatReserve struct {
	clock    Clock
	born     atomic.Int64 // UnixNano of the first event (0: none yet)
	critical rateWindow
	done     rateWindow
}

// NewSeatReserve returns a reserve reading clock (nil: the system clock).
func NewSeatReserve(clock Clock) *SeatReserve { return &SeatReserve{clock: orSystem(clock)} }

// Arrive counts a request of class c admitted to the model (only critical ones count).
func (r *SeatReserve) Arrive(c Class) {
	if c == Critical {
		r.critical.add(r.stamp())
	}
}

// Done counts an attempt that ended on one of the model's backends (its seat freed), whatever its class and
// outcome.
func (r *SeatReserve) Done() { r.done.add(r.stamp()) }

// stamp reads the clock and remembers the first event's time.
func (r *SeatReserve) stamp() time.Time {
	now := r.clock.Now()
	if r.born.Load() == 0 {
		r.born.CompareAndSwap(0, now.UnixNano())
	}
	return now
}

// Active reports whether critical requests arrived within ReserveLongWindow: whether there is anything to
// keep seats for (Cap.LimitFor's guard).
func (r *SeatReserve) Active() bool {
	return r.critical.count(r.clock.Now(), ReserveLongWindow) > 0
}

// rate returns w's events per second over the window span ending at now, counting a span younger than the
// reserve from the second of its first event.
func (r *SeatReserve) rate(w *rateWindow, now time.Time, span time.Duration) float64 {
	if age := time.Duration(now.Unix()-time.Unix(0, r.born.Load()).Unix()+1) * time.Second; age < span {
		span = max(age, time.Second)
	}
	return float64(w.count(now, span)) / span.Seconds()
}

// Forecast returns the critical arrivals per second the reserve is sized for: the larger of the rates over
// the short and the long window.
func (r *SeatReserve) Forecast() float64 {
	now := r.clock.Now()
	return max(r.rate(&r.critical, now, ReserveShortWindow), r.rate(&r.critical, now, ReserveLongWindow))
}

// Seats returns how many seats to keep free for critical requests, at most limit (the caller passes a share of
// the fleet's seats; a critical stream that alone exceeds the completions gets that).
func (r *SeatReserve) Seats(limit int) int {
	crit := r.Forecast()
	if crit == 0 || limit <= 0 {
		return 0
	}
	done := r.rate(&r.done, r.clock.Now(), ReserveLongWindow)
	if crit >= done {
		return limit
	}
	rho := crit / done
	n := int(math.Ceil(math.Log(ReserveMiss) / math.Log(rho)))
	return min(max(n, 1), limit)
}

// Admits reports whether a request of class c may take one of free engine seats, of seats in the fleet (those
// the caps know): critical ones always, standard ones while more than Seats(seats/2) are free, sheddable ones
// while more than twice that are. With no reserve every class may.
func (r *SeatReserve) Admits(c Class, free, seats int) bool {
	if c == Critical {
		return true
	}
	n := r.Seats(seats / 2)
	if c == Standard {
		return free > n
	}
	return free > 2*n
}

// rateWindow counts events in one-second buckets over the last reserveBuckets seconds. Lock-free: an event
// that races with its bucket's reset to a new second may be lost, which an estimate can afford.
type rateWindow struct {
	b [reserveBuckets]struct {
		sec atomic.Int64
		n   atomic.Int64
	}
}

func (w *rateWindow) add(now time.Time) {
	s := now.Unix()
	b := &w.b[s%int64(reserveBuckets)]
	if old := b.sec.Load(); old != s && b.sec.CompareAndSwap(old, s) {
		b.n.Store(0)
	}
	b.n.Add(1)
}

// count returns the events of the last span (whole seconds, at most reserveBuckets), the current second
// included.
func (w *rateWindow) count(now time.Time, span time.Duration) int64 {
	s, k := now.Unix(), int64(span/time.Second)
	var n int64
	for i := range w.b {
		b := &w.b[i]
		if sec := b.sec.Load(); sec > s-k && sec <= s {
			n += b.n.Load()
		}
	}
	return n
}
