package proxy

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/openai"
)

// Traces (README.md, "Traces and access log"). With Options.Tracer set, each request is a server span named
// "{gen_ai.operation.name} {model}" in the client's trace (W3C traceparent and tracestate, extracted from the
// forwarded headers), and each attempt on a backend is a client span below it whose context replaces the client's
// traceparent upstream. Attribute names follow the OpenTelemetry GenAI conventions (semconv v1.41.0: the last
// release that carries them in the Go module); the gateway's own are switchyard.*.
//
// Off costs nothing: every hook below starts with a nil check of the tracer and returns, so a gateway without
// tracing creates no span, reads no clock and allocates nothing more per request (TestObservabilityOffAllocs).
//
// Spans are started and ended on the handler goroutine only (prepare, won, settle and record run there), so the
// exchange's and the attempt's span fields need no lock; a hedge's goroutine reads only the request it sends.

// tracerName is the instrumentation scope of the gateway's spans.
const tracerName = "github.com/switchyard/switchyard/proxy"

// TracerName is the instrumentation scope name the request path expects its tracer to carry, for
// TracerProvider.Tracer.
const TracerName = tracerName

// The gateway's own span attributes.
const (
	attrStrategy      = attribute.Key("switchyard.routing.strategy")
	attrCandidates    = attribute.Key("switchyard.routing.candidates")
	attrReason        = attribute.Key("switchyard.routing.reason")
	attrPredictedTTFT = attribute.Key("switchyard.routing.predicted_ttft")
	attrCachedTokens  = attribute.Key("switchyard.routing.cached_tokens")
	attrCost          = attribute.Key("switchyard.routing.cost")
	attrSaturated     = attribute.Key("switchyard.routing.saturated")
	attrObservedTTFT  = attribute.Key("switchyard.routing.observed_ttft")
	attrTTFT          = attribute.Key("switchyard.ttft")
	attrITLP50        = attribute.Key("switchyard.itl.p50")
	attrITLP99        = attribute.Key("switchyard.itl.p99")
	attrBackend       = attribute.Key("switchyard.backend")
	attrRegion        = attribute.Key("switchyard.backend.region")
	attrAttempt       = attribute.Key("switchyard.attempt")
	attrRetry         = attribute.Key("switchyard.attempt.retry")
	attrHedge         = attribute.Key("switchyard.attempt.hedge")
	attrOutcome       = attribute.Key("switchyard.attempt.outcome")
	attrAttempts      = attribute.Key("switchyard.attempts")
	attrClass         = attribute.Key("switchyard.priority")
	attrKey           = attribute.Key("switchyard.key")
	attrRequestID     = attribute.Key("switchyard.request_id")
	attrCache         = attribute.Key("switchyard.cache")
	attrShed          = attribute.Key("switchyard.shed_reason")
	attrDegraded      = attribute.Key("switchyard.degraded_to")
	attrStreamEnd     = attribute.Key("switchyard.stream.end")
)

// traceContext is the W3C propagator: traceparent and tracestate, nothing else.
var traceContext propagation.TraceContext

// headerCarrier adapts fasthttp request headers to the propagator.
type headerCarrier struct{ h *fasthttp.RequestHeader }

func (c headerCarrier) Get(k string) string { return string(c.h.Peek(k)) }
func (c headerCarrier) Set(k, v string)     { c.h.Set(k, v) }
func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, c.h.Len())
	for k := range c.h.All() {
		keys = append(keys, string(k))
	}
	return keys
}

// apiProvider is gen_ai.provider.name of the API the client speaks to the gateway (the server span's; the
// metrics name the engine instead, genai.go). gen_ai.operation.name is ex.operation (genai.go).
func (ex *exchange) apiProvider() string {
	if ex.endpoint == openai.Messages {
		return "anthropic"
	}
	return "openai"
}

// engineProvider is gen_ai.provider.name of a backend: a hosted API is OpenAI's, an engine is named by itself.
func engineProvider(engine string) string {
	switch engine {
	case "openai-hosted", "openai":
		return "openai"
	case "":
		return "vllm"
	}
	return engine
}

// serverSpan returns the request's server span, starting it (back-dated to the arrival) on first use, in the
// client's trace when its forwarded headers carry one.
func (ex *exchange) serverSpan() trace.Span {
	if ex.obs.span != nil {
		return ex.obs.span
	}
	ctx := traceContext.Extract(context.Background(), headerCarrier{&ex.fwd})
	name := ex.operation()
	if ex.asked != nil {
		name += " " + ex.asked.Name
	}
	ctx, span := ex.s.opts.Tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(ex.arrival))
	ex.obs.ctx, ex.obs.span = ctx, span
	return span
}

