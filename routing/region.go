package routing

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// RegionParams tune the hysteresis of region failover (Regional). DefaultRegionParams gives the defaults.
type RegionParams struct {
	// Debounce is how long a region must stay unavailable (every candidate there unhealthy or saturated) before
	// it counts as failed. Requests leave an unavailable region at once whatever Debounce says; a shorter dip
	// (a scrape that caught a momentary queue) spills the requests it touches and is then forgotten, so a noisy
	// saturation signal does not hold the region back. Default 500ms.
	Debounce time.Duration
	// Hold is how long a failed region must be available again before it gets any traffic back: until then the
	// regions after it in the failover order keep it. Default 2s.
	Hold time.Duration
	// Ramp is how long, after Hold, the region's share of picks takes to grow linearly from 0 to 1. 0 returns
	// all of it at once after Hold. Default 4s.
	Ramp time.Duration
}

// DefaultRegionParams returns the default hysteresis: Debounce 500ms, Hold 2s, Ramp 4s.
func DefaultRegionParams() RegionParams {
	return RegionParams{Debounce: 500 * time.Millisecond, Hold: 2 * time.Second, Ramp: 4 * time.Second}
}

// Validate reports the parameters out of range.
func (p RegionParams) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"debounce", p.Debounce}, {"hold", p.Hold}, {"ramp", p.Ramp}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s: %v: must be >= 0", f.name, f.v))
		}
	}
	return errors.Join(errs...)
}

// MaxFailover is the longest failover order a strategy takes (regions after the gateway's own).
const MaxFailover = maxTiers - 3

// maxTiers bounds the tiers of a pick: the gateway's region, MaxFailover failover regions, the rest, and the
// overflow backends after all of them.
const maxTiers = 17

// regionOrder is a model's region tiers: tier 0 is the gateway's region (and backends that name no region), tier
// i the i-th failover region, tier len(names) every other region. Without a gateway region every backend is in
// tier 0.
type regionOrder struct{ names []string }

func newRegionOrder(env StrategyEnv) regionOrder {
	if env.Region == "" {
		return regionOrder{}
	}
	names := []string{env.Region}
	for _, f := range env.Failover {
		if f != "" && !slices.Contains(names, f) {
			names = append(names, f)
		}
	}
	return regionOrder{names: names}
}

// overflow is the tier of every overflow backend, whatever its region: after all regions' dedicated backends.
func (o regionOrder) overflow() int { return len(o.names) + 1 }

// tierOf returns the tier of a backend configured as cfg: its region's, or the overflow tier.
func (o regionOrder) tierOf(cfg *BackendConfig) int {
	if cfg.Tier == TierOverflow {
		return o.overflow()
	}
	return o.tier(cfg.Region)
}

// tier returns the tier of a dedicated backend in region.
func (o regionOrder) tier(region string) int {
	if region == "" || len(o.names) == 0 {
		return 0
	}
	for i, n := range o.names {
		if n == region {
			return i
		}
	}
	return len(o.names)
}

// saturation says when a backend counts as saturated, for the adaptive strategy's filter and for region tiers:
// at its MaxConcurrency; where its engine's seats are known (stated or measured, Backend.seatsOf), with more
// requests in flight than seats, or fresh metrics showing every seat taken and a queue (seatsFull); or, while
// its engine metrics are fresh, with more than waiting requests queued, or with a KV usage over kv.
type saturation struct{ waiting, kv float64 }

func saturationOf(p AdaptiveParams) saturation {
	return saturation{waiting: p.QueueThreshold * (1 + p.Headroom), kv: p.KVThreshold}
}

// at is the rule for a backend under load l (Backend.loadAt), whose configuration is cfg.
func (s saturation) at(cfg *BackendConfig, l load) bool {
	if c := cfg.MaxConcurrency; c > 0 && l.inflight >= int64(c) {
		return true
	}
	return l.full || (l.fresh && (l.waiting > s.waiting || l.kv > s.kv))
}

// saturated is the same rule without a load at hand: the thresholds before the freshness, which costs more.
func (s saturation) saturated(b *Backend, cfg *BackendConfig, now time.Time) bool {
	if c := cfg.MaxConcurrency; c > 0 && b.Inflight() >= int64(c) {
		return true
	}
	e := b.engine.Load()
	fresh := e.Fresh(now, time.Duration(b.staleAfter.Load()))
	seats := b.seatsNow(e, cfg, fresh)
	if seats > 0 && float64(b.Inflight()) > seats {
		return true
	}
	return fresh && (e.Waiting > s.waiting || e.KVUsage > s.kv || b.seatsFull(e, seats))
}

// regionWeigher is implemented by a strategy that weighs regions in its own cost (the adaptive strategy's
// per-tier margin): Regional gives it the chosen tier and every later one, not the chosen tier alone.
type regionWeigher interface{ weighsRegions() }

// Regional puts region failover and overflow tiers in front of any strategy (NewStrategy adds it whenever the
// gateway has a region or the model has an overflow target). Each pick sorts the candidates into tiers (the
// dedicated backends of the gateway's region, then of its failover order, then of every other region, and last
// every overflow backend, TierOverflow) and hands the inner strategy one tier: the first with a backend that is
// healthy and not saturated (MaxConcurrency reached, or a fresh engine queue or KV usage over the adaptive
// thresholds). A strategy that weighs regions itself (adaptive) gets that tier and every later dedicated one,
// so that a remote backend can still win on cost by more than its margin. Dedicated capacity, paid for whether
// used or not, is filled first: the overflow tier is offered to the inner strategy only when no dedicated tier
// has room, and to adaptive also for a request with a TTFT objective, which it takes only when every dedicated
// backend with room is predicted to miss that objective (so that a burst goes to overflow rather than queueing on
// a slow backend). In the overflow tier the
// inner strategy sees only the cheapest of the available overflow backends (by input plus output price), so
// overflow spend goes in order of price. When every tier is saturated, the first healthy tier is used (fail
// open; the adaptive strategy then reports Decision.Saturated).
//
// Overflow is paid per token, so for a model with overflow targets (StrategyEnv.Overflow) a tier whose
// backends are healthy but saturated is left pick by pick and used again as soon as one has room: only a tier
// whose backends are all unhealthy fails, and gets the Hold and Ramp below.
//
// Hysteresis: a tier that stays unavailable for Debounce has failed. Traffic leaves it at once (it already did,
// pick by pick), and once it is available again it gets nothing for Hold, then a share of picks that grows
// linearly to 1 over Ramp; the remaining picks skip it and go to the next available tier. A new failure during
// Hold or Ramp starts Hold again. Hysteresis never refuses a request: a held-back tier is used when no later one
// is available.
//
// State is per tier and per model (one Regional per model), in atomics: picks never lock. A Regional built with
// StrategyEnv.Previous shares its predecessor's state for the regions they have in common, so a policy reload
// neither forgets a failure nor restarts a return. Safe for concurrent use; time comes from StrategyEnv.Clock.
type Regional struct {
	inner  Strategy
	span   bool // the inner strategy weighs regions itself: give it the chosen tier and every later one
	order  regionOrder
	p      RegionParams
	sat    saturation
	clock  Clock
	states []*regionState // per tier: len(order.names) + 2: the regions outside the order, then overflow
	active atomic.Int32   // last published active tier, -1 before the first pick
	m      *regionMetrics // nil without metrics
	spill  bool           // the model has overflow targets (StrategyEnv.Overflow): Status shows their tier
}

var _ Strategy = (*Regional)(nil)

// regionState is one tier's failover state, shared by the Regionals of successive policies.
type regionState struct {
	seen     atomic.Bool  // a pick has had a candidate in this tier
	badSince atomic.Int64 // UnixNano of the first unavailable observation of the current run; 0 while available
	lastBad  atomic.Int64 // UnixNano of the last observation of a failure (unavailable for Debounce); 0: healthy
	shown    atomic.Uint64
}

// NewRegional wraps inner with region failover for one model in env's region, with env's failover order and
// hysteresis (env.Regions, nil: DefaultRegionParams). Backends are saturated at env.Adaptive's thresholds
// (nil: DefaultAdaptiveParams). It reports to env.Metrics when set.
func NewRegional(inner Strategy, env StrategyEnv) (*Regional, error) {
	p := DefaultRegionParams()
	if env.Regions != nil {
		p = *env.Regions
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("regions: %w", err)
	}
	if len(env.Failover) > MaxFailover {
		return nil, fmt.Errorf("regions: failover: %d regions, at most %d", len(env.Failover), MaxFailover)
	}
	ap := DefaultAdaptiveParams()
	if env.Adaptive != nil {
		ap = *env.Adaptive
	}
	g := &Regional{inner: inner, order: newRegionOrder(env), p: p, sat: saturationOf(ap), clock: env.Clock, spill: env.Overflow}
	_, g.span = inner.(regionWeigher)
	if g.clock == nil {
		g.clock = SystemClock{}
	}
	prev, _ := env.Previous.(*Regional)
	g.states = make([]*regionState, len(g.order.names)+2)
	for k := range g.states {
		if prev != nil {
			g.states[k] = prev.state(g.regionName(k))
		}
		if g.states[k] == nil {
			g.states[k] = new(regionState)
		}
	}
	g.active.Store(-1)
	if env.Metrics != nil && len(g.order.names) > 0 {
		g.m = newRegionMetrics(env, g.order)
		now := g.clock.Now().UnixNano()
		for k, gauge := range g.m.shares {
			g.states[k].shown.Store(math.Float64bits(-1))
			g.publishShare(k, gauge, g.states[k].share(now, &g.p))
		}
	}
	return g, nil
}

// Strategy returns the strategy g hands each tier to.
func (g *Regional) Strategy() Strategy { return g.inner }

// RegionStatus is one tier of a Regional as Status reports it.
type RegionStatus struct {
	// Region is the tier's region; "" stands for the regions outside the failover order, and for the overflow
	// tier (Overflow).
	Region string `json:"region"`
	// Overflow marks the tier of the overflow backends, whatever their regions.
	Overflow bool `json:"overflow,omitempty"`
	// Unavailable says the last pick with a candidate there found every one unhealthy or saturated; Failed,
	// that this has lasted Debounce.
	Unavailable bool `json:"unavailable"`
	Failed      bool `json:"failed"`
	// Share is the share of picks the tier may take now: 1 normally, 0 during Hold, rising over Ramp.
	Share float64 `json:"share"`
}

// Status returns g's tiers in order, for logs and debugging; the overflow tier only when the model has one.
func (g *Regional) Status() []RegionStatus {
	ns := g.clock.Now().UnixNano()
	states := g.states
	if !g.spill {
		states = states[:g.order.overflow()]
	}
	out := make([]RegionStatus, len(states))
	for k, st := range states {
		out[k] = RegionStatus{Region: g.regionName(k), Overflow: k == g.order.overflow(), Unavailable: st.badSince.Load() != 0,
			Failed: st.failed(ns, int64(g.p.Debounce)), Share: st.share(ns, &g.p)}
		if out[k].Overflow {
			out[k].Region = ""
		}
	}
	return out
}

// overflowState names the overflow tier's state for a successor's lookup (state); no region is spelt so.
const overflowState = "\x00overflow"

// regionName is tier k's region ("" for the regions outside the order, overflowState for overflow).
func (g *Regional) regionName(k int) string {
	switch {
	case k < len(g.order.names):
		return g.order.names[k]
	case k == g.order.overflow():
		return overflowState
	}
	return ""
}

// state returns the state of region name's tier in g ("": the regions outside the order), nil if g has none.
func (g *Regional) state(name string) *regionState {
	for k := range g.states {
		if g.regionName(k) == name {
			return g.states[k]
		}
	}
	return nil
}

// tierScratch is per-pick working memory, pooled so that picking allocates nothing.
type tierScratch struct {
	tier []uint8
	sub  []Target
}

var tierPool = sync.Pool{New: func() any { return new(tierScratch) }}

// Pick implements Strategy.
func (g *Regional) Pick(r *Request, targets []Target) (Target, error) {
	if len(targets) == 0 {
		return Target{}, ErrNoBackend
	}
	now := g.clock.Now()
	ns := now.UnixNano()
	sc := tierPool.Get().(*tierScratch)
	defer func() {
		clear(sc.sub) // do not pin backends
		sc.sub = sc.sub[:0]
		tierPool.Put(sc)
	}()
	sc.tier = slices.Grow(sc.tier[:0], len(targets))[:len(targets)]
	var count, healthy, avail [maxTiers]int32
	lo, hi := maxTiers, -1
	for i, t := range targets {
		cfg := t.Backend.Config()
		k := g.order.tierOf(cfg)
		sc.tier[i] = uint8(k)
		count[k]++
		lo, hi = min(lo, k), max(hi, k)
		if t.Backend.Healthy() {
			healthy[k]++
			if !g.sat.saturated(t.Backend, cfg, now) {
				avail[k]++
			}
		}
	}
	debounce := int64(g.p.Debounce)
	for k := lo; k <= hi; k++ {
		if count[k] > 0 {
			// With overflow targets, a tier that is only full has not failed: its return needs no Hold.
			g.states[k].observe(avail[k] > 0 || (g.spill && healthy[k] > 0), ns, debounce)
		}
	}
	// The first available tier that the hysteresis lets this pick use; else the first available one; else (all
	// saturated) the first healthy one.
	chosen, held := -1, -1
	u := rand.Float64()
	for k := lo; k <= hi; k++ {
		if avail[k] == 0 {
			continue
		}
		if u < g.states[k].share(ns, &g.p) {
			chosen = k
			break
		}
		if held < 0 {
			held = k
		}
	}
	if chosen < 0 {
		chosen = held
	}
	for k := lo; chosen < 0 && k <= hi; k++ {
		if healthy[k] > 0 {
			chosen = k
		}
	}
	if chosen < 0 {
		return Target{}, ErrNoBackend
	}
	if g.m != nil {
		g.publish(ns, chosen)
	}
	last := chosen
	if g.span && chosen < g.order.overflow() {
		last = min(hi, g.order.overflow()-1)
	}
	// A strategy that weighs tiers itself (adaptive) is also offered the overflow tier when the request has a
	// TTFT objective: it ranks overflow below every dedicated backend predicted to meet the objective.
	ov := g.order.overflow()
	offer := g.span && chosen < ov && r.TTFTSLO > 0 && avail[ov] > 0
	// In the overflow tier, only its cheapest available backends (sc.tier marks the others out of range).
	if (chosen == ov || offer) && avail[ov] > 0 {
		cheapest := math.Inf(1)
		for i, t := range targets {
			if int(sc.tier[i]) != ov {
				continue
			}
			if cfg := t.Backend.Config(); t.Backend.Healthy() && !g.sat.saturated(t.Backend, cfg, now) {
				cheapest = min(cheapest, listPrice(cfg))
			} else {
				sc.tier[i] = maxTiers
			}
		}
		for i, t := range targets {
			if int(sc.tier[i]) == ov && listPrice(t.Backend.Config()) > cheapest {
				sc.tier[i] = maxTiers
			}
		}
		hi = maxTiers
	}
	sub := targets
	if chosen > lo || last < hi {
		sub = sc.sub[:0]
		for i, t := range targets {
			if k := int(sc.tier[i]); (k >= chosen && k <= last) || (offer && k == ov) {
				sub = append(sub, t)
			}
		}
		sc.sub = sub
	}
	t, err := g.inner.Pick(r, sub)
	if err == nil && g.m != nil {
		if region := t.Backend.Config().Region; region != "" && g.order.tier(region) > 0 {
			g.m.spill(g.order.tier(region), region)
		}
	}
	return t, err
}

