package admission

import (
	"math"
	"sync/atomic"
	"time"
)

// ReserveMiss is the share of critical requests that may find no free engine seat in a saturated fleet: the
// target SeatReserve sizes its reserve for. It follows from the objective the reserve serves, a critical p99
// first token through a spike: a request that finds no seat waits for a completion, far longer than a first
// token, so at most 1% of them may, and a spike has some 100 critical requests, whose p99 is their worst or
// second worst. At a 1% target the count of such requests in a spike of 100 is 2 or more about a quarter of the
// time (Poisson with mean 1), and the protect matrix's 8x8-seat cell failed 1.5x in about half of its runs on
// record, its slowest critical requests waiting in the gateway for a seat (the reserve sized for 1%: 5 seats of
// 64 at rho 0.38). Half of it, 0.5%, makes that about one time in ten, for one seat more at the usual rho.
const ReserveMiss = 0.005

// The forecast's windows. A spike of critical traffic shows in the short one within its first seconds; the
// long one remembers the demand of the last minute, so that a lull between two spikes does not give the
// reserve away just before the second.
const (
	// ReserveShortWindow is the short window of the critical-arrival forecast.
	ReserveShortWindow = 3 * time.Second
	// ReserveLongWindow is the long window of the forecast, and that of the critical share, the seat time and
	// the completion rate.
	ReserveLongWindow = 60 * time.Second
	// reserveBuckets is how many one-second buckets the windows' counters keep.
	reserveBuckets = int(ReserveLongWindow / time.Second)
)

// SeatReserve sizes the engine seats a model's fleet keeps free for critical requests, before a spike rather
// than after it: standard requests may take a seat only while more than Seats remain free across the fleet
// (summed over the backends whose seats the concurrency caps know or hold provisionally, Cap.Batch), sheddable
// ones only while more than twice Seats remain (Admits), critical ones any free seat. Under overload a critical
// request then starts at once on whichever backend has a seat, instead of waiting for a running sequence to
// finish; and as the free seats fall towards the reserve, sheddable traffic stops first, then standard.
//
// In a full fleet each critical arrival takes a reserved seat and each completion anywhere gives one back (a
// freed seat goes to critical requests first while the reserve is short), so the reserve's shortfall is a
// birth-death queue with ratio rho = critical arrivals / completions of the full fleet, and a reserve of R seats
// runs dry with probability about rho^R. Seats returns the smallest R with rho^R <= ReserveMiss: 6 seats when
// critical traffic is 40% of what the fleet completes, 4 at 20%, 0 without critical traffic in the last minute
// (then nothing is held idle). Each figure is measured:
//
//	critical rate  the larger of the critical arrivals over ReserveShortWindow and ReserveLongWindow (Forecast),
//	               each raised by one standard error of its count (sqrt(n)/span: Poisson counts), so that the
//	               few arrivals of a short window do not size the reserve below the demand they sample
//	completions    the full fleet's: its seats over the mean time an attempt held a seat (Served), over
//	               ReserveLongWindow, or the last such mean once none was timed in it (a minute without
//	               traffic); until an attempt is timed, the completion rate itself, and until one ends, the
//	               seats over the reserve's age: no attempt held a seat longer, so the fleet completes at most
//	               that. Counted as none, a fresh gateway held half the seats for critical requests until its
//	               first completion and refused every sheddable request for 2 s with 45 of 64 seats free
//	share floor    rho is at least the critical share of all arrivals over ReserveLongWindow (Arrive): the
//	               reserve matters only once the fleet is full, when arrivals are at least its completions and
//	               critical ones at least that share of them. It holds the reserve from before a spike: at a
//	               base load, when critical arrivals are few next to the full fleet's completions
//	surge          rho is at least that share of the arrivals of every class over the last half second, second
//	               or two (Surge, the highest), over the completions, when those arrivals are more: a spike
//	               shows in every class's arrivals at once, many more of them than critical ones, so that the
//	               critical demand it brings is known within half a second instead of the short window's three
//	               (a fleet of 64 seats held a reserve of 3
//	               through the first seconds of a 2x spike, whose critical requests needed 6, and the
//	               critical p99 of those seconds was 1.6-2.2x the unloaded one). It assumes the spike brings
//	               critical requests at their share; one that brings fewer is reserved for as if it did,
//	               which costs seats idle only while the fleet is full
//
// A window younger than the reserve counts from the reserve's first event.
//
// Every method is lock-free and allocation-free. A SeatReserve must not be copied.
type SeatReserve struct {
	clock    Clock
	born     atomic.Int64 // UnixNano of the first event (0: none yet)
	critical rateWindow
	all      rateWindow // arrivals of every class
	recent   tickWindow // the same, in surgeTick buckets (Surge)
	done     rateWindow
	timed    rateWindow   // completions whose seat time is known (Served)
	held     rateWindow   // their seat time, in microseconds
	hold     atomic.Int64 // the last mean seat time measured, in microseconds (0: none yet)
}

