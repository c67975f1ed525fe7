package metrics

import (
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestNamesAndBuckets pins the metric contract (docs/design.md, "External contracts"; docs/metrics.md): dashboards
// and alerts depend on these names and on the GenAI bucket boundaries.
func TestNamesAndBuckets(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.TTFT.WithLabelValues(OpChat, "vllm", "m", "m").Observe(0.1)
	m.TPOT.WithLabelValues(OpChat, "vllm", "m", "m").Observe(0.02)
	m.Duration.WithLabelValues(OpChat, "vllm", "m", "m", "").Observe(1)
	m.ClientDuration.WithLabelValues(OpChat, "vllm", "m", "m", "connect").Observe(1)
	m.Tokens.WithLabelValues(OpChat, "vllm", "m", "m", "input").Observe(10)
	m.BackendTTFT.WithLabelValues("b").Observe(0.1)
	m.BackendITL.WithLabelValues("b").Observe(0.02)
	m.Requests.WithLabelValues("m", "b", "200").Inc()
	m.Cost.WithLabelValues("m", "b", "k").Add(0.5)
	m.Inflight.WithLabelValues("b").Set(1)
	m.QueueDepth.WithLabelValues("b").Set(1)
	m.Retries.WithLabelValues("m", "connect").Inc()
	m.TTFTPredictionError.WithLabelValues("b").Observe(0.1)
	m.PrefixLookups.WithLabelValues("m").Inc()
	m.PrefixHits.WithLabelValues("m").Inc()
	m.Shed.WithLabelValues("slo", "sheddable").Inc()
	m.Hedges.WithLabelValues("won").Inc()
	m.Yields.WithLabelValues("m", "sheddable", "resumed").Inc()
	m.BreakerState.WithLabelValues("b").Set(0)
	m.QueueWait.WithLabelValues("standard").Observe(0.01)
	m.UpstreamErrors.WithLabelValues("b", "connect").Inc()
	m.ClientDisconnects.WithLabelValues("streaming").Inc()
	m.StreamEnds.WithLabelValues("b", "upstream_idle_timeout").Inc()
	m.QueueLength.WithLabelValues("m", "standard").Set(1)
	m.ConcurrencyLimit.WithLabelValues("b").Set(32)
	m.OutlierState.WithLabelValues("b").Set(0)
	m.OutlierEjections.WithLabelValues("b", "slow").Inc()
	m.Degraded.WithLabelValues("m", "m-small").Inc()
	m.BudgetDenied.WithLabelValues("retry").Inc()
	m.RedisErrors.WithLabelValues("ratelimit").Inc()
	m.RegionSpills.WithLabelValues("m", "us-east", "eu-west").Inc()
	m.RegionActiveTier.WithLabelValues("m").Set(0)
	m.RegionShare.WithLabelValues("m", "us-east").Set(1)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]float64{}
	for _, f := range fams {
		var bounds []float64
		if ms := f.GetMetric(); len(ms) > 0 && ms[0].GetHistogram() != nil {
			for _, b := range ms[0].GetHistogram().GetBucket() {
				bounds = append(bounds, b.GetUpperBound())
			}
		}
		got[f.GetName()] = bounds
	}
	for _, name := range []string{
		"gen_ai_server_time_to_first_token_seconds", "gen_ai_server_time_per_output_token_seconds",
		"gen_ai_server_request_duration_seconds", "gen_ai_client_token_usage", "gen_ai_client_operation_duration_seconds",
		"switchyard_backend_time_to_first_token_seconds", "switchyard_backend_inter_token_latency_seconds",
		"switchyard_requests_total", "switchyard_cost_dollars_total",
		"switchyard_backend_inflight", "switchyard_backend_queue_depth", "switchyard_ttft_prediction_error_ratio",
		"switchyard_prefix_cache_lookups_total", "switchyard_prefix_cache_hits_total", "switchyard_shed_total",
		"switchyard_hedges_total", "switchyard_yields_total", "switchyard_retries_total", "switchyard_breaker_state",
		"switchyard_overhead_seconds", "switchyard_config_reload_success", "switchyard_queue_wait_seconds",
		"switchyard_queue_length", "switchyard_backend_concurrency_limit", "switchyard_outlier_state",
		"switchyard_outlier_ejections_total", "switchyard_degraded_total", "switchyard_budget_denied_total", "switchyard_redis_errors_total",
		"switchyard_region_spill_total", "switchyard_region_active_tier", "switchyard_region_share",
		"switchyard_redis_breaker_state", "switchyard_stream_ends_total",
	} {
		if _, ok := got[name]; !ok {
			t.Errorf("metric %s is not exported", name)
		}
	}
	genai := map[string][]float64{
		"gen_ai_server_time_per_output_token_seconds": {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5},
		"gen_ai_server_request_duration_seconds":      {0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92},
		"gen_ai_client_operation_duration_seconds":    {0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92},
		"gen_ai_client_token_usage":                   {1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864},
	}
	for name, want := range genai {
		if !slices.Equal(got[name], want) {
			t.Errorf("%s buckets = %v, want the GenAI semconv boundaries %v", name, got[name], want)
		}
	}
	// TTFT keeps every semconv boundary and adds SLO edges.
	for _, b := range []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0} {
		if !slices.Contains(got["gen_ai_server_time_to_first_token_seconds"], b) {
			t.Errorf("TTFT buckets lack the semconv boundary %v", b)
		}
	}
	for name := range got {
		if !strings.HasPrefix(name, "gen_ai_") && !strings.HasPrefix(name, "switchyard_") &&
			!strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") {
			t.Errorf("metric %s has no recognised prefix", name)
		}
	}
}

