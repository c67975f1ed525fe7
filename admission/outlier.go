package admission

import (
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

// OutlierParams tune passive outlier detection. DefaultOutlierParams gives the defaults.
type OutlierParams struct {
	// Window is the sliding window observations are judged over, kept in 10 buckets. Default 30s.
	Window time.Duration
	// SlowRatio and SlowShare define a slow backend: more than SlowShare of its first tokens took longer than
	// SlowRatio times their prediction, i.e. the p(1-SlowShare) of observed/predicted TTFT exceeds SlowRatio.
	// Defaults 3 and 0.1 (routing.md 4.7: ratio p90 > 3).
	SlowRatio float64
	SlowShare float64
	// SlowSlack is how late a first token must also be, beyond SlowRatio times its prediction, to count as slow.
	// Default 50 ms: for a backend that answers in milliseconds, scheduler jitter or one engine step is several
	// times the prediction (a probe of a backend back from an outage took 45 ms against 12 ms predicted and
	// ejected it again, in protect-region-down), which is not the slowness this rule is for.
	SlowSlack time.Duration
	// MinSlow is how many slow first tokens the window must hold before the slow rule may eject. Default 5: with
	// the 20 observations MinRequests allows, three slow ones pass a 10% share by chance under load (at twice
	// capacity a healthy backend was ejected with 0.107 of 31, that is 3 or 4 slow ones, and the fleet lost a
	// quarter of its throughput); Envoy's success-rate ejection asks for 100 requests.
	MinSlow int
	// ErrorRate is the share of failed attempts above which a backend is ejected. Default 0.05 (routing.md 4.7).
	ErrorRate float64
	// MinRequests is how many observations the window needs before either rule may eject. Default 20.
	MinRequests int
	// BaseEjection is the first ejection's length; the n-th consecutive one lasts n times as long, up to
	// MaxEjection. Defaults 30s and 300s (Envoy's outlier detection).
	BaseEjection time.Duration
	MaxEjection  time.Duration
	// MaxEjectedPercent caps the backends out of service (ejected or probing) at once, as a share of those
	// tracked; one may always be ejected. Default 50 (ops.md B1: GPU pools are small; never eject most of one).
	MaxEjectedPercent float64
	// PeerFactor makes both rules relative to the pool, as Envoy's success-rate ejection is: a backend is
	// ejected only if its slow (or error) share is also more than PeerFactor times the median share of the other
	// serving backends that have enough observations, and there must be at least one such peer. A pool where
	// every backend looks slow (the router's predictions are off, say round robin missing the prefix cache
	// everywhere) or fails alike (the requests themselves are bad) ejects nobody: ejecting would only
	// concentrate the same load on fewer backends. Default 3.
	PeerFactor float64
	// Probes is how many good probes in a row bring a backend back. Default 3.
	Probes int
	// ProbeTimeout frees the probe slot when a granted probe reports nothing (its client left before the first
	// token). Default 60s (the default first-byte timeout).
	ProbeTimeout time.Duration
}

// DefaultOutlierParams returns the defaults listed on OutlierParams.
func DefaultOutlierParams() OutlierParams {
	return OutlierParams{
		Window: 30 * time.Second, SlowRatio: 3, SlowShare: 0.1, SlowSlack: 50 * time.Millisecond, MinSlow: 5,
		ErrorRate: 0.05, MinRequests: 20, PeerFactor: 3,
		BaseEjection: 30 * time.Second, MaxEjection: 300 * time.Second, MaxEjectedPercent: 50,
		Probes: 3, ProbeTimeout: 60 * time.Second,
	}
}

func (p OutlierParams) withDefaults() OutlierParams {
	d := DefaultOutlierParams()
	if p.Window <= 0 {
		p.Window = d.Window
	}
	if p.SlowRatio <= 0 {
		p.SlowRatio = d.SlowRatio
	}
	if p.SlowShare <= 0 {
		p.SlowShare = d.SlowShare
	}
	if p.SlowSlack <= 0 {
		p.SlowSlack = d.SlowSlack
	}
	if p.MinSlow <= 0 {
		p.MinSlow = d.MinSlow
	}
	if p.PeerFactor <= 0 {
		p.PeerFactor = d.PeerFactor
	}
	if p.ErrorRate <= 0 {
		p.ErrorRate = d.ErrorRate
	}
	if p.MinRequests <= 0 {
		p.MinRequests = d.MinRequests
	}
	if p.BaseEjection <= 0 {
		p.BaseEjection = d.BaseEjection
	}
	if p.MaxEjection < p.BaseEjection {
		p.MaxEjection = max(d.MaxEjection, p.BaseEjection)
	}
	if p.MaxEjectedPercent <= 0 {
		p.MaxEjectedPercent = d.MaxEjectedPercent
	}
	if p.Probes <= 0 {
		p.Probes = d.Probes
	}
	if p.ProbeTimeout <= 0 {
		p.ProbeTimeout = d.ProbeTimeout
	}
	return p
}

// OutlierState is a backend's state in passive outlier detection.
type OutlierState uint32

const (
	// Serving: the backend takes traffic.
	Serving OutlierState = iota
	// Probing: the ejection ended; the backend takes one probe request at a time until Probes good ones in a
	// row bring it back (half-open).
	Probing
	// Ejected: the backend takes no traffic until the ejection ends.
	Ejected
)

// String returns "serving", "probing" or "ejected", the names /debug output uses.
func (s OutlierState) String() string {
	switch s {
	case Serving:
		return "serving"
	case Probing:
		return "probing"
	}
	return "ejected"
}

// OutlierDetector ejects backends that run far slower than predicted or fail too often (routing.md 4.7, Envoy
// outlier detection, Tail at Scale "probation"), and brings them back through probes. It complements the
// per-backend circuit breaker (proxy, gobreaker), which reacts to hard consecutive failures: the detector also
// sees a backend that answers, but late.
//
// It holds one Outlier per backend, kept across policy reloads (Update). Get is lock-free. Safe for concurrent
// use.
type OutlierDetector struct {
	p       OutlierParams
	clock   Clock
	base    time.Time
	m       *metrics.Gateway
	log     *slog.Logger
	mu      sync.Mutex
	by      atomic.Pointer[map[string]*Outlier]
	out     atomic.Int64 // backends ejected or probing
	tracked atomic.Int64
}

// NewOutlierDetector returns a detector with no backends; zero fields of p take their defaults. clock nil means
// the system clock; m (nil: none) receives switchyard_outlier_state and switchyard_outlier_ejections_total; log
// (nil: slog's default) gets a line for every ejection and return, as the gateway's breaker changes do.
func NewOutlierDetector(p OutlierParams, clock Clock, m *metrics.Gateway, log *slog.Logger) *OutlierDetector {
	if log == nil {
		log = slog.Default()
	}
	d := &OutlierDetector{p: p.withDefaults(), clock: orSystem(clock), m: m, log: log}
	d.base = d.clock.Now()
	empty := map[string]*Outlier{}
	d.by.Store(&empty)
	return d
}

// Update installs the backends of a new policy: new names start Serving, existing ones keep their state, and
// names not listed are dropped. Call it when a policy snapshot is built, and resolve each backend's *Outlier
// then (Get).
func (d *OutlierDetector) Update(names []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	old := *d.by.Load()
	next := make(map[string]*Outlier, len(names))
	for _, name := range names {
		o := old[name]
		if o == nil {
			o = &Outlier{d: d, name: name}
			o.slowShare.Store(math.Float64bits(-1))
			o.errShare.Store(math.Float64bits(-1))
			if d.m != nil {
				o.gauge = d.m.OutlierState.WithLabelValues(name)
				o.ejectErrors = d.m.OutlierEjections.WithLabelValues(name, "errors")
				o.ejectSlow = d.m.OutlierEjections.WithLabelValues(name, "slow")
				o.gauge.Set(0)
			}
		}
		next[name] = o
	}
	for name, o := range old {
		if next[name] != nil {
			continue
		}
		o.mu.Lock()
		if OutlierState(o.state.Load()) != Serving {
			d.out.Add(-1) // a dropped backend no longer counts against the cap
		}
		o.gone.Store(true)
		o.state.Store(uint32(Serving))
		o.mu.Unlock()
		if d.m != nil {
			d.m.OutlierState.DeleteLabelValues(name)
		}
	}
	d.tracked.Store(int64(len(next)))
	d.by.Store(&next)
}

// standsOut reports whether o's share is more than PeerFactor times the median share of the other serving
// backends that have enough observations. Without any such peer there is no evidence that o is worse than the
// pool, and nothing to gain from ejecting it (a lone backend's hard failures are the circuit breaker's job), so
// it does not stand out. It reads the others' published shares lock-free; it runs only when o is over a
// threshold, so its pass over the pool is rare.
func (d *OutlierDetector) standsOut(o *Outlier, v float64, share func(*Outlier) float64) bool {
	var buf [64]float64
	vals := buf[:0]
	for _, x := range *d.by.Load() {
		if x == o || OutlierState(x.state.Load()) != Serving {
			continue
		}
		if s := share(x); s >= 0 {
			vals = append(vals, s)
		}
	}
	if len(vals) == 0 {
		return false
	}
	slices.Sort(vals)
	n := len(vals)
	median := vals[n/2]
	if n%2 == 0 {
		median = (vals[n/2-1] + vals[n/2]) / 2
	}
	return v > d.p.PeerFactor*median
}

// Get returns the backend's Outlier, or nil for a name Update did not install. Lock-free.
func (d *OutlierDetector) Get(name string) *Outlier { return (*d.by.Load())[name] }

func (d *OutlierDetector) now() int64 { return int64(d.clock.Now().Sub(d.base)) }

// mayEject reports whether one more backend may go out of service.
func (d *OutlierDetector) mayEject() bool {
	limit := max(1, int64(d.p.MaxEjectedPercent/100*float64(d.tracked.Load())))
	return d.out.Load() < limit
}

const outlierBuckets = 10

// Outlier is one backend's outlier-detection state. Serving backends are checked with one atomic load; the
// window is updated under a small mutex of the backend's own. A backend's Outlier must not be copied.
type Outlier struct {
	d     *OutlierDetector
	name  string
	state atomic.Uint32 // OutlierState
	until atomic.Int64  // ns since base: end of the current ejection
	probe atomic.Int64  // ns since base (+1, so never 0) when the probe in flight was granted; 0 none
	gone  atomic.Bool   // dropped by Update: late observations from an old policy's requests are ignored

	mu        sync.Mutex
	buckets   [outlierBuckets]outlierBucket
	ejections int   // consecutive ejections, for the ejection length
	recovered int64 // ns since base when the backend last came back into service
	probesOK  int
	forErrors bool // the current ejection (or the last one) was for errors, not slowness

	// The window's shares as of the last observation (math.Float64bits; -1 while it has too few observations),
	// read lock-free by the other backends' peer comparison.
	slowShare, errShare atomic.Uint64

	gauge                  prometheus.Gauge
	ejectErrors, ejectSlow prometheus.Counter
}

type outlierBucket struct {
	epoch                  int64 // bucket number (time / width) the counts belong to
	requests, errors, slow int
	ratios                 int // observations with a prediction
}

// State returns the backend's state now (an ejection that ended reads as Probing).
func (o *Outlier) State() OutlierState {
	s := OutlierState(o.state.Load())
	if s == Ejected && o.d.now() >= o.until.Load() {
		return Probing
	}
	return s
}

// Available reports, without side effects, whether the backend may be picked: serving, or probing with no
// probe in flight. Use it as a filter before routing. Lock-free; one atomic load for a serving backend.
func (o *Outlier) Available() bool {
	if OutlierState(o.state.Load()) == Serving {
		return true
	}
	now := o.d.now()
	if OutlierState(o.state.Load()) == Ejected && now < o.until.Load() {
		return false
	}
	p := o.probe.Load()
	return p == 0 || now-(p-1) >= int64(o.d.p.ProbeTimeout)
}

// Acquire reports whether an attempt may be sent to the backend now, and for a probing backend takes the
// probe slot. Call it after the pick and before sending; on false, pick again without this backend. An
// attempt for which Acquire returned true must report through Observe. One atomic load for a serving backend;
// otherwise it takes the backend's mutex (rare: only out-of-service backends pay it).
func (o *Outlier) Acquire() bool {
	if OutlierState(o.state.Load()) == Serving {
		return true
	}
	now := o.d.now()
	o.mu.Lock()
	defer o.mu.Unlock()
	switch OutlierState(o.state.Load()) {
	case Serving:
		return true
	case Ejected:
		if now < o.until.Load() {
			return false
		}
		o.state.Store(uint32(Probing))
		o.setGauge(Probing)
	}
	if p := o.probe.Load(); p != 0 && now-(p-1) < int64(o.d.p.ProbeTimeout) {
		return false
	}
	o.probe.Store(now + 1)
	return true
}

// Observe records one attempt's outcome for the backend: ok false for a failure that is the backend's fault
// (connection refused or reset, 5xx, first-byte timeout, invalid response; not 4xx, not 429/503 "busy"
// replies, not a client that left), ok true with ttft the observed time to first token and predicted what
// routing predicted (Decision.TTFT; 0 if unknown). Call it once per attempt when its outcome is known: at its
// first token, or at its failure before one.
//
// While serving, it ejects the backend (unless MaxEjectedPercent is reached) when the window holds at least
// MinRequests observations and more than ErrorRate of them failed, or more than SlowShare of those with a
// prediction were slower than SlowRatio times it (and SlowSlack late). While probing, a good observation counts
// toward Probes and a bad one ejects the backend again, for longer. While ejected, it is ignored.
func (o *Outlier) Observe(ok bool, ttft, predicted time.Duration) {
	p := &o.d.p
	now := o.d.now()
	slow := ok && predicted > 0 && float64(ttft) > p.SlowRatio*float64(predicted) && ttft-predicted > p.SlowSlack
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.gone.Load() {
		return
	}
	switch o.State() {
	case Ejected:
		return
	case Probing:
		o.state.Store(uint32(Probing)) // an ejection that ended is Probing from now on
		o.setGauge(Probing)
		o.probe.Store(0)
		if !ok || slow {
			o.ejectLocked(now, !ok)
			o.d.log.Warn("outlier: probe failed, backend ejected again", "backend", o.name, "ok", ok, "ttft", ttft,
				"predicted", predicted, "for", o.length())
			return
		}
		o.probesOK++
		if o.probesOK >= p.Probes {
			o.recovered = now
			o.state.Store(uint32(Serving))
			o.d.out.Add(-1)
			o.buckets = [outlierBuckets]outlierBucket{}
			o.setGauge(Serving)
			o.d.log.Info("outlier: backend back in service", "backend", o.name, "probes", o.probesOK)
		}
		return
	}
	width := int64(p.Window) / outlierBuckets
	epoch := now / max(width, 1)
	b := &o.buckets[epoch%outlierBuckets]
	if b.epoch != epoch {
		*b = outlierBucket{epoch: epoch}
	}
	b.requests++
	if !ok {
		b.errors++
	}
	if ok && predicted > 0 {
		b.ratios++
		if slow {
			b.slow++
		}
	}
	var requests, errors, ratios, slows int
	for i := range o.buckets {
		if x := &o.buckets[i]; epoch-x.epoch < outlierBuckets {
			requests, errors, ratios, slows = requests+x.requests, errors+x.errors, ratios+x.ratios, slows+x.slow
		}
	}
	errShare, slowShare := -1.0, -1.0
	if requests >= p.MinRequests {
		errShare = float64(errors) / float64(requests)
	}
	if ratios >= p.MinRequests {
		slowShare = float64(slows) / float64(ratios)
	}
	o.errShare.Store(math.Float64bits(errShare))
	o.slowShare.Store(math.Float64bits(slowShare))
	byErrors := errShare > p.ErrorRate && o.d.standsOut(o, errShare, func(x *Outlier) float64 {
		return math.Float64frombits(x.errShare.Load())
	})
	bySlow := slowShare > p.SlowShare && slows >= p.MinSlow && o.d.standsOut(o, slowShare, func(x *Outlier) float64 {
		return math.Float64frombits(x.slowShare.Load())
	})
	if (byErrors || bySlow) && o.d.mayEject() {
		o.d.out.Add(1)
		if now-o.recovered > int64(p.MaxEjection) {
			o.ejections = 0 // it served well for long: start again at BaseEjection
		}
		o.ejectLocked(now, byErrors)
		reason, share := "slow", slowShare
		if byErrors {
			reason, share = "errors", errShare
		}
		o.d.log.Warn("outlier: backend ejected", "backend", o.name, "reason", reason, "share", math.Round(share*1000)/1000,
			"window_requests", requests, "for", o.length())
	}
}

// Reset clears the backend's window and, if it is out of service, returns it to service. The request path calls
// it when the backend's circuit breaker changes state: when the breaker opens it takes the hard failures over
// (the detector must not also eject for them, later, against peers that did not fail), and when it closes the
// backend has just answered its probes, so failures recorded during an outage (a region down, a crash) say
// nothing about it any more. Without this, a recovered backend is ejected for 30 s for an outage that is over.
func (o *Outlier) Reset() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.gone.Load() {
		return
	}
	if OutlierState(o.state.Load()) != Serving {
		o.d.out.Add(-1)
		o.state.Store(uint32(Serving))
		o.setGauge(Serving)
	}
	o.probe.Store(0)
	o.probesOK = 0
	o.ejections = 0
	o.buckets = [outlierBuckets]outlierBucket{}
	o.slowShare.Store(math.Float64bits(-1))
	o.errShare.Store(math.Float64bits(-1))
}