// NewSeatReserve returns a reserve reading clock (nil: the system clock).
func NewSeatReserve(clock Clock) *SeatReserve { return &SeatReserve{clock: orSystem(clock)} }

// Arrive counts a request of class c arriving for the model: every class counts towards the critical share,
// critical ones towards the critical rate too. Call it once per request, before it is admitted or refused.
func (r *SeatReserve) Arrive(c Class) {
	now := r.stamp()
	r.all.add(now, 1)
	r.recent.add(now)
	if c == Critical {
		r.critical.add(now, 1)
	}
}

// Done counts an attempt that ended on one of the model's backends (its seat freed), whatever its class and
// outcome, when the time it held its seat is not known; Served when it is.
func (r *SeatReserve) Done() { r.done.add(r.stamp(), 1) }

// Now returns the reserve's clock reading: the start a Permit passes to Served.
func (r *SeatReserve) Now() time.Time { return r.clock.Now() }

// Served counts an attempt that ended on one of the model's backends having held its seat since start (Now
// when the seat was taken).
func (r *SeatReserve) Served(start time.Time) {
	now := r.stamp()
	r.done.add(now, 1)
	if d := now.Sub(start); d > 0 && !start.IsZero() {
		r.timed.add(now, 1)
		r.held.add(now, max(d.Microseconds(), 1))
	}
}

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

// span returns the window span ending at now, counting a span younger than the reserve from the second of its
// first event.
func (r *SeatReserve) span(now time.Time, span time.Duration) time.Duration {
	if age := time.Duration(now.Unix()-time.Unix(0, r.born.Load()).Unix()+1) * time.Second; age < span {
		span = max(age, time.Second)
	}
	return span
}

// rate returns w's events per second over the window span ending at now (span).
func (r *SeatReserve) rate(w *rateWindow, now time.Time, span time.Duration) float64 {
	span = r.span(now, span)
	return float64(w.count(now, span)) / span.Seconds()
}

// upper returns w's events per second over the window span ending at now, raised by one standard error of
// the count (Poisson: sqrt(n)).
func (r *SeatReserve) upper(w *rateWindow, now time.Time, span time.Duration) float64 {
	span = r.span(now, span)
	n := float64(w.count(now, span))
	return (n + math.Sqrt(n)) / span.Seconds()
}

// Forecast returns the critical arrivals per second the reserve is sized for: the larger of the rates over
// the short and the long window, each raised by one standard error of its count.
func (r *SeatReserve) Forecast() float64 {
	now := r.clock.Now()
	return max(r.upper(&r.critical, now, ReserveShortWindow), r.upper(&r.critical, now, ReserveLongWindow))
}

// Surge returns the arrivals per second of every class over the recent past: the highest rate over the last
// surgeSpans (half a second, one, two), each counted in surgeTick buckets up to now. The half second is what
// sizes the reserve before a spike fills the fleet: counted over whole seconds, a 2x spike on a 64-seat fleet
// showed at 24 arrivals/s of its 44 through its first 0.6 s, the reserve stayed at 3, and standard requests
// took the fleet down to 1-3 free seats in that second, so that critical ones waited for seats 2 s later
// (bench/results/protect-2026-12-02-matrix.md, 2026-12-07). A window longer than the reserve's age counts from
// its first event, over at least a second.
func (r *SeatReserve) Surge() float64 {
	now := r.clock.Now()
	age := now.Sub(time.Unix(0, r.born.Load()))
	into := time.Duration(now.UnixNano() % int64(surgeTick)) // the current bucket's elapsed part
	best := 0.0
	for _, k := range surgeSpans {
		span := time.Duration(k-1)*surgeTick + into
		if age < span {
			span = max(age, time.Second) // a young reserve: no rate from its first instants
		}
		best = max(best, float64(r.recent.count(now, k))/span.Seconds())
	}
	return best
}

