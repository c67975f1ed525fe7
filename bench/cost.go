package bench

import "time"

// CostReport is what a run's answers cost at the fleet's prices (the fleet file's cost per backend): each
// successful measured answer priced at the backend that served it (X-Switchyard-Backend), its prompt at the
// plan's canonical length less the cached tokens it reported, its output as reported.
type CostReport struct {
	// Dollars is the total, in the fleet's currency.
	Dollars float64 `json:"dollars"`
	// OutputTokens is the output tokens priced.
	OutputTokens int `json:"output_tokens"`
	// PerMOutput is Dollars per million output tokens: the cost efficiency of the run.
	PerMOutput float64 `json:"per_m_output"`
	// Unpriced counts answers from a backend the fleet gives no price (not in the fleet, or free).
	Unpriced int `json:"unpriced"`
	// Overflow counts the answers of the fleet's overflow backends by when they were sent: "before_burst" (before
	// the main workload's first burst: the dedicated tier had room), "burst" (inside a burst window) and
	// "after_burst". Nil without overflow backends.
	Overflow map[string]int `json:"overflow,omitempty"`
}

// costOf prices res's measured successful answers, with the phases of bursts; nil when no backend of the fleet
// has a price.
func costOf(res *Result, fleet []FleetBackend, bursts []Burst) *CostReport {
	prices := map[string]Price{}
	overflow := map[string]bool{}
	for _, b := range fleet {
		if !b.Price.IsZero() {
			prices[b.Name] = b.Price
		}
		if b.Tier == "overflow" {
			overflow[b.Name] = true
		}
	}
	if len(prices) == 0 {
		return nil
	}
	c := &CostReport{}
	if len(overflow) > 0 {
		c.Overflow = map[string]int{"before_burst": 0, "burst": 0, "after_burst": 0}
	}
	phase := func(at time.Duration) string {
		if len(bursts) == 0 || at < bursts[0].At {
			return "before_burst"
		}
		for _, b := range bursts {
			if at >= b.At && at < b.At+b.Duration {
				return "burst"
			}
		}
		return "after_burst"
	}
	for i := range res.Samples {
		s, it := &res.Samples[i], &res.Plan.Items[i]
		if it.Warmup || s.Err != "" || s.Status != 200 {
			continue
		}
		p, ok := prices[s.Backend]
		if !ok {
			c.Unpriced++
			continue
		}
		if overflow[s.Backend] {
			c.Overflow[phase(s.SendAt)]++
		}
		c.Dollars += p.Of(it.PromptTokens, s.CachedTokens, s.OutputTokens)
		c.OutputTokens += s.OutputTokens
	}
	if c.OutputTokens > 0 {
		c.PerMOutput = c.Dollars / float64(c.OutputTokens) * 1e6
	}
	return c
}
