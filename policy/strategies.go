package policy

import (
	"maps"
	"slices"

	"github.com/switchyard/switchyard/routing"
)

// DefaultStrategy is the strategy of a model that names none. It becomes "adaptive" when routing's adaptive
// strategy lands.
const DefaultStrategy = "least_request"

// strategies maps every strategy name the schema knows to its constructor, in this one place. A nil constructor
// is a name whose strategy has not landed in routing yet: a file that uses it is rejected as "not supported yet".
// Each model gets its own instance, built at every load, so strategies with state (round_robin's counter) never
// share it between models.
var strategies = map[string]func() routing.Strategy{
	"adaptive":      nil,
	"round_robin":   func() routing.Strategy { return &routing.RoundRobin{} },
	"least_request": func() routing.Strategy { return routing.LeastRequest{} },
	"random":        func() routing.Strategy { return routing.Random{} },
	"cache_aware":   nil,
	"prefix_hash":   nil,
}

// strategyNames returns the known strategy names, or only those available now, sorted.
func strategyNames(availableOnly bool) []string {
	var names []string
	for _, n := range slices.Sorted(maps.Keys(strategies)) {
		if !availableOnly || strategies[n] != nil {
			names = append(names, n)
		}
	}
	return names
}