// surgeTick is the bucket of the arrivals Surge reads, and surgeSpans its windows in buckets (the current one
// included). The shortest holds some 20 arrivals of a spike at twice a 64-seat fleet's completions (22/s), so a
// Poisson count reads that rate within a quarter; at a base load of half the completions its noise stays under
// them, where Surge changes nothing (rho takes it only above the completions).
const surgeTick = 100 * time.Millisecond

var surgeSpans = [...]int{5, 10, 20}

// Share returns the critical share of the arrivals over ReserveLongWindow (0 without any).
func (r *SeatReserve) Share() float64 {
	now := r.clock.Now()
	all := r.all.count(now, ReserveLongWindow)
	if all == 0 {
		return 0
	}
	return min(float64(r.critical.count(now, ReserveLongWindow))/float64(all), 1)
}

// Completions returns the completions per second the reserve is sized against: a full fleet's of seats seats,
// seats over the mean time a timed attempt held its seat over ReserveLongWindow (Served), or over the last mean
// measured when none was timed within it. While no attempt was ever timed or seats is not known, the measured
// completion rate; while none has ended at all, seats over the reserve's age (no attempt has held a seat
// longer, so none may be counted on ending sooner on average): the fleet completes at most that.
func (r *SeatReserve) Completions(seats int) float64 {
	now := r.clock.Now()
	if seats > 0 {
		if n := r.timed.count(now, ReserveLongWindow); n > 0 {
			mean := max(r.held.count(now, ReserveLongWindow)/n, 1) // microseconds
			if r.hold.Load() != mean {
				r.hold.Store(mean)
			}
			return float64(seats) / (float64(mean) / 1e6)
		}
		if mean := r.hold.Load(); mean > 0 {
			return float64(seats) / (float64(mean) / 1e6)
		}
	}
	if done := r.rate(&r.done, now, ReserveLongWindow); done > 0 || seats <= 0 || r.born.Load() == 0 {
		return done
	}
	age := max(now.Sub(time.Unix(0, r.born.Load())), surgeTick)
	return float64(seats) / age.Seconds()
}

// Seats returns how many seats to keep free for critical requests in a fleet of seats seats (those the caps
// know or hold provisionally), at most limit (the caller passes a share of the fleet's seats; a critical stream
// that alone reaches the completions gets that).
func (r *SeatReserve) Seats(limit, seats int) int {
	crit := r.Forecast()
	if crit == 0 || limit <= 0 {
		return 0
	}
	done := r.Completions(seats)
	if crit >= done {
		return limit
	}
	rho := rhoOf(crit, done, r.Share(), r.Surge())
	if rho >= 1 {
		return limit
	}
	n := int(math.Ceil(math.Log(ReserveMiss) / math.Log(rho)))
	return min(max(n, 1), limit)
}

