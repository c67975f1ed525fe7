package policy

import (
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
)

const costPolicy = `objectives: {seconds_per_dollar: 500}
backends:
  - {name: dear, url: 'http://h:1', models: [m], cost: {input: 3, output: 12}}
  - {name: cheap, url: 'http://h:2', models: [m], cost: {input: 0.4, cached_input: 0.1, output: 1.6}}
  - {name: hosted, url: 'http://h:3', models: [m], tier: overflow, cost: {input: 5, output: 15}}
models:
  - {name: m, objective: cost, slo: {ttft: 5s}}
api_keys:
  - {name: k, key: 'sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae', budget: {limit: 10, soft_limit: 8}, objective: throughput}
`

func TestCostPolicyCompiles(t *testing.T) {
	c, s, err := loadBytes(t, costPolicy)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*routing.BackendConfig{}
	for _, b := range s.Backends {
		byName[b.Config().Name] = b.Config()
	}
	if p := byName["dear"].Price; p != (routing.Price{Input: 3, CachedInput: 3, Output: 12}) {
		t.Errorf("dear's price %+v: cached_input should default to input", p)
	}
	if p := byName["cheap"].Price; p.CachedInput != 0.1 {
		t.Errorf("cheap's price %+v", p)
	}
	if byName["hosted"].Tier != routing.TierOverflow || byName["dear"].Tier != routing.TierDedicated {
		t.Error("tiers not compiled")
	}
	if m := s.Models["m"]; m.Objective != routing.ObjectiveCost {
		t.Errorf("model objective %v", m.Objective)
	}
	if s.Objectives.SecondsPerDollar != 500 || s.Objectives.Header != "x-switchyard-objective" {
		t.Errorf("objectives %+v", s.Objectives)
	}
	k := s.Keys.All()[0]
	if k.Budget != (admission.Budget{Limit: 10, Soft: 8, Period: 24 * time.Hour}) || k.Objective != "throughput" {
		t.Errorf("key %+v", k)
	}
	if _, ok := s.Spender.(*admission.LocalSpender); !ok {
		t.Errorf("spender %T, want a LocalSpender", s.Spender)
	}
	if c.APIKeys[0].Budget.Period != 24*time.Hour {
		t.Error("budget period default")
	}
}

func TestCostPolicyErrors(t *testing.T) {
	for _, tc := range []struct{ name, from, to, want string }{
		{"cost without a rate", "objectives: {seconds_per_dollar: 500}\n", "", "models[0].objective: the cost objective needs objectives.seconds_per_dollar"},
		{"unknown objective", "objective: cost,", "objective: cheapest,", `models[0].objective: unknown objective "cheapest"`},
		{"soft above hard", "soft_limit: 8", "soft_limit: 12", "api_keys[0].budget.soft_limit: 12: must be below limit (10)"},
		{"short period", "soft_limit: 8}", "soft_limit: 8, period: 10s}", "api_keys[0].budget.period: must be at least 1m"},
		{"negative cached price", "cached_input: 0.1", "cached_input: -1", "backends[1].cost.cached_input: must be >= 0"},
		{"bad header", "{seconds_per_dollar: 500}", "{seconds_per_dollar: 500, header: 'a b'}", `objectives.header: invalid HTTP header name "a b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := strings.Replace(costPolicy, tc.from, tc.to, 1)
			_, _, err := loadBytes(t, src)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
