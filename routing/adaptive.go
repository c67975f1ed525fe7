package routing

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/cache"
)

// AdaptiveParams tune the adaptive strategy. DefaultAdaptiveParams gives routing.md section 4.8's defaults;
// Validate says what is out of range.
//
// What the strategy must know about an engine is learned per backend, not set here: what a cached prefix saves
// per token and how load slows it are the TTFT model's coefficients (model.go, shown with their errors in
// /debug/backends), the other replicas' prefill is drained by its age at the learned rate (drain.go), an engine that states its
// seats is saturated when they are full with a queue (seatsFull), the share of a prefix still being prefilled
// that a request sent to the same engine finds cached is learned from its cached_tokens (specHit), and the margin
// by which the owner of a prefix keeps it is the models' own measured error (keepOwner). Each parameter below says why its default is safe on
// every kind of engine: stepped continuous batching (vLLM, the simulator), fixed seats that slow only when
// saturated, radix or token-block prefix caches, with or without chunked prefill, and hosted APIs.
type AdaptiveParams struct {
	// QueueThreshold is the engine queue (waiting requests) at which a backend counts as fully loaded. Default 4.
	// Safe everywhere because it is a last resort, not the measure of load: an engine that states its seats is
	// saturated as soon as they are full with one request waiting (seatsFull); for the others the queue's wait is
	// already in the cost (waiting times the uncached tokens per request, at the learned rate), so the
	// threshold only removes a backend the cost already ranks low; and a hosted API exports no queue at all.
	QueueThreshold float64
	// KVThreshold is the KV-cache usage (0 to 1) at which a backend counts as fully loaded. Default 0.85. Safe
	// on caches that keep prefixes (vLLM's block cache, SGLang's radix tree) because their usage counts blocks
	// held by running requests, not evictable cached ones: a cache full of reusable prefixes reads low. Past
	// 0.85 a paged engine preempts or stops admitting, whatever its batching.
	KVThreshold float64
	// Headroom is how far past QueueThreshold a backend's queue may go before it is filtered out as saturated:
	// it is saturated when waiting > QueueThreshold*(1+Headroom) or kv > KVThreshold (KV usage cannot exceed 1,
	// so it gets no headroom). Default 0.2: a scrape is a snapshot, and an engine that steps every few
	// milliseconds always has a request or two between steps.
	Headroom float64
	// RegionMargin is added to the cost of a backend outside the gateway's region, once per step down the
	// failover order (a backend in the first failover region pays it once, in the second twice, elsewhere once
	// more than the last): a remote backend wins only when it is cheaper by more than that, a hysteresis against
	// flapping between regions. Its RTT is counted separately. Default 100ms. A policy choice about regions
	// (data residency, egress), not engine physics: the engine kind does not enter it.
	RegionMargin time.Duration
	// Interference weighs the stall a request's prefill imposes on the sequences already decoding on a
	// backend: running * prefill_time * Interference seconds are added to its cost. Default 0.05. Safe because
	// it is small next to the request's own TTFT at any running count an engine sustains, and it prices the
	// stall in the engine's own learned prefill time: an engine with chunked prefill stalls its decodes less
	// than that, one without stalls them for the whole prefill, and in both the term only tips near-ties.
	Interference float64
	// TieRelative and TieAbsolute define near-ties: candidates whose cost is within best*(1+TieRelative) +
	// TieAbsolute. Defaults 0.1 and 10ms. They decide only among candidates within 10% (plus one engine step) of
	// the best predicted cost, for a prompt whose owner does not keep it (keepOwner): at most that much is lost on
	// any engine, and the 10 ms is about one engine step or one scheduling hiccup of the host.
	TieRelative float64
	TieAbsolute time.Duration
	// TieMax caps how many near-tied candidates are sampled among (the cheapest ones). Default 3. Temperature is
	// the softmax temperature of sampling among near-ties, relative to the best cost (at least 50 ms):
	// P(b) ~ exp(-(cost_b - best) / (Temperature * max(best, 50ms))). Default 0.1. Both act only within the
	// near-tie band, for a prompt held by no candidate in it: they spread, within the same bounded loss.
	TieMax      int
	Temperature float64
	// MaxBlocks caps the prompt blocks hashed and matched (64 bytes each). Default cache.DefaultMaxBlocks. A
	// bound on the gateway's work per request; engines hold longer prefixes, which then match up to it.
	MaxBlocks int
	// ImbalanceAbs and ImbalanceRel are a seatbelt that does not depend on the latency models: a backend with
	// more than ImbalanceAbs requests in flight beyond the least loaded candidate, and more than ImbalanceRel
	// times its count, is treated as saturated (SGLang's imbalance rule, with its defaults 64 and 1.5), so a
	// model that has learned nonsense cannot pile the traffic onto one backend. Counts of requests, so it holds on
	// any engine; it fires only at an imbalance no healthy model produces.
	ImbalanceAbs float64
	ImbalanceRel float64
	// UseP90 makes the cost use each backend's p90 predicted TTFT instead of its mean. Default false: the
	// spread behind a p90 is estimated from each backend's own recent errors, so a backend that has seen fewer
	// (or noisier) requests looks costlier, gets fewer, and stays that way; against simulators on a busy host
	// this herded traffic onto whichever backend had been observed most. Decision.TTFT is the p90 either way.
	UseP90 bool
}