// ResumeWait returns how long a stream that gives its seat to a critical request now may expect to wait for a
// seat again, in a fleet of seats seats where need seats are still wanted by critical requests (those waiting
// less the yields under way, the asker's included): need completions of the full fleet (Completions), of which
// critical arrivals take the share rho the reserve is sized for (Status: the forecast, or the critical share of
// a surge, over the completions), so need / (completions x (1 - rho)). With rho at 1 or more critical requests
// take every seat that frees and it returns the longest duration. ok is false while no completion is known.
//
// A standard stream yields its seat only if it may expect it back within its class's objective for a first token
// (proxy/yield.go; docs/design.md, "Yielding seats"). At five times the capacity of one engine of 64 seats, where
// critical demand alone is about the completions, 12-17 standard streams yielded per spike (on seed 1, every one begun
// before it or in its first 1.5 s) and waited 6-9 s to resume; a rule on the forecast alone (critical arrivals at least
// the completions) stopped none. This one, whose rho takes the surge of the last half second into account, stopped
// every standard yield in one run of seed 1, and in the whole matrix run after it 15, 8 and 18 still yielded on seeds
// 1-3 (bench/results/protect-2026-12-02-matrix.md, run 16): the wait leaves out the seats the reserve keeps from a
// resumed standard stream (Admits), and counting them at the reserve's present size was tried and reverted (run 17).
func (r *SeatReserve) ResumeWait(need, seats int) (wait time.Duration, ok bool) {
	done := r.Completions(seats)
	if done <= 0 {
		return 0, false
	}
	rho := r.rho(done)
	if rho >= 1 {
		return time.Duration(math.MaxInt64), true
	}
	s := float64(max(need, 1)) / (done * (1 - rho))
	if s >= time.Duration(math.MaxInt64).Seconds() {
		return time.Duration(math.MaxInt64), true
	}
	return time.Duration(s * float64(time.Second)), true
}

// rho returns the ratio the reserve is sized for against done completions a second (rhoOf).
func (r *SeatReserve) rho(done float64) float64 {
	return rhoOf(r.Forecast(), done, r.Share(), r.Surge())
}

// rhoOf returns the ratio a reserve is sized for: critical arrivals over completions, or the critical share of
// the arrivals of every class (surge) when those are more than the completions, if either is more.
func rhoOf(crit, done, share, surge float64) float64 {
	return max(crit/done, share*max(1, surge/done))
}

// ReserveStatus is what a SeatReserve's figures stand at (Status): what /debug/models shows an operator asking
// why standard or sheddable requests wait while engine seats are free.
type ReserveStatus struct {
	// Active reports critical arrivals within ReserveLongWindow: without any, no seat is held.
	Active bool `json:"active"`
	// FleetSeats and FreeSeats are the seats the caps know or hold provisionally, and those free, as the caller
	// counted them.
	FleetSeats int `json:"fleet_seats"`
	FreeSeats  int `json:"free_seats"`
	// Seats is how many of them are kept free for critical requests: standard requests wait while at most Seats
	// are free, sheddable ones while at most twice Seats are (Admits).
	Seats int `json:"seats"`
	// CriticalPerSecond is the forecast of critical arrivals (Forecast), CompletionsPerSecond the full fleet's
	// completions (Completions), CriticalShare the critical share of arrivals (Share), SurgePerSecond the recent
	// arrivals of every class (Surge), Rho the ratio Seats is sized for (0 with no completions counted).
	CriticalPerSecond    float64 `json:"critical_per_second"`
	CompletionsPerSecond float64 `json:"completions_per_second"`
	CriticalShare        float64 `json:"critical_share"`
	SurgePerSecond       float64 `json:"surge_per_second"`
	Rho                  float64 `json:"rho"`
}

// Status returns the reserve's figures for a fleet of seats seats (those the caps know or hold provisionally)
// of which free are free.
func (r *SeatReserve) Status(free, seats int) ReserveStatus {
	st := ReserveStatus{Active: r.Active(), FleetSeats: seats, FreeSeats: free, Seats: r.Seats(seats/2, seats),
		CriticalPerSecond: r.Forecast(), CompletionsPerSecond: r.Completions(seats), CriticalShare: r.Share(),
		SurgePerSecond: r.Surge()}
	if st.CompletionsPerSecond > 0 {
		st.Rho = rhoOf(st.CriticalPerSecond, st.CompletionsPerSecond, st.CriticalShare, st.SurgePerSecond)
	}
	return st
}

// Admits reports whether a request of class c may take one of free engine seats, of seats in the fleet (those
// the caps know or hold provisionally): critical ones always, standard ones while more than Seats(seats/2,
// seats) are free, sheddable ones while more than twice that are. With no reserve every class may.
func (r *SeatReserve) Admits(c Class, free, seats int) bool {
	if c == Critical {
		return true
	}
	n := r.Seats(seats/2, seats)
	if c == Standard {
		return free > n
	}
	return free > 2*n
}

