package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/internal/browsertest"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// reportingSource is a fixed policy that reports a file and a failed reload, as policy.Watcher does.
type reportingSource struct {
	Static
	path string
	err  error
}

func (r reportingSource) Path() string     { return r.path }
func (r reportingSource) LastError() error { return r.err }

var (
	_ PathReporter   = reportingSource{}
	_ ReloadReporter = reportingSource{}
)

// startGatewayFrom is startGateway with a Source of the test's own.
func startGatewayFrom(t *testing.T, src Source) *gateway {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	s, err := New(src, Options{Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
		<-done
	})
	return &gateway{s: s, url: "http://" + ln.Addr().String(), reg: reg, m: m}
}

// statusFleet is a gateway in front of two live simulated backends (b0 fast, b1 slower) and a dead one (b2,
// marked down), with API keys: sk-ok unlimited, sk-lim one request a minute (its others are shed).
func statusFleet(t *testing.T) (*gateway, reportingSource) {
	t.Helper()
	fast := startSim(t, "fast", func(c *sim.Config) { c.ITL = 2 * time.Millisecond })
	slow := startSim(t, "slow", func(c *sim.Config) { c.ITL = 8 * time.Millisecond })
	snap := withAdmission(snapshotOf(&routing.LeastRequest{}, 2, fast.URL(), slow.URL(), deadURL(t)),
		key("ok", "sk-ok", admission.Standard, 0), key("lim", "sk-lim", admission.Sheddable, 1))
	snap.Hash = "5ca1ab1e0ddba11f00d"
	snap.Backends[2].SetHealthy(false)
	src := reportingSource{Static: Static{snap}, path: "/etc/switchyard/config.yaml",
		err: errors.New("/etc/switchyard/config.yaml:12: models[0].strategy: unknown \"fastest\"")}
	return startGatewayFrom(t, src), src
}

// drive sends requests from a few clients until d has passed, and one a second on the rate-limited key.
func drive(t *testing.T, gw *gateway, d time.Duration) {
	t.Helper()
	stop := time.Now().Add(d)
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for time.Now().Before(stop) {
				post(t, gw.url, `{"model":"sim-model","max_tokens":8,"messages":[{"role":"user","content":"status page"}]}`,
					map[string]string{"Authorization": "Bearer sk-ok"})
			}
		})
	}
	for time.Now().Before(stop) {
		post(t, gw.url, small, map[string]string{"Authorization": "Bearer sk-lim"})
		time.Sleep(500 * time.Millisecond)
	}
	wg.Wait()
}

func TestAdminStatusEndpoints(t *testing.T) {
	t.Parallel()
	gw, src := statusFleet(t)
	admin := startAdmin(t, gw)
	drive(t, gw, 2500*time.Millisecond)

	var ts Timeseries
	code, body := get(t, admin+"/debug/timeseries?window=60&step=2")
	if err := json.Unmarshal([]byte(body), &ts); err != nil || code != 200 {
		t.Fatalf("/debug/timeseries %d %v: %s", code, err, body)
	}
	if ts.StepS != 2 || ts.WindowS != 60 || len(ts.T) != 30 || ts.QuantileError != QuantileError {
		t.Errorf("/debug/timeseries shape: step %d window %d points %d error %v", ts.StepS, ts.WindowS, len(ts.T), ts.QuantileError)
	}
	requests := map[string]float64{}
	for _, s := range ts.Series {
		for _, v := range s.RequestsPerS {
			requests[s.Name] += v * float64(ts.StepS)
		}
	}
	if requests["fleet"] < 3 || requests["b0"] < 1 || requests["b1"] < 1 || ts.Series[0].Name != "fleet" {
		t.Errorf("/debug/timeseries requests by series: %v", requests)
	}

	var ds []DecisionEntry
	code, body = get(t, admin+"/debug/decisions")
	if err := json.Unmarshal([]byte(body), &ds); err != nil || code != 200 || len(ds) < 3 {
		t.Fatalf("/debug/decisions %d %v: %s", code, err, body[:min(len(body), 500)])
	}
	served, shed, bad := map[string]bool{}, false, 0
	for _, d := range ds {
		served[d.Backend] = true
		if d.Shed == admission.ReasonRateLimitRequests && d.Status == 429 && d.Class == "sheddable" {
			shed = true
		}
		if d.Backend == "b0" && (d.CandidatesTotal != 2 || d.Status != 200 || d.Strategy != "test" || d.TTFTMs <= 0) && bad == 0 {
			bad++
			t.Errorf("decision %+v: want 2 candidates (b2 is down), 200 and a TTFT", d)
		}
	}
	if !served["b0"] || !served["b1"] || !shed {
		t.Errorf("/debug/decisions: backends %v, a rate-limit shed %v", served, shed)
	}

	var ps PolicyStatus
	code, body = get(t, admin+"/debug/policy")
	if err := json.Unmarshal([]byte(body), &ps); err != nil || code != 200 {
		t.Fatalf("/debug/policy %d %v: %s", code, err, body)
	}
	if ps.Hash != src.S.Hash || ps.File != src.path || !ps.Reloadable || ps.LastReloadOK || ps.Error != src.err.Error() ||
		ps.ReloadSuccess == nil {
		t.Errorf("/debug/policy %+v", ps)
	}
}