// DefaultAdaptiveParams returns the default parameters.
func DefaultAdaptiveParams() AdaptiveParams {
	return AdaptiveParams{
		QueueThreshold: 4,
		KVThreshold:    0.85,
		Headroom:       0.2,
		RegionMargin:   100 * time.Millisecond,
		Interference:   0.05,
		TieRelative:    0.1,
		TieAbsolute:    10 * time.Millisecond,
		TieMax:         3,
		Temperature:    0.1,
		MaxBlocks:      cache.DefaultMaxBlocks,
		ImbalanceAbs:   64,
		ImbalanceRel:   1.5,
	}
}

// Validate reports the first parameter out of range, naming it as the policy spells it.
func (p AdaptiveParams) Validate() error {
	var errs []error
	check := func(ok bool, name string, v any, want string) {
		if !ok {
			errs = append(errs, fmt.Errorf("%s: %v: must be %s", name, v, want))
		}
	}
	check(p.QueueThreshold > 0, "queue_threshold", p.QueueThreshold, "> 0")
	check(p.KVThreshold > 0 && p.KVThreshold <= 1, "kv_threshold", p.KVThreshold, "in (0, 1]")
	check(p.Headroom >= 0, "headroom", p.Headroom, ">= 0")
	check(p.RegionMargin >= 0, "region_margin", p.RegionMargin, ">= 0")
	check(p.Interference >= 0, "interference", p.Interference, ">= 0")
	check(p.TieRelative >= 0, "tie_relative", p.TieRelative, ">= 0")
	check(p.TieAbsolute >= 0, "tie_absolute", p.TieAbsolute, ">= 0")
	check(p.TieMax >= 1 && p.TieMax <= maxTies, "tie_max", p.TieMax, fmt.Sprintf("in [1, %d]", maxTies))
	check(p.Temperature > 0, "temperature", p.Temperature, "> 0")
	check(p.MaxBlocks > 0, "max_blocks", p.MaxBlocks, "> 0")
	check(p.ImbalanceAbs > 0, "imbalance_abs", p.ImbalanceAbs, "> 0")
	check(p.ImbalanceRel >= 1, "imbalance_rel", p.ImbalanceRel, ">= 1")
	return errors.Join(errs...)
}

const maxTies = 8

