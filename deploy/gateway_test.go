package deploy

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/policy"
	"github.com/switchyard/switchyard/proxy"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// gateway is a real gateway wired as cmd/switchyard's serve wires it (policy watcher, proxy, admin handler,
// engine monitor), on loopback, with the collectors metrics.New registered.
type gateway struct {
	api, admin string
	collectors []prometheus.Collector
}

// recorder registers on a registry and keeps the collectors, so that a test can read every metric's declared
// labels, also of the metrics no traffic has touched yet (a counter vector without series is not exported).
type recorder struct {
	*prometheus.Registry
	collectors []prometheus.Collector
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
	r.Registry.MustRegister(cs...)
}

// startGateway runs a gateway on the policy text (written to a file in a temporary directory), stopped at the end
// of the test.
func startGateway(t *testing.T, pol string) *gateway {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(pol), 0o600); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rec := &recorder{Registry: prometheus.NewRegistry()}
	m := metrics.New(rec)
	backends := routing.NewRegistry(routing.WithMetrics(m))
	w, err := policy.NewWatcher(path, backends, m, log)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(w, proxy.Options{Metrics: m, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	monitor := routing.NewMonitor(backends, routing.MonitorOptions{ScrapeInterval: 50 * time.Millisecond, OnBack: srv.EngineBack})
	monitor.Start()
	done := make(chan error, 2)
	go func() { done <- w.Run(ctx) }()
	go func() { done <- srv.Serve(ln) }()
	admin := httptest.NewServer(proxy.NewAdmin(srv, rec.Registry))
	t.Cleanup(func() {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		_ = srv.Shutdown(sctx)
		cancel()
		<-done
		<-done
		monitor.Stop()
		admin.Close()
	})
	return &gateway{api: "http://" + ln.Addr().String(), admin: admin.URL, collectors: rec.collectors}
}

// startSim starts a simulated engine on loopback, stopped at the end of the test.
func startSim(t *testing.T, name string, mut func(*sim.Config)) *sim.Backend {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.Name = name
	if mut != nil {
		mut(&cfg)
	}
	b, err := sim.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// post sends body to the gateway's path and returns the status.
func post(t *testing.T, base, path, body string, hdr ...string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// descPattern reads client_golang's Desc.String(): the metric's name and its variable labels.
var descPattern = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

// declared returns every metric the gateway registers, with its label names, from the collectors' descriptors.
func (g *gateway) declared(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, c := range g.collectors {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := descPattern.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the descriptor %s (did client_golang change Desc.String?)", d)
			}
			var labels []string
			if m[2] != "" {
				labels = strings.Split(m[2], ",")
			}
			out[m[1]] = labels
		}
	}
	return out
}

// fmtPolicy is the policy of the dashboard test: a healthy engine and a failing one in the gateway's region,
// one engine in the failover region; hedging on sim-model, off on plain (whose failures are retried).
func fmtPolicy(local, failing, remote string) string {
	return fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
region: us-east
auth: none
backends:
  - {name: b0, url: %s, region: us-east, models: [sim-model]}
  - {name: b1, url: %s, region: us-east, models: [sim-model]}
  - {name: b2, url: %s, region: eu-west, models: [sim-model]}
models:
  - name: sim-model
    strategy: round_robin
    retries: 2
    hedge: {after: 5ms, budget_percent: 100}
  - name: plain
    strategy: round_robin
    retries: 2
    targets:
      - {backend: b0, model: sim-model}
      - {backend: b1, model: sim-model}
regions:
  us-east: {failover: [eu-west]}
limits: {drain_timeout: 1s}
`, local, failing, remote)
}
