package routing

import "sync/atomic"

// RoundRobin sends requests to the healthy targets in turn. It knows nothing about load or latency: it is the
// baseline the benchmarks compare against. The zero value is ready to use.
type RoundRobin struct {
	next atomic.Uint64
}

var _ Strategy = (*RoundRobin)(nil)

// Pick implements Strategy.
func (rr *RoundRobin) Pick(_ *Request, targets []Target) (Target, error) {
	var buf [16]Target
	hs := healthy(buf[:0], targets)
	if len(hs) == 0 {
		return Target{}, ErrNoBackend
	}
	n := rr.next.Add(1) - 1
	return hs[n%uint64(len(hs))], nil
}