// Adaptive is the project's default strategy (routing.md section 4.5): every term of its cost is a predicted
// time, so prompt length, prefix hits, GPU speed, load and distance trade in one unit.
//
//	filter:  healthy; then not saturated (engine queue, KV usage, MaxConcurrency, in-flight imbalance); then,
//	         if the request has an ITL objective, predicted mean ITL within it. Each filter fails open when it
//	         would leave nothing.
//	cost_b = RTT_b + seatwait_b + TTFT_b(uncached_b, queued_b, running_b) + Interference*running_b*prefill_b
//	         + RegionMargin * tier_b (0 in the gateway's region, i in its i-th failover region)
//	         + out * ITL_b(running_b+1)              under ObjectiveThroughput
//	         + SecondsPerDollar * price_b(request)   under ObjectiveCost, which also filters on the TTFT SLO
//	pick:    for a prefix some candidate holds, its owner (the rendezvous winner among those holding the most of
//	         it: replicas agree on it) unless another candidate's cost plus its TTFT's measured error is below
//	         the owner's cost less its own (keepOwner); otherwise, among candidates within
//	         best*(1+TieRelative)+TieAbsolute: for a prefix no candidate holds confirmed (by a first token), of
//	         the two rendezvous-hash winners of the first block, the one with less traffic for prefixes it holds,
//	         then fewer requests, then the cheaper (pickCold; the band widened there by what the models do not
//	         know yet); for a prefix some of them hold, the rendezvous winner among those holding the most of it;
//	         when none within the band holds it, a softmax sample among the TieMax cheapest.
//
// uncached_b is the prompt minus the prefix b is believed to hold (a prefix an earlier request is still
// prefilling there counts at the share of it such requests were found to get: specHit), queued_b the prefill ahead on b (this
// replica's and what is left of the others', drain.go), and seatwait_b the wait for one of b's seats when all are
// taken (seatWait: the requests ahead, at the rate b's seats free up), so the owner of a hot prefix keeps it until
// its queue costs more than the prefill saved elsewhere, by more than the models can tell apart. Safe for
// concurrent use; picking among 64 backends with an 8 KiB prompt takes microseconds and allocates nothing.
type Adaptive struct {
	p      AdaptiveParams
	order  regionOrder
	sat    saturation
	clock  Clock
	lookup prometheus.Counter // nil without metrics
	hits   prometheus.Counter
}

var _ Strategy = (*Adaptive)(nil)

// weighsRegions implements regionWeigher: the cost's region margin lets a remote backend win by more than it.
func (*Adaptive) weighsRegions() {}

// NewAdaptive returns an adaptive strategy for one model with parameters p (see DefaultAdaptiveParams).
func NewAdaptive(env StrategyEnv, p AdaptiveParams) (*Adaptive, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("adaptive: %w", err)
	}
	s := &Adaptive{p: p, order: newRegionOrder(env), sat: saturationOf(p), clock: env.Clock}
	if s.clock == nil {
		s.clock = SystemClock{}
	}
	s.lookup, s.hits = prefixCounters(env)
	return s, nil
}

func prefixCounters(env StrategyEnv) (lookups, hits prometheus.Counter) {
	if env.Metrics == nil {
		return nil, nil
	}
	return env.Metrics.PrefixLookups.WithLabelValues(env.Model), env.Metrics.PrefixHits.WithLabelValues(env.Model)
}

func countLookup(lookups, hits prometheus.Counter, longest int) {
	if lookups == nil {
		return
	}
	lookups.Inc()
	if longest > 0 {
		hits.Inc()
	}
}

// cand is one candidate backend as a strategy evaluates it.
type cand struct {
	i      int     // index in targets
	tier   uint8   // 0 eligible, 1 eligible overflow, 2 misses an objective, 3 saturated (see evaluate)
	blocks int     // leading prefix blocks held
	conf   int     // of which confirmed by a first token (the rest are still being prefilled: specHit)
	hit    int     // cached tokens predicted
	cost   float64 // seconds
	pred   float64 // the predicted engine TTFT in cost (mean, or p90 with UseP90), seconds
	spread float64 // the backend's p90/mean TTFT factor, exp(z90*sigma) from its recent prediction errors
	known  float64 // the p90 factor of its mean TTFT's own error (knownFactor): what the model does not know yet
	region int     // its step down the failover order (0 in the gateway's region)
	ttft   float64 // p90 TTFT, RTT included, seconds
	load   float64 // strategy-specific load
	room   bool    // its engine has a seat free for the request and none waiting, as the views brought up to now say
}

