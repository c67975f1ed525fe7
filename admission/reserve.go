package admission

import (
	"math"
	"sync/atomic"
	"time"
)

// ReserveMiss is the share of critical requests that may find no free engine seat in a saturated fleet: the
// target SeatReserve sizes its reserve for.
const ReserveMiss = 0.01

// reserveWindow is how many one-second buckets SeatReserve's rates cover.
const reserveWindow = 10

// SeatReserve sizes the engine seats a model's fleet keeps free for critical requests while it is saturated:
// standard and sheddable requests may take a seat only while more than Seats remain free across the fleet
// (summed over the backends whose batch size the concurrency caps learned, Cap.Seats), critical ones any free
// seat. Under overload a critical request then starts at once on whichever backend has a seat, instead of
// waiting for a running sequence to finish.
//
// The size follows critical demand. In a full fleet each critical arrival takes a reserved seat and each
// completion anywhere gives one back (a freed seat goes to critical requests first while the reserve is short),
// so the reserve's shortfall is a birth-death queue with ratio rho = critical arrivals / completions, and a
// reserve of R seats runs dry with probability about rho^R. Seats returns the smallest R with rho^R <=
// ReserveMiss: 6 seats when critical traffic is 40% of what the fleet completes, 3 at 20%, 1 at 1%, 0 without
// critical traffic (then nothing is held idle). The rates cover the last ten seconds.
//
// Every method is lock-free and allocation-free. A SeatReserve must not be copied.
type SeatReserve struct {
	clock    Clock
	critical rateWindow
	done     rateWindow
}

// NewSeatReserve returns a reserve reading clock (nil: the system clock).
func NewSeatReserve(clock Clock) *SeatReserve { return &SeatReserve{clock: orSystem(clock)} }

// Arrive counts a request of class c admitted to the model (only critical ones count).
func (r *SeatReserve) Arrive(c Class) {
	if c == Critical {
		r.critical.add(r.clock.Now())
	}
}

// Done counts an attempt that ended on one of the model's backends (its seat freed), whatever its class and
// outcome.
func (r *SeatReserve) Done() { r.done.add(r.clock.Now()) }

// Active reports whether critical requests arrived in the last ten seconds: whether there is anything to keep
// seats for (Cap.LimitFor's guard).
func (r *SeatReserve) Active() bool { return r.critical.count(r.clock.Now()) > 0 }

// Seats returns how many seats to keep free for critical requests, at most limit (the caller passes a share of
// the fleet's seats; a critical stream that alone exceeds the completions gets that).
func (r *SeatReserve) Seats(limit int) int {
	now := r.clock.Now()
	crit, done := r.critical.count(now), r.done.count(now)
	if crit == 0 || limit <= 0 {
		return 0
	}
	if crit >= done {
		return limit
	}
	rho := float64(crit) / float64(done)
	n := int(math.Ceil(math.Log(ReserveMiss) / math.Log(rho)))
	return min(max(n, 1), limit)
}

// rateWindow counts events in one-second buckets over the last reserveWindow seconds. Lock-free: an event that
// races with its bucket's reset to a new second may be lost, which an estimate can afford.
type rateWindow struct {
	b [reserveWindow]struct {
		sec atomic.Int64
		n   atomic.Int64
	}
}

func (w *rateWindow) add(now time.Time) {
	s := now.Unix()
	b := &w.b[s%reserveWindow]
	if old := b.sec.Load(); old != s && b.sec.CompareAndSwap(old, s) {
		b.n.Store(0)
	}
	b.n.Add(1)
}

// count returns the events of the last reserveWindow seconds, the current one included.
func (w *rateWindow) count(now time.Time) int64 {
	s := now.Unix()
	var n int64
	for i := range w.b {
		b := &w.b[i]
		if sec := b.sec.Load(); sec > s-reserveWindow && sec <= s {
			n += b.n.Load()
		}
	}
	return n
}
