package proxy

import (
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
)

// Snapshot is the compiled, immutable runtime policy the request path reads. A request loads the current
// snapshot once and uses it to the end, so a reload never changes a request half way. Nothing in it may be
// modified after it is published (the live state it points to, routing.Backend, is concurrency-safe).
type Snapshot struct {
	// Region is where this gateway runs.
	Region string
	// Models maps public model names (what clients send) to their routes.
	Models map[string]*Model
	// ModelNames lists the public model names in a stable order, for GET /v1/models.
	ModelNames []string
	// Backends are all backends of the policy, in declaration order.
	Backends []*routing.Backend
	// Loaded is when the snapshot was built; Hash identifies the policy text it was built from.
	Loaded time.Time
	Hash   string

	// Keys are the API keys clients must present ("Authorization: Bearer <key>"); nil means no authentication.
	Keys *admission.Keys
	// Priorities say how a request gets its class (from its key, or the priority header) and each class's SLO
	// factor. The zero value is not valid: use admission.DefaultPriorities.
	Priorities admission.Priorities
	// Limiter enforces the keys' per-minute request and token limits; nil means none. It keeps its buckets
	// across reloads (the policy passes the previous snapshot's limiter on).
	Limiter admission.RateLimiter
	// Spender keeps the keys' money budgets (cost.go); nil means none. Like Limiter, it keeps each key's
	// spend across reloads.
	Spender admission.Spender
	// Objectives say how a request names its routing objective and the cost objective's exchange rate.
	Objectives Objectives
	// Shedder decides admit, queue or shed before any prefill is spent; nil means admit everything.
	Shedder *admission.Shedder
	// Queue bounds the gateway queue where requests wait for capacity.
	Queue QueueSettings
}

// QueueSettings bound the gateway queue (one per model).
type QueueSettings struct {
	// Size is the most requests that may wait per model; beyond it the lowest-priority newest is refused (503).
	Size int
	// Timeout is the longest a request waits (503 after it); the class's SLO may shorten it.
	Timeout time.Duration
}

// Model is the route for one public model name.
type Model struct {
	// Name is the public model name.
	Name string
	// Targets are the backends that serve the model, with the upstream model name for each.
	Targets []routing.Target
	// Strategy picks among Targets.
	Strategy routing.Strategy
	// StrategyName is the policy's name for Strategy (for /debug and metrics).
	StrategyName string
	// SLO is the latency the model promises; zero fields mean "no objective".
	SLO SLO
	// Retries is how many other backends a request may try after a failure before its first byte; 0 disables
	// retries.
	Retries int
	// Created is the Unix time reported for the model by GET /v1/models.
	Created int64
	// Hedge races a second backend when the first has not produced a token in time; zero After disables it.
	Hedge Hedge
	// Preempt lets a critical request that finds no free seat take one from a sheddable stream, which resumes
	// later as a continuation (yield.go).
	Preempt bool
	// PreemptAll lets it take one from a standard stream too, when no sheddable stream can yield (with Preempt).
	PreemptAll bool
	// DegradeTo is the model that serves non-critical requests when this one's pool is saturated (brownout);
	// nil means none.
	DegradeTo *Model
	// Cache is the model's exact response cache (respcache.go); nil means none.
	Cache *ResponseCache
	// Endpoints are the endpoint groups the model serves; a request to another gets 404 naming it. The zero
	// value means DefaultEndpoints.
	Endpoints EndpointSet
	// Objective is what routing optimises for the model's requests when neither their key nor their header
	// names one; the zero value is routing.ObjectiveLatency.
	Objective routing.Objective
}

// Hedge is a model's hedging policy (The Tail at Scale): when an attempt has produced no token after After, a
// copy goes to the next best backend; the first token wins and the other attempt is cancelled. Hedges are
// bounded by BudgetPercent of requests.
type Hedge struct {
	// After is how long to wait for a first token before hedging; 0 disables hedging.
	After time.Duration
	// BudgetPercent caps hedges as a share of requests, in percent (e.g. 5).
	BudgetPercent float64
}

// SLO is a model's latency objective.
type SLO struct {
	// TTFT is the time to first token the model promises.
	TTFT time.Duration
	// ITL is the inter-token latency the model promises.
	ITL time.Duration
}

// Source gives the request path the current snapshot. The policy package's watcher satisfies it; tests use a
// fixed snapshot.
type Source interface {
	// Snapshot returns the current snapshot; never nil once the server runs.
	Snapshot() *Snapshot
}

// Static is a Source that always returns the same snapshot.
type Static struct{ S *Snapshot }

// Snapshot implements Source.
func (s Static) Snapshot() *Snapshot { return s.S }
