package routing

import "fmt"

// Objective is what the adaptive strategy optimises for one request (Request.Objective). Other strategies
// ignore it; Regional fills dedicated capacity before overflow whatever it says.
type Objective uint8

const (
	// ObjectiveLatency, the zero value, is the adaptive strategy's own cost: predicted time to first token plus
	// its penalties (routing.md section 4.5). Prices are not looked at.
	ObjectiveLatency Objective = iota
	// ObjectiveThroughput adds the predicted decode time of the request's output (its tokens times the
	// backend's inter-token latency with one more sequence running): the backend with the most tokens per
	// second per seat wins, so a batch job finishes soonest.
	ObjectiveThroughput
	// ObjectiveCost adds the request's predicted price, converted to seconds at Request.SecondsPerDollar, and
	// demotes the backends whose predicted p90 TTFT misses Request.TTFTSLO (failing open like the ITL filter):
	// the cheapest backend that still meets the SLO, with latency breaking near-ties.
	ObjectiveCost
)

// ObjectiveNames are the objectives as the policy and the objective header spell them, by value.
var ObjectiveNames = [...]string{ObjectiveLatency: "latency", ObjectiveThroughput: "throughput", ObjectiveCost: "cost"}

// String returns the objective's policy name.
func (o Objective) String() string {
	if int(o) < len(ObjectiveNames) {
		return ObjectiveNames[o]
	}
	return fmt.Sprintf("objective(%d)", uint8(o))
}

// ParseObjective returns the objective named s (exactly as ObjectiveNames spells it), and whether there is one.
func ParseObjective(s string) (Objective, bool) {
	for i, n := range ObjectiveNames {
		if n == s {
			return Objective(i), true
		}
	}
	return ObjectiveLatency, false
}

// defaultOutputTokens is the output length the objectives assume for a request without max_tokens
// (admission.DefaultCompletionTokens, repeated because routing does not import admission).
const defaultOutputTokens = 512

// outputTokens is the output length the objectives price and time: MaxTokens, else defaultOutputTokens.
func (r *Request) outputTokens() int {
	if r.MaxTokens > 0 {
		return r.MaxTokens
	}
	return defaultOutputTokens
}