// observe records whether the tier had an available backend at a pick at ns.
func (st *regionState) observe(ok bool, ns, debounce int64) {
	if !st.seen.Load() {
		st.seen.Store(true)
	}
	if ok {
		if st.badSince.Load() != 0 {
			st.badSince.Store(0)
		}
		return
	}
	since := st.badSince.Load()
	if since == 0 {
		st.badSince.CompareAndSwap(0, ns)
		since = ns
	}
	// Stores are skipped within a millisecond of the last one: an outage must not make every pick write.
	if ns-since >= debounce && ns-st.lastBad.Load() > int64(time.Millisecond) {
		st.lastBad.Store(ns)
	}
}

// failed reports whether the tier is in a run of unavailability that has lasted Debounce.
func (st *regionState) failed(ns, debounce int64) bool {
	since := st.badSince.Load()
	return since != 0 && ns-since >= debounce
}

// share returns the share of picks the tier may take at ns: 1 unless it failed within the last Hold + Ramp.
func (st *regionState) share(ns int64, p *RegionParams) float64 {
	last := st.lastBad.Load()
	if last == 0 {
		return 1
	}
	x := time.Duration(ns-last) - p.Hold
	switch {
	case x < 0:
		return 0
	case x >= p.Ramp:
		st.lastBad.CompareAndSwap(last, 0) // recovered: later picks skip the arithmetic
		return 1
	}
	return float64(x) / float64(p.Ramp)
}

// publish updates the active-tier gauge (when it changed) and the shares of the ordered tiers. The active tier
// is the first tier that has been seen, has not failed, and takes its full share; it reads the tiers' state, not
// this pick's candidates, so a retry that excludes the local backends does not move it.
func (g *Regional) publish(ns int64, chosen int) {
	debounce := int64(g.p.Debounce)
	active := chosen
	for k, st := range g.states {
		if st.seen.Load() && !st.failed(ns, debounce) && st.share(ns, &g.p) >= 1 {
			active = k
			break
		}
	}
	if old := g.active.Load(); int32(active) != old && g.active.CompareAndSwap(old, int32(active)) {
		g.m.active.Set(float64(active))
	}
	for k, gauge := range g.m.shares {
		g.publishShare(k, gauge, g.states[k].share(ns, &g.p))
	}
}

// publishShare sets tier k's share gauge when it moved by at least 0.01 or reached 0 or 1.
func (g *Regional) publishShare(k int, gauge prometheus.Gauge, v float64) {
	st := g.states[k]
	old := st.shown.Load()
	ov := math.Float64frombits(old)
	if ov == v || (math.Abs(v-ov) < 0.01 && v != 0 && v != 1) {
		return
	}
	if st.shown.CompareAndSwap(old, math.Float64bits(v)) {
		gauge.Set(v)
	}
}

// regionMetrics are a Regional's resolved metric children.
type regionMetrics struct {
	model, from string
	spills      []prometheus.Counter // per ordered tier (index 0 unused)
	spillVec    *prometheus.CounterVec
	active      prometheus.Gauge
	shares      []prometheus.Gauge // per ordered tier
}

func newRegionMetrics(env StrategyEnv, o regionOrder) *regionMetrics {
	m := &regionMetrics{model: env.Model, from: o.names[0], spillVec: env.Metrics.RegionSpills,
		active: env.Metrics.RegionActiveTier.WithLabelValues(env.Model)}
	m.spills = make([]prometheus.Counter, len(o.names))
	m.shares = make([]prometheus.Gauge, len(o.names))
	for k, name := range o.names {
		if k > 0 {
			m.spills[k] = m.spillVec.WithLabelValues(env.Model, m.from, name)
		}
		m.shares[k] = env.Metrics.RegionShare.WithLabelValues(env.Model, name)
	}
	return m
}

// spill counts a pick in tier k > 0, in region.
func (m *regionMetrics) spill(k int, region string) {
	if k < len(m.spills) {
		m.spills[k].Inc()
		return
	}
	m.spillVec.WithLabelValues(m.model, m.from, region).Inc() // a region outside the order: rare
}

// listPrice orders overflow backends: the price of a million input plus a million output tokens.
func listPrice(cfg *BackendConfig) float64 { return cfg.Price.Input + cfg.Price.Output }
