package routing

import (
	"math"

	"github.com/cespare/xxhash/v2"

	"github.com/switchyard/switchyard/cache"
)

// PrefixHash is consistent hashing of the prompt's leading blocks with bounded load (KubeAI's CHWBL, SGLang's
// prefix_hash), a baseline that needs no shared state: replicas agree because they hash the same bytes.
//
//	key   = chained hash of the first PrefixBlocks 64-byte blocks (of the whole prompt if shorter than a block)
//	order = healthy backends by rendezvous score mix64(key ^ hash(name)), highest first
//	pick  = the first in order with inflight < ceil(LoadFactor * (total_inflight + 1) / healthy)
//
// Defaults: PrefixBlocks 8 (512 bytes, about 128 tokens), LoadFactor 1.25. Safe for concurrent use.
type PrefixHash struct {
	// PrefixBlocks is how many leading 64-byte blocks make the key.
	PrefixBlocks int
	// LoadFactor bounds a backend's load to this multiple of the mean before the key moves on.
	LoadFactor float64
}

var _ Strategy = (*PrefixHash)(nil)

// NewPrefixHash returns a PrefixHash strategy with the defaults.
func NewPrefixHash(StrategyEnv) *PrefixHash { return &PrefixHash{PrefixBlocks: 8, LoadFactor: 1.25} }

// Pick implements Strategy.
func (s *PrefixHash) Pick(r *Request, targets []Target) (Target, error) {
	hs := r.hashes(cache.DefaultMaxBlocks)
	var key uint64
	switch {
	case len(hs) == 0:
		key = xxhash.Sum64(r.Prompt) ^ cache.Seed(r.Model)
	case len(hs) < s.PrefixBlocks:
		key = hs[len(hs)-1]
	default:
		key = hs[s.PrefixBlocks-1]
	}
	n, total := 0, int64(0)
	for _, t := range targets {
		if t.Backend.Healthy() {
			n++
			total += t.Backend.Inflight()
		}
	}
	if n == 0 {
		return Target{}, ErrNoBackend
	}
	bound := int64(math.Ceil(s.LoadFactor * float64(total+1) / float64(n)))
	// The highest-scoring backend under the bound; the highest overall if none is (cannot happen: some backend
	// is at or below the mean).
	bestUnder, bestAny := -1, -1
	var scoreUnder, scoreAny uint64
	for i, t := range targets {
		if !t.Backend.Healthy() {
			continue
		}
		sc := rendezvous(key, t.Backend)
		if bestAny < 0 || sc > scoreAny {
			bestAny, scoreAny = i, sc
		}
		if t.Backend.Inflight() < bound && (bestUnder < 0 || sc > scoreUnder) {
			bestUnder, scoreUnder = i, sc
		}
	}
	i := bestUnder
	if i < 0 {
		i = bestAny
	}
	t := targets[i]
	r.dec = Decision{Backend: t.Backend}
	return t, nil
}
