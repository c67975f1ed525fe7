package proxy

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// metricSeries returns the series of metric name whose labels include every pair of want, and the label names the
// metric has (those of its first series).
func metricSeries(t *testing.T, g prometheus.Gatherer, name string, want map[string]string) ([]*dto.Metric, []string) {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []*dto.Metric
	var names []string
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			if names == nil {
				names = slices.Sorted(maps.Keys(got))
			}
			match := true
			for k, v := range want {
				if gv, ok := got[k]; !ok || gv != v {
					match = false
				}
			}
			if match {
				out = append(out, m)
			}
		}
	}
	return out, names
}

func count(ms []*dto.Metric) uint64 {
	var n uint64
	for _, m := range ms {
		n += m.GetHistogram().GetSampleCount()
	}
	return n
}

// TestGenAIMetricLabels: the gen_ai_* metrics carry the OpenTelemetry GenAI attributes (operation by endpoint,
// the backend's engine as provider, the models asked for and served, error_type for failures and no status
// code), the client-side duration sees each upstream attempt with how it failed, and the per-backend TTFT and
// inter-token histograms are labelled by backend alone.
func TestGenAIMetricLabels(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	// b1 refuses connections: round robin sends it every other first attempt, which is retried on b0.
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 2, be.URL(), deadURL(t)), Options{})
	for range 2 {
		rawPost(t, gw.url, "/v1/chat/completions", []byte(`{"model":"sim-model","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"x"}]}`), nil)
		rawPost(t, gw.url, "/v1/completions", []byte(`{"model":"sim-model","max_tokens":4,"prompt":"x"}`), nil)
		rawPost(t, gw.url, "/v1/embeddings", []byte(`{"model":"sim-model","input":"x"}`), nil)
	}
	if resp, _ := rawPost(t, gw.url, "/v1/chat/completions", []byte(`{"model":"nope","messages":[{"role":"user","content":"x"}]}`), nil); resp.StatusCode != 404 {
		t.Fatalf("unknown model: %d, want 404", resp.StatusCode)
	}

	ok := map[string]string{"gen_ai_provider_name": "vllm", "gen_ai_request_model": "sim-model", "gen_ai_response_model": "sim-model"}
	with := func(extra ...string) map[string]string {
		m := maps.Clone(ok)
		for i := 0; i < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		return m
	}
	genai := []string{"gen_ai_operation_name", "gen_ai_provider_name", "gen_ai_request_model", "gen_ai_response_model"}
	for _, tc := range []struct {
		metric string
		want   map[string]string
		n      uint64
		labels []string
	}{
		{"gen_ai_server_time_to_first_token_seconds", with("gen_ai_operation_name", "chat"), 2, genai},
		{"gen_ai_server_time_to_first_token_seconds", with("gen_ai_operation_name", "text_completion"), 2, genai},
		{"gen_ai_server_time_per_output_token_seconds", with("gen_ai_operation_name", "chat"), 6, genai},
		{"gen_ai_server_request_duration_seconds", with("gen_ai_operation_name", "embeddings", "error_type", ""), 2,
			append(slices.Clone(genai), "error_type")},
		{"gen_ai_server_request_duration_seconds", map[string]string{"gen_ai_operation_name": "chat",
			"gen_ai_provider_name": "switchyard", "gen_ai_request_model": "", "error_type": "404"}, 1, nil},
		{"gen_ai_client_token_usage", with("gen_ai_operation_name", "text_completion", "gen_ai_token_type", "output"), 2,
			append(slices.Clone(genai), "gen_ai_token_type")},
		{"gen_ai_client_operation_duration_seconds", with("gen_ai_operation_name", "chat", "error_type", ""), 2,
			append(slices.Clone(genai), "error_type")},
		{"gen_ai_client_operation_duration_seconds", with("error_type", "connect"), 3, nil},
		{"switchyard_backend_time_to_first_token_seconds", map[string]string{"backend": "b0"}, 4, []string{"backend"}},
		{"switchyard_backend_inter_token_latency_seconds", map[string]string{"backend": "b0"}, 12, []string{"backend"}},
	} {
		ms, names := metricSeries(t, gw.reg, tc.metric, tc.want)
		if n := count(ms); n != tc.n {
			t.Errorf("%s%v: %d observations, want %d", tc.metric, tc.want, n, tc.n)
		}
		if tc.labels != nil && !slices.Equal(names, slices.Sorted(slices.Values(tc.labels))) {
			t.Errorf("%s has labels %v, want %v", tc.metric, names, tc.labels)
		}
	}
	if ms, _ := metricSeries(t, gw.reg, "switchyard_backend_time_to_first_token_seconds", map[string]string{"backend": "b1"}); count(ms) != 0 {
		t.Errorf("the dead backend has a first token")
	}
}