// Pick implements Strategy.
func (s *Adaptive) Pick(r *Request, targets []Target) (Target, error) {
	if len(targets) == 0 {
		return Target{}, ErrNoBackend
	}
	sc := acquireScratch(len(targets))
	defer releaseScratch(sc)
	longest := prefixMatch(r, targets, sc, s.p.MaxBlocks)
	countLookup(s.lookup, s.hits, longest)
	now := s.clock.Now()
	prompt := r.promptTokens()
	prev := turnsOf(targets).prevTurn(r, now) // the previous turn's backend, seen through another replica (turns.go)
	minInflight := int64(math.MaxInt64)
	overflow := false // Regional offered overflow backends beside dedicated ones
	for _, t := range targets {
		if t.Backend.Healthy() {
			minInflight = min(minInflight, t.Backend.Inflight())
		}
		overflow = overflow || t.Backend.Config().Tier == TierOverflow
	}
	best := uint8(255)
	for i, t := range targets {
		if !t.Backend.Healthy() {
			continue
		}
		conf := sc.counts[i]
		if conf > 0 {
			conf = sc.owners[i].Confirmed(r.hb.Hashes[:conf])
		}
		c := s.evaluate(r, t.Backend, now, prompt, sc.counts[i], conf, float64(minInflight), overflow, prev.on(t.Backend))
		c.i = i
		sc.cands = append(sc.cands, c)
		best = min(best, c.tier)
	}
	if len(sc.cands) == 0 {
		return Target{}, ErrNoBackend
	}
	// Keep the best tier only: the filters fail open. A prefix that no candidate holds confirmed (by a first
	// token) is cold: one still being prefilled where an earlier request went is placed by the cold rule too, its
	// owner's cost counting the share of it a request sent now is found to get (specHit). Followed there as an
	// owner, the second of two requests of a new prompt sent 12 ms apart joined the first on an engine that
	// prefilled both in one step, 460-477 ms against 255 ms for either alone (hot-prefix-pressure on eight
	// engines: p99 TTFT 1.66-1.70x round robin's).
	cs := sc.cands[:0]
	minCost, cold := math.Inf(1), true
	for _, c := range sc.cands {
		if c.tier == best {
			cs = append(cs, c)
			minCost = min(minCost, c.cost)
			cold = cold && c.conf == 0
		}
	}
	tie := nearTie{s.p.TieRelative, s.p.TieAbsolute.Seconds()}
	band := tie.limit(minCost)
	var chosen cand
	if c, kept := keepTurn(cs, prev.b, targets); kept {
		chosen = c
	} else if cold {
		chosen = pickCold(cs, band, tie, coldKey(r), targets)
	} else if c, kept := keepOwner(cs, tie, coldKey(r), targets); kept {
		chosen = c
	} else if c, owned := pickOwner(cs, band, coldKey(r), targets); owned {
		chosen = c
	} else {
		chosen = s.sample(cs, minCost, band)
	}
	t := targets[chosen.i]
	r.dec = Decision{Backend: t.Backend, CachedTokens: chosen.hit, TTFT: duration(chosen.ttft),
		Cost: duration(chosen.cost), Saturated: best == tierSaturated, blocks: chosen.blocks}
	return t, nil
}

// The candidate tiers of a pick; only the best one present is considered (the filters fail open).
const (
	tierEligible  = 0 // meets the objectives
	tierOverflow  = 1 // an overflow backend that meets them: paid per token, so after every eligible dedicated one
	tierMisses    = 2 // predicted to miss the ITL objective or the TTFT one (its mean; the p90 under the cost objective or with overflow offered)
	tierSaturated = 3
)

