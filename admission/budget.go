package admission

import (
	"math"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

// Budget defaults: Envoy's retry budget (ops.md B1) and a hedge budget of a few percent of requests (Tail at
// Scale; the policy's hedge.budget_percent default).
const (
	DefaultRetryPercent        = 20
	DefaultRetryMinConcurrency = 3
	DefaultHedgePercent        = 5
	DefaultHedgeBurst          = 3
)

// RetryBudget caps concurrent retries at a share of live traffic, Envoy style: at most
// max(MinConcurrency, floor(Percent/100 * active)) retries in flight, where active counts the requests between
// Begin and End. A burst of failures therefore cannot multiply the load on a fleet that is already failing (a
// retry storm); a quiet gateway can still retry a few. Lock-free; safe for concurrent use. Use one per pool
// (model) or one per gateway.
type RetryBudget struct {
	percent float64
	floor   int64
	active  atomic.Int64
	retries atomic.Int64
	denied  prometheus.Counter
}

// NewRetryBudget returns a budget of percent (of active requests; <= 0 means DefaultRetryPercent, 20) with a
// floor of minConcurrency retries (< 0 means DefaultRetryMinConcurrency, 3; 0 is no floor). m (nil: none)
// counts denials in switchyard_budget_denied_total{kind="retry"}.
func NewRetryBudget(percent float64, minConcurrency int, m *metrics.Gateway) *RetryBudget {
	if percent <= 0 {
		percent = DefaultRetryPercent
	}
	if minConcurrency < 0 {
		minConcurrency = DefaultRetryMinConcurrency
	}
	b := &RetryBudget{percent: percent, floor: int64(minConcurrency)}
	if m != nil {
		b.denied = m.BudgetDenied.WithLabelValues("retry")
	}
	return b
}

// Begin counts a request as active: call it once per request when it is admitted (before its first attempt).
func (b *RetryBudget) Begin() { b.active.Add(1) }

// End uncounts a request counted by Begin: call it once when the request ends, however it ends.
func (b *RetryBudget) End() { b.active.Add(-1) }

// Allow reserves a retry if the budget has room, and reports whether it did. Call it before each retry (an
// attempt after the first, before the first byte); when it returns false, give the client the last error
// instead. Every true must be matched by one Done.
func (b *RetryBudget) Allow() bool {
	limit := max(b.floor, int64(math.Floor(b.percent/100*float64(b.active.Load()))))
	for {
		n := b.retries.Load()
		if n >= limit {
			if b.denied != nil {
				b.denied.Inc()
			}
			return false
		}
		if b.retries.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// Done ends a retry reserved by Allow: call it when the retried attempt gets its first byte (it is then
// ordinary traffic) or fails, whichever comes first.
func (b *RetryBudget) Done() { b.retries.Add(-1) }

// Active returns the requests counted by Begin and not yet ended.
func (b *RetryBudget) Active() int { return int(b.active.Load()) }

// Retries returns the retries in flight.
func (b *RetryBudget) Retries() int { return int(b.retries.Load()) }

// HedgeBudget caps hedged attempts at a share of requests: each request earns Percent/100 of a hedge, a hedge
// spends one, and at most Burst hedges (and the fraction of the next) can be saved up; the budget starts with
// Burst. Over any run of N requests at most Burst + N*Percent/100 hedges are allowed. GPU prefill is expensive, so a hedge is a bet the
// budget keeps small. Lock-free (exact integer credit); safe for concurrent use. Use one per model (the
// policy's hedge.budget_percent is per model).
type HedgeBudget struct {
	earn   int64 // credit per request, in units of 1/hedgeUnit hedge
	limit  int64 // most credit saved: Burst hedges and the fraction of one more, in units
	credit atomic.Int64
	denied prometheus.Counter
}

const hedgeUnit = 1_000_000 // credit units per hedge: percent is kept to 4 decimals exactly

// NewHedgeBudget returns a budget of percent of requests (in (0, 100]; <= 0 means DefaultHedgePercent, 5) that
// can save up burst hedges (<= 0 means DefaultHedgeBurst, 3). m (nil: none) counts denials in
// switchyard_budget_denied_total{kind="hedge"}.
func NewHedgeBudget(percent float64, burst int, m *metrics.Gateway) *HedgeBudget {
	if percent <= 0 {
		percent = DefaultHedgePercent
	}
	percent = min(percent, 100)
	if burst <= 0 {
		burst = DefaultHedgeBurst
	}
	b := &HedgeBudget{earn: int64(math.Round(percent / 100 * hedgeUnit)), limit: int64(burst+1)*hedgeUnit - 1}
	b.credit.Store(int64(burst) * hedgeUnit)
	if m != nil {
		b.denied = m.BudgetDenied.WithLabelValues("hedge")
	}
	return b
}

// Request earns the budget its share of a request: call it once per request of the model (hedged or not),
// when the request is admitted.
func (b *HedgeBudget) Request() {
	for {
		c := b.credit.Load()
		if c >= b.limit {
			return
		}
		if b.credit.CompareAndSwap(c, min(c+b.earn, b.limit)) {
			return
		}
	}
}

// Allow spends one hedge if the budget holds one, and reports whether it did. Call it when a request's hedge
// timer fires (hedge.after without a first byte), before sending the hedge; on false, keep waiting on the
// first attempt.
func (b *HedgeBudget) Allow() bool {
	for {
		c := b.credit.Load()
		if c < hedgeUnit {
			if b.denied != nil {
				b.denied.Inc()
			}
			return false
		}
		if b.credit.CompareAndSwap(c, c-hedgeUnit) {
			return true
		}
	}
}