// chartPath matches one series' line as status.html draws it.
var chartPath = regexp.MustCompile(`<path class="line( fleet)?" d="([^"]*)" stroke="[^"]*" data-series="([^"]*)" data-points="(\d+)"`)

// TestStatusPageInBrowser loads the status page in a real headless Chromium after a few seconds of traffic
// and checks what its script rendered: the charts have lines with points for the fleet and the backends that
// served, the decisions table names those backends and the shed request, the policy panel shows the hash of
// /debug/config and the failed reload, and the backends table has a row per backend with its state. It keeps
// a screenshot in $SWITCHYARD_ARTIFACTS when set (else the test's temporary directory).
func TestStatusPageInBrowser(t *testing.T) {
	t.Parallel()
	browsertest.Chromium(t)
	gw, src := statusFleet(t)
	admin := startAdmin(t, gw)
	drive(t, gw, 4500*time.Millisecond)

	dom := browsertest.DumpDOM(t, admin+"/", browsertest.Options{Budget: 5 * time.Second})
	for _, chart := range []string{"ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "requests_per_s", "shed_per_s"} {
		m := regexp.MustCompile(`(?s)<svg id="chart-` + chart + `"[^>]*>(.*?)</svg>`).FindStringSubmatch(dom)
		if m == nil {
			t.Errorf("no chart %s in the page", chart)
			continue
		}
		lines := map[string]int{}
		for _, p := range chartPath.FindAllStringSubmatch(m[1], -1) {
			n, _ := strconv.Atoi(p[4])
			if strings.Count(p[2], "L") < n-1 {
				t.Errorf("chart %s, %s: %d points but path %q", chart, p[3], n, p[2])
			}
			lines[p[3]] = n
		}
		want := []string{"fleet", "b0", "b1"}
		if chart == "shed_per_s" {
			want = want[:1]
		}
		for _, s := range want {
			if lines[s] < 2 {
				t.Errorf("chart %s: the line of %s has %d points, want 2 or more (lines %v)", chart, s, lines[s], lines)
			}
		}
	}
	for _, want := range []string{
		`<tr data-backend="b0"><td class="l">`, `<tr data-backend="b1"><td class="l">`, // decisions (and backends)
		`<tr data-backend="none" class="shed">`, ">rate_limit_requests<",
		`<code id="policy-hash" title="` + src.S.Hash + `">` + src.S.Hash + `</code>`,
		"from " + src.path, `class="bad">FAILED`, `unknown "fastest"`,
		`data-backend="b2"`, `>down (closed)<`, "sim-model (test)", `<td class="l">vllm</td>`, "kv_usage",
	} {
		if !strings.Contains(dom, strings.ReplaceAll(want, `"fastest"`, `"fastest"`)) {
			t.Errorf("the rendered page lacks %q", want)
		}
	}
	// The policy hash the page shows is the one /debug/config serves.
	_, cfg := get(t, admin+"/debug/config")
	if !strings.Contains(cfg, `"hash": "`+src.S.Hash+`"`) {
		t.Errorf("/debug/config: %s", cfg)
	}
	if t.Failed() {
		t.Logf("the rendered page:\n%s", dom)
	}

	dir := os.Getenv("SWITCHYARD_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	shot := filepath.Join(dir, "status-page-test.png")
	browsertest.Screenshot(t, admin+"/", shot, browsertest.Options{Width: 1400, Height: 1500, Budget: 5 * time.Second})
	t.Logf("screenshot: %s", shot)
}
