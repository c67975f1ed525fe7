package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Env is how compare and overhead start what they measure: child processes of the switchyard binary Exe ("sim
// -fleet FILE", "serve -config FILE"), with generated files and child logs in WorkDir.
type Env struct {
	Exe     string
	WorkDir string
	// Log receives progress lines; nil discards them.
	Log io.Writer
	// Timeout bounds each request (RunConfig.Timeout); Ready bounds each wait for readiness (default 30s).
	Timeout time.Duration
	Ready   time.Duration
	// Pin, when set, is a CPU list (taskset -c syntax: "0", "0-1") that the gateway and reference proxies are
	// started on; empty leaves them to the scheduler.
	Pin string
	// GatewayArgs are added to "switchyard serve" (e.g. -cpuprofile FILE).
	GatewayArgs []string
}

// argv prefixes argv with taskset when e.Pin is set; taskset execs, so the pid is the proxy's own.
func (e *Env) argv(argv ...string) []string {
	if e.Pin == "" {
		return argv
	}
	return append([]string{"taskset", "-c", e.Pin}, argv...)
}

func (e *Env) logf(format string, args ...any) {
	if e.Log != nil {
		fmt.Fprintf(e.Log, format+"\n", args...)
	}
}

func (e *Env) ready() time.Duration {
	if e.Ready <= 0 {
		return 30 * time.Second
	}
	return e.Ready
}

// startFleet starts "switchyard sim -fleet" on a copy of src with free ports and waits for every /health.
func (e *Env) startFleet(ctx context.Context, src, tag string) (*Proc, []FleetBackend, error) {
	return onFreePorts(func() (*Proc, []FleetBackend, error) { return e.startFleetOnce(ctx, src, tag) })
}

func (e *Env) startFleetOnce(ctx context.Context, src, tag string) (*Proc, []FleetBackend, error) {
	dst := filepath.Join(e.WorkDir, tag+"-fleet.yaml")
	backends, err := PrepareFleet(src, dst)
	if err != nil {
		return nil, nil, err
	}
	p, err := StartProc(ctx, "sim fleet", filepath.Join(e.WorkDir, tag+"-sim.log"), e.Exe, "sim", "-fleet", dst)
	if err != nil {
		return nil, nil, err
	}
	for _, b := range backends {
		if err := WaitHTTP(ctx, b.URL+"/health", e.ready(), p); err != nil {
			p.Stop()
			return nil, nil, err
		}
	}
	return p, backends, nil
}

// startGateway writes a gateway config for spec (free ports), starts "switchyard serve" on it and waits for the
// admin /readyz. It returns the process and the client base URL.
func (e *Env) startGateway(ctx context.Context, spec GatewaySpec, tag string) (*Proc, string, error) {
	return onFreePorts(func() (*Proc, string, error) { return e.startGatewayOnce(ctx, spec, tag) })
}

func (e *Env) startGatewayOnce(ctx context.Context, spec GatewaySpec, tag string) (*Proc, string, error) {
	ports, err := FreePorts(2)
	if err != nil {
		return nil, "", err
	}
	spec.Listen, spec.AdminListen = "127.0.0.1:"+strconv.Itoa(ports[0]), "127.0.0.1:"+strconv.Itoa(ports[1])
	cfg, err := GatewayConfig(spec)
	if err != nil {
		return nil, "", err
	}
	path := filepath.Join(e.WorkDir, tag+"-gateway.yaml")
	if err := os.WriteFile(path, cfg, 0o644); err != nil {
		return nil, "", fmt.Errorf("bench: gateway: %w", err)
	}
	argv := e.argv(append([]string{e.Exe, "serve", "-config", path}, e.GatewayArgs...)...)
	p, err := StartProc(ctx, "gateway", filepath.Join(e.WorkDir, tag+"-gateway.log"), argv...)
	if err != nil {
		return nil, "", err
	}
	if err := WaitHTTP(ctx, "http://"+spec.AdminListen+"/readyz", e.ready(), p); err != nil {
		p.Stop()
		return nil, "", err
	}
	// The run starts once the gateway has measured its engines: a seat probe's requests are not the run's.
	if err := WaitMeasured(ctx, "http://"+spec.AdminListen, e.ready(), p); err != nil {
		p.Stop()
		return nil, "", err
	}
	return p, "http://" + spec.Listen, nil
}

// controlAction posts body as JSON to backend's /sim/control.
func controlAction(ev Event, backends []FleetBackend) (Action, error) {
	i := slices.IndexFunc(backends, func(b FleetBackend) bool { return b.Name == ev.Backend })
	if i < 0 {
		return Action{}, fmt.Errorf("bench: scenario: event %q names backend %q, not in the fleet", ev.Label, ev.Backend)
	}
	body := ev.Control
	if body == nil {
		body = map[string]any{}
	}
	data, err := json.Marshal(body)
	if err != nil {
		return Action{}, fmt.Errorf("bench: scenario: event %q: %w", ev.Label, err)
	}
	url := backends[i].URL + "/sim/control"
	return Action{At: ev.At, Label: ev.Label, Do: func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(data))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			return fmt.Errorf("POST %s: %d %s", url, resp.StatusCode, bytes.TrimSpace(msg))
		}
		return nil
	}}, nil
}