// traceAttempt starts attempt a's client span, a child of the server span, and puts its context in a's request
// in place of the client's traceparent (hook: prepare, once the request is built).
func (ex *exchange) traceAttempt(a *attempt) {
	if ex.s.opts.Tracer == nil {
		return
	}
	ex.serverSpan()
	cfg := a.target.Backend.Config()
	dec := ex.rreq.Decision()
	ctx, span := ex.s.opts.Tracer.Start(ex.obs.ctx, ex.operation()+" "+a.target.Model,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithTimestamp(a.started))
	if span.IsRecording() {
		span.SetAttributes(
			semconv.GenAIOperationNameKey.String(ex.operation()),
			semconv.GenAIProviderNameKey.String(engineProvider(cfg.Engine)),
			semconv.GenAIRequestModelKey.String(a.target.Model),
			semconv.ServerAddressKey.String(a.up.host),
			attrBackend.String(a.name),
			attrRegion.String(cfg.Region),
			attrAttempt.Int(ex.attempts),
			attrRetry.Bool(ex.attempts > 1 && !a.hedge),
			attrHedge.Bool(a.hedge),
			attrCandidates.Int(len(ex.cands)),
			attrReason.String(ex.routingReason(dec.CachedTokens > 0, dec.Saturated)),
			attrPredictedTTFT.Float64(a.acct.PredictedTTFT().Seconds()),
			attrCachedTokens.Int(dec.CachedTokens),
			attrSaturated.Bool(dec.Saturated),
		)
		if dec.Cost > 0 {
			span.SetAttributes(attrCost.Float64(dec.Cost.Seconds()))
		}
	}
	a.span = span
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return
	}
	a.req.Header.Del("Traceparent")
	a.req.Header.Del("Tracestate")
	traceContext.Inject(ctx, headerCarrier{&a.req.Header})
}

// routingReason says in one word why the strategy chose the backend it chose, from what its Decision holds.
func (ex *exchange) routingReason(cached, saturated bool) string {
	switch {
	case ex.pin != nil:
		return "pinned" // a stored response's follow-up goes where it lives
	case ex.model.StrategyName != "adaptive" && ex.model.StrategyName != "":
		return ex.model.StrategyName
	case saturated:
		return "least_saturated" // every candidate was saturated: the least bad
	case cached:
		return "prefix_owner"
	}
	return "lowest_cost"
}

// traceWon records on a's span and for the server span that a answered first, with its observed time to first
// token (hook: won).
func (ex *exchange) traceWon(a *attempt) {
	if ex.s.opts.Tracer == nil && ex.s.opts.AccessLog == nil {
		return
	}
	ex.obs.region = a.target.Backend.Config().Region
	if ex.s.opts.Tracer == nil || !a.gotFirst {
		return
	}
	ex.obs.ttft = time.Since(a.started)
	ex.obs.predicted = a.acct.PredictedTTFT()
	ex.obs.reason = ex.routingReason(a.acct.PredictedHit(), ex.rreq.Decision().Saturated)
	if a.span != nil {
		a.span.SetAttributes(attrObservedTTFT.Float64(ex.obs.ttft.Seconds()))
	}
}

// traceAttemptEnd ends a's span with its outcome (hook: settle).
func (ex *exchange) traceAttemptEnd(a *attempt, outcome error) {
	span := a.span
	if span == nil {
		return
	}
	a.span = nil
	o := attemptOutcome(outcome)
	span.SetAttributes(attrOutcome.String(o))
	// The response is read only when the attempt answered, or failed with a status: a hedge that lost may still
	// be reading its own on its goroutine.
	var ue *upstreamError
	switch {
	case outcome == nil:
		span.SetAttributes(semconv.HTTPResponseStatusCodeKey.Int(a.resp.StatusCode()))
	case errors.As(outcome, &ue) && ue.kind == kindStatus:
		span.SetAttributes(semconv.HTTPResponseStatusCodeKey.Int(ue.status))
	}
	if outcome != nil && o != "hedge_lost" && o != "client_gone" {
		span.SetAttributes(semconv.ErrorTypeKey.String(o))
		span.SetStatus(codes.Error, o)
	}
	span.End()
}

// attemptOutcome names how an attempt ended: answered, a kind of upstream failure, or why it was stopped.
func attemptOutcome(err error) string {
	var ue *upstreamError
	switch {
	case err == nil:
		return "answered"
	case errors.Is(err, errHedgeLost):
		return "hedge_lost"
	case errors.Is(err, errYield):
		return "yielded"
	case errors.Is(err, errClientGone):
		return "client_gone"
	case errors.Is(err, errShutdown):
		return "shutdown"
	case errors.Is(err, errNotSent):
		return "not_sent"
	case errors.As(err, &ue):
		return ue.kind.String()
	}
	return "error"
}

// noteFailure keeps what ended the request for its span and its access log line (hooks: finish and fail,
// before record).
func (ex *exchange) noteFailure(err error) { ex.obs.err = err }

