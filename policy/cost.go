package policy

import (
	"fmt"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
)

// Cost as a routing dimension (docs/config.md, "Cost"): backends[].cost and backends[].tier
// (schema.go), per-key budgets, and the objectives that decide how much a request's price weighs against its
// latency.

// Objectives configures routing objectives.
type Objectives struct {
	// Header is the request header in which a client names its request's objective (latency, throughput or
	// cost; another value is ignored), over its key's and its model's. Default x-switchyard-objective.
	Header string `yaml:"header"`
	// SecondsPerDollar is the cost objective's exchange rate: a backend whose predicted price for a request is
	// one unit of money more must be predicted this many seconds faster to win it (e.g. 3600: a dollar is worth
	// an hour). Required (> 0) when a model or key names the cost objective; a request that asks for cost by
	// header without it is routed on latency. Default 0.
	SecondsPerDollar float64 `yaml:"seconds_per_dollar"`
}

// Budget caps what a key's requests may cost per period, in the currency of backends[].cost (admission.Budget:
// reserved at admission at the dearest target's price for the prompt and max_tokens, settled with the real
// cost; shared by the replicas when redis is set). Every response to the key carries
// x-ratelimit-limit-budget, x-ratelimit-remaining-budget and x-ratelimit-reset-budget.
type Budget struct {
	// Limit is the hard limit: once the period's spend reaches it the key's requests get 429
	// insufficient_quota, with Retry-After the time to the next period. Default 0 (none); >= 0.
	Limit float64 `yaml:"limit"`
	// SoftLimit is the soft limit: past it the key's standard and sheddable requests to a model with a
	// degrade_to are served by that model (brownout) for the rest of the period. Default 0 (none); >= 0, and
	// below limit when both are set.
	SoftLimit float64 `yaml:"soft_limit"`
	// Period is the length of a budget period, aligned to the Unix epoch (24h: UTC days; 1h: clock hours).
	// Default 24h; at least 1m.
	Period time.Duration `yaml:"period"`
}

const (
	defaultObjectiveHeader = "x-switchyard-objective"
	defaultBudgetPeriod    = 24 * time.Hour
)

// defaultCost fills the defaults of the objectives and of the keys' budgets.
func (r *report) defaultCost(c *Config) {
	if c.Objectives.Header == "" {
		c.Objectives.Header = defaultObjectiveHeader
	}
	for i := range c.APIKeys {
		if !r.set(fmt.Sprintf("api_keys[%d].budget.period", i)) {
			c.APIKeys[i].Budget.Period = defaultBudgetPeriod
		}
	}
	for i := range c.Models {
		if c.Models[i].Objective == "" {
			c.Models[i].Objective = routing.ObjectiveLatency.String()
		}
	}
}

// validateCost checks the objectives, the models' and keys' objectives and the keys' budgets.
func (r *report) validateCost(c *Config) {
	if c.Objectives.SecondsPerDollar < 0 {
		r.errorf("objectives.seconds_per_dollar", "must be >= 0")
	}
	if h := c.Objectives.Header; !headerRE.MatchString(h) {
		r.errorf("objectives.header", fmt.Sprintf("invalid HTTP header name %q", h))
	}
	needRate := ""
	objective := func(path, name string) {
		o, ok := routing.ParseObjective(name)
		switch {
		case !ok:
			r.errorf(path, fmt.Sprintf("unknown objective %q (one of: latency, throughput, cost)", name))
		case o == routing.ObjectiveCost && needRate == "":
			needRate = path
		}
	}
	for i, m := range c.Models {
		objective(fmt.Sprintf("models[%d].objective", i), m.Objective)
	}
	for i, k := range c.APIKeys {
		p := fmt.Sprintf("api_keys[%d]", i)
		if k.Objective != "" {
			objective(p+".objective", k.Objective)
		}
		b := k.Budget
		if b.Limit < 0 {
			r.errorf(p+".budget.limit", "must be >= 0 (0: none)")
		}
		if b.SoftLimit < 0 {
			r.errorf(p+".budget.soft_limit", "must be >= 0 (0: none)")
		}
		if b.Limit > 0 && b.SoftLimit >= b.Limit {
			r.errorf(p+".budget.soft_limit", fmt.Sprintf("%v: must be below limit (%v)", b.SoftLimit, b.Limit))
		}
		if b.Period < time.Minute {
			r.errorf(p+".budget.period", "must be at least 1m")
		}
	}
	if needRate != "" && c.Objectives.SecondsPerDollar <= 0 {
		r.errorf(needRate, "the cost objective needs objectives.seconds_per_dollar (> 0): how many seconds of latency a unit of money is worth")
	}
}

// budgetOf is k's budget as admission applies it.
func budgetOf(k *APIKey) admission.Budget {
	return admission.Budget{Limit: k.Budget.Limit, Soft: k.Budget.SoftLimit, Period: k.Budget.Period}
}

// hasBudgets reports whether some key has a budget.
func (c *Config) hasBudgets() bool {
	for i := range c.APIKeys {
		if budgetOf(&c.APIKeys[i]).Enabled() {
			return true
		}
	}
	return false
}