// CompareOptions configures Compare.
type CompareOptions struct {
	Env
	Scenario *Scenario
	// Overrides apply on top of the scenario's (command-line flags).
	Overrides Overrides
	// Only restricts the run to these column names; empty runs every column.
	Only []string
}

// Compare runs the scenario's columns one after the other, each on a fresh fleet (and a fresh gateway unless the
// column is direct), with the same plan, and returns one RunReport per column. A column that cannot start (for
// instance a gateway that is not ready) is reported with its Error set, and the others still run; Compare
// returns an error only for problems that concern every column, or when ctx is cancelled.
func Compare(ctx context.Context, opt CompareOptions) ([]*RunReport, error) {
	sc := opt.Scenario
	w, err := LoadWorkload(sc.Path(sc.Workload))
	if err != nil {
		return nil, err
	}
	if w, err = w.Apply(sc.Overrides()); err != nil {
		return nil, err
	}
	if w, err = w.Apply(opt.Overrides); err != nil {
		return nil, err
	}
	plan, err := NewPlan(w)
	if err != nil {
		return nil, err
	}
	e := opt.Env
	e.logf("scenario %s: workload %s, %d requests (%d measured) over %v, seed %d", sc.Name, w.Name,
		len(plan.Items), plan.Requests(), w.Span(), w.Seed)
	var comps []companionPlan
	for _, c := range sc.Companions {
		cw, err := LoadWorkload(sc.Path(c.Workload))
		if err == nil {
			cw, err = cw.Apply(Overrides{Duration: w.Duration, Warmup: w.Warmup})
		}
		var cp *Plan
		if err == nil {
			cp, err = NewPlan(cw)
		}
		if err != nil {
			return nil, fmt.Errorf("bench: companion %s: %w", c.Name, err)
		}
		e.logf("companion %s: workload %s, model %s, %d requests (%d measured)", c.Name, cw.Name, cw.Model,
			len(cp.Items), cp.Requests())
		comps = append(comps, companionPlan{c, cp})
	}
	var runs []*RunReport
	for i, col := range sc.Columns {
		if len(opt.Only) > 0 && !slices.Contains(opt.Only, col.Name) {
			continue
		}
		tag := fmt.Sprintf("%02d-%s", i, col.Name)
		colPlan := plan
		if col.Rate > 0 || col.NoBursts {
			cw, err := w.Apply(Overrides{Rate: col.Rate, NoBursts: col.NoBursts})
			if err == nil {
				colPlan, err = NewPlan(cw)
			}
			if err != nil {
				return runs, fmt.Errorf("bench: column %s: %w", col.Name, err)
			}
			e.logf("column %s: its own load, %.1f requests/s, bursts %v (%d requests)", col.Name, cw.Arrival.Rate,
				!col.NoBursts, len(colPlan.Items))
		}
		rs, err := runColumn(ctx, &e, sc, col, colPlan, comps, tag)
		if ctx.Err() != nil {
			return runs, ctx.Err()
		}
		if err != nil {
			e.logf("column %s: %v", col.Name, err)
			rs = []*RunReport{{Name: col.Name, Workload: w.Name, Seed: w.Seed, Error: err.Error()}}
		}
		runs = append(runs, rs...)
	}
	return runs, nil
}

// companionPlan is a companion workload's plan, the same for every column.
type companionPlan struct {
	Companion
	plan *Plan
}

