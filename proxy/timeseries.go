package proxy

import (
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The status page's live charts (GET /debug/timeseries, status.html) come from fixed rings of one-second
// buckets, one ring for the fleet and one per backend, fed once per finished request by exchange.record.
//
// Cost: a request takes the fleet ring's mutex and its backend ring's mutex once each, for a few counter and
// bin increments (a bucket older than a second is cleared first, once a second); the backend's ring is found
// in an immutable map swapped with atomic.Pointer (STYLE.md, habit 2), which changes only when a backend
// name is first seen. Nothing is allocated per request. Memory: each ring is tsBuckets buckets of
// 2 x histBins uint32 bins and three counters, 158 KiB, allocated when its backend first finishes a request;
// at most maxSeries backends have one (beyond, a new backend takes the ring of one idle for the whole window,
// or counts in the fleet only).
const (
	tsBuckets = 300 // one per second: five minutes
	maxSeries = 64  // backends with a ring of their own

	// Histogram bins: histSub linear sub-bins per power-of-two octave of microseconds, from 2^histMinOctave µs
	// (0.512 ms) to 2^(histMinOctave+histOctaves) µs (33.6 s). Faster values count in the first bin, slower
	// in the last.
	histMinOctave = 9
	histOctaves   = 16
	histSubBits   = 2
	histSub       = 1 << histSubBits
	histBins      = histOctaves * histSub

	// QuantileError bounds the relative error of a quantile read from the histograms, for values inside
	// their range: the sample quantile lies in the bin the rank falls in, and the bin's midpoint is within
	// half a bin's width of it; the widest bin relative to its lower edge is the first of an octave,
	// [2^k, 1.25 x 2^k), so the error is at most 0.125 x 2^k / 2^k.
	QuantileError = 1.0 / (2 * histSub)
)

// hist counts latencies in log-linear bins (see histBins). The zero value is empty.
type hist [histBins]uint32

// histBin returns the bin that counts d.
func histBin(d time.Duration) int {
	us := uint64(max(d.Microseconds(), 0))
	if us < 1<<histMinOctave {
		return 0
	}
	oct := bits.Len64(us) - 1
	if oct >= histMinOctave+histOctaves {
		return histBins - 1
	}
	sub := int(us>>(oct-histSubBits)) & (histSub - 1)
	return (oct-histMinOctave)*histSub + sub
}

// histMid returns the midpoint of bin i, in milliseconds.
func histMid(i int) float64 {
	oct, sub := i/histSub+histMinOctave, i%histSub
	lo := math.Ldexp(1+float64(sub)/histSub, oct)
	return (lo + math.Ldexp(0.5/histSub, oct)) / 1000
}

// quantile returns the q-quantile (0 < q <= 1) of the values counted in h, in milliseconds (the midpoint of
// the bin the rank ceil(q*n) falls in), and false when h is empty.
func (h *hist) quantile(q float64) (float64, bool) {
	var n uint64
	for _, c := range h {
		n += uint64(c)
	}
	if n == 0 {
		return 0, false
	}
	rank := uint64(math.Ceil(q * float64(n)))
	rank = min(max(rank, 1), n)
	var cum uint64
	for i, c := range h {
		cum += uint64(c)
		if cum >= rank {
			return histMid(i), true
		}
	}
	return histMid(histBins - 1), true
}

func (h *hist) add(o *hist) {
	for i, c := range o {
		h[i] += c
	}
}

// tsBucket is one second of one ring.
type tsBucket struct {
	sec      int64 // Unix second it counts; a bucket whose sec is not the one asked for is empty
	requests uint32
	errors   uint32 // answered 5xx, sheds excepted
	shed     uint32 // refused by admission control (an admission.Error with a shed reason)
	ttft     hist   // time to first token as the client saw it, from arrival
	itl      hist   // each request's mean inter-token gap
}

// series is the ring of one backend (or the fleet). Its mutex guards name and b; last is read without it.
type series struct {
	mu   sync.Mutex
	name string
	last atomic.Int64 // Unix second of the last observation
	b    [tsBuckets]tsBucket
}

// sample is what one finished request adds to a ring.
type sample struct {
	sec        int64
	ttft, itl  time.Duration // 0: not measured (no first token; fewer than two tokens)
	err, shed  bool
	hasBackend bool
}

func (s *series) observe(x *sample) {
	s.last.Store(x.sec)
	s.mu.Lock()
	b := &s.b[uint64(x.sec)%tsBuckets]
	if b.sec != x.sec {
		*b = tsBucket{sec: x.sec}
	}
	b.requests++
	if x.err {
		b.errors++
	}
	if x.shed {
		b.shed++
	}
	if x.ttft > 0 {
		b.ttft[histBin(x.ttft)]++
	}
	if x.itl > 0 {
		b.itl[histBin(x.itl)]++
	}
	s.mu.Unlock()
}

// read adds the buckets of seconds [from, from+n) to dst (a bucket already cleared) and returns s's name.
func (s *series) read(dst *tsBucket, from int64, n int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for sec := from; sec < from+int64(n); sec++ {
		b := &s.b[uint64(sec)%tsBuckets]
		if b.sec != sec {
			continue
		}
		dst.requests += b.requests
		dst.errors += b.errors
		dst.shed += b.shed
		dst.ttft.add(&b.ttft)
		dst.itl.add(&b.itl)
	}
	return s.name
}

// timeseries holds the rings. The zero value is ready to use; it must not be copied.
type timeseries struct {
	fleet  series
	mu     sync.Mutex                         // serialises changes to byName
	byName atomic.Pointer[map[string]*series] // immutable once published
}

// observe adds one finished request to the fleet's ring and, when it reached one, to its backend's.
func (ts *timeseries) observe(backend string, x *sample) {
	ts.fleet.observe(x)
	if !x.hasBackend {
		return
	}
	if m := ts.byName.Load(); m != nil {
		if s := (*m)[backend]; s != nil {
			s.observe(x)
			return
		}
	}
	if s := ts.add(backend, x.sec); s != nil {
		s.observe(x)
	}
}

// add returns the ring of backend, giving it one: a new ring while there are fewer than maxSeries, else the
// ring of the backend idle longest if it has been idle for the whole window; nil if every ring is in use.
func (ts *timeseries) add(backend string, now int64) *series {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	old := ts.byName.Load()
	if old != nil && (*old)[backend] != nil {
		return (*old)[backend]
	}
	next := make(map[string]*series, 1+lenOf(old))
	var idle *series
	if old != nil {
		for k, v := range *old {
			next[k] = v
			if idle == nil || v.last.Load() < idle.last.Load() {
				idle = v
			}
		}
	}
	var s *series
	switch {
	case len(next) < maxSeries:
		s = &series{name: backend}
	case idle != nil && idle.last.Load() <= now-tsBuckets:
		idle.mu.Lock()
		delete(next, idle.name)
		idle.name, idle.b = backend, [tsBuckets]tsBucket{}
		idle.mu.Unlock()
		s = idle
	default:
		return nil
	}
	next[backend] = s
	ts.byName.Store(&next)
	return s
}

func lenOf(m *map[string]*series) int {
	if m == nil {
		return 0
	}
	return len(*m)
}

// Timeseries is GET /debug/timeseries: the last WindowS seconds in points of StepS seconds, oldest first,
// ending with the last whole second before the request. It is columnar (one array per field, aligned with T):
// what a chart draws.
type Timeseries struct {
	// ResolutionS is the rings' bucket, in seconds; StepS the seconds merged into each point.
	ResolutionS int `json:"resolution_s"`
	StepS       int `json:"step_s"`
	WindowS     int `json:"window_s"`
	// QuantileError bounds the relative error of every quantile (see QuantileError).
	QuantileError float64 `json:"quantile_error"`
	// T is the Unix second each point starts at.
	T      []int64        `json:"t"`
	Series []SeriesPoints `json:"series"`
}

// SeriesPoints is one ring's points: the fleet (Name "fleet", first) or a backend. Rates are per second over
// the point's step; quantiles are in milliseconds, null for a point without a measured request. Requests are
// counted when they finish; TTFT is from the request's arrival to its first token (what the client saw),
// ITL each request's mean gap between tokens. A refused request counts in the fleet, and in a backend's
// ring only when it had been tried there first (most reach no backend).
type SeriesPoints struct {
	Name         string    `json:"name"`
	RequestsPerS []float64 `json:"requests_per_s"`
	ErrorsPerS   []float64 `json:"errors_per_s"`
	ShedPerS     []float64 `json:"shed_per_s"`
	TTFTP50      []jsonMs  `json:"ttft_p50_ms"`
	TTFTP99      []jsonMs  `json:"ttft_p99_ms"`
	ITLP50       []jsonMs  `json:"itl_p50_ms"`
	ITLP99       []jsonMs  `json:"itl_p99_ms"`
}

// jsonMs is a latency in milliseconds that encodes NaN (no data) as null.
type jsonMs float64

// MarshalJSON implements json.Marshaler.
func (v jsonMs) MarshalJSON() ([]byte, error) {
	if math.IsNaN(float64(v)) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, float64(v), 'f', 3, 64), nil
}

