package admission

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Calibration constants. Neither is a figure fitted to a fleet: MissShare is the objective's own definition and
// CalibrationWindow only trades how fast the correction follows a change against the noise of its quantile.
const (
	// MissShare is the share of admitted requests allowed to miss their TTFT objective: the correction is the
	// (1 - MissShare) quantile of the prediction's error, so admitted requests meet their objective at p99.
	MissShare = 0.01
	// CalibrationWindow is how many recent admitted requests of a class the correction is measured on. With 256,
	// the p99 is the second largest error seen, whose expected coverage is 255/257 (split conformal prediction),
	// and a fleet that changes (a new engine, a bias that flips) is followed after 256 requests of the class.
	CalibrationWindow = 256
)

// Calibration measures, for the requests a model's fleet admitted, how far their time to first token was from
// the prediction they were admitted on, and gives the factors that correct the prediction, so that admission
// holds on engines and fleets whose predictions are biased either way (the cost model's fit is off, the queue's
// wait estimate lags a spike, critical traffic overtakes more than expected).
//
// The prediction has two parts, and each part's error is measured per class as the ratio observed / predicted
// over the last CalibrationWindow admitted requests, and corrected by its (1 - MissShare) quantile (split
// conformal prediction on a sliding window, which assumes nothing of the error's distribution):
//
//	Wait:  arrival to dispatch, against the queue's expected wait the Shedder judged (Queue.ExpectedWait), for
//	       requests that waited; a request admitted and refused in the queue (its chance had passed) counts
//	       as having waited at least as long as it did
//	Serve: dispatch to first token, against routing's p90 prediction for the backend it was dispatched to
//
// The parts are corrected apart, not as one total: a total ratio is set by whichever part dominates the
// samples (the serve time of the many requests that start at once), and scaling the wait by the serve
// error refused waiting requests that would have met their objective and left engine seats idle.
//
// A part with no observation yet has factor 1 (its prediction is taken as it is); one with fewer than
// 1/MissShare observations uses the largest error seen, the most cautious figure the samples allow. Critical
// requests are never refused on prediction and need no calibration; the request path does not report them.
//
// The factors are read lock-free on every admission decision; an observation takes a per-part mutex and keeps the
// window sorted, so the quantile is current after every one. Safe for
// concurrent use. Keep one per model across policy reloads: what it measured stays true of the fleet.
type Calibration struct {
	wait, serve [NumClasses]ratioWindow
}

// NewCalibration returns a Calibration with nothing measured (factors 1).
func NewCalibration() *Calibration { return &Calibration{} }

// Wait returns the factor by which the queue's expected wait (Queue.ExpectedWait) of a request of class c is
// multiplied before the Shedder adds it to the corrected serve prediction. 1 when nothing was measured;
// nil-safe.
func (k *Calibration) Wait(c Class) float64 {
	if k == nil {
		return 1
	}
	return k.wait[c.Index()].factor()
}

// Serve returns the factor by which routing's p90 prediction from dispatch to first token of a request of class
// c is multiplied, when the Shedder admits it and when the queue judges whether it can still meet its objective.
// 1 when nothing was measured; nil-safe.
func (k *Calibration) Serve(c Class) float64 {
	if k == nil {
		return 1
	}
	return k.serve[c.Index()].factor()
}

// Corrected returns the corrected prediction of a request of class c's first token counted from its arrival:
// serve * Serve(c) + wait * Wait(c). Nil-safe.
func (k *Calibration) Corrected(c Class, serve, wait time.Duration) time.Duration {
	return time.Duration(float64(serve)*k.Serve(c) + float64(wait)*k.Wait(c))
}

// Observe records an admitted request's first token: waited is its time from arrival to dispatch, wait the
// expected wait the Shedder judged it on (ShedDecision.Wait); serve its attempt's time from dispatch to first
// token, predicted routing's p90 prediction for that attempt (Decision.TTFT). A zero prediction skips its part
// (not measured). Nil-safe.
func (k *Calibration) Observe(c Class, waited, wait, serve, predicted time.Duration) {
	if k == nil {
		return
	}
	if wait > 0 {
		k.wait[c.Index()].add(float64(waited) / float64(wait))
	}
	if predicted > 0 && serve > 0 {
		k.serve[c.Index()].add(float64(serve) / float64(predicted))
	}
}

// Late records an admitted request that the queue refused because it could no longer meet its objective, after
// it waited waited: its real wait, never seen, was at least that, against the wait it was admitted on
// (ShedDecision.Wait), so admission becomes more careful. Nil-safe.
func (k *Calibration) Late(c Class, wait, waited time.Duration) {
	if k == nil || wait <= 0 {
		return
	}
	k.wait[c.Index()].add(float64(waited) / float64(wait))
}

// ratioWindow is a sliding window of errors (observed / predicted), kept both in arrival order (to know which
// one leaves) and sorted (to read the quantile), and its (1 - MissShare) quantile.
type ratioWindow struct {
	q afloat // the factor; 0 until the first observation (read as 1)

	mu      sync.Mutex
	buf     [CalibrationWindow]float32 // in arrival order, a ring
	sorted  [CalibrationWindow]float32 // the same values, ascending
	n, next int                        // values held (up to CalibrationWindow), and where the next one goes
}

func (w *ratioWindow) factor() float64 {
	if q := w.q.load(); q > 0 {
		return q
	}
	return 1
}

// add puts r in the window, dropping the oldest value when it is full, and recomputes the quantile: two binary
// searches and two moves of at most CalibrationWindow values (about 100 ns), no allocation.
func (w *ratioWindow) add(r float64) {
	if !(r > 0) || math.IsInf(r, 0) {
		return
	}
	x := float32(min(r, math.MaxFloat32))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n == CalibrationWindow {
		old := w.buf[w.next]
		i, _ := slices.BinarySearch(w.sorted[:w.n], old)
		copy(w.sorted[i:w.n-1], w.sorted[i+1:w.n])
		w.n--
	}
	w.buf[w.next] = x
	w.next = (w.next + 1) % CalibrationWindow
	i, _ := slices.BinarySearch(w.sorted[:w.n], x)
	copy(w.sorted[i+1:w.n+1], w.sorted[i:w.n])
	w.sorted[i] = x
	w.n++
	w.q.store(float64(w.sorted[conformalRank(w.n)]))
}

// conformalRank returns the index, in ascending order, of the split-conformal (1 - MissShare) quantile of n
// values: the k-th smallest with k = ceil((n+1)(1 - MissShare)), or the largest when k > n (too few samples for
// that level).
func conformalRank(n int) int {
	k := int(math.Ceil(float64(n+1)*(1-MissShare))) - 1
	return min(k, n-1)
}
