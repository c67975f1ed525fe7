package proxy

import (
	"time"

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
