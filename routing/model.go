package routing

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// The online latency models of one backend (routing.md section 4.3), learned from every request it serves:
//
//	TTFT ~ a + b*uncached/1000 + c*queued/1000 + d*running/100     (seconds; the engine's part, RTT excluded)
//	ITL  ~ e + f*running/100                                       (seconds per output token)
//
// uncached: this request's prompt tokens the engine must prefill; queued: prefill tokens dispatched to the
// backend ahead of it without a first token yet; running: sequences decoding there. Features are scaled to
// about 1 so that the recursive least squares (RLS) below stays well conditioned.
//
// RLS with forgetting factor lambda (0.995: about the last 200 observations matter) keeps a coefficient vector
// theta and its covariance P. Each variance is bounded (by the prior's, or by a standard deviation of half the
// coefficient if larger) so that directions the traffic never excites do not wind up, and theta is projected
// onto [lo, hi] (non-negative, bounded) after every step. Observation noise is taken as proportional to the
// prediction (10% plus a floor): latency errors are relative.
//
// Two additions make it react fast and robustly:
//   - Regime change: an EWMA (weight 0.2) of the log error, each term clamped to +-1.5, crosses 0.6 after three
//     consecutive errors of 4.5x or more (five of 2.5x): every coefficient is scaled by the median of the last
//     three errors (at most 10x; a backend that slows down usually slows down across the board) and the
//     covariance is reset, so the next few observations refine it. One or two outliers never cross it. A fit
//     deferred past a change (detectTTFT, then fitTTFT at the stream's usage) is placed in its regime first
//     (regimeOf).
//   - Outliers: an observation whose log error exceeds 3 sigma gets its noise variance inflated by
//     (error/3 sigma)^2 (a Huber-like weight), so one stall does not drag theta away.
//
// The spread sigma is the EWMA (weight 0.05) of the squared log error of the prediction made before each
// observation, each term winsorised at 4 sigma; the p90 is mean*exp(1.2816*min(sigma, 0.8)) (routing.md: the llm-d predictor's p90 objective at no cost).
// Priors (the simulator's defaults, and llm-d-inference-sim's 8B-on-H100 profile) make a new backend usable at
// once with sigma 0.3, which costs it a 1.47x p90 factor until it has been observed; in a Registry the TTFT
// prior is first scaled to what the fleet's engines were observed to do (priorCal).

const (
	tokScale = 1000.0 // tokens per unit of the token features
	runScale = 100.0  // sequences per unit of the running feature

	rlsLambda     = 0.995
	regimeAlpha   = 0.2
	regimeClamp   = 1.5
	regimeTrigger = 0.6
	regimeMaxStep = 10.0 // a regime change rescales the model by at most this factor
	spreadAlpha   = 0.05
	priorSigma    = 0.3
	maxSigma      = 0.8 // the p90 factor is at most exp(1.28*0.8) = 2.8: a noisy backend is penalised, not banished
	z90           = 1.2815515655446004
	minPrediction = 0.0005 // seconds; predictions are floored here so log errors stay finite
)

// ttftPrior: a = 30 ms fixed cost (API server, one engine step), b = 0.15 ms per uncached token (6,700 prefill
// tokens/s), c = 0.15 ms per queued token, d = 0.2 ms per running sequence.
var (
	ttftPrior = rlsSpec{
		n:     4,
		theta: [4]float64{0.030, 0.15, 0.15, 0.02},
		sd:    [4]float64{0.05, 0.5, 0.5, 0.05},
		lo:    [4]float64{0, 0, 0, 0},
		hi:    [4]float64{30, 20, 20, 10},
		noise: [2]float64{0.10, 0.002},

		queueFloor: true,
	}
	// itlPrior: e = 20 ms per token with one sequence, f = 0.1 ms per running sequence.
	itlPrior = rlsSpec{
		n:     2,
		theta: [4]float64{0.020, 0.01},
		sd:    [4]float64{0.03, 0.05},
		lo:    [4]float64{0.0001, 0},
		hi:    [4]float64{5, 10},
		noise: [2]float64{0.10, 0.001},
	}
)