// Back tells the detector that the backend's engine answers again after it was seen unreachable (its metrics
// scrapes failed, then one succeeded), restarted saying that it is another process. The failures that ejected a
// backend for errors were those of the outage (a crash, a restart, a network cut), which is over: the ejection
// ends now and the backend goes to Probing, whose probes bring it back or eject it again for longer. Without
// this, a backend the detector ejected before its circuit breaker opened (so that no breaker probe brings it
// back, Reset) stays out for the whole ejection after it returns (docs/design.md, "Outlier detection").
// An ejection for slowness ends early only for a new process: an engine that was slow and merely missed a
// scrape is as slow as before. It does nothing to a serving or probing backend.
func (o *Outlier) Back(restarted bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.gone.Load() || OutlierState(o.state.Load()) != Ejected || !(o.forErrors || restarted) {
		return
	}
	now := o.d.now()
	if now >= o.until.Load() {
		return // ended already: Probing
	}
	o.until.Store(now)
	o.state.Store(uint32(Probing))
	o.setGauge(Probing)
	o.probe.Store(0)
	o.d.log.Info("outlier: engine back, ejection ended early", "backend", o.name, "restarted", restarted)
}

// ejectLocked ejects the backend, for BaseEjection times its consecutive ejections (a failed probe counts as
// one more; a backend back in service for longer than MaxEjection starts again at 1).
func (o *Outlier) ejectLocked(now int64, byErrors bool) {
	o.ejections++
	o.forErrors = byErrors
	o.until.Store(now + int64(o.length()))
	o.probesOK = 0
	o.buckets = [outlierBuckets]outlierBucket{}
	o.slowShare.Store(math.Float64bits(-1))
	o.errShare.Store(math.Float64bits(-1))
	o.state.Store(uint32(Ejected))
	o.setGauge(Ejected)
	switch {
	case byErrors && o.ejectErrors != nil:
		o.ejectErrors.Inc()
	case !byErrors && o.ejectSlow != nil:
		o.ejectSlow.Inc()
	}
}

// length is the current ejection's length: BaseEjection times the consecutive ejections, at most MaxEjection.
func (o *Outlier) length() time.Duration {
	p := &o.d.p
	return min(time.Duration(o.ejections)*p.BaseEjection, p.MaxEjection)
}

func (o *Outlier) setGauge(s OutlierState) {
	if o.gauge != nil {
		o.gauge.Set(float64(s))
	}
}
