package routing

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/switchyard/switchyard/cache"
	"github.com/switchyard/switchyard/metrics"
)

// ErrNoBackend is returned when no backend can take a request: none serves the model, all are unhealthy, or all
// were already tried.
var ErrNoBackend = errors.New("routing: no backend available")

// ErrUnknownStrategy is returned by NewStrategy for a name it does not know.
var ErrUnknownStrategy = errors.New("routing: unknown strategy")

// Target is one way to serve a public model: a backend and the model name to send it upstream.
type Target struct {
	Backend *Backend
	// Model is the model name the backend knows; the request's "model" is rewritten to it when it differs.
	Model string
}

// Request is what a strategy knows about the request it routes. The request path owns it and may reuse it for
// another request after Reset. It is not safe for concurrent use: Pick and Dispatch for one request (including
// its hedges) must not run at the same time.
//
// On its first Pick a Request hashes its Prompt into 64-byte prefix blocks (cache.AppendHashes, seeded by Model)
// and keeps the hashes, in a pooled buffer, for later Picks (retries, hedges, late binding) and for the Attempts
// that Dispatch begins. Pick also records its Decision.
type Request struct {
	// Model is the public model name the client asked for; it seeds the prefix hashes.
	Model string
	// PromptTokens estimates the prompt's length in tokens; 0 means len(Prompt)/4.
	PromptTokens int
	// MaxTokens is the client's output bound (0 when unset).
	MaxTokens int
	// Prompt is the canonical prompt (openai.AppendPrompt), for prefix hashing; read during Pick and Dispatch.
	Prompt []byte
	// PrevTurn is the length of Prompt before the conversation's last answer (openai.Summary.PrevTurn): Prompt[:PrevTurn]
	// is the previous turn's prompt, whose request has ended since the client has its answer. 0 when there is none.
	// With replicas, routing takes that request off the views of the backend that served it (turns.go).
	PrevTurn int
	// ITLSLO, when set, is the inter-token latency the model promises: the adaptive strategy avoids backends
	// whose predicted mean ITL with this request added exceeds it, unless all do.
	ITLSLO time.Duration
	// Objective is what the adaptive strategy optimises (ObjectiveLatency, the zero value, is its own cost).
	Objective Objective
	// SecondsPerDollar is the cost objective's exchange rate: a backend whose predicted price for the request
	// is one dollar more must be this many seconds faster to win. 0 under the cost objective compares prices
	// not at all, leaving only its SLO filter.
	SecondsPerDollar float64
	// TTFTSLO, when set, is the time to first token the request is promised: the cost objective demotes the
	// backends predicted (p90) to miss it, unless all do.
	TTFTSLO time.Duration

	hb     *cache.HashBuf
	hashed bool
	dec    Decision
	key    uint64 // turnKey of Prompt, once keyed (Dispatch with peers)
	keyed  bool
}

// Decision is what the last Pick chose and predicted, for admission (early SLO checks), logs and Dispatch.
type Decision struct {
	// Backend is the chosen backend, nil before a successful Pick.
	Backend *Backend
	// CachedTokens is the prefix the chosen backend is believed to hold, in tokens.
	CachedTokens int
	// TTFT is the predicted p90 time to first token on the chosen backend, RTT included (adaptive only).
	TTFT time.Duration
	// Cost is the adaptive strategy's cost of the choice (TTFT plus penalties); 0 for other strategies.
	Cost time.Duration
	// Saturated says that every healthy candidate was saturated: the pick is the least bad, and admission
	// control may prefer to queue or shed.
	Saturated bool

	blocks int // leading prefix blocks the chosen backend holds
}

// Decision returns what the last Pick on r chose and predicted.
func (r *Request) Decision() Decision { return r.dec }

// Reset clears r for another request and returns its hash buffer to the pool. Call it only after every Attempt
// begun for r has ended (they read its hashes).
func (r *Request) Reset() {
	if r.hb != nil {
		cache.ReleaseHashBuf(r.hb)
	}
	*r = Request{}
}