type rlsSpec struct {
	n         int
	theta, sd [4]float64
	lo, hi    [4]float64
	noise     [2]float64 // relative, absolute (seconds)
	// queueFloor, when set, keeps theta[2] (per queued token) at least half of theta[1] (per uncached token):
	// prefill queued ahead is prefill, done at the same engine's rate. Queued tokens are only estimated
	// (some of them were in fact cached), so the model may learn less than the rate, but not much less.
	queueFloor bool
}

// rls is one recursive-least-squares model with bounded forgetting. Not safe for concurrent use.
type rls struct {
	spec  *rlsSpec
	theta [4]float64
	p     [4][4]float64
}

func newRLS(s *rlsSpec) rls {
	m := rls{spec: s, theta: s.theta}
	m.resetCov()
	return m
}

func (m *rls) resetCov() {
	m.p = [4][4]float64{}
	for i := 0; i < m.spec.n; i++ {
		m.p[i][i] = m.pcap(i)
	}
}

// pcap bounds coefficient i's variance: the prior's, or a quarter of the coefficient's square (a standard
// deviation of half its value) when that is larger, so a coefficient far from its prior can still move.
func (m *rls) pcap(i int) float64 {
	return max(m.spec.sd[i]*m.spec.sd[i], m.theta[i]*m.theta[i]/4)
}

// rescale multiplies every coefficient by k (within bounds) and resets the covariance.
func (m *rls) rescale(k float64) {
	for i := 0; i < m.spec.n; i++ {
		m.theta[i] = min(max(m.theta[i]*k, m.spec.lo[i]), m.spec.hi[i])
	}
	m.resetCov()
}

func (m *rls) predict(x *[4]float64) float64 {
	s := 0.0
	for i := 0; i < m.spec.n; i++ {
		s += m.theta[i] * x[i]
	}
	return s
}

// update folds in observation y at features x with noise variance r.
func (m *rls) update(x *[4]float64, y, r float64) {
	n := m.spec.n
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			m.p[i][j] /= rlsLambda
		}
	}
	for i := 0; i < n; i++ { // bound the forgetting (see pcap)
		if lim := m.pcap(i); m.p[i][i] > lim {
			f := math.Sqrt(lim / m.p[i][i])
			for j := 0; j < n; j++ {
				m.p[i][j] *= f
				m.p[j][i] *= f
			}
		}
	}
	var px [4]float64
	s := r
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			px[i] += m.p[i][j] * x[j]
		}
		s += x[i] * px[i]
	}
	e := y - m.predict(x)
	for i := 0; i < n; i++ {
		k := px[i] / s
		m.theta[i] = min(max(m.theta[i]+k*e, m.spec.lo[i]), m.spec.hi[i])
		for j := 0; j < n; j++ {
			m.p[i][j] -= k * px[j]
		}
	}
	if m.spec.queueFloor {
		m.theta[2] = max(m.theta[2], m.theta[1]/2)
	}
	for i := 0; i < n; i++ { // keep P symmetric against rounding
		for j := i + 1; j < n; j++ {
			v := (m.p[i][j] + m.p[j][i]) / 2
			m.p[i][j], m.p[j][i] = v, v
		}
	}
}

// errStat tracks a model's log errors: the regime-change detector and the spread.
type errStat struct {
	shift float64    // EWMA of clamped log errors
	last  [3]float64 // the last three log errors, newest first
	v     float64    // EWMA of squared log errors
	level float64    // log of the product of the rescales applied so far (0 at the prior)
	// slowed sums the logs of the rescales the detector applied, never below 0 (so not the prior's calibration,
	// and a faster start is no credit): above regimeTrigger, the backend was seen to slow down by more than it has
	// been seen to recover since.
	slowed float64
}