// evaluate computes b's tier and cost for r, a prompt of prompt tokens of which b holds blocks leading blocks
// (conf of them confirmed by a first token, the rest still being prefilled: specHit), under r's objective.
// overflow says that Regional offered overflow backends beside the dedicated ones (Request.TTFTSLO set): a
// dedicated backend predicted to miss the TTFT objective then ranks below them, so that a burst the dedicated
// tier cannot serve in time goes to overflow rather than queueing on a slow backend.
func (s *Adaptive) evaluate(r *Request, b *Backend, now time.Time, prompt, blocks, conf int, minInflight float64, overflow bool, less turnLess) cand {
	cfg := b.Config()
	l := b.loadLess(now, less)
	hit, _, _ := b.specHit(blocks, conf, prompt, b.hitScale.load())
	u := float64(uncachedTokens(prompt, hit))
	mean := b.lat.ttftMean(u, l.queuedTok, l.running)
	p90 := mean * b.lat.ttftSpread.load()
	ttft := mean
	if s.p.UseP90 {
		ttft = p90
	}
	rtt := b.rtt()
	cost := rtt + l.seatWait + ttft + s.p.Interference*l.running*b.lat.prefillPerToken()*u
	k := s.order.tier(cfg.Region)
	if k > 0 {
		cost += float64(k) * s.p.RegionMargin.Seconds()
	}
	switch r.Objective {
	case ObjectiveThroughput:
		cost += float64(r.outputTokens()) * b.lat.itlMean(l.running+1)
	case ObjectiveCost:
		cost += r.SecondsPerDollar * cfg.Price.estimate(prompt, hit, r.outputTokens())
	}
	c := cand{blocks: blocks, conf: conf, hit: hit, cost: cost, pred: ttft, spread: b.lat.ttftSpread.load(),
		known: b.lat.ttftKnown.load(), region: k, ttft: rtt + l.seatWait + p90, room: l.room}
	itlSLO := r.ITLSLO
	switch {
	case s.sat.at(cfg, l):
		c.tier = tierSaturated
	case float64(l.inflight) > max(minInflight+s.p.ImbalanceAbs, minInflight*s.p.ImbalanceRel):
		c.tier = tierSaturated
	case itlSLO > 0 && b.lat.itlMean(l.running+1) > itlSLO.Seconds():
		// Judged on the mean inter-token latency predicted with this request added, not its p90: the spread
		// behind a p90 comes from each backend's own recent errors, and a backend that has served few streams
		// keeps the prior's (1.47x the mean), so against an objective within that margin of the engines' real
		// ITL every backend but the few most observed "missed" it, and those took all the traffic until their
		// seats overflowed (64 backends of 4 seats, shared prefixes: p99 TTFT 10x round robin's). A backend
		// whose mean misses the objective still ranks below those whose mean meets it.
		c.tier = tierMisses
	case (r.Objective == ObjectiveCost || overflow) && r.TTFTSLO > 0 && c.ttft > r.TTFTSLO.Seconds():
		c.tier = tierMisses
	case r.TTFTSLO > 0 && rtt+l.seatWait+mean > r.TTFTSLO.Seconds():
		// Predicted (mean) to miss the TTFT objective: it ranks with the backends that miss the ITL objective,
		// and the cost decides among them. Without this, on engines whose ITL grows with their batch (fixed
		// seats that slow when full) the ITL filter left only the few lightly loaded backends eligible; they
		// filled their seats, and a request waited seconds for one there rather than start at once on a
		// backend with a free seat whose ITL would miss by a few milliseconds.
		c.tier = tierMisses
	case cfg.Tier == TierOverflow:
		c.tier = tierOverflow
	}
	return c
}