// ReleaseHashes gives r's prefix-hash buffer back to its pool before r ends, so that an open stream does not hold
// it (docs/design.md, "Pooling"). Call it only when every Attempt dispatched for r has had its first token (which
// is the last use of the hashes) or ended, or holds its own copy (Attempt.KeepHashes); a later Pick hashes the
// prompt again.
func (r *Request) ReleaseHashes() {
	if r.hb != nil {
		cache.ReleaseHashBuf(r.hb)
		r.hb, r.hashed = nil, false
	}
}

// hashes returns r's prefix-block hashes, computing them on first use.
func (r *Request) hashes(maxBlocks int) []uint64 {
	if !r.hashed {
		if r.hb == nil {
			r.hb = cache.AcquireHashBuf()
		}
		r.hb.Hashes = cache.AppendHashes(r.hb.Hashes[:0], cache.Seed(r.Model), r.Prompt, maxBlocks)
		r.hashed = true
	}
	return r.hb.Hashes
}

func (r *Request) promptTokens() int {
	if r.PromptTokens > 0 {
		return r.PromptTokens
	}
	return (len(r.Prompt) + bytesPerToken - 1) / bytesPerToken
}

// Strategy picks the target to send a request to. Implementations are safe for concurrent use.
type Strategy interface {
	// Pick chooses one of targets (all serve the request's model and none was tried yet). It returns
	// ErrNoBackend when none is acceptable. targets is owned by the caller and valid during the call only.
	Pick(r *Request, targets []Target) (Target, error)
}

// Strategy names, as the policy spells them (`strategy:` of a model).
const (
	StrategyAdaptive     = "adaptive"
	StrategyRoundRobin   = "round_robin"
	StrategyLeastRequest = "least_request"
	StrategyRandom       = "random"
	StrategyCacheAware   = "cache_aware"
	StrategyPrefixHash   = "prefix_hash"
)

// DefaultStrategy is the strategy of a model whose policy names none.
const DefaultStrategy = StrategyAdaptive

// StrategyEnv is what NewStrategy needs besides the name. One strategy serves one public model; its zero value
// works (no metrics, no region, default parameters, the system clock).
type StrategyEnv struct {
	// Region is the gateway's own region: backends elsewhere pay the adaptive strategy's cross-region margin.
	// Empty means "no region": no backend pays it.
	Region string
	// Model is the public model name, used as the label of the prefix-lookup metrics.
	Model string
	// Metrics receives switchyard_prefix_cache_lookups_total and _hits_total; nil disables them.
	Metrics *metrics.Gateway
	// Clock is the time source for staleness checks; nil means the system clock.
	Clock Clock
	// Adaptive tunes the adaptive strategy; nil means DefaultAdaptiveParams. Other strategies ignore it, but
	// region failover counts a backend as saturated at its thresholds.
	Adaptive *AdaptiveParams
	// Failover is Region's failover order (the policy's regions.<region>.failover): a pick considers the
	// backends of these regions, in this order, only when every backend of the regions before is unhealthy or
	// saturated (see Regional). Backends of regions not listed come after all of them. Ignored without Region;
	// at most MaxFailover regions.
	Failover []string
	// Regions tunes the failover's hysteresis; nil means DefaultRegionParams.
	Regions *RegionParams
	// Overflow says that some of the model's targets are overflow backends (TierOverflow): the strategy is
	// wrapped in a Regional even without Region, so that they are used only when no dedicated one has room.
	Overflow bool
	// Previous is the strategy this one replaces (the same model's, before a policy reload), or nil: the new
	// strategy keeps its region failover state, so a reload neither forgets a failure nor restarts a return.
	Previous Strategy
}

