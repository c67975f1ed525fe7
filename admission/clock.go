package admission

import (
	"math"
	"sync/atomic"
	"time"
)

// Clock tells the time. Every mechanism reads it instead of time.Now so that tests drive windows, deadlines and
// ejections on a virtual clock. Implementations must be safe for concurrent use.
type Clock interface {
	Now() time.Time
}

// SystemClock is the Clock that reads time.Now.
type SystemClock struct{}

// Now implements Clock.
func (SystemClock) Now() time.Time { return time.Now() }

// orSystem returns c, or the system clock when c is nil.
func orSystem(c Clock) Clock {
	if c == nil {
		return SystemClock{}
	}
	return c
}

// afloat is a float64 read and written atomically (its bits in an atomic.Uint64).
type afloat struct{ v atomic.Uint64 }

func (f *afloat) load() float64   { return math.Float64frombits(f.v.Load()) }
func (f *afloat) store(x float64) { f.v.Store(math.Float64bits(x)) }

// update replaces f with fn(f) atomically: fn may run more than once and must be pure.
func (f *afloat) update(fn func(float64) float64) float64 {
	for {
		old := f.v.Load()
		nv := fn(math.Float64frombits(old))
		if f.v.CompareAndSwap(old, math.Float64bits(nv)) {
			return nv
		}
	}
}
