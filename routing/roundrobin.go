package routing

import "sync/atomic"

// RoundRobin sends requests to the healthy targets in turn. It knows nothing about load or latency: it is the
// baseline the benchmarks compare against. The zero value is ready to use.
type RoundRobin struct {
	next atomic.Uint64
}

var _ Strategy = (*RoundRobin)(nil)

// Pick implements Strategy.
func (rr *RoundRobin) Pick(r *Request, targets []Target) (Target, error) {
	n := healthyCount(targets)
	if n == 0 {
		return Target{}, ErrNoBackend
	}
	k := int((rr.next.Add(1) - 1) % uint64(n))
	for _, t := range targets {
		if !t.Backend.Healthy() {
			continue
		}
		if k == 0 {
			r.dec = Decision{Backend: t.Backend}
			return t, nil
		}
		k--
	}
	// A target turned unhealthy between the two loops: take any healthy one.
	for _, t := range targets {
		if t.Backend.Healthy() {
			r.dec = Decision{Backend: t.Backend}
			return t, nil
		}
	}
	return Target{}, ErrNoBackend
}