// seen is what the regime detector made of an observation shown to it before its fit (detectTTFT): the
// detector's level after it, and its log error against the model of that moment. The fit uses them to place an
// observation that a regime change overtook in the regime it belongs to (see regimeOf).
type seen struct {
	level, le float64
}

// regimeOf returns the factor by which to scale an observation seen as s so that it describes the model's
// current regime. A fit deferred until a stream ends (fitTTFT after detectTTFT) may come after a regime change
// that its own first token preceded. Fitted as it is, an observation of the old regime pulls the rescaled
// coefficients back with the full gain of the reset covariance, and old observations of other prompt lengths
// than the slow ones that triggered the change bend its shape: the slowdown lands in the intercept and the
// per-token cost falls, so a long prompt looks cheap on a backend that is slow for every prompt. The observation
// belongs to whichever regime predicted it better in log terms, the old one (its error then, le) or the new one
// (le minus the log rescale k since): an old-regime observation is scaled by exp(k) (a change scales everything,
// see detect), a new-regime one (the errors that triggered the change) is kept as it is.
func regimeOf(st *errStat, s seen) float64 {
	k := st.level - s.level
	if k == 0 || math.Abs(s.le) >= math.Abs(s.le-k) {
		return 1
	}
	return math.Exp(k)
}

// logErr is the log error of observation y against prediction pred, both floored at minPrediction and the
// result clamped to [-3, 3], as every model here takes it.
func logErr(y, pred float64) float64 {
	return min(max(math.Log(max(y, minPrediction)/max(pred, minPrediction)), -3), 3)
}

// median3 returns the median of three values.
func median3(a, b, c float64) float64 { return max(min(a, b), min(max(a, b), c)) }

// observe folds y (seconds, observed at x) into m and st and returns the prediction it made before. With
// detected set, the observation was already shown to the regime detector (see detect) and is only fitted.
func observe(m *rls, st *errStat, x *[4]float64, y float64, detected bool) float64 {
	pred := max(m.predict(x), minPrediction)
	y = max(y, minPrediction)
	le := logErr(y, pred)
	sigma := math.Sqrt(st.v)
	// Winsorised at 4 sigma: one outlier must not inflate the spread that bounds the next one's weight.
	st.v += spreadAlpha * (min(le*le, 16*max(st.v, 0.01)) - st.v)
	if !detected {
		detect(m, st, le)
	}
	// The noise scales with the prediction, not with y: weighting by y would favour observations that came out
	// low and bias the model downwards.
	noise := m.spec.noise[0]*max(m.predict(x), minPrediction) + m.spec.noise[1]
	r := noise * noise
	if lim := 3 * max(sigma, 0.1); math.Abs(le) > lim {
		r *= (le / lim) * (le / lim)
	}
	m.update(x, y, r)
	return pred
}

// detect feeds one log error to the regime-change detector and rescales m when it fires.
func detect(m *rls, st *errStat, le float64) {
	st.shift += regimeAlpha * (min(max(le, -regimeClamp), regimeClamp) - st.shift)
	st.last = [3]float64{le, st.last[0], st.last[1]}
	if math.Abs(st.shift) > regimeTrigger {
		// The backend changed (a slowdown, a recovery, another GPU behind the same name): assume first that
		// everything scaled by the median of the last three errors, then let the next observations refine it.
		k := min(max(math.Exp(median3(st.last[0], st.last[1], st.last[2])), 1/regimeMaxStep), regimeMaxStep)
		m.rescale(k)
		st.level += math.Log(k)
		st.slowed = max(st.slowed+math.Log(k), 0)
		st.shift = 0
	}
}

// errWindowLen is how many recent prediction errors a model keeps for /debug/backends.
const errWindowLen = 64

// errWindow keeps the last errWindowLen ratios of an observation to the prediction made before it. Guarded by
// latency.mu.
type errWindow struct {
	buf  [errWindowLen]float64
	n, i int
}

