package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"

	"github.com/switchyard/switchyard/policy"
)

// tracingShutdownTimeout bounds how long the gateway waits at exit for its last spans to reach the collector.
const tracingShutdownTimeout = 5 * time.Second

// newTracing builds the tracer provider the policy's tracing section and the OTEL_* environment ask for, or nil
// when tracing is off (policy.Tracing says when). The exporter batches spans off the request path and drops
// them when its queue is full (2048 spans), so a slow collector never slows a request. The caller shuts it down.
func newTracing(ctx context.Context, t policy.Tracing, getenv func(string) string, log *slog.Logger) (*sdktrace.TracerProvider, error) {
	if !tracingOn(t, getenv) {
		return nil, nil
	}
	protocol := firstSet(t.Protocol, getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"), getenv("OTEL_EXPORTER_OTLP_PROTOCOL"), policy.TracingHTTP)
	var exp sdktrace.SpanExporter
	var err error
	switch protocol {
	case policy.TracingHTTP, policy.TracingJSON:
		var opts []otlptracehttp.Option
		if t.Endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(tracesURL(t.Endpoint)))
		}
		if protocol == policy.TracingJSON {
			opts = append(opts, otlptracehttp.WithEncoding(otlptracehttp.EncodingJSON))
		}
		exp, err = otlptracehttp.New(ctx, opts...)
	case policy.TracingGRPC:
		var opts []otlptracegrpc.Option
		if t.Endpoint != "" {
			opts = append(opts, otlptracegrpc.WithEndpointURL(t.Endpoint))
		}
		exp, err = otlptracegrpc.New(ctx, opts...)
	default:
		return nil, fmt.Errorf("tracing: unknown OTLP protocol %q (one of: %s, %s, %s)", protocol, policy.TracingGRPC, policy.TracingHTTP, policy.TracingJSON)
	}
	if err != nil {
		return nil, fmt.Errorf("tracing: exporter: %w", err)
	}
	// The service name defaults to switchyard; OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, read after it,
	// override it.
	res, err := resource.New(ctx, resource.WithAttributes(semconv.ServiceName("switchyard")), resource.WithFromEnv(),
		resource.WithTelemetrySDK())
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithBatcher(exp), sdktrace.WithResource(res)}
	sampler := "OTEL_TRACES_SAMPLER (default parentbased_always_on)"
	if t.Sample != nil {
		// Without it the SDK reads OTEL_TRACES_SAMPLER and OTEL_TRACES_SAMPLER_ARG itself.
		opts = append(opts, sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(*t.Sample))))
		sampler = fmt.Sprintf("parentbased_traceidratio %g", *t.Sample)
	}
	log.Info("tracing on", "protocol", protocol, "endpoint", endpointForLog(t.Endpoint, getenv), "sampler", sampler)
	return sdktrace.NewTracerProvider(opts...), nil
}

// tracingOn decides whether the gateway traces: never when OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none;
// else as tracing.enabled says; else when an OTLP endpoint is set in the environment.
func tracingOn(t policy.Tracing, getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") ||
		strings.EqualFold(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")), "none") {
		return false
	}
	if t.Enabled != nil {
		return *t.Enabled
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// tracesURL is the OTLP/HTTP URL for a collector's base URL: /v1/traces is added when the URL has no path, as
// the SDK does for OTEL_EXPORTER_OTLP_ENDPOINT.
func tracesURL(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || strings.Trim(u.Path, "/") != "" {
		return endpoint
	}
	u.Path = "/v1/traces"
	return u.String()
}

// endpointForLog says where spans go, without any credential the URL might carry.
func endpointForLog(policyEndpoint string, getenv func(string) string) string {
	e := firstSet(policyEndpoint, getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), getenv("OTEL_EXPORTER_OTLP_ENDPOINT"), "the SDK's default (localhost)")
	if u, err := url.Parse(e); err == nil && u.Host != "" {
		return u.Scheme + "://" + u.Host + u.Path
	}
	return e
}

func firstSet(vals ...string) string {
	for _, v := range vals {
		if v = strings.TrimSpace(v); v != "" {
			return v
		}
	}
	return ""
}

// shutdownTracing flushes and stops tp (nil: nothing to do), waiting at most tracingShutdownTimeout.
func shutdownTracing(tp *sdktrace.TracerProvider, log *slog.Logger) {
	if tp == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownTimeout)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("tracing: shutdown", "err", err)
	}
}