// snapshot reads the rings into points of step seconds over the window seconds ending before the second
// now (the current second is still filling). window is clamped to the rings' length and rounded down to
// whole steps.
func (ts *timeseries) snapshot(now int64, window, step int) Timeseries {
	step = min(max(step, 1), tsBuckets)
	window = min(max(window, step), tsBuckets-1) / step * step
	n := window / step
	out := Timeseries{ResolutionS: 1, StepS: step, WindowS: window, QuantileError: QuantileError, T: make([]int64, n)}
	start := now - int64(window)
	for i := range n {
		out.T[i] = start + int64(i*step)
	}
	rings := []*series{&ts.fleet}
	if m := ts.byName.Load(); m != nil {
		for _, s := range *m {
			rings = append(rings, s)
		}
	}
	for i, s := range rings {
		sp := SeriesPoints{RequestsPerS: make([]float64, n), ErrorsPerS: make([]float64, n), ShedPerS: make([]float64, n),
			TTFTP50: make([]jsonMs, n), TTFTP99: make([]jsonMs, n), ITLP50: make([]jsonMs, n), ITLP99: make([]jsonMs, n)}
		var b tsBucket
		for j := range n {
			b = tsBucket{}
			sp.Name = s.read(&b, out.T[j], step)
			f := float64(step)
			sp.RequestsPerS[j], sp.ErrorsPerS[j], sp.ShedPerS[j] = float64(b.requests)/f, float64(b.errors)/f, float64(b.shed)/f
			sp.TTFTP50[j], sp.TTFTP99[j] = quantileMs(&b.ttft, 0.5), quantileMs(&b.ttft, 0.99)
			sp.ITLP50[j], sp.ITLP99[j] = quantileMs(&b.itl, 0.5), quantileMs(&b.itl, 0.99)
		}
		if i == 0 {
			sp.Name = "fleet"
		}
		out.Series = append(out.Series, sp)
	}
	// Backends in name order after the fleet, so that colours stay put between refreshes.
	slices.SortFunc(out.Series[1:], func(a, b SeriesPoints) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func quantileMs(h *hist, q float64) jsonMs {
	if v, ok := h.quantile(q); ok {
		return jsonMs(v)
	}
	return jsonMs(math.NaN())
}