func (w *errWindow) add(ratio float64) {
	w.buf[w.i] = ratio
	w.i = (w.i + 1) % errWindowLen
	w.n = min(w.n+1, errWindowLen)
}

// quantiles returns the 10th, 50th and 90th percentiles of the kept ratios (zeros when there are none).
func (w *errWindow) quantiles() [3]float64 {
	if w.n == 0 {
		return [3]float64{}
	}
	var s [errWindowLen]float64
	v := s[:w.n]
	copy(v, w.buf[:w.n])
	slices.Sort(v)
	at := func(q float64) float64 { return v[min(int(q*float64(w.n)), w.n-1)] }
	return [3]float64{at(0.1), at(0.5), at(0.9)}
}

// latency holds a backend's TTFT and ITL models. Updates take mu; the coefficients and spreads are also
// published as atomics after every update, so predictions on the request path never lock (a reader may see
// coefficients from two consecutive updates mixed, which are both valid estimates).
type latency struct {
	mu          sync.Mutex
	cal         *priorCal   // the fleet's calibration of the TTFT prior (the Registry's; nil outside one)
	started     atomic.Bool // the TTFT model left the prior: calibrated (start) before its first observation
	ttft, itl   rls
	ttftE, itlE errStat
	nTTFT, nITL int
	ttftW, itlW errWindow // observed/predicted, the last errWindowLen of each

	pubTTFT    [4]afloat
	pubITL     [2]afloat
	ttftSpread afloat // exp(z90*sigma)
	ttftKnown  afloat // exp(z90*sigma/sqrt(n+1)): the p90 factor of the mean's own error (knownFactor)
	ttftSlowed afloat // ttftE.slowed
	itlSpread  afloat
}

func (l *latency) init() {
	l.ttft = newRLS(&ttftPrior)
	l.itl = newRLS(&itlPrior)
	l.ttftE.v = priorSigma * priorSigma
	l.itlE.v = priorSigma * priorSigma
	l.publish()
}

func (l *latency) publish() {
	for i := range l.pubTTFT {
		l.pubTTFT[i].store(l.ttft.theta[i])
	}
	for i := range l.pubITL {
		l.pubITL[i].store(l.itl.theta[i])
	}
	l.ttftSpread.store(math.Exp(z90 * min(math.Sqrt(l.ttftE.v), maxSigma)))
	l.ttftKnown.store(knownFactor(l.ttftE.v, l.nTTFT))
	l.ttftSlowed.store(l.ttftE.slowed)
	l.itlSpread.store(math.Exp(z90 * min(math.Sqrt(l.itlE.v), maxSigma)))
}

// knownFactor is the p90 factor of a model's mean TTFT as an estimate of the backend's true mean: the errors'
// spread (sigma, as in the p90 factor) over the square root of the observations behind the mean, n plus one for
// the prior, at most the 1/(1-rlsLambda) = 200 that the forgetting keeps. It is what the model does not yet know
// about the backend, where the spread is also what the backend itself varies: 1.47 before any observation
// (the prior's sigma), 1.21 after three, 1.04 after a hundred, whatever the engine. A backend that stalls now
// and then has a wide spread but a well-known mean, so it does not get the benefit of the doubt that a backend
// no request has reached yet does (pickCold).
func knownFactor(v float64, n int) float64 {
	return math.Exp(z90 * min(math.Sqrt(v), maxSigma) / math.Sqrt(float64(min(n, rlsMemory)+1)))
}

// rlsMemory is about how many recent observations a model's mean rests on: 1/(1-rlsLambda), 200.
const rlsMemory = 1 / (1 - rlsLambda)

func ttftX(uncached, queued, running float64) [4]float64 {
	return [4]float64{1, uncached / tokScale, queued / tokScale, running / runScale}
}

// observeTTFT folds in one observed engine TTFT (seconds) with the features captured at dispatch and returns
// the prediction made before it.
func (l *latency) observeTTFT(uncached, queued, running, y float64) float64 {
	return l.fitTTFT(uncached, queued, running, y, nil)
}