// coldKey is the rendezvous key of a prompt no backend holds: its first block's hash, or for a prompt shorter
// than a block the hash of the whole prompt.
func coldKey(r *Request) uint64 {
	if r.hb != nil && len(r.hb.Hashes) > 0 {
		return r.hb.Hashes[0]
	}
	return xxhash.Sum64(r.Prompt) ^ cache.Seed(r.Model)
}

// pickRendezvous returns, among the candidates whose cost is within band and that hold at least minBlocks of
// the prefix, the one with the highest rendezvous score for key. Every such candidate is considered (not only the
// cheapest few) so that replicas whose views differ slightly still agree.
func pickRendezvous(cs []cand, band float64, minBlocks int, key uint64, targets []Target) cand {
	var best cand
	var bestScore uint64
	found := false
	for _, c := range cs {
		if c.cost > band || c.blocks < minBlocks {
			continue
		}
		if sc := rendezvous(key, targets[c.i].Backend); !found || sc > bestScore {
			best, bestScore, found = c, sc, true
		}
	}
	return best
}

// pickCold places a prompt no candidate holds. Of the candidates that the models cannot tell apart from the
// cheapest (those within band, and in the cheapest one's region also those whose optimistic cost, their TTFT
// divided by the p90 factor of its mean's own error (knownFactor), is within band), it takes the two with the
// highest rendezvous scores for key; of those two, the one serving fewer requests that came to it for a prefix it
// holds (Backend.warm) wins, then, when their costs are near-tied (TieRelative, TieAbsolute), the one with fewer
// requests in flight, then the cheaper.
//
// Two choices, not the rendezvous winner alone: with one choice, two of a fleet's few hot system prompts shared
// a backend as often as the hash put them together (two of four on eight backends: 59% of the time), and that
// backend's queue later pushed long conversations off it at the full cost of their history's prefill, while
// other backends held no prompt at all (multi-turn conversations on 8 backends: p99 TTFT 1.22-1.80x
// cache_aware's, routing/README.md). A backend that owns a hot prefix is busy with that prefix's traffic from
// now on, which its present cost does not show on an engine that does not slow down until its seats are full,
// so a new prompt goes to the other of its two; prompts that share nothing leave warm at zero everywhere and are
// spread by load, as two random choices do, without herding every replica's new prompts onto the one cheapest
// backend. The two are a pair the hash fixes for the prompt, so replicas that see the pair alike agree on it, and
// a conversation's next turn finds the backend its first one went to from the prefix hints (hints.go), not from
// this choice. A backend the models avoid for its cost is in no pair: the pair is drawn from the band only.
//
// Membership by optimistic cost: judged on the mean cost alone, a backend no request had reached yet lost every
// new prompt to the backends already observed whenever the prior was off (priorCal calibrates it, but from the
// first observations on). The band itself stays the mean costs' (an optimistic minimum would narrow it on one
// replica and not on another); only membership widens, by what each model says it does not know yet, so it
// narrows as they learn, and only in the cheapest candidate's region: the region margin is the policy's, not an
// uncertain prediction. The spread of the errors alone (as keepOwner uses it) is not that: a backend that stalls
// now and then has a wide one, and given the doubt it took a quarter of the cold prompts of
// bench/scenarios/protect-hedging.yaml (p99 TTFT 5.0 s, round robin's).
func pickCold(cs []cand, band float64, tie nearTie, key uint64, targets []Target) cand {
	var first, second cand
	var firstScore, secondScore uint64
	n := 0
	home := cs[0] // the cheapest candidate: its region's candidates are judged by their optimistic cost
	for _, c := range cs[1:] {
		if c.cost < home.cost {
			home = c
		}
	}
	for _, c := range cs {
		if c.cost > band && (c.region != home.region || c.optimistic(c.known) > band) {
			continue
		}
		sc := rendezvous(key, targets[c.i].Backend)
		switch {
		case n == 0 || sc > firstScore:
			second, secondScore = first, firstScore
			first, firstScore = c, sc
		case n == 1 || sc > secondScore:
			second, secondScore = c, sc
		}
		n++
	}
	if n < 2 {
		return first
	}
	bf, bs := targets[first.i].Backend, targets[second.i].Backend
	if c, ok := fewer(first, second, bf.warm.Load(), bs.warm.Load()); ok {
		return c
	}
	// Requests in flight decide only between costs the near-tie rule cannot tell apart: a count says nothing of
	// what the requests cost, and a backend busy with one long prefill is dearer than one decoding two answers.
	if max(first.cost, second.cost) <= tie.limit(min(first.cost, second.cost)) {
		if c, ok := fewer(first, second, bf.Inflight(), bs.Inflight()); ok {
			return c
		}
	}
	if second.cost < first.cost {
		return second
	}
	return first
}

