package policy

import (
	"fmt"
	"net/url"
)

// Tracing configures the gateway's OpenTelemetry traces (README.md, "Traces and access log"): a server span per
// request and a client span per attempt on a backend, exported over OTLP. Each field left out falls back to the
// standard OTEL_* environment variable that the OpenTelemetry SDK reads (named on the field), then to the SDK's
// default. Static: a reload that changes it keeps the one the process started with.
type Tracing struct {
	// Enabled turns tracing on or off. Default: on when OTEL_EXPORTER_OTLP_ENDPOINT or
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set, off otherwise. OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none
	// turn it off whatever the file says. Off, the request path creates no span and allocates nothing for traces.
	Enabled *bool `yaml:"enabled"`
	// Endpoint is the collector's OTLP URL: for http/protobuf its base (http://collector:4318, the gateway adds
	// /v1/traces when the URL has no path), for grpc http://collector:4317 (https for TLS). Default:
	// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, OTEL_EXPORTER_OTLP_ENDPOINT, else localhost on the protocol's port.
	Endpoint string `yaml:"endpoint"`
	// Protocol is http/protobuf, http/json or grpc. Default: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL,
	// else http/protobuf.
	Protocol string `yaml:"protocol"`
	// Sample is the share of new traces (requests without a sampled parent) that are sampled, in [0, 1]; a
	// request whose client's traceparent says sampled or not follows its parent. Default: OTEL_TRACES_SAMPLER and
	// OTEL_TRACES_SAMPLER_ARG, else every trace (parentbased_always_on).
	Sample *float64 `yaml:"sample"`
}

// The tracing protocols, as OTEL_EXPORTER_OTLP_PROTOCOL spells them.
const (
	TracingHTTP = "http/protobuf"
	TracingJSON = "http/json"
	TracingGRPC = "grpc"
)

// AccessLog configures the access log: one structured line per request, on the gateway's log output in its
// -log-format, whatever its -log-level (README.md, "Traces and access log"). On by default: it is the record an
// operator reads first in an incident, and it costs a few microseconds per request; at high rates, sample it.
// Static.
type AccessLog struct {
	// Enabled turns the access log on or off. Default true.
	Enabled *bool `yaml:"enabled"`
	// Sample is the share of successful requests logged, in (0, 1]; every failed request (status 400 and
	// above) is logged. Default 1: every request.
	Sample float64 `yaml:"sample"`
}

// On reports whether the access log is on.
func (a AccessLog) On() bool { return a.Enabled == nil || *a.Enabled }

// defaultObserve fills the tracing and access_log sections.
func (r *report) defaultObserve(c *Config) {
	if !r.set("access_log.sample") {
		c.AccessLog.Sample = 1
	}
}

// validateObserve checks the tracing and access_log sections.
func (r *report) validateObserve(c *Config) {
	t := c.Tracing
	if t.Endpoint != "" {
		u, err := url.Parse(t.Endpoint)
		switch {
		case err != nil:
			r.errorf("tracing.endpoint", fmt.Sprintf("not a URL: %v", err))
		case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
			r.errorf("tracing.endpoint", fmt.Sprintf("expected http://host:port or https://host:port, got %q", t.Endpoint))
		case u.User != nil || u.RawQuery != "" || u.Fragment != "":
			r.errorf("tracing.endpoint", "must not carry user info, a query or a fragment (headers go in OTEL_EXPORTER_OTLP_HEADERS)")
		}
	}
	switch t.Protocol {
	case "", TracingHTTP, TracingJSON, TracingGRPC:
	default:
		r.errorf("tracing.protocol", fmt.Sprintf("unknown protocol %q (one of: %s, %s, %s)", t.Protocol, TracingGRPC, TracingJSON, TracingHTTP))
	}
	if t.Sample != nil && (*t.Sample < 0 || *t.Sample > 1) {
		r.errorf("tracing.sample", "must be in [0, 1]")
	}
	if s := c.AccessLog.Sample; s <= 0 || s > 1 {
		r.errorf("access_log.sample", "must be in (0, 1]: failed requests are always logged, set enabled: false to log none")
	}
}
