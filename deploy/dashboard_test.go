package deploy

import (
	"encoding/json"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/switchyard/switchyard/sim"
)

const dashboardFile = "grafana/switchyard.json"

// dashboard is the part of Grafana's dashboard JSON the test reads.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Type  string `json:"type"`
			Query any    `json:"query"`
		} `json:"list"`
	} `json:"templating"`
	Requires []struct {
		Type string `json:"type"`
		ID   string `json:"id"`
	} `json:"__requires"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

// builtinPanels are the panel types Grafana ships: the dashboard needs no plugin.
var builtinPanels = []string{"row", "timeseries", "stat", "state-timeline", "gauge", "bargauge", "table", "text", "heatmap"}

func loadDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(data)))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

func allPanels(ps []panel) []panel {
	var out []panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, allPanels(p.Panels)...)
	}
	return out
}

// TestDashboardShape: the dashboard is Grafana JSON with unique panel ids, built-in panel types only, every
// panel on the grid and querying the dashboard's Prometheus data source variable.
func TestDashboardShape(t *testing.T) {
	d := loadDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("uid %q title %q", d.UID, d.Title)
	}
	for _, r := range d.Requires {
		if r.Type == "panel" && !slices.Contains(builtinPanels, r.ID) || r.Type == "datasource" && r.ID != "prometheus" {
			t.Errorf("__requires a plugin: %s %s", r.Type, r.ID)
		}
	}
	hasDS := false
	for _, v := range d.Templating.List {
		hasDS = hasDS || v.Name == "datasource" && v.Type == "datasource"
	}
	if !hasDS {
		t.Error("no datasource variable: the dashboard would be tied to one Prometheus")
	}
	ids := map[int]string{}
	for _, p := range allPanels(d.Panels) {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panel id %d used by %q and %q", p.ID, prev, p.Title)
		}
		ids[p.ID] = p.Title
		if !slices.Contains(builtinPanels, p.Type) {
			t.Errorf("panel %q: type %q is not built into Grafana", p.Title, p.Type)
		}
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: gridPos %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
	}
}

// exported is a metric as the gateway's /metrics shows it: its label names, and whether it is a histogram.
type exported struct {
	labels    []string
	histogram bool
}

// scrape reads the gateway's /metrics.
func scrape(t *testing.T, admin string) map[string]exported {
	t.Helper()
	resp, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]exported{}
	for name, f := range fams {
		var labels []string
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if !slices.Contains(labels, l.GetName()) {
					labels = append(labels, l.GetName())
				}
			}
		}
		out[name] = exported{labels: labels, histogram: f.GetType() == dto.MetricType_HISTOGRAM}
	}
	return out
}

// resolve finds the metric a selector names: the name itself, or a histogram's _bucket (which adds le), _sum or
// _count series.
func resolve(name string, fams map[string]exported) (labels []string, ok bool) {
	if f, ok := fams[name]; ok && !f.histogram {
		return f.labels, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, found := strings.CutSuffix(name, suffix)
		if f, ok := fams[base]; found && ok && f.histogram {
			if suffix == "_bucket" {
				return append(slices.Clone(f.labels), "le"), true
			}
			return f.labels, true
		}
	}
	return nil, false
}

var (
	legendLabel = regexp.MustCompile(`\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}`)
	labelValues = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)
)

// TestDashboardQueriesRealMetrics: every metric a dashboard query or variable reads exists on a real gateway's
// /metrics after traffic (histogram suffixes resolved), and every label a query filters on, groups by or shows
// in its legend is one of that metric's labels. The few metrics that this traffic cannot produce (a counter
// vector has no series until its first event: panics, Redis errors, shedding) are checked against the labels
// metrics.New declares for them instead, and listed in the log.
func TestDashboardQueriesRealMetrics(t *testing.T) {
	d := loadDashboard(t)
	local := startSim(t, "local", func(c *sim.Config) { c.ITL = time.Millisecond; c.Overhead = 20 * time.Millisecond })
	remote := startSim(t, "remote", func(c *sim.Config) { c.ITL = time.Millisecond })
	failing := startSim(t, "failing", nil)
	if code := post(t, failing.URL(), "/sim/control", `{"fail_rate":1}`); code != 200 {
		t.Fatalf("sim control: %d", code)
	}
	gw := startGateway(t, fmtPolicy(local.URL(), failing.URL(), remote.URL()))
	chat := `{"model":"sim-model","stream":%s,"max_tokens":4,"messages":[{"role":"user","content":"dashboard"}]}`
	// plain first: sim-model's hedges lose on the slower local engine, and every loss counts against its
	// circuit breaker (reported as a bug: a lost hedge should not), which soon opens.
	for i := range 4 {
		if code := post(t, gw.api, "/v1/chat/completions", strings.Replace(strings.Replace(chat, "%s", "true", 1), "sim-model", "plain", 1)); code != 200 {
			t.Fatalf("plain chat %d: status %d", i, code)
		}
	}
	for i := range 12 {
		stream := "true"
		if i%3 == 0 {
			stream = "false"
		}
		if code := post(t, gw.api, "/v1/chat/completions", strings.Replace(chat, "%s", stream, 1)); code != 200 {
			t.Fatalf("chat %d: status %d", i, code)
		}
	}
	post(t, gw.api, "/v1/completions", `{"model":"sim-model","max_tokens":4,"prompt":"dashboard"}`)
	post(t, gw.api, "/v1/embeddings", `{"model":"sim-model","input":"dashboard"}`)
	post(t, gw.api, "/v1/chat/completions", `{"model":"nope","messages":[{"role":"user","content":"x"}]}`)
	time.Sleep(200 * time.Millisecond) // a scrape of each engine (queue depth)

	fams := scrape(t, gw.admin)
	declared := gw.declared(t)
	// What this traffic must have produced: the latency, traffic, error and backend-state panels must never be
	// checked against declarations alone.
	mustSee := []string{
		"gen_ai_server_time_to_first_token_seconds_bucket", "gen_ai_server_time_per_output_token_seconds_bucket",
		"switchyard_backend_time_to_first_token_seconds_bucket", "switchyard_backend_inter_token_latency_seconds_bucket",
		"gen_ai_server_request_duration_seconds_count", "gen_ai_client_operation_duration_seconds_count",
		"gen_ai_client_token_usage_sum", "switchyard_requests_total", "switchyard_upstream_errors_total",
		"switchyard_retries_total", "switchyard_breaker_state", "switchyard_backend_inflight",
		"switchyard_ttft_prediction_error_ratio_bucket", "switchyard_config_reload_success",
		"switchyard_redis_breaker_state",
	}
	seen := map[string]bool{}
	var declaredOnly []string
	check := func(where, expr, legend string) {
		q, err := parsePromQL(expr)
		if err != nil {
			t.Errorf("%s: %v", where, err)
			return
		}
		if len(q.selectors) == 0 {
			t.Errorf("%s: %q reads no metric", where, expr)
		}
		var all [][]string
		for _, s := range q.selectors {
			labels, ok := resolve(s.metric, fams)
			if ok {
				seen[s.metric] = true
			} else {
				base := s.metric
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, found := strings.CutSuffix(s.metric, suffix); found {
						if _, ok := declared[b]; ok {
							base = b
						}
					}
				}
				labels, ok = declared[base]
				if !ok {
					t.Errorf("%s: metric %s is neither on /metrics nor declared by metrics.New", where, s.metric)
					continue
				}
				if base != s.metric && strings.HasSuffix(s.metric, "_bucket") {
					labels = append(slices.Clone(labels), "le")
				}
				if !slices.Contains(declaredOnly, s.metric) {
					declaredOnly = append(declaredOnly, s.metric)
				}
			}
			for _, l := range s.labels {
				if !slices.Contains(labels, l) {
					t.Errorf("%s: %s has no label %q (it has %v)", where, s.metric, l, labels)
				}
			}
			all = append(all, labels)
		}
		for _, g := range q.grouping {
			for i, labels := range all {
				if !slices.Contains(labels, g) {
					t.Errorf("%s: groups by %q, which %s lacks (it has %v)", where, g, q.selectors[i].metric, labels)
				}
			}
		}
		for _, m := range legendLabel.FindAllStringSubmatch(legend, -1) {
			if len(q.grouping) > 0 && !slices.Contains(q.grouping, m[1]) {
				t.Errorf("%s: the legend shows {{%s}}, which the query aggregates away", where, m[1])
			}
		}
	}
	n := 0
	for _, p := range allPanels(d.Panels) {
		for i, tg := range p.Targets {
			n++
			check(p.Title+" #"+string(rune('A'+i)), tg.Expr, tg.LegendFormat)
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var text string
		switch q := v.Query.(type) {
		case string:
			text = q
		case map[string]any:
			text, _ = q["query"].(string)
		}
		m := labelValues.FindStringSubmatch(text)
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(metric, label)", v.Name, text)
			continue
		}
		check("variable "+v.Name, m[1]+`{`+m[2]+`=""}`, "")
	}
	for _, name := range mustSee {
		if !seen[name] {
			t.Errorf("%s: not on the gateway's /metrics after the traffic (or not on the dashboard)", name)
		}
	}
	t.Logf("%d queries checked; read from declarations only (no event of theirs in this traffic): %v", n, declaredOnly)
}