// nearTie is the near-tie rule (AdaptiveParams.TieRelative and TieAbsolute, in seconds): a cost within limit(x)
// cannot be told apart from x.
type nearTie struct{ rel, abs float64 }

// limit is the dearest cost near-tied with x.
func (t nearTie) limit(x float64) float64 { return x*(1+t.rel) + t.abs }

// optimistic is c's cost with its predicted TTFT divided by the factor f (a p90 factor): the cost if the model
// erred that far on the slow side.
func (c cand) optimistic(f float64) float64 { return c.cost - c.pred*(1-1/f) }

// fewer returns whichever of a and b has the smaller count (na, nb), or false when they are equal.
func fewer(a, b cand, na, nb int64) (cand, bool) {
	switch {
	case na < nb:
		return a, true
	case nb < na:
		return b, true
	}
	return cand{}, false
}

// pickOwner returns the owner of a warm prefix among the candidates within band: of those holding the longest
// prefix, the rendezvous winner for key. It reports false when no candidate within band holds any of it (the
// owners' queues cost more than the prefill saved). Sampling among near-tied owners instead, as the strategy once
// did, let two replicas (or two requests of one conversation) alternate between two backends that both held a
// prefix, so both kept it in their KV caches and the conversation switched backends on a quarter to a third of
// its turns across replicas; the rendezvous owner takes the prefix's traffic until its own queue pushes it out of
// the band, then the next owner does.
func pickOwner(cs []cand, band float64, key uint64, targets []Target) (cand, bool) {
	most := 0
	for _, c := range cs {
		if c.cost <= band {
			most = max(most, c.blocks)
		}
	}
	if most == 0 {
		return cand{}, false
	}
	return pickRendezvous(cs, band, most, key, targets), true
}

// keepTurn returns the candidate on prev, the backend that served the previous turn of the conversation through
// another replica (Peers.prevTurn), while it holds the most of the prefix of any candidate and its engine has a
// seat free with no request waiting (cand.room); false otherwise, and the cost decides as for any request.
//
// Two replicas each learn their models from their own half of a conversation's turns, and their models of one
// backend differ: across two replicas, turns left their backend on 7-15% of follow-ups (multi-turn on 64 engines
// of 4 seats, four physics), most of them leaving an owner with a seat free, because one replica's model of the
// owner had learned slow first tokens from moments the engine was full, or its model of another backend had
// learned fast ones from prompts its prefix index took as uncached (bench/results/routing-2026-12-02-matrix.md,
// run 14). No margin on the costs holds against errors of that size. The previous turn's backend is a fact both
// replicas share through the turn records, and while its engine has a seat free and nothing waiting, the turn
// waits for nothing there and prefills only what the conversation added; another backend prefills the whole
// history too. What the owner's running sequences cost the new one (a stepped engine's shared steps, a seat
// engine's load factor) is what the models would weigh, and it is the term their errors swamp here; it is bounded
// by the engine's seats, since a full engine is not kept. Once the engine has no seat free, or another candidate
// holds more of the prompt, the costs decide again, so load still moves a conversation. The candidate must also be
// in the best tier, which cs holds alone: a backend predicted to miss an objective others meet is not kept; and in
// the nearest region any candidate is in: a conversation that failed over to another region comes home once its
// region can serve it again, as the region margin of the costs would bring it.
func keepTurn(cs []cand, prev *Backend, targets []Target) (cand, bool) {
	if prev == nil {
		return cand{}, false
	}
	most, home := 0, math.MaxInt
	var c cand
	found := false
	for _, x := range cs {
		most, home = max(most, x.blocks), min(home, x.region)
		if targets[x.i].Backend == prev {
			c, found = x, true
		}
	}
	if !found || most == 0 || c.blocks < most || !c.room || c.region > home {
		return cand{}, false
	}
	return c, true
}