// runColumn runs one column: the main plan and every companion's at once against one fleet and gateway. It
// returns the main run's report, then one per companion.
func runColumn(ctx context.Context, e *Env, sc *Scenario, col Column, plan *Plan, comps []companionPlan, tag string) ([]*RunReport, error) {
	w := plan.Workload
	e.logf("column %s: starting fleet %s", col.Name, sc.Fleet)
	fleet, backends, err := e.startFleet(ctx, sc.Path(sc.Fleet), tag)
	if err != nil {
		return nil, err
	}
	defer fleet.Stop()
	target := backends[0].URL
	var picker Picker
	if col.Strategy == "oracle" {
		picker = NewOracle(backends, e.Timeout)
		target = "oracle"
	}
	var gws []*Proc
	if col.gateway() {
		spec := GatewaySpec{Region: sc.Region, Model: w.Model, Strategy: col.Strategy, SLO: w.SLO,
			Backends: backends, Gateway: col.Gateway, ModelOverlay: col.Model}
		for _, c := range comps {
			spec.Companions = append(spec.Companions, CompanionModel{Name: c.plan.Workload.Model, SLO: c.plan.Workload.SLO,
				Overlay: merge(c.Model, col.Also[c.Name])})
		}
		if col.Replicas > 1 {
			redis, addr, err := e.startRedis(ctx, tag)
			if err != nil {
				return nil, err
			}
			defer redis.Stop()
			spec.Gateway = merge(col.Gateway, map[string]any{"redis": map[string]any{"url": "redis://" + addr + "/0"}})
		}
		var targets []string
		for r := range max(col.Replicas, 1) {
			rtag := tag
			if col.Replicas > 1 {
				rtag = fmt.Sprintf("%s-r%d", tag, r)
			}
			gw, url, err := e.startGateway(ctx, spec, rtag)
			if err != nil {
				return nil, err
			}
			defer gw.Stop()
			gws, targets = append(gws, gw), append(targets, url)
		}
		target = targets[0]
		if len(targets) > 1 {
			picker, target = replicaPicker(targets), strings.Join(targets, ",")
		}
	}
	var actions []Action
	events := sc.Events
	if col.NoEvents {
		events = nil
	}
	for _, ev := range events {
		a, err := controlAction(ev, backends)
		if err != nil {
			return nil, err
		}
		actions = append(actions, a)
	}
	var metricURLs []string
	for _, b := range backends {
		metricURLs = append(metricURLs, b.URL+"/metrics")
	}
	probe := StartPrefixProbe(ctx, metricURLs)
	cpu0 := procsCPU(gws)
	e.logf("column %s: running %v against %s", col.Name, w.Span(), target)
	name := col.Name
	if len(comps) > 0 {
		name += "/" + w.Name
	}
	compRes := make([]*Result, len(comps))
	compErr := make([]error, len(comps))
	var wg sync.WaitGroup
	for i, c := range comps {
		wg.Add(1)
		go func() {
			defer wg.Done()
			compRes[i], compErr[i] = Run(ctx, RunConfig{Name: col.Name + "/" + c.Name, BaseURL: target, Plan: c.plan, Timeout: e.Timeout, Picker: picker})
		}()
	}
	res, err := Run(ctx, RunConfig{Name: name, BaseURL: target, Plan: plan, Timeout: e.Timeout, Actions: actions,
		Picker: picker})
	wg.Wait()
	if err == nil {
		err = errors.Join(compErr...)
	}
	if err != nil {
		return nil, err
	}
	if e.WorkDir != "" {
		if err := writeSamples(filepath.Join(e.WorkDir, tag+"-requests.jsonl"), res); err != nil {
			return nil, err
		}
	}
	r := Summary(res, target, w.SLO)
	r.Cost = costOf(res, backends, w.Bursts)
	r.PrefixHitRate, r.EngineRequests = probe.Finish(ctx)
	out := []*RunReport{r}
	for i, c := range comps {
		cr := Summary(compRes[i], target, c.plan.Workload.SLO)
		cr.Cost = costOf(compRes[i], backends, w.Bursts)
		out = append(out, cr)
	}
	if len(gws) > 0 {
		r.CPU = cpuUse("gateway", procsCPU(gws)-cpu0, r.Sent, res.Elapsed)
	}
	for _, gw := range gws {
		select {
		case <-gw.Done():
			return out, errors.New("bench: the gateway exited during the run:\n" + gw.Tail(2000))
		default:
		}
	}
	return out, nil
}

// procsCPU returns the CPU time the processes used so far, together (a process whose figure cannot be read
// counts nothing).
func procsCPU(ps []*Proc) time.Duration {
	var sum time.Duration
	for _, p := range ps {
		if t, err := p.CPUTime(); err == nil {
			sum += t
		}
	}
	return sum
}