// traceEnd ends the request's server span (from record, which every request reaches once).
func (ex *exchange) traceEnd(code int, backend string, now time.Time) {
	span := ex.serverSpan()
	if span.IsRecording() {
		ex.spanAttributes(span, code, backend)
	}
	if code >= 500 {
		span.SetStatus(codes.Error, strconv.Itoa(code))
	}
	span.End(trace.WithTimestamp(now))
	ex.obs.span, ex.obs.ctx = nil, nil
}

func (ex *exchange) spanAttributes(span trace.Span, code int, backend string) {
	span.SetAttributes(
		semconv.GenAIOperationNameKey.String(ex.operation()),
		semconv.GenAIProviderNameKey.String(ex.apiProvider()),
		semconv.HTTPRequestMethodKey.String(ex.method()),
		semconv.HTTPResponseStatusCodeKey.Int(code),
		semconv.URLPathKey.String(string(ex.path)),
		attrRequestID.String(string(ex.reqID)),
		attrBackend.String(backend),
		attrAttempts.Int(ex.attempts),
	)
	if ex.clientIP != nil {
		span.SetAttributes(semconv.ClientAddressKey.String(ex.clientIP.String()))
	}
	if ex.asked != nil {
		span.SetAttributes(semconv.GenAIRequestModelKey.String(ex.asked.Name),
			attrStrategy.String(ex.asked.StrategyName), attrClass.String(ex.class.String()))
		if ex.sum.MaxTokens > 0 {
			span.SetAttributes(semconv.GenAIRequestMaxTokensKey.Int(ex.sum.MaxTokens))
		}
	}
	if ex.key != nil {
		span.SetAttributes(attrKey.String(ex.key.Name))
	}
	if code < 400 && ex.model != nil {
		span.SetAttributes(semconv.GenAIResponseModelKey.String(ex.model.Name))
		if ex.model != ex.asked {
			span.SetAttributes(attrDegraded.String(ex.model.Name))
		}
	}
	if ex.obs.region != "" {
		span.SetAttributes(attrRegion.String(ex.obs.region))
	}
	if ex.obs.reason != "" {
		span.SetAttributes(attrReason.String(ex.obs.reason), attrPredictedTTFT.Float64(ex.obs.predicted.Seconds()),
			attrObservedTTFT.Float64(ex.obs.ttft.Seconds()))
	}
	if !ex.firstAt.IsZero() {
		span.SetAttributes(attrTTFT.Float64(ex.firstAt.Sub(ex.arrival).Seconds()))
	}
	if ex.obs.itl.n > 0 {
		span.SetAttributes(attrITLP50.Float64(ex.obs.itl.quantile(0.5).Seconds()),
			attrITLP99.Float64(ex.obs.itl.quantile(0.99).Seconds()))
	}
	if in, out, ok := ex.tokenCounts(); ok {
		span.SetAttributes(semconv.GenAIUsageInputTokensKey.Int(in), semconv.GenAIUsageOutputTokensKey.Int(out))
	}
	if c := ex.cacheState(); c != "" {
		span.SetAttributes(attrCache.String(c))
	}
	if ex.committed {
		span.SetAttributes(attrStreamEnd.String(ex.end.String())) // streamend.go
	}
	if code >= 400 {
		e, shed := ex.errorType(code)
		span.SetAttributes(semconv.ErrorTypeKey.String(e))
		if shed != "" {
			span.SetAttributes(attrShed.String(shed))
		}
	}
}

// method is the client's HTTP method (the route's).
func (ex *exchange) method() string {
	if ex.rt == nil {
		return ""
	}
	return ex.rt.method
}

// tokenCounts returns the request's input and output tokens: the usage the backend reported, else the
// gateway's own counts (the prompt's estimate, the content chunks relayed); ok is false when there are none.
func (ex *exchange) tokenCounts() (in, out int, ok bool) {
	if ex.hasUsage {
		return ex.usage.PromptTokens, ex.usage.CompletionTokens, true
	}
	if ex.tokens > 0 {
		return ex.sum.PromptTokens, ex.tokens, true
	}
	return 0, 0, false
}

// cacheState is "hit" for an answer from the response cache, "miss" for a request that looked it up in vain,
// "" for a request that does not use it.
func (ex *exchange) cacheState() string {
	switch {
	case ex.rc.hit != nil:
		return "hit"
	case ex.rc.key != "":
		return "miss"
	}
	return ""
}

// errorType returns error.type for a failed request (the error code the client got, or the status) and, for a
// refusal that shed load, admission's reason.
func (ex *exchange) errorType(code int) (typ, shed string) {
	err := ex.obs.err
	if err == nil {
		if ex.upstreamError {
			return "upstream_error", ""
		}
		return strconv.Itoa(code), ""
	}
	var ae *admission.Error
	if errors.As(err, &ae) {
		shed = ae.Reason
	}
	if e := status(err); e.code != "" {
		return e.code, shed
	}
	return strconv.Itoa(code), shed
}