// keepOwner returns the owner of a warm prefix, the rendezvous winner among the candidates holding the most of it,
// unless another candidate is cheaper beyond both predictions' measured errors: unless even the owner's optimistic
// cost (its TTFT divided by its p90 factor) exceeds the other's pessimistic one (its TTFT times its p90 factor).
// It reports false when the owner is outweighed so, and the pick falls back to the near-tie band.
//
// Keeping the owner only while it was within the near-tie band of the cheapest candidate lost conversations that
// alternate between two replicas: each replica's models of the backends differ (each learns from its own half of
// the traffic), and an owner whose prefill saving was a hundred milliseconds left the band whenever one
// replica's model of it, or of a cold backend, was off by more than the band's 10% (multi-turn conversations
// across two replicas stayed on their backend for 70-95% of their turns). The margin here is what the models
// themselves say they do not know, so it narrows as they learn and widens on a noisy engine, and a load that
// really outweighs the saving (a queue of other prefills on the owner) still moves the prefix.
//
// The margin protects the prefill the owner saves, so it holds only against candidates that hold less of the
// prefix. Against one that holds as much there is nothing to save: the owner is kept only while it is within a
// near-tie (TieRelative, TieAbsolute) of it, and beyond that the near-tie band decides (pickOwner). With the margin
// against every holder, the rendezvous owner of a hot prefix kept it while four other backends held it too and
// cost 20-30% less, until it ran 68 requests on an engine of 64 seats (burst-short on eight engines, p99 TTFT
// 1.2-1.55x round robin's).
func keepOwner(cs []cand, tie nearTie, key uint64, targets []Target) (cand, bool) {
	most := 0
	for _, c := range cs {
		most = max(most, c.blocks)
	}
	if most == 0 {
		return cand{}, false
	}
	o := pickRendezvous(cs, math.Inf(1), most, key, targets)
	lo := o.optimistic(o.spread)
	for _, c := range cs {
		switch {
		case c.i == o.i:
		case c.blocks < most:
			if c.cost+c.pred*(c.spread-1) < lo {
				return cand{}, false
			}
		case o.cost > tie.limit(c.cost):
			return cand{}, false
		}
	}
	return o, true
}

// sample draws among the TieMax cheapest candidates within band, with P ~ exp(-(cost-min)/(T*max(min, 50ms))).
func (s *Adaptive) sample(cs []cand, minCost, band float64) cand {
	var top [maxTies]cand
	n := 0
	for _, c := range cs {
		if c.cost > band {
			continue
		}
		// Insertion into the sorted top list.
		if n < s.p.TieMax {
			n++
		} else if c.cost >= top[n-1].cost {
			continue
		}
		j := n - 1
		for j > 0 && top[j-1].cost > c.cost {
			top[j] = top[j-1]
			j--
		}
		top[j] = c
	}
	if n == 1 {
		return top[0]
	}
	scale := s.p.Temperature * max(minCost, 0.05)
	var w [maxTies]float64
	total := 0.0
	for i := range n {
		w[i] = math.Exp(-(top[i].cost - minCost) / scale)
		total += w[i]
	}
	x := rand.Float64() * total
	for i := range n {
		if x -= w[i]; x < 0 {
			return top[i]
		}
	}
	return top[n-1]
}
