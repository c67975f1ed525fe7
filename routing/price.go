package routing

// Tier says how a backend's capacity is paid for, which decides when routing may use it (Regional).
type Tier uint8

const (
	// TierDedicated is capacity the deployment owns and pays for whether it is used or not: filled first.
	TierDedicated Tier = iota
	// TierOverflow is capacity paid per use (a serverless or hosted endpoint): used only while every dedicated
	// backend is unhealthy or saturated, the cheapest first, and left as soon as a dedicated one has room again.
	TierOverflow
)

// String returns the tier as the policy spells it.
func (t Tier) String() string {
	if t == TierOverflow {
		return "overflow"
	}
	return "dedicated"
}

// MarshalText implements encoding.TextMarshaler, for /debug/backends.
func (t Tier) MarshalText() ([]byte, error) { return []byte(t.String()), nil }

// Price is what a backend's tokens cost, per million tokens, in the operator's currency (dollars by
// convention). The zero Price is free: such a backend adds nothing to the cost counter and always wins a
// comparison on price.
type Price struct {
	// Input is the price of a million prompt tokens the engine did not have cached.
	Input float64 `json:"input"`
	// CachedInput is the price of a million prompt tokens served from the engine's prefix cache (providers
	// discount them); the policy defaults it to Input.
	CachedInput float64 `json:"cached_input"`
	// Output is the price of a million generated tokens.
	Output float64 `json:"output"`
}

// IsZero reports whether p charges nothing.
func (p Price) IsZero() bool { return p == Price{} }

// Of returns the cost of one request's usage at p. Cached tokens are charged at CachedInput only when the
// engine reported them (u.HasCached), and never more of them than the prompt; otherwise the whole prompt is
// charged at Input.
func (p Price) Of(u Usage) float64 {
	cached := 0
	if u.HasCached {
		cached = min(max(u.CachedTokens, 0), u.PromptTokens)
	}
	return (float64(u.PromptTokens-cached)*p.Input + float64(cached)*p.CachedInput +
		float64(u.CompletionTokens)*p.Output) / 1e6
}

// estimate returns the predicted cost of a request of prompt tokens, hit of them cached, and out generated.
func (p Price) estimate(prompt, hit, out int) float64 {
	hit = min(hit, prompt)
	return (float64(prompt-hit)*p.Input + float64(hit)*p.CachedInput + float64(out)*p.Output) / 1e6
}
