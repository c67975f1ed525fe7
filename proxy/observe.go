package proxy

import (
	"context"
	"math/bits"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// observation is an exchange's part for its trace (trace.go) and its access log line (accesslog.go): what the
// hooks on the request path learn that the exchange does not keep already. It stays zero, and costs nothing,
// when neither is on.
type observation struct {
	span trace.Span      // the server span, once started
	ctx  context.Context // span's context, the parent of the attempts' spans
	err  error           // what ended the request, when it failed (noteFailure)

	region    string        // the answering backend's region
	ttft      time.Duration // the answering attempt's time to first token, from its send
	predicted time.Duration // the routing model's prediction of it at dispatch
	reason    string        // why the answering backend was chosen (routingReason)

	itl gapHist // the inter-token gaps the client saw
}

// observing reports whether traces or the access log are on, so that the hooks have anything to do.
func (ex *exchange) observing() bool { return ex.s.opts.Tracer != nil || ex.s.opts.AccessLog != nil }

// resetObservation clears the exchange's observation for the pool (hook: releaseExchange).
func (ex *exchange) resetObservation() {
	if ex.observing() {
		ex.obs = observation{}
	}
}

// observe ends the request's span and writes its access log line (hook: record, once per request).
func (ex *exchange) observe(code int, backend string) {
	if !ex.observing() {
		return
	}
	now := time.Now()
	var traceID trace.TraceID
	if ex.s.opts.Tracer != nil {
		traceID = ex.serverSpan().SpanContext().TraceID()
		ex.traceEnd(code, backend, now)
	}
	if ex.s.opts.AccessLog != nil {
		ex.accessLog(code, backend, now, traceID)
	}
}

// noteGap records one inter-token gap the client saw, at now (hook: countTokens, for every token after the
// first).
func (ex *exchange) noteGap(now time.Time) {
	if ex.observing() {
		ex.obs.itl.add(now.Sub(ex.lastTokenAt))
	}
}

// gapHist is a fixed-size log-linear histogram of one request's inter-token gaps, for their p50 and p99
// without keeping every gap or allocating: four buckets per power of two of 1.024 µs units, from 0 to about
// 137 s (longer gaps count in the last bucket). A quantile is its bucket's midpoint, within 12.5% of the true
// gap. Adding a gap is a shift, a bit length and an increment.
type gapHist struct {
	n      uint32
	counts [gapBuckets]uint32
}

const (
	gapUnitShift = 10  // a unit is 2^10 ns
	gapBuckets   = 104 // buckets 0-3 are one unit wide; then four per octave up to 2^26 units
)

// gapBucket returns the bucket of a gap.
func gapBucket(d time.Duration) int {
	if d < 0 {
		d = 0
	}
	v := uint64(d) >> gapUnitShift
	if v < 4 {
		return int(v)
	}
	e := bits.Len64(v) - 1 // v is in [2^e, 2^(e+1)), e >= 2
	i := (e-1)*4 + int(v>>(e-2)&3)
	return min(i, gapBuckets-1)
}

// gapMid returns the midpoint of bucket i.
func gapMid(i int) time.Duration {
	if i < 4 {
		return time.Duration((2*i + 1) << gapUnitShift / 2)
	}
	e, m := i/4+1, i%4
	lo := uint64(4+m) << (e - 2)
	width := uint64(1) << (e - 2)
	return time.Duration((lo*2 + width) << gapUnitShift / 2)
}

func (h *gapHist) add(d time.Duration) {
	h.counts[gapBucket(d)]++
	h.n++
}

// quantile returns the q-quantile (0 < q <= 1) of the gaps added, 0 when there are none.
func (h *gapHist) quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint32(q*float64(h.n) + 0.999999)
	rank = max(rank, 1)
	var seen uint32
	for i, c := range h.counts {
		if seen += c; seen >= rank {
			return gapMid(i)
		}
	}
	return gapMid(gapBuckets - 1)
}
