package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/switchyard/switchyard/policy"
)

func TestTracingOn(t *testing.T) {
	t.Parallel()
	on, off := true, false
	for _, tc := range []struct {
		name    string
		enabled *bool
		env     map[string]string
		want    bool
	}{
		{"nothing set", nil, nil, false},
		{"endpoint in the environment", nil, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, true},
		{"traces endpoint in the environment", nil, map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, true},
		{"policy on", &on, nil, true},
		{"policy off beats the environment", &off, map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, false},
		{"SDK disabled beats the policy", &on, map[string]string{"OTEL_SDK_DISABLED": "true"}, false},
		{"exporter none beats the policy", &on, map[string]string{"OTEL_TRACES_EXPORTER": "none"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			getenv := func(k string) string { return tc.env[k] }
			if got := tracingOn(policy.Tracing{Enabled: tc.enabled}, getenv); got != tc.want {
				t.Errorf("tracingOn = %v, want %v", got, tc.want)
			}
		})
	}
	for in, want := range map[string]string{"http://c:4318": "http://c:4318/v1/traces", "http://c:4318/": "http://c:4318/v1/traces",
		"https://c/otlp/v1/traces": "https://c/otlp/v1/traces"} {
		if got := tracesURL(in); got != want {
			t.Errorf("tracesURL(%q) = %q, want %q", in, got, want)
		}
	}
	if _, err := newTracing(context.Background(), policy.Tracing{Enabled: &on, Protocol: "thrift"}, func(string) string { return "" }, slog.New(slog.DiscardHandler)); err == nil {
		t.Error("an unknown protocol was accepted")
	}
}

// TestServeExportsTraces runs `serve` with tracing on against an OTLP/HTTP receiver on loopback, and checks that
// stopping the gateway flushes the last request's spans, and that its access log line is written.
func TestServeExportsTraces(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var spans []*tracepb.Span
	col := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil || r.URL.Path != "/v1/traces" {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				spans = append(spans, ss.Spans...)
			}
		}
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer col.Close()
	sims := startSims(t, 1, nil)
	path := filepath.Join(t.TempDir(), "config.yaml")
	pol := policyFor(sims, "round_robin", "", "auth: none\ntracing: {enabled: true, endpoint: '"+col.URL+"', sample: 1}\naccess_log: {sample: 1}\n")
	if err := os.WriteFile(path, []byte(pol), 0o644); err != nil {
		t.Fatal(err)
	}
	var access bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- serveLogs(ctx, path, slog.New(slog.DiscardHandler), slog.New(slog.NewJSONHandler(&access, nil)),
			func(api, _ string) { ready <- "http://" + api })
	}()
	var api string
	select {
	case api = <-ready:
	case err := <-done:
		t.Fatalf("serve: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not start")
	}
	resp, err := http.Post(api+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"sim-model","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
	mu.Lock()
	defer mu.Unlock()
	var server, client int
	for _, s := range spans {
		switch s.Kind {
		case tracepb.Span_SPAN_KIND_SERVER:
			server++
		case tracepb.Span_SPAN_KIND_CLIENT:
			client++
		}
	}
	if server != 1 || client != 1 {
		t.Errorf("the collector got %d server and %d client spans by the time serve returned, want 1 and 1", server, client)
	}
	var line map[string]any
	if err := json.Unmarshal(bytes.TrimSpace(access.Bytes()), &line); err != nil || line["status"] != 200.0 || line["trace_id"] == nil {
		t.Errorf("access log %q (%v): want one line with status 200 and the trace id", access.String(), err)
	}
}

func TestLogFormatFlag(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	if code := runServe([]string{"-log-format", "xml"}, io.Discard, &stderr); code != 2 || !strings.Contains(stderr.String(), "-log-format") {
		t.Errorf("exit %d, stderr %q; want 2 naming -log-format", code, stderr.String())
	}
	var out bytes.Buffer
	l, err := newLoggerFormat(&out, "info", "json")
	if err != nil {
		t.Fatal(err)
	}
	l.Info("hello", "k", 1)
	if !json.Valid(bytes.TrimSpace(out.Bytes())) {
		t.Errorf("json format wrote %q", out.String())
	}
}