// replicaPicker sends each request to one of several gateway replicas (Column.Replicas): turn i of a session to
// replica i mod n, so that a conversation alternates between them, any other request by its plan index.
type replicaPicker []string

// Pick implements Picker.
func (p replicaPicker) Pick(_ context.Context, it *Item) (string, error) {
	k := it.Index
	if it.Session >= 0 {
		k = it.Turn
	}
	return p[k%len(p)], nil
}

// startRedis starts a redis-server of the column's own on a free loopback port (no persistence), for replicas
// that share state, and returns it and its address.
func (e *Env) startRedis(ctx context.Context, tag string) (*Proc, string, error) {
	return onFreePorts(func() (*Proc, string, error) { return e.startRedisOnce(ctx, tag) })
}

func (e *Env) startRedisOnce(ctx context.Context, tag string) (*Proc, string, error) {
	exe, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", fmt.Errorf("bench: replicas share a redis-server, and none is on PATH (Debian: apt-get install redis-server): %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := StartProc(ctx, "redis-server", filepath.Join(e.WorkDir, tag+"-redis.log"), exe, "--bind", "127.0.0.1",
		"--port", strconv.Itoa(port), "--save", "", "--appendonly", "no")
	if err != nil {
		return nil, "", err
	}
	if err := WaitTCP(ctx, addr, e.ready(), p); err != nil {
		p.Stop()
		return nil, "", err
	}
	return p, addr, nil
}

func cpuUse(name string, d time.Duration, requests int, elapsed time.Duration) *CPUUse {
	c := &CPUUse{Process: name, Seconds: d.Seconds()}
	if requests > 0 {
		c.Per1kReqS = d.Seconds() / float64(requests) * 1000
	}
	if elapsed > 0 {
		c.Utilization = d.Seconds() / elapsed.Seconds()
	}
	return c
}

// WriteArtifacts writes report.json, ttft-cdf.svg and ttft-timeline.svg to dir, for the runs that have data.
func WriteArtifacts(dir, title string, rep *Report) error {
	if err := WriteJSON(dir, rep); err != nil {
		return err
	}
	var ok []*RunReport
	var events []EventRecord
	for _, r := range rep.Runs {
		if r.Error == "" {
			ok = append(ok, r)
			if len(events) == 0 {
				events = r.Events
			}
		}
	}
	files := map[string][]byte{
		"ttft-cdf.svg":      TTFTCDFSVG(title+": TTFT distribution", ok),
		"ttft-timeline.svg": TimelineSVG(title+": TTFT over time", ok, events),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return fmt.Errorf("bench: report: %w", err)
		}
	}
	return nil
}

// sampleLine is one request of a column's run as written to TAG-requests.jsonl: the plan item that says what it
// asked and the sample that says what it got, for reading a cell's tail request by request.
type sampleLine struct {
	Index        int     `json:"i"`
	AtMs         float64 `json:"at_ms"`
	Warmup       bool    `json:"warmup,omitempty"`
	Kind         string  `json:"kind"`
	Session      int     `json:"session"`
	Turn         int     `json:"turn"`
	Group        int     `json:"group"`
	PromptTokens int     `json:"prompt_tokens"`
	Status       int     `json:"status"`
	Err          string  `json:"err,omitempty"`
	Backend      string  `json:"backend,omitempty"`
	TTFTMs       float64 `json:"ttft_ms"`
	E2EMs        float64 `json:"e2e_ms"`
	LateMs       float64 `json:"late_ms"`
	CachedTokens int     `json:"cached_tokens"`
	OutputTokens int     `json:"output_tokens"`
}

// writeSamples writes one JSON line per planned request of res to path.
func writeSamples(path string, res *Result) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: samples: %w", err)
	}
	bw := bufio.NewWriter(f)
	enc := json.NewEncoder(bw)
	for i, s := range res.Samples {
		if i >= len(res.Plan.Items) {
			break
		}
		it := &res.Plan.Items[i]
		l := sampleLine{Index: it.Index, AtMs: ms(it.At), Warmup: it.Warmup, Kind: it.Kind, Session: it.Session,
			Turn: it.Turn, Group: it.Group, PromptTokens: it.PromptTokens, Status: s.Status, Err: s.Err,
			Backend: s.Backend, TTFTMs: ms(s.TTFT), E2EMs: ms(s.E2E), LateMs: ms(s.Late),
			CachedTokens: s.CachedTokens, OutputTokens: s.OutputTokens}
		if err = enc.Encode(&l); err != nil {
			break
		}
	}
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("bench: samples: %w", err)
	}
	return nil
}
