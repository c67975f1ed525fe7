package routing

import (
	"math"
	"sync/atomic"
	"time"
)

// Clock tells the time. Backends, strategies and the Monitor read it instead of time.Now so that tests can drive
// latency models, staleness and TTLs on a virtual clock. Implementations must be safe for concurrent use.
type Clock interface {
	Now() time.Time
}

// SystemClock is the Clock that reads time.Now.
type SystemClock struct{}

// Now implements Clock.
func (SystemClock) Now() time.Time { return time.Now() }

// afloat is a float64 read and written atomically (its bits in an atomic.Uint64).
type afloat struct{ v atomic.Uint64 }

func (f *afloat) load() float64   { return math.Float64frombits(f.v.Load()) }
func (f *afloat) store(x float64) { f.v.Store(math.Float64bits(x)) }

// ewma folds x into f with weight alpha; lock-free, so concurrent updates may each see the other's result.
func (f *afloat) ewma(x, alpha float64) {
	for {
		old := f.v.Load()
		nv := math.Float64bits((1-alpha)*math.Float64frombits(old) + alpha*x)
		if f.v.CompareAndSwap(old, nv) {
			return
		}
	}
}

// duration converts seconds to a Duration, saturating instead of overflowing.
func duration(s float64) time.Duration {
	if s >= math.MaxInt64/1e9 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * 1e9)
}
