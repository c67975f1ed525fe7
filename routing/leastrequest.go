package routing

import "math/rand/v2"

// LeastRequest sends each request to the healthy target with the fewest requests in flight (divided by its
// weight), breaking ties at random so that replicas do not herd. It sees the gateway's own accounting only.
// The zero value is ready to use.
type LeastRequest struct{}

var _ Strategy = LeastRequest{}

// Pick implements Strategy.
func (LeastRequest) Pick(r *Request, targets []Target) (Target, error) {
	var best Target
	bestLoad, ties := 0.0, 0
	for _, t := range targets {
		if !t.Backend.Healthy() {
			continue
		}
		load := float64(t.Backend.Inflight()) / weight(t.Backend.Config())
		switch {
		case ties == 0 || load < bestLoad:
			best, bestLoad, ties = t, load, 1
		case load == bestLoad:
			// Reservoir sampling over the ties: each tied target wins with probability 1/ties.
			ties++
			if rand.IntN(ties) == 0 {
				best = t
			}
		}
	}
	if ties == 0 {
		return Target{}, ErrNoBackend
	}
	r.dec = Decision{Backend: best.Backend}
	return best, nil
}

func weight(c *BackendConfig) float64 {
	if c.Weight > 0 {
		return c.Weight
	}
	return 1
}