var strategyTable = map[string]func(StrategyEnv) (Strategy, error){
	StrategyAdaptive: func(env StrategyEnv) (Strategy, error) {
		p := DefaultAdaptiveParams()
		if env.Adaptive != nil {
			p = *env.Adaptive
		}
		return NewAdaptive(env, p)
	},
	StrategyRoundRobin:   func(StrategyEnv) (Strategy, error) { return &RoundRobin{}, nil },
	StrategyLeastRequest: func(StrategyEnv) (Strategy, error) { return LeastRequest{}, nil },
	StrategyRandom:       func(StrategyEnv) (Strategy, error) { return Random{}, nil },
	StrategyCacheAware:   func(env StrategyEnv) (Strategy, error) { return NewCacheAware(env), nil },
	StrategyPrefixHash:   func(env StrategyEnv) (Strategy, error) { return NewPrefixHash(env), nil },
}

// NewStrategy returns a new instance of the strategy called name (one of StrategyNames; "" means
// DefaultStrategy) for one model. With env.Region or env.Overflow set, the strategy is wrapped in a Regional: it
// sees the gateway's region first, the others in env.Failover's order, and overflow backends last. Each call returns an independent instance
// (except for the region state it takes over from env.Previous): give each model its own. The error wraps
// ErrUnknownStrategy for an unknown name, or says which parameter is invalid.
func NewStrategy(name string, env StrategyEnv) (Strategy, error) {
	if name == "" {
		name = DefaultStrategy
	}
	mk, ok := strategyTable[name]
	if !ok {
		return nil, fmt.Errorf("%w %q (known: %v)", ErrUnknownStrategy, name, StrategyNames())
	}
	s, err := mk(env)
	if err != nil || (env.Region == "" && !env.Overflow) {
		return s, err
	}
	return NewRegional(s, env)
}

// StrategyNames returns the names NewStrategy knows, sorted.
func StrategyNames() []string {
	names := make([]string, 0, len(strategyTable))
	for n := range strategyTable {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// healthyCount returns the number of targets whose backend is healthy.
func healthyCount(targets []Target) int {
	n := 0
	for _, t := range targets {
		if t.Backend.Healthy() {
			n++
		}
	}
	return n
}

// pickScratch is per-Pick working memory, pooled so that picking allocates nothing.
type pickScratch struct {
	owners []*cache.Owner
	counts []int
	cands  []cand
}

var scratchPool = sync.Pool{New: func() any { return new(pickScratch) }}

func acquireScratch(n int) *pickScratch {
	s := scratchPool.Get().(*pickScratch)
	if cap(s.owners) < n {
		s.owners = make([]*cache.Owner, n)
		s.counts = make([]int, n)
	}
	s.owners, s.counts = s.owners[:n], s.counts[:n]
	s.cands = s.cands[:0]
	return s
}

func releaseScratch(s *pickScratch) {
	clear(s.owners) // do not pin owners of removed backends
	scratchPool.Put(s)
}

// prefixMatch looks up r's prefix among targets' backends: counts[i] is the number of leading 64-byte blocks
// targets[i]'s backend is believed to hold. It returns the longest match. Backends without a prefix-index share
// (not in a Registry) count 0.
func prefixMatch(r *Request, targets []Target, s *pickScratch, maxBlocks int) int {
	hs := r.hashes(maxBlocks)
	var ix *cache.Index
	for i, t := range targets {
		o := t.Backend.prefixOwner()
		s.owners[i] = o
		if ix == nil && o != nil {
			ix = o.Index()
		}
	}
	if ix == nil || len(hs) == 0 {
		clear(s.counts)
		return 0
	}
	return ix.Lookup(hs, s.owners, s.counts)
}

// mix64 is splitmix64's finalizer: a cheap, well-mixed hash of x, for rendezvous scores.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// rendezvous is the highest-random-weight score of backend b for key: every gateway replica computes the same
// scores from the same names, so they agree on the winner without talking.
func rendezvous(key uint64, b *Backend) uint64 { return mix64(key ^ b.nameHash) }
