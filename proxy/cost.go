package proxy

import (
	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
)

// Cost (docs/config.md, "Cost"): each request is priced from the usage the engine reported, at the
// answering backend's price (routing.Price), into switchyard_cost_dollars_total, the access log and the status
// page; a key with a budget reserves the request's dearest estimate at admission and settles what it cost when
// it ends; and the request's objective (its header, else its key's, else its model's) tells the adaptive
// strategy how much price weighs against latency.
//
// The hooks, in order: admitCost (admit, after the rate limits), routeObjective (admitCost and degrade),
// costHeaders (the response headers), charge (finish, while the answering attempt is at hand) and settleCost
// (record, once per request however it ended).

// costState is an exchange's part for cost. Its zero value is a request that has not been priced.
type costState struct {
	spend    admission.Spend
	budgeted bool    // spend holds a reservation to settle
	dollars  float64 // what the request cost, once charged
	charged  bool
	obj      routing.Objective
}

// Objectives are the snapshot's objective settings (policy: objectives).
type Objectives struct {
	// Header is the request header that names a request's objective ("" disables it).
	Header string
	// SecondsPerDollar is the cost objective's exchange rate (routing.Request.SecondsPerDollar); 0 routes the
	// requests that ask for cost by header on latency, since the policy stated no rate.
	SecondsPerDollar float64
}

// admitCost takes the request's budget reservation, degrades it past its key's soft limit, and resolves its
// objective. The error is the hard limit's refusal.
func (ex *exchange) admitCost(h *fasthttp.RequestHeader) error {
	snap := ex.snap
	if snap.Spender != nil && ex.key != nil && ex.key.Budget.Enabled() {
		ex.cost.spend = snap.Spender.Reserve(ex.key, ex.estimateCost())
		if err := ex.cost.spend.Err; err != nil {
			return shedError{err, ex.cost.spend.Reset}
		}
		ex.cost.budgeted = true
		if d := ex.model.DegradeTo; ex.cost.spend.Soft && d != nil && ex.class != admission.Critical {
			ex.s.m.Degraded.WithLabelValues(ex.model.Name, d.Name).Inc()
			ex.degrade(d)
		}
	}
	ex.cost.obj = ex.model.Objective
	if ex.key != nil && ex.key.Objective != "" {
		if o, ok := routing.ParseObjective(ex.key.Objective); ok {
			ex.cost.obj = o
		}
	}
	if name := snap.Objectives.Header; name != "" {
		if v := h.Peek(name); len(v) > 0 {
			if o, ok := routing.ParseObjective(string(v)); ok && (o != routing.ObjectiveCost || snap.Objectives.SecondsPerDollar > 0) {
				ex.cost.obj = o
			}
		}
	}
	ex.routeObjective()
	return nil
}

// routeObjective sets the routing request's objective for the model that serves it (hook: admitCost, and
// degrade, which starts routing over).
func (ex *exchange) routeObjective() {
	ex.rreq.Objective = ex.cost.obj
	ex.rreq.SecondsPerDollar = ex.snap.Objectives.SecondsPerDollar
	ex.rreq.TTFTSLO = ex.model.SLO.TTFT
}

// estimateCost is what the request may cost at most: its prompt and its output bound (max_tokens times n, or
// admission's default) at the price of the model's dearest target.
func (ex *exchange) estimateCost() float64 {
	total := admission.EstimateTokens(ex.sum.PromptTokens, ex.sum.MaxTokens, ex.sum.Sequences())
	u := routing.Usage{PromptTokens: ex.sum.PromptTokens, CompletionTokens: int(total) - ex.sum.PromptTokens}
	most := 0.0
	for _, t := range ex.model.Targets {
		most = max(most, t.Backend.Config().Price.Of(u))
	}
	return most
}

// costHeaders sets the budget's x-ratelimit-*-budget headers on the response.
func (ex *exchange) costHeaders(resp *fasthttp.ResponseHeader) {
	if !ex.cost.budgeted && ex.cost.spend.Err == nil {
		return
	}
	ex.scratch = ex.cost.spend.AppendHeaders(ex.scratch[:0], func(name string, value []byte) {
		resp.SetBytesV(name, value)
	})
}

// charge prices the request at a's backend from the usage the engine reported (or, without one, the prompt
// estimate and the tokens relayed) and counts it in switchyard_cost_dollars_total (hook: finish, once, with the
// answering attempt).
func (ex *exchange) charge(a *attempt) {
	if ex.cost.charged || ex.model == nil {
		return
	}
	in, out, ok := ex.tokenCounts()
	if !ok {
		return
	}
	u := routing.Usage{PromptTokens: in, CompletionTokens: out}
	if ex.hasUsage {
		u.CachedTokens, u.HasCached = ex.usage.CachedTokens, ex.usage.HasCached
	}
	price := a.target.Backend.Config().Price
	ex.cost.dollars, ex.cost.charged = price.Of(u), true
	ex.note.cost = ex.cost.dollars
	if price.IsZero() {
		return
	}
	key := ""
	if ex.key != nil {
		key = ex.key.Name
	}
	ex.s.m.Cost.WithLabelValues(ex.model.Name, a.name, key).Add(ex.cost.dollars)
}

// settleCost settles the request's budget reservation with what it cost (hook: record, once per request).
func (ex *exchange) settleCost() {
	if !ex.cost.budgeted {
		return
	}
	ex.snap.Spender.Settle(ex.key, &ex.cost.spend, ex.cost.dollars)
	ex.cost.budgeted = false
}