// rateWindow counts events (or sums amounts: add's n) in one-second buckets over the last reserveBuckets seconds.
// Lock-free and lossless: each bucket is one word holding its second and its count, so an event never races
// with its bucket's reset to a new second (the second is kept modulo 2^24, 194 days; a bucket last written a
// multiple of that ago would count as current, which no gateway process lives to see).
type rateWindow struct {
	b [reserveBuckets]atomic.Uint64
}

// windowCountBits is the width of a rateWindow bucket's count: 1.1e12, far above a second's events or seat
// microseconds.
const windowCountBits = 40

func (w *rateWindow) add(now time.Time, n int64) {
	bucketAdd(w.b[:], uint64(now.Unix()), uint64(max(n, 0)), windowCountBits)
}

// count returns the events of the last span (whole seconds, at most reserveBuckets), the current second
// included.
func (w *rateWindow) count(now time.Time, span time.Duration) int64 {
	return bucketCount(w.b[:], uint64(now.Unix()), uint64(span/time.Second), windowCountBits)
}

// tickWindow counts events in surgeTick buckets over the last len(b) of them, as rateWindow does, with a tick
// kept modulo 2^32 (13 years of 100 ms ticks) and a count of 32 bits.
type tickWindow struct {
	b [20]atomic.Uint64
}

func (w *tickWindow) add(now time.Time) {
	bucketAdd(w.b[:], uint64(now.UnixNano()/int64(surgeTick)), 1, 32)
}

// count returns the events of the last k buckets (at most len(b)), the current one included.
func (w *tickWindow) count(now time.Time, k int) int64 {
	return bucketCount(w.b[:], uint64(now.UnixNano()/int64(surgeTick)), uint64(k), 32)
}

// bucketAdd adds n to slot's bucket of b, each bucket one word holding its slot (modulo 2^(64-bits)) and its
// count (bits wide, saturating): a bucket found holding an older slot starts over. Lock-free.
func bucketAdd(b []atomic.Uint64, slot, n uint64, bits uint) {
	countMask, slotMask := uint64(1)<<bits-1, uint64(1)<<(64-bits)-1
	s, w := slot&slotMask, &b[slot%uint64(len(b))]
	for {
		old := w.Load()
		c := n
		if old>>bits == s {
			c += old & countMask
		}
		if w.CompareAndSwap(old, s<<bits|min(c, countMask)) {
			return
		}
	}
}

// bucketCount returns the counts of b's buckets whose slot is among the last k up to slot, slot's included.
func bucketCount(b []atomic.Uint64, slot, k uint64, bits uint) int64 {
	countMask, slotMask := uint64(1)<<bits-1, uint64(1)<<(64-bits)-1
	s := slot & slotMask
	var n int64
	for i := range b {
		v := b[i].Load()
		if age := (s - v>>bits) & slotMask; age < k {
			n += int64(v & countMask)
		}
	}
	return n
}

// CriticalDelay is how much later than on an engine with nothing queued a critical request may get its first
// token because of the standard and sheddable prefill sent to that engine ahead of it, as a share of that
// first token: the protection's objective itself (critical first tokens within 1.5x their unloaded ones under
// overload, admission/README.md "Prefill pacing"), not a figure fitted to a fleet.
const CriticalDelay = 0.5

// PrefillPaced reports whether a request of class c must wait before its prefill is added to an engine where,
// with it, the prefill queued would delay a critical request's first token by ahead against idle, that first
// token on the engine with nothing queued (routing.Backend.PrefillAhead): standard and sheddable requests, while
// the model has critical demand (guard), and only while something is queued there already, so that one prefill
// at a time always goes. An engine co-schedules the prefill it was sent in one step (up to its token budget):
// at a spike's onset a 64-seat engine ran steps of some 4,000 prefill tokens, and a critical request arriving
// then waited for such a step and shared the next (1.75x its unloaded p99).
func PrefillPaced(c Class, guard bool, ahead, idle time.Duration, queued bool) bool {
	return c != Critical && guard && queued && float64(ahead) > CriticalDelay*float64(idle)
}
