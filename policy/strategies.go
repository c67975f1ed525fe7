package policy

import (
	"errors"
	"fmt"
	"strings"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/routing"
)

// DefaultStrategy is the strategy of a model that names none: routing's default, adaptive.
const DefaultStrategy = routing.DefaultStrategy

// newStrategy builds model m's strategy. routing.NewStrategy is the one table from strategy names to
// constructors; every call returns a new instance, so models never share state (round_robin's counter), except
// the region failover state it takes over from prev, the model's strategy in the policy being replaced (nil:
// none). Its region tiers are the gateway's region then regions.<region>.failover. mt may be nil (validation
// builds strategies without metrics, to find invalid names before anything is swapped).
func newStrategy(c *Config, m *Model, mt *metrics.Gateway, prev routing.Strategy) (routing.Strategy, error) {
	fo, _ := c.failover()
	if len(fo) > routing.MaxFailover {
		fo = nil // reported by validation at regions.<region>.failover
	}
	overflow := false
	for _, t := range m.Targets {
		for i := range c.Backends {
			overflow = overflow || (c.Backends[i].Name == t.Backend && c.Backends[i].Tier == "overflow")
		}
	}
	s, err := routing.NewStrategy(m.Strategy, routing.StrategyEnv{Region: c.Region, Failover: fo, Model: m.Name,
		Metrics: mt, Previous: prev, Overflow: overflow})
	if errors.Is(err, routing.ErrUnknownStrategy) {
		return nil, fmt.Errorf("unknown strategy %q (one of: %s)", m.Strategy, strings.Join(routing.StrategyNames(), ", "))
	}
	return s, err
}