// TestGenAILabels pins the OpenTelemetry GenAI attributes on the gen_ai_* metrics (their Prometheus names), the
// per-backend latency histograms' single backend label, and that no gen_ai_* duration carries a status code
// (error_type does; switchyard_requests_total keeps code).
func TestGenAILabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.TTFT.WithLabelValues(OpChat, "vllm", "m", "m").Observe(0.1)
	m.TPOT.WithLabelValues(OpChat, "vllm", "m", "m").Observe(0.02)
	m.Duration.WithLabelValues(OpChat, ProviderGateway, "", "", ErrorType(404)).Observe(1)
	m.ClientDuration.WithLabelValues(OpEmbeddings, "sglang", "m", "m", "").Observe(1)
	m.Tokens.WithLabelValues(OpTextCompletion, "vllm", "m", "m-small", "output").Observe(10)
	m.BackendTTFT.WithLabelValues("b").Observe(0.1)
	m.BackendITL.WithLabelValues("b").Observe(0.02)
	m.Requests.WithLabelValues("m", "b", "200").Inc()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	genai := []string{"gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_response_model"}
	want := map[string][]string{
		"gen_ai_server_time_to_first_token_seconds":      genai,
		"gen_ai_server_time_per_output_token_seconds":    genai,
		"gen_ai_server_request_duration_seconds":         append(slices.Clone(genai), "error_type"),
		"gen_ai_client_operation_duration_seconds":       append(slices.Clone(genai), "error_type"),
		"gen_ai_client_token_usage":                      append(slices.Clone(genai), "gen_ai_token_type"),
		"switchyard_backend_time_to_first_token_seconds": {"backend"},
		"switchyard_backend_inter_token_latency_seconds": {"backend"},
		"switchyard_requests_total":                      {"model", "backend", "code"},
	}
	for _, f := range fams {
		labels, ok := want[f.GetName()]
		if !ok {
			continue
		}
		delete(want, f.GetName())
		var got []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			got = append(got, l.GetName())
		}
		if !slices.Equal(got, slices.Sorted(slices.Values(labels))) {
			t.Errorf("%s labels = %v, want %v", f.GetName(), got, labels)
		}
	}
	for name := range want {
		t.Errorf("%s is not exported", name)
	}
	for code, want := range map[int]string{200: "", 299: "", 399: "", 400: "400", 499: "499", 503: "503"} {
		if got := ErrorType(code); got != want {
			t.Errorf("ErrorType(%d) = %q, want %q", code, got, want)
		}
	}
}
