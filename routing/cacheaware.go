package routing

import (
	"math/rand/v2"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/cache"
)

// CacheAware is SGLang's cache-aware load balancer (sgl-model-gateway policies/cache_aware.rs), a baseline for the
// adaptive strategy. Load is the gateway's own count of requests in flight per backend.
//
//	if max_load - min_load > BalanceAbs and max_load > BalanceRel * min_load:   least loaded (imbalanced)
//	else if matched_bytes / prompt_bytes > Threshold:                           longest prefix match (least
//	                                                                            loaded among equal matches)
//	else:                                                                       least loaded
//
// with SGLang's defaults Threshold 0.3, BalanceAbs 64, BalanceRel 1.5. The prefix match comes from the same
// prefix index as the adaptive strategy (64-byte blocks instead of SGLang's character radix tree). Ties are
// broken at random. Safe for concurrent use.
type CacheAware struct {
	// Threshold is the share of the prompt a backend must hold for the request to follow the cache.
	Threshold float64
	// BalanceAbs and BalanceRel define imbalance: both must be exceeded.
	BalanceAbs, BalanceRel float64

	lookup, hits prometheus.Counter
}

var _ Strategy = (*CacheAware)(nil)

// NewCacheAware returns a CacheAware strategy with SGLang's defaults.
func NewCacheAware(env StrategyEnv) *CacheAware {
	c := &CacheAware{Threshold: 0.3, BalanceAbs: 64, BalanceRel: 1.5}
	c.lookup, c.hits = prefixCounters(env)
	return c
}

// Pick implements Strategy.
func (s *CacheAware) Pick(r *Request, targets []Target) (Target, error) {
	if len(targets) == 0 {
		return Target{}, ErrNoBackend
	}
	sc := acquireScratch(len(targets))
	defer releaseScratch(sc)
	longest := prefixMatch(r, targets, sc, cache.DefaultMaxBlocks)
	countLookup(s.lookup, s.hits, longest)
	minLoad, maxLoad := 0.0, 0.0
	for i, t := range targets {
		if !t.Backend.Healthy() {
			continue
		}
		l := float64(t.Backend.Inflight())
		if len(sc.cands) == 0 {
			minLoad, maxLoad = l, l
		}
		minLoad, maxLoad = min(minLoad, l), max(maxLoad, l)
		sc.cands = append(sc.cands, cand{i: i, blocks: sc.counts[i], load: l})
	}
	if len(sc.cands) == 0 {
		return Target{}, ErrNoBackend
	}
	imbalanced := maxLoad-minLoad > s.BalanceAbs && maxLoad > s.BalanceRel*minLoad
	followCache := false
	if !imbalanced && len(r.Prompt) > 0 {
		best := 0
		for _, c := range sc.cands {
			best = max(best, c.blocks)
		}
		followCache = float64(best*cache.BlockBytes)/float64(len(r.Prompt)) > s.Threshold
	}
	// Least loaded, among the longest matches when following the cache; ties reservoir-sampled.
	compare := func(c, cur cand) int { // > 0: c is better
		if followCache && c.blocks != cur.blocks {
			return c.blocks - cur.blocks
		}
		switch {
		case c.load < cur.load:
			return 1
		case c.load > cur.load:
			return -1
		}
		return 0
	}
	chosen, ties := sc.cands[0], 1
	for _, c := range sc.cands[1:] {
		switch d := compare(c, chosen); {
		case d > 0:
			chosen, ties = c, 1
		case d == 0:
			ties++
			if rand.IntN(ties) == 0 {
				chosen = c
			}
		}
	}
	t := targets[chosen.i]
	hit := hitTokens(chosen.blocks, r.promptTokens(), 1)
	r.dec = Decision{Backend: t.Backend, CachedTokens: hit, blocks: chosen.blocks}
	return t, nil
}