// fitTTFT is observeTTFT for an observation that detectTTFT has already seen, as s, when s is not nil: it is
// fitted in the regime it belongs to (regimeOf) and not shown to the detector again.
func (l *latency) fitTTFT(uncached, queued, running, y float64, s *seen) float64 {
	x := ttftX(uncached, queued, running)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.start()
	if l.cal != nil {
		l.cal.observe(y, &x)
	}
	if s != nil {
		y *= regimeOf(&l.ttftE, *s)
	}
	pred := observe(&l.ttft, &l.ttftE, &x, y, s != nil)
	l.ttftW.add(max(y, minPrediction) / pred)
	l.nTTFT++
	l.publish()
	return pred
}

// detectTTFT shows an observed TTFT to the regime detector only, with features that may later be corrected
// (fitTTFT fits it then): a backend that suddenly became slow is seen at its first tokens, not when its slow
// streams end. It returns what fitTTFT needs to place the observation in its regime.
func (l *latency) detectTTFT(uncached, queued, running, y float64) seen {
	x := ttftX(uncached, queued, running)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.start()
	le := logErr(y, l.ttft.predict(&x))
	detect(&l.ttft, &l.ttftE, le)
	l.publish()
	return seen{level: l.ttftE.level, le: le}
}

// observeITL folds in one request's mean inter-token latency (seconds) with the mean running count it saw.
func (l *latency) observeITL(running, y float64) {
	x := [4]float64{1, running / runScale}
	l.mu.Lock()
	defer l.mu.Unlock()
	pred := observe(&l.itl, &l.itlE, &x, y, false)
	l.itlW.add(max(y, minPrediction) / pred)
	l.nITL++
	l.publish()
}

// ttftMean predicts the engine's TTFT (seconds, RTT excluded): before the model's first observation, the prior
// as the fleet's calibration scales it (priorCal). Lock-free.
func (l *latency) ttftMean(uncached, queued, running float64) float64 {
	x := ttftX(uncached, queued, running)
	s := 0.0
	for i := range x {
		s += l.pubTTFT[i].load() * x[i]
	}
	if !l.started.Load() {
		s *= l.cal.factor()
	}
	return max(s, minPrediction)
}

// start moves the TTFT model from the prior to the prior as the fleet's calibration scales it, once, before the
// model sees its first observation (the detector's or the fit's), so that the observation refines what the
// fleet knows of engines like it rather than the fixed prior. l.mu must be held.
func (l *latency) start() {
	if l.started.Load() {
		return
	}
	if k := l.cal.factor(); k != 1 {
		l.ttft.rescale(k)
		l.ttftE.level += math.Log(k)
	}
	l.publish()
	l.started.Store(true)
}

// priorCal calibrates the TTFT prior to the fleet it routes to. The prior (ttftPrior) is a guess, the
// simulator's defaults and one 8B-on-H100 profile; engines on other hardware, models and physics are faster or
// slower by a factor that every backend of one fleet mostly shares. Until a backend's own model has seen an
// observation, the prior predicts it, and where the engines were twice as fast as the prior, every backend no
// request had reached yet was predicted twice as slow as those already observed, so the first few backends took
// every new prompt (multi-turn conversations: two of four system prompts on one of eight backends, four holding
// none; routing/README.md). The calibration is the mean log ratio of every TTFT observed on the fleet to what the
// prior predicts for it (over the last rlsMemory observations once there are that many; each clamped as the
// models clamp errors), and it scales the prior of a backend not yet observed, and the start of its model. It is
// measured, so it holds on any engine; a fleet that mixes engines gets their mean, which each backend's own
// observations then correct as they do today. Safe for concurrent use; nil calibrates nothing.
type priorCal struct {
	mu   sync.Mutex
	n    int
	logK afloat
}

