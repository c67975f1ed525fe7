package proxy

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/trace"
)

// The access log (README.md, "Traces and access log"): with Options.AccessLog set, one line per request, message
// "request", written when the request is recorded (its answer complete, or its failure sent). Its fields are
// names and numbers the gateway decided or measured, never a credential (the key's policy name stands for the
// key) and never content of the body (a model name is logged only when the policy knows it).
//
// A failed request (status 400 or more, 499 included) is always logged; a successful one with probability
// Options.AccessLogSample.

// accessAttrs bounds the fields of one line, so that they are gathered on the stack.
const accessAttrs = 28

// accessLog writes the request's access log line.
func (ex *exchange) accessLog(code int, backend string, now time.Time, traceID trace.TraceID) {
	if p := ex.s.opts.AccessLogSample; code < 400 && p > 0 && p < 1 && rand.Float64() >= p {
		return
	}
	var buf [accessAttrs]slog.Attr
	a := append(buf[:0],
		slog.String("request_id", string(ex.reqID)),
		slog.String("method", ex.method()),
		slog.String("path", string(truncate(ex.path, maxEcho))),
		slog.Int("status", code),
	)
	if ex.asked != nil {
		a = append(a, slog.String("model", ex.asked.Name))
		if ex.model != nil && ex.model != ex.asked {
			a = append(a, slog.String("degraded_to", ex.model.Name))
		}
	}
	if ex.key != nil {
		a = append(a, slog.String("key", ex.key.Name))
	}
	if ex.asked != nil {
		a = append(a, slog.String("class", ex.class.String()), slog.Bool("stream", ex.sum.Stream))
	}
	a = append(a, slog.String("backend", backend))
	if ex.obs.region != "" {
		a = append(a, slog.String("region", ex.obs.region))
	}
	a = append(a, slog.Int("attempts", ex.attempts), slog.Float64("duration_ms", millis(now.Sub(ex.arrival))))
	if ex.queueWait > 0 {
		a = append(a, slog.Float64("queue_ms", millis(ex.queueWait))) // time in the gateway's queue, within duration and ttft
	}
	if !ex.firstAt.IsZero() {
		a = append(a, slog.Float64("ttft_ms", millis(ex.firstAt.Sub(ex.arrival))))
	}
	if ex.yields > 0 { // yield.go: the stream gave its seat to critical requests, and waited to resume
		a = append(a, slog.Int("yields", ex.yields), slog.Float64("yield_wait_ms", millis(ex.yieldWait)))
	}
	if ex.obs.itl.n > 0 {
		a = append(a, slog.Float64("itl_p50_ms", millis(ex.obs.itl.quantile(0.5))),
			slog.Float64("itl_p99_ms", millis(ex.obs.itl.quantile(0.99))))
	}
	if in, out, ok := ex.tokenCounts(); ok {
		a = append(a, slog.Int("tokens_in", in), slog.Int("tokens_out", out))
	}
	if ex.cost.charged {
		a = append(a, slog.Float64("cost", ex.cost.dollars))
	}
	if c := ex.cacheState(); c != "" {
		a = append(a, slog.String("cache", c))
	}
	if ex.committed {
		a = append(a, slog.String("stream_end", ex.end.String())) // streamend.go: whose failure a broken stream was
	}
	if code >= 400 {
		typ, shed := ex.errorType(code)
		a = append(a, slog.String("error", typ))
		if shed != "" {
			a = append(a, slog.String("shed", shed))
		}
	}
	if ex.clientIP != nil {
		a = append(a, slog.String("client", ex.clientIP.String()))
	}
	if traceID.IsValid() {
		a = append(a, slog.String("trace_id", traceID.String()))
	}
	ex.s.opts.AccessLog.LogAttrs(context.Background(), slog.LevelInfo, "request", a...)
}

// logRefused writes the access log line of a request refused from its headers alone, before it had an
// exchange (Server.headerReceived): its key did not authenticate, or it named no endpoint the gateway serves.
func (s *Server) logRefused(ctx *fasthttp.RequestCtx, e apiError) {
	if s.opts.AccessLog == nil {
		return
	}
	var buf [accessAttrs]slog.Attr
	a := append(buf[:0],
		slog.String("request_id", string(ctx.Response.Header.Peek(headerRequestID))),
		slog.String("method", string(ctx.Method())),
		slog.String("path", string(truncate(ctx.Path(), maxEcho))),
		slog.Int("status", e.status),
		slog.String("backend", "none"),
		slog.Int("attempts", 0),
		slog.Float64("duration_ms", millis(time.Since(ctx.Time()))),
		slog.String("error", e.code),
		slog.String("client", ctx.RemoteIP().String()),
	)
	s.opts.AccessLog.LogAttrs(context.Background(), slog.LevelInfo, "request", a...)
}

// millis is d in milliseconds, rounded to the microsecond.
func millis(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }
