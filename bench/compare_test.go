package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/switchyard/switchyard/sim"
)

// helperEnv makes the test binary act as "switchyard sim -fleet FILE" or "switchyard serve -config FILE" when
// Compare starts it as a child, so that compare is tested end to end (child processes, readiness, events,
// metrics scraping, stop) without building the real binary. The fake gateway implements only the contract
// compare relies on: the generated config's listen, admin_listen and backends, /readyz, /debug/backends,
// X-Switchyard-Backend.
const helperEnv = "SWITCHYARD_BENCH_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" && len(os.Args) >= 4 {
		os.Exit(helperMain(os.Args[1], os.Args[3]))
	}
	os.Exit(m.Run())
}

func helperMain(cmd, file string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	switch cmd {
	case "sim":
		cfgs, err := sim.LoadFleet(file)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		f, err := sim.StartFleet(ctx, cfgs)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		<-ctx.Done()
		_ = f.Close()
		return 0
	case "serve":
		return fakeGateway(ctx, file)
	}
	return 2
}

func fakeGateway(ctx context.Context, file string) int {
	data, err := os.ReadFile(file)
	if err != nil {
		return 2
	}
	var cfg struct {
		Listen      string         `yaml:"listen"`
		AdminListen string         `yaml:"admin_listen"`
		Region      string         `yaml:"region"`
		Auth        string         `yaml:"auth"`
		Limits      map[string]any `yaml:"limits"`
		Redis       struct {
			URL string `yaml:"url"`
		} `yaml:"redis"`
		Backends []struct {
			Name   string   `yaml:"name"`
			URL    string   `yaml:"url"`
			Region string   `yaml:"region"`
			Engine string   `yaml:"engine"`
			Models []string `yaml:"models"`
		} `yaml:"backends"`
		Models []struct {
			Name     string         `yaml:"name"`
			Strategy string         `yaml:"strategy"`
			SLO      map[string]any `yaml:"slo"`
		} `yaml:"models"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true) // the generated config must stay within the stable core
	if err := dec.Decode(&cfg); err != nil {
		fmt.Fprintln(os.Stderr, "fake gateway:", err)
		return 2
	}
	if len(cfg.Models) != 1 || cfg.Models[0].Strategy == "broken" || len(cfg.Backends) == 0 {
		fmt.Fprintln(os.Stderr, "switchyard serve: not yet")
		return 2
	}
	if u := cfg.Redis.URL; u != "" { // replicas: the shared redis-server must answer
		if err := pingRedis(strings.TrimSuffix(strings.TrimPrefix(u, "redis://"), "/0")); err != nil {
			fmt.Fprintln(os.Stderr, "fake gateway: redis:", err)
			return 1
		}
		fmt.Fprintln(os.Stderr, "fake gateway: redis answers")
	}
	// A minimal streaming forwarder: round-robin over the backends, X-Switchyard-Backend on every answer, each
	// upstream read written and flushed at once; every failure is logged to the child's log.
	upstream := &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
	var next atomic.Uint64
	srv := &http.Server{Addr: cfg.Listen, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := cfg.Backends[next.Add(1)%uint64(len(cfg.Backends))]
		fmt.Fprintln(os.Stderr, "fake gateway: served")
		out, err := http.NewRequestWithContext(r.Context(), r.Method, b.URL+r.URL.Path, r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		out.Header = r.Header.Clone()
		resp, err := upstream.RoundTrip(out)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fake gateway: upstream:", err)
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.Header().Set("X-Switchyard-Backend", b.Name)
		w.WriteHeader(resp.StatusCode)
		rc := http.NewResponseController(w)
		buf := make([]byte, 32<<10)
		for {
			n, rerr := resp.Body.Read(buf)
			if n > 0 {
				if _, err := w.Write(buf[:n]); err != nil {
					fmt.Fprintln(os.Stderr, "fake gateway: write to client:", err)
					return
				}
				_ = rc.Flush()
			}
			if rerr == io.EOF {
				return
			}
			if rerr != nil {
				fmt.Fprintln(os.Stderr, "fake gateway: read from", b.Name+":", rerr)
				panic(http.ErrAbortHandler)
			}
		}
	})}
	admin := &http.Server{Addr: cfg.AdminListen, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/readyz":
			w.WriteHeader(http.StatusOK)
		case "/debug/backends":
			_, _ = w.Write([]byte("[]")) // no engine scraped, no seat probe
		default:
			http.NotFound(w, r)
		}
	})}
	// Like switchyard serve, a port that cannot be bound ends the process with the error, at once.
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake gateway: listen:", err)
		return 1
	}
	aln, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake gateway: admin listen:", err)
		return 1
	}
	go func() { _ = srv.Serve(ln) }()
	go func() { _ = admin.Serve(aln) }()
	<-ctx.Done()
	_ = srv.Close()
	_ = admin.Close()
	return 0
}

func TestCompareEndToEnd(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(helperEnv, "1")
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("fleet.yaml", `
- {name: sim-x, region: here, prefill_tps: 50000, itl: 5ms, overhead: 1ms, seed: 1}
- {name: sim-y, region: here, prefill_tps: 50000, itl: 5ms, overhead: 1ms, seed: 1}
`)
	write("wl.yaml", `
arrival: {process: fixed, rate: 20}
warmup: 500ms
duration: 2s
prompt: {dist: fixed, value: 40}
output: {dist: fixed, value: 8}
prefix: {groups: 2, tokens: 128}
`)
	write("scenario.yaml", `
name: e2e
fleet: fleet.yaml
workload: wl.yaml
slo: {ttft: 1s}
columns:
  - {name: direct, strategy: direct}
  - {strategy: round_robin}
  - {name: not-ready, strategy: broken}
events:
  - {at: 1s, backend: sim-y, control: {slowdown: 2}, label: sim-y slower}
  - {at: 2s, backend: sim-y, control: {}}
`)
	t.Cleanup(func() {
		if t.Failed() { // the children's logs say why
			logs, _ := filepath.Glob(filepath.Join(dir, "*.log"))
			for _, l := range logs {
				data, _ := os.ReadFile(l)
				t.Logf("%s:\n%s", filepath.Base(l), truncate(string(data), 3000))
			}
		}
	})
	sc, err := LoadScenario(filepath.Join(dir, "scenario.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runs, err := Compare(ctx, CompareOptions{Env: Env{Exe: exe, WorkDir: dir, Log: &log, Timeout: 10 * time.Second,
		Ready: 20 * time.Second}, Scenario: sc})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	if len(runs) != 3 {
		t.Fatalf("%d runs", len(runs))
	}
	direct, rr, broken := runs[0], runs[1], runs[2]
	for _, r := range runs[:2] {
		if r.Error != "" || r.OK != r.Requests || r.Requests != 40 {
			t.Fatalf("%s: error %q, %d of %d ok (%v %v)\n%s", r.Name, r.Error, r.OK, r.Requests, r.Errors, r.ErrorSamples, log.String())
		}
		if len(r.Events) != 2 || r.Events[0].Err != "" || r.Events[1].Err != "" || r.Events[1].Label != `sim-y {}` {
			t.Errorf("%s: events %+v", r.Name, r.Events)
		}
		if r.PrefixHitRate == nil || *r.PrefixHitRate <= 0 {
			t.Errorf("%s: no prefix hit rate from the simulators' metrics", r.Name)
		}
	}
	if direct.Backends["sim-x"] != 40 || len(direct.Backends) != 1 {
		t.Errorf("direct went to %v, want only the first backend", direct.Backends)
	}
	if rr.Backends["sim-x"] < 15 || rr.Backends["sim-y"] < 15 || rr.CPU == nil {
		t.Errorf("through the gateway: backends %v, cpu %+v", rr.Backends, rr.CPU)
	}
	// Each column's requests, one JSON line each, agree with its report.
	files, _ := filepath.Glob(filepath.Join(dir, "*-round_robin-requests.jsonl"))
	if len(files) != 1 {
		t.Fatalf("request lines of the round_robin column: %q", files)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	perBackend := map[string]int{}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	for _, l := range lines {
		var x sampleLine
		if err := json.Unmarshal([]byte(l), &x); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		if !x.Warmup && x.Status == 200 && x.TTFTMs > 0 && x.Group >= 0 && x.PromptTokens > 0 {
			perBackend[x.Backend]++
		}
	}
	if !maps.Equal(perBackend, rr.Backends) {
		t.Errorf("request lines count %v per backend, the report %v (%d lines)", perBackend, rr.Backends, len(lines))
	}
	if !strings.Contains(broken.Error, "not yet") {
		t.Errorf("a gateway that exits should be reported with its output, got %q", broken.Error)
	}
	// Every child is gone: the direct column's simulator no longer accepts connections.
	if c, err := net.DialTimeout("tcp", strings.TrimPrefix(direct.Target, "http://"), time.Second); err == nil {
		c.Close()
		t.Errorf("the simulator at %s is still running after Compare", direct.Target)
	}
	rep := NewReport("test")
	rep.Runs = runs
	out := filepath.Join(dir, "out")
	if err := WriteArtifacts(out, "e2e", rep); err != nil {
		t.Fatal(err)
	}
	svg, err := os.ReadFile(filepath.Join(out, "ttft-timeline.svg"))
	if err != nil {
		t.Fatal(err)
	}
	series, events, _ := parseSVG(t, svg)
	if len(series) != 4 || len(events) != 2 {
		t.Errorf("timeline has series %q and events %q", series, events)
	}
}

func TestOverheadEndToEnd(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(helperEnv, "1")
	dir := t.TempDir()
	fleet := filepath.Join(dir, "fleet.yaml")
	if err := os.WriteFile(fleet, []byte("- {name: solo, prefill_tps: 50000, itl: 5ms, overhead: 1ms}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := testWorkload(t, "arrival: {process: fixed, rate: 20}\nduration: 1s\nprompt: {dist: fixed, value: 16}\noutput: {dist: fixed, value: 4}\n")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runs, rows, err := Overhead(ctx, OverheadOptions{Env: Env{Exe: exe, WorkDir: dir, Timeout: 10 * time.Second},
		Fleet: fleet, Workload: w, Proxies: []string{"no-such-proxy-binary"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Name != "direct" || runs[1].Name != "gateway" || len(rows) != 1 {
		t.Fatalf("runs %d, rows %+v", len(runs), rows)
	}
	for _, r := range runs {
		if r.Error != "" || r.OK != 19 {
			t.Fatalf("%s: %q, %d ok", r.Name, r.Error, r.OK)
		}
	}
	row := rows[0]
	if row.Proxy != "gateway" || row.TTFTP50Ratio <= 0 || row.TTFTP50AddedMS != runs[1].TTFT.P50-runs[0].TTFT.P50 {
		t.Errorf("row %+v", row)
	}
	if runs[1].CPU == nil || runs[1].CPU.Seconds < 0 || runs[0].CPU != nil {
		t.Errorf("cpu: direct %+v, gateway %+v", runs[0].CPU, runs[1].CPU)
	}
	var b strings.Builder
	PrintOverhead(&b, runs, rows)
	if !strings.Contains(b.String(), "gateway") || !strings.Contains(b.String(), "CPU s/1k req") {
		t.Errorf("table:\n%s", b.String())
	}
}

// TestReferenceProxyRelativeWorkDir: nginx starts when the work directory is relative (bench overhead -out
// bench/out/...), which it resolves against its prefix: the paths given to it must be absolute.
func TestReferenceProxyRelativeWorkDir(t *testing.T) {
	if _, err := exec.LookPath("nginx"); err != nil {
		t.Skip("nginx is not installed; bench overhead skips it too")
	}
	t.Chdir(t.TempDir())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	e := &Env{WorkDir: filepath.Join("out", "work"), Ready: 10 * time.Second}
	p, url, err := startReferenceProxy(ctx, e, "nginx", FleetBackend{URL: "http://127.0.0.1:9"}, "02-nginx")
	if err != nil {
		t.Fatalf("nginx under a relative work directory: %v", err)
	}
	p.Stop()
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Errorf("url %q", url)
	}
}

// TestCostOf: answers are priced at the backend that served them, cached prompt tokens at their price, and
// overflow answers counted by burst phase.
func TestCostOf(t *testing.T) {
	cached := 0.5
	fleet := []FleetBackend{{Name: "a", Price: Price{Input: 2, Output: 10, CachedInput: &cached}},
		{Name: "o", Price: Price{Input: 5, Output: 20}, Tier: "overflow"}, {Name: "free"}}
	plan := &Plan{Items: []Item{{PromptTokens: 1000}, {PromptTokens: 100}, {PromptTokens: 100}, {PromptTokens: 100, Warmup: true}}}
	res := &Result{Plan: plan, Samples: []Sample{
		{Status: 200, Backend: "a", CachedTokens: 400, OutputTokens: 100, SendAt: time.Second},
		{Status: 200, Backend: "o", OutputTokens: 50, SendAt: 12 * time.Second},
		{Status: 200, Backend: "free", OutputTokens: 50},
		{Status: 200, Backend: "a", OutputTokens: 1000},
	}}
	c := costOf(res, fleet, []Burst{{At: 10 * time.Second, Duration: 5 * time.Second}})
	want := (600*2+400*0.5+100*10)/1e6 + (100*5+50*20)/1e6
	if abs(c.Dollars-want) > 1e-12 || c.OutputTokens != 150 || c.Unpriced != 1 {
		t.Fatalf("cost %+v, want %v dollars for 150 tokens, 1 unpriced", c, want)
	}
	if c.Overflow["burst"] != 1 || c.Overflow["before_burst"] != 0 {
		t.Fatalf("overflow phases %v", c.Overflow)
	}
	if got := c.PerMOutput; abs(got-want/150*1e6) > 1e-9 {
		t.Fatalf("per million output %v", got)
	}
}

// pingRedis sends PING to the redis-server at addr and wants +PONG.
func pingRedis(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 7)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != "+PONG\r\n" {
		return fmt.Errorf("PING answered %q", buf)
	}
	return nil
}

// TestReplicaPicker: a session's turns alternate between the replicas, other requests go by plan index.
func TestReplicaPicker(t *testing.T) {
	p := replicaPicker{"a", "b", "c"}
	for _, tc := range []struct {
		it   Item
		want string
	}{
		{Item{Index: 7, Session: 3, Turn: 0}, "a"},
		{Item{Index: 9, Session: 3, Turn: 1}, "b"},
		{Item{Index: 12, Session: 3, Turn: 5}, "c"},
		{Item{Index: 4, Session: -1}, "b"},
		{Item{Index: 6, Session: -1}, "a"},
	} {
		if got, err := p.Pick(context.Background(), &tc.it); got != tc.want || err != nil {
			t.Errorf("Pick(index %d, session %d, turn %d) = %q, %v; want %q", tc.it.Index, tc.it.Session, tc.it.Turn,
				got, err, tc.want)
		}
	}
}