// observe folds in one observed engine TTFT y (seconds) at features x.
func (c *priorCal) observe(y float64, x *[4]float64) {
	prior := rls{spec: &ttftPrior, theta: ttftPrior.theta}
	le := logErr(y, prior.predict(x))
	c.mu.Lock()
	c.n = min(c.n+1, rlsMemory)
	c.logK.store(c.logK.load() + (le-c.logK.load())/float64(c.n))
	c.mu.Unlock()
}

// factor is the calibration as a factor on the prior's prediction, within the bounds of a regime change.
func (c *priorCal) factor() float64 {
	if c == nil {
		return 1
	}
	return min(max(math.Exp(c.logK.load()), 1/regimeMaxStep), regimeMaxStep)
}

// prefillRate returns the predicted seconds of prefill per uncached token (b / 1000).
func (l *latency) prefillPerToken() float64 { return l.pubTTFT[1].load() / tokScale }

// itlMean predicts the inter-token latency (seconds) with running sequences decoding. Lock-free.
func (l *latency) itlMean(running float64) float64 {
	return max(l.pubITL[0].load()+l.pubITL[1].load()*running/runScale, minPrediction)
}

// Coefficient is one learned coefficient of a latency model as /debug/backends shows it.
type Coefficient struct {
	// Name says what the coefficient multiplies; Unit its unit (ms, ms per 1,000 tokens, ms per 100 sequences).
	Name string `json:"name"`
	Unit string `json:"unit"`
	// Value is the estimate; StdErr its standard error: the square root of the RLS covariance's diagonal,
	// scaled from the noise the fit assumes (10% of the prediction) to the spread its errors show (Sigma).
	Value  float64 `json:"value"`
	StdErr float64 `json:"std_err"`
}

// ModelStatus is one learned latency model of a backend as /debug/backends shows it: its coefficients with
// their errors, and how well its recent predictions did.
type ModelStatus struct {
	Coefficients []Coefficient `json:"coefficients"`
	// Samples is how many observations trained it; Sigma the EWMA spread of their log errors (the p90 factor
	// is exp(1.28 * min(Sigma, 0.8))).
	Samples int     `json:"samples"`
	Sigma   float64 `json:"sigma"`
	// ErrorP10, ErrorP50 and ErrorP90 are quantiles of observed/predicted over the last 64 observations (the
	// prediction made before each): 1 is exact, a median above 1 a model that predicts too fast. Zero before
	// any observation.
	ErrorP10 float64 `json:"error_p10"`
	ErrorP50 float64 `json:"error_p50"`
	ErrorP90 float64 `json:"error_p90"`
}

var (
	ttftCoefNames = [4][2]string{{"fixed", "ms"}, {"prefill", "ms per 1k uncached tokens"},
		{"queued", "ms per 1k queued prefill tokens"}, {"running", "ms per 100 decoding sequences"}}
	itlCoefNames = [4][2]string{{"fixed", "ms per token"}, {"running", "ms per token per 100 decoding sequences"}}
)

// status returns both models' figures. It takes l.mu: for the admin port, not the request path.
func (l *latency) status() (ttft, itl ModelStatus) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return modelStatus(&l.ttft, &l.ttftE, &l.ttftW, l.nTTFT, &ttftCoefNames),
		modelStatus(&l.itl, &l.itlE, &l.itlW, l.nITL, &itlCoefNames)
}

func modelStatus(m *rls, st *errStat, w *errWindow, n int, names *[4][2]string) ModelStatus {
	sigma := math.Sqrt(st.v)
	scale := sigma / m.spec.noise[0]
	out := ModelStatus{Samples: n, Sigma: sigma}
	for i := 0; i < m.spec.n; i++ {
		out.Coefficients = append(out.Coefficients, Coefficient{Name: names[i][0], Unit: names[i][1],
			Value: m.theta[i] * 1e3, StdErr: math.Sqrt(max(m.p[i][i], 0)) * scale * 1e3})
	}
	q := w.quantiles()
	out.ErrorP10, out.ErrorP50, out.ErrorP90 = q[0], q[1], q[2]
	return out
}
