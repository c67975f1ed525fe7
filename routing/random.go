package routing

import "math/rand/v2"

// Random sends each request to a healthy target chosen at random, in proportion to the targets' weights. The
// zero value is ready to use.
type Random struct{}

var _ Strategy = Random{}

// Pick implements Strategy.
func (Random) Pick(r *Request, targets []Target) (Target, error) {
	total := 0.0
	for _, t := range targets {
		if t.Backend.Healthy() {
			total += weight(t.Backend.Config())
		}
	}
	if total == 0 {
		return Target{}, ErrNoBackend
	}
	x := rand.Float64() * total
	var last Target
	for _, t := range targets {
		if !t.Backend.Healthy() {
			continue
		}
		last = t
		if x -= weight(t.Backend.Config()); x < 0 {
			break
		}
	}
	r.dec = Decision{Backend: last.Backend} // the loop ends on the pick, or rounding left x at exactly 0
	return last, nil
}
