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
// constructors; every call returns a new instance, so models never share state (round_robin's counter). m may be
// nil (validation builds strategies without metrics, to find invalid names before anything is swapped).
func newStrategy(c *Config, m *Model, mt *metrics.Gateway) (routing.Strategy, error) {
	s, err := routing.NewStrategy(m.Strategy, routing.StrategyEnv{Region: c.Region, Model: m.Name, Metrics: mt})
	if errors.Is(err, routing.ErrUnknownStrategy) {
		return nil, fmt.Errorf("unknown strategy %q (one of: %s)", m.Strategy, strings.Join(routing.StrategyNames(), ", "))
	}
	return s, err
}
