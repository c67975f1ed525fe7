package proxy

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// withAdmission turns on the gateway's admission control in a test snapshot, as the policy compiles it.
func withAdmission(snap *Snapshot, keys ...admission.KeyConfig) *Snapshot {
	snap.Priorities = admission.DefaultPriorities()
	snap.Shedder = admission.NewShedder(admission.DefaultShedParams(), nil)
	snap.Queue = QueueSettings{Size: 64, Timeout: 10 * time.Second}
	if len(keys) > 0 {
		k, err := admission.NewKeys(keys)
		if err != nil {
			panic(err)
		}
		snap.Keys = k
		snap.Limiter = admission.NewLocalLimiter(k, nil, nil, nil)
	}
	return snap
}

func key(name, secret string, class admission.Class, rpm int64, models ...string) admission.KeyConfig {
	return admission.KeyConfig{Name: name, Hash: sha256.Sum256([]byte(secret)), Class: class, RequestsPerMinute: rpm, Models: models}
}

type answer struct {
	code    int
	backend string
	body    string
	header  http.Header
}

func post(t *testing.T, url string, body string, hdr map[string]string) answer {
	t.Helper()
	resp, b := rawPost(t, url, "/v1/chat/completions", []byte(body), hdr)
	return answer{resp.StatusCode, resp.Header.Get("X-Switchyard-Backend"), string(b), resp.Header}
}

func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("not an error body: %s", body)
	}
	return e.Error.Code
}

const small = `{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`

func TestAPIKeys(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 2, be.URL()),
		key("team-a", "sk-a", admission.Standard, 0),
		key("team-b", "sk-b", admission.Standard, 0, "other-model"))
	gw := startGateway(t, snap, Options{})
	for _, tc := range []struct {
		name, auth string
		code       int
		ecode      string
	}{
		{"no key", "", 401, "invalid_api_key"},
		{"unknown key", "Bearer sk-nope", 401, "invalid_api_key"},
		{"not bearer", "Basic sk-a", 401, "invalid_api_key"},
		{"key not allowed this model", "Bearer sk-b", 403, "model_not_allowed"},
		{"valid key", "Bearer sk-a", 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{}
			if tc.auth != "" {
				hdr["Authorization"] = tc.auth
			}
			a := post(t, gw.url, small, hdr)
			if a.code != tc.code {
				t.Fatalf("status %d, want %d: %s", a.code, tc.code, a.body)
			}
			if tc.ecode != "" {
				if got := errorCode(t, a.body); got != tc.ecode {
					t.Errorf("code %q, want %q", got, tc.ecode)
				}
				if a.header.Get("X-Should-Retry") != "false" {
					t.Error("an authentication refusal must say x-should-retry: false")
				}
			}
		})
	}
}

func TestRateLimit(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 2, be.URL()), key("team-a", "sk-a", admission.Standard, 5))
	gw := startGateway(t, snap, Options{})
	auth := map[string]string{"Authorization": "Bearer sk-a"}
	for i := range 5 {
		a := post(t, gw.url, small, auth)
		if a.code != 200 {
			t.Fatalf("request %d of 5 refused: %d %s", i+1, a.code, a.body)
		}
		if got := a.header.Get("X-Ratelimit-Remaining-Requests"); got != fmt.Sprint(4-i) {
			t.Errorf("request %d: x-ratelimit-remaining-requests %q, want %d", i+1, got, 4-i)
		}
		if a.header.Get("X-Ratelimit-Limit-Requests") != "5" {
			t.Errorf("x-ratelimit-limit-requests %q", a.header.Get("X-Ratelimit-Limit-Requests"))
		}
	}
	a := post(t, gw.url, small, auth)
	if a.code != 429 || errorCode(t, a.body) != "rate_limit_exceeded" {
		t.Fatalf("the 6th request in a minute: %d %s, want 429 rate_limit_exceeded", a.code, a.body)
	}
	if ra := a.header.Get("Retry-After"); ra == "" || ra == "0" {
		t.Errorf("Retry-After %q on a rate-limit refusal", ra)
	}
	if a.header.Get("X-Ratelimit-Remaining-Requests") != "0" {
		t.Errorf("x-ratelimit-remaining-requests on refusal: %q", a.header.Get("X-Ratelimit-Remaining-Requests"))
	}
}

// TestQueueWaitsForCapacity: with a backend capped at one request in flight, concurrent requests wait in the
// gateway queue and are dispatched one by one as the backend frees, instead of piling up in the engine.
func TestQueueWaitsForCapacity(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = 5 * time.Millisecond })
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 2, be.URL()))
	editBackends(snap, func(c *routing.BackendConfig) { c.MaxConcurrency = 1 })
	gw := startGateway(t, snap, Options{})
	const n = 6
	var wg sync.WaitGroup
	codes := make([]int, n)
	var maxInflight atomic.Int64
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if v := snap.Backends[0].Inflight(); v > maxInflight.Load() {
				maxInflight.Store(v)
			}
			time.Sleep(time.Millisecond)
		}
	}()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = post(t, gw.url, `{"model":"sim-model","max_tokens":10,"messages":[{"role":"user","content":"queue me"}]}`,
				map[string]string{"X-Switchyard-Priority": "critical"}).code
		}()
	}
	wg.Wait()
	close(stop)
	for i, c := range codes {
		if c != 200 {
			t.Errorf("request %d: status %d", i, c)
		}
	}
	if m := maxInflight.Load(); m > 1 {
		t.Errorf("the backend had %d requests in flight; its cap is 1", m)
	}
	if h := histogramByLabel(t, gw.reg, "switchyard_queue_wait_seconds", "priority", "critical"); h == 0 {
		t.Error("no request was recorded as having waited in the queue")
	}
}

// histogramByLabel returns the sample count of the histogram name whose label has value (0 if absent).
func histogramByLabel(t *testing.T, g prometheus.Gatherer, name, label, value string) uint64 {
	t.Helper()
	return histogramWith(t, g, name, label, value).GetSampleCount()
}

// histogramSum returns the sum of the samples of the histogram name whose label has value (0 if absent).
func histogramSum(t *testing.T, g prometheus.Gatherer, name, label, value string) float64 {
	t.Helper()
	return histogramWith(t, g, name, label, value).GetSampleSum()
}

// histogramWith returns the histogram name whose label has value, nil if absent (its getters then return 0).
func histogramWith(t *testing.T, g prometheus.Gatherer, name, label, value string) *dto.Histogram {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetHistogram()
				}
			}
		}
	}
	return nil
}

// oneSlotGateway is a gateway with admission and the shedder in front of one simulated engine (20 ms steps)
// that it may send one request at a time, for a model whose TTFT objective is ttft.
func oneSlotGateway(t *testing.T, ttft time.Duration) (*Snapshot, *gateway) {
	t.Helper()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = 20 * time.Millisecond })
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 2, be.URL()))
	snap.Models["sim-model"].SLO = SLO{TTFT: ttft}
	editBackends(snap, func(c *routing.BackendConfig) { c.MaxConcurrency = 1 })
	gw := startGateway(t, snap, Options{})
	snap.Shedder = admission.NewShedder(admission.DefaultShedParams(), gw.m)
	return snap, gw
}

// TestSheddableRefusedFirst: when every backend is at capacity, sheddable requests are refused at once with 503
// and Retry-After (they would miss their objective waiting), while critical ones wait and are served.
func TestSheddableRefusedFirst(t *testing.T) {
	t.Parallel()
	snap, gw := oneSlotGateway(t, 200*time.Millisecond)
	// Occupy the only slot for about a second.
	busy := make(chan answer, 1)
	go func() {
		busy <- post(t, gw.url, `{"model":"sim-model","max_tokens":50,"messages":[{"role":"user","content":"long"}]}`, nil)
	}()
	waitFor(t, 5*time.Second, func() bool { return snap.Backends[0].Inflight() == 1 })
	start := time.Now()
	shed := post(t, gw.url, small, map[string]string{"X-Switchyard-Priority": "sheddable"})
	if shed.code != 503 || shed.header.Get("Retry-After") == "" || errorCode(t, shed.body) != "overloaded" {
		t.Errorf("sheddable at capacity: %d %s (Retry-After %q), want 503 overloaded", shed.code, shed.body, shed.header.Get("Retry-After"))
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("the refusal took %v; it must be immediate", d)
	}
	crit := post(t, gw.url, small, map[string]string{"X-Switchyard-Priority": "critical"})
	if crit.code != 200 {
		t.Errorf("critical at capacity: %d %s, want 200 after waiting", crit.code, crit.body)
	}
	if b := <-busy; b.code != 200 {
		t.Errorf("the long request: %d", b.code)
	}
	if n := counterValue(t, gw.reg, "switchyard_shed_total"); n < 1 {
		t.Errorf("switchyard_shed_total = %v", n)
	}
}

// TestBrownout: when the primary model's pool is saturated, a sheddable request is served by its degrade_to
// model instead of being refused, and the response says so.
func TestBrownout(t *testing.T) {
	t.Parallel()
	big := startSim(t, "big", func(c *sim.Config) { c.ITL = 20 * time.Millisecond })
	smallBe := startSim(t, "small", func(c *sim.Config) { c.ITL = time.Millisecond })
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 2, big.URL()))
	cfg := *snap.Backends[0].Config()
	cfg.MaxConcurrency = 1
	snap.Backends[0] = routing.NewBackend(&cfg)
	primary := snap.Models["sim-model"]
	primary.Targets[0].Backend = snap.Backends[0]
	lite := routing.NewBackend(&routing.BackendConfig{Name: "lite", URL: smallBe.URL(), Region: "local", Models: []string{"sim-model"}})
	snap.Backends = append(snap.Backends, lite)
	degraded := &Model{Name: "sim-model-lite", Strategy: &routing.RoundRobin{}, Retries: 2,
		Targets: []routing.Target{{Backend: lite, Model: "sim-model"}}}
	snap.Models[degraded.Name] = degraded
	snap.ModelNames = append(snap.ModelNames, degraded.Name)
	primary.DegradeTo = degraded
	gw := startGateway(t, snap, Options{})
	busy := make(chan answer, 1)
	go func() {
		busy <- post(t, gw.url, `{"model":"sim-model","max_tokens":50,"messages":[{"role":"user","content":"long"}]}`, nil)
	}()
	waitFor(t, 5*time.Second, func() bool { return snap.Backends[0].Inflight() == 1 })
	a := post(t, gw.url, small, map[string]string{"X-Switchyard-Priority": "sheddable"})
	if a.code != 200 || a.backend != "lite" || a.header.Get("X-Switchyard-Degraded-To") != "sim-model-lite" {
		t.Errorf("sheddable under saturation: %d backend %q degraded-to %q: %s", a.code, a.backend, a.header.Get("X-Switchyard-Degraded-To"), a.body)
	}
	if !strings.Contains(a.body, `"model":"sim-model-lite"`) {
		t.Errorf("the degraded answer should name the model that served it: %s", a.body)
	}
	<-busy
}

// TestHedging: a backend that stalls its first token is raced by a hedge after the model's delay; the hedge's
// first token wins and answers. The loser reads on to its own first token, teaches routing its real TTFT (not
// only the hedge delay it had waited when it lost), and is then cancelled (its engine sees the abort).
func TestHedging(t *testing.T) {
	t.Parallel()
	const stall = 1500 * time.Millisecond
	slow := startSim(t, "slow", func(c *sim.Config) { c.ITL = 5 * time.Millisecond })
	fast := startSim(t, "fast", func(c *sim.Config) { c.ITL = 5 * time.Millisecond })
	control(t, slow.URL(), fmt.Sprintf(`{"stall":"%s"}`, stall))
	snap := snapshotOf(firstHealthy{}, 2, slow.URL(), fast.URL())
	snap.Models["sim-model"].Hedge = Hedge{After: 150 * time.Millisecond, BudgetPercent: 100}
	gw := startGateway(t, snap, Options{})
	for _, stream := range []bool{true, false} {
		start := time.Now()
		resp, body := rawPost(t, gw.url, "/v1/chat/completions",
			[]byte(fmt.Sprintf(`{"model":"sim-model","stream":%v,"max_tokens":5,"messages":[{"role":"user","content":"hedge %v"}]}`, stream, stream)), nil)
		d := time.Since(start)
		if resp.StatusCode != 200 || resp.Header.Get("X-Switchyard-Backend") != "b1" {
			t.Fatalf("stream=%v: status %d backend %q body %s", stream, resp.StatusCode, resp.Header.Get("X-Switchyard-Backend"), body)
		}
		if d > stall*2/3 {
			t.Errorf("stream=%v: answered after %v; the hedge should have answered within a fraction of the %v stall", stream, d, stall)
		}
	}
	waitFor(t, 3*stall, func() bool {
		return gw.s.orphans.len() == 0 && simGauge(t, slow.URL(), "vllm:num_requests_running")+
			simGauge(t, slow.URL(), "vllm:num_requests_waiting")+simGauge(t, slow.URL(), "sim_requests_pending") == 0
	})
	fams, _ := gw.reg.Gather()
	got := map[string]float64{}
	for _, f := range fams {
		if f.GetName() == "switchyard_hedges_total" {
			for _, m := range f.GetMetric() {
				got[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if got["sent"] != 2 || got["hedge_won"] != 2 {
		t.Errorf("switchyard_hedges_total = %v, want 2 sent and 2 won by the hedge", got)
	}
	if snap.Backends[0].Inflight() != 0 || snap.Backends[1].Inflight() != 0 {
		t.Errorf("in flight after the races: %d, %d", snap.Backends[0].Inflight(), snap.Backends[1].Inflight())
	}
	// Routing learned the stall: cancelled at the hedge's first token, the losers would have taught it 150 ms.
	if mean, _ := snap.Backends[0].PredictTTFT(10, 0); mean < stall/2 {
		t.Errorf("the stalling backend's predicted TTFT is %v after two first tokens of %v: routing did not learn from the races it lost", mean, stall)
	}
}

// firstHealthy always picks the first healthy candidate: a deterministic order for tests.
type firstHealthy struct{}

func (firstHealthy) Pick(_ *routing.Request, ts []routing.Target) (routing.Target, error) {
	for _, t := range ts {
		if t.Backend.Healthy() {
			return t, nil
		}
	}
	return routing.Target{}, routing.ErrNoBackend
}

// TestStandardRefusedWhenItsChanceHasPassed: a standard request queued behind a long one is refused (503
// overloaded, Retry-After) as soon as it can no longer meet its objective, while the slot it waits for is still
// taken, rather than dispatched late when the slot frees; the refusal counts as queue_timeout.
func TestStandardRefusedWhenItsChanceHasPassed(t *testing.T) {
	t.Parallel()
	// Objective 1.5 s; the long request holds the only slot for at least 100 * 20ms = 2 s, less than twice it.
	snap, gw := oneSlotGateway(t, 1500*time.Millisecond)
	busy := make(chan answer, 1)
	go func() {
		busy <- post(t, gw.url, `{"model":"sim-model","max_tokens":100,"messages":[{"role":"user","content":"long"}]}`,
			map[string]string{"X-Switchyard-Priority": "critical"})
	}()
	waitFor(t, 5*time.Second, func() bool { return snap.Backends[0].Inflight() == 1 })
	std := post(t, gw.url, small, map[string]string{"X-Switchyard-Priority": "standard"})
	stillBusy := snap.Backends[0].Inflight() == 1
	if std.code != 503 || std.header.Get("Retry-After") == "" || errorCode(t, std.body) != "overloaded" {
		t.Errorf("standard behind a long request: %d %s (Retry-After %q), want 503 overloaded", std.code, std.body, std.header.Get("Retry-After"))
	}
	if !stillBusy {
		t.Error("the refusal came after the slot freed: the request waited past its chance")
	}
	if b := <-busy; b.code != 200 {
		t.Errorf("the long request: %d", b.code)
	}
	if n := counterWith(t, gw, "switchyard_shed_total", "reason", "queue_timeout"); n != 1 {
		t.Errorf("switchyard_shed_total{reason=queue_timeout} = %v, want 1 (the standard request)", n)
	}
}

// TestAdmissionMeasuresItsPredictions: the first tokens of standard requests admitted on routing's prediction
// feed their model's Calibration (the serve factor leaves 1); critical requests, never refused on a prediction,
// are not measured.
func TestAdmissionMeasuresItsPredictions(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", nil)
	ad, err := routing.NewAdaptive(routing.StrategyEnv{Model: "sim-model"}, routing.DefaultAdaptiveParams())
	if err != nil {
		t.Fatal(err)
	}
	snap := withAdmission(snapshotOf(ad, 2, be.URL()))
	snap.Models["sim-model"].SLO = SLO{TTFT: 5 * time.Second}
	gw := startGateway(t, snap, Options{})
	for _, class := range []string{"critical", "standard", "standard", "standard", "standard"} {
		if a := post(t, gw.url, small, map[string]string{"X-Switchyard-Priority": class}); a.code != 200 {
			t.Fatalf("%s request: %d %s", class, a.code, a.body)
		}
	}
	k := gw.s.calibrationFor("sim-model")
	if f := k.Serve(admission.Standard); f == 1 || !(f > 0) {
		t.Errorf("standard serve factor %v after 4 first tokens, want measured (not 1)", f)
	}
	if f := k.Serve(admission.Critical); f != 1 {
		t.Errorf("critical serve factor %v, want 1 (not measured)", f)
	}
}

// TestPacedWaitersGoOneByOne: prefill pacing counts a request's prefill from the moment its backend is claimed,
// not from its dispatch. Three standard prompts of 1,000 tokens wait in the gateway queue behind a long prefill
// (critical demand on); when its first token frees the engine, the queue's dispatcher offers them one after
// another, before any of them is sent. The first goes, and each of the others must wait for the previous one's
// first token: before the claim counted, all three went at once, and a critical request arriving then waited
// for their prefill (bench/results/protect-2026-12-02-matrix.md, n1/s64).
func TestPacedWaitersGoOneByOne(t *testing.T) {
	t.Parallel()
	// 2,000 prompt tokens/s: the long prompt's prefill takes a second, each waiter's half a second.
	be := startSim(t, "a", func(c *sim.Config) { c.PrefillTPS = 2000; c.ITL = 5 * time.Millisecond })
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 0, be.URL()))
	var logs syncBuffer
	gw := startGateway(t, snap, Options{AccessLog: slog.New(slog.NewJSONHandler(&logs, nil))})
	critical := map[string]string{"X-Switchyard-Priority": "critical"}
	const small = `{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
	if a := post(t, gw.url, small, critical); a.code != http.StatusOK {
		t.Fatalf("critical request: %d %s", a.code, a.body)
	}
	prompt := func(n, words int) string { // n leads the prompt: no prefix of one is cached for another
		return fmt.Sprintf(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"%d %s"}]}`,
			n, strings.Repeat("word ", words))
	}
	var wg sync.WaitGroup
	codes := make([]int, 4)
	wg.Add(1)
	go func() { defer wg.Done(); codes[0] = post(t, gw.url, prompt(0, 2000), nil).code }()
	waitFor(t, 5*time.Second, func() bool { _, tok := snap.Backends[0].Prefilling(); return tok > 0 })
	for i := 1; i <= 3; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); codes[i] = post(t, gw.url, prompt(i, 1000), nil).code }()
	}
	waitFor(t, 5*time.Second, func() bool { return gw.s.queueFor("sim-model", snap).Len() == 3 })
	wg.Wait()
	for i, c := range codes {
		if c != http.StatusOK {
			t.Fatalf("request %d: status %d", i, c)
		}
	}
	type span struct{ dispatch, first time.Time }
	var waiters []span
	for _, l := range logs.lines(t) {
		q, queued := l["queue_ms"].(float64)
		if l["msg"] != "request" || l["class"] != "standard" || !queued || q <= 0 {
			continue
		}
		end, err := time.Parse(time.RFC3339Nano, l["time"].(string))
		if err != nil {
			t.Fatal(err)
		}
		ms := func(k string) time.Duration { return time.Duration(l[k].(float64) * float64(time.Millisecond)) }
		start := end.Add(-ms("duration_ms"))
		waiters = append(waiters, span{start.Add(ms("queue_ms")), start.Add(ms("ttft_ms"))}) // ttft from arrival
	}
	if len(waiters) != 3 {
		t.Fatalf("%d standard requests waited in the queue, want the 3 sent during the long prefill", len(waiters))
	}
	slices.SortFunc(waiters, func(a, b span) int { return a.dispatch.Compare(b.dispatch) })
	for i := 1; i < len(waiters); i++ {
		// 10 ms of slack for the access log's arithmetic; a waiter sent with the previous one comes within
		// microseconds of it, half a second before that one's first token.
		if gap := waiters[i-1].first.Sub(waiters[i].dispatch); gap > 10*time.Millisecond {
			t.Errorf("waiter %d was dispatched %v before waiter %d's first token: its prefill went to the engine "+
				"with the other's", i+1, gap, i)
		}
	}
}

// TestPrefillPacing: while the model has critical demand, a standard request waits in the gateway queue rather
// than add its prefill to an engine whose queued prefill would already delay a critical first token by more
// than admission.CriticalDelay of it (a long prompt sent just before, not yet answered); a critical request sent
// then does not wait for the prefill. Without critical demand (no critical request in the last minute) nothing
// is held back.
func TestPrefillPacing(t *testing.T) {
	t.Parallel()
	for _, demand := range []bool{true, false} {
		t.Run(fmt.Sprintf("critical demand %v", demand), func(t *testing.T) {
			t.Parallel()
			// 2,000 prompt tokens at 2,000 tokens/s: the long request's prefill takes the engine a second.
			be := startSim(t, "a", func(c *sim.Config) { c.PrefillTPS = 2000; c.ITL = 5 * time.Millisecond })
			snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 0, be.URL()))
			gw := startGateway(t, snap, Options{})
			critical := map[string]string{"X-Switchyard-Priority": "critical"}
			const small = `{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`
			if demand {
				if a := post(t, gw.url, small, critical); a.code != http.StatusOK {
					t.Fatalf("critical request: %d %s", a.code, a.body)
				}
			}
			long := fmt.Sprintf(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":%q}]}`,
				strings.Repeat("word ", 2000))
			done := make(chan answer, 1)
			go func() { done <- post(t, gw.url, long, nil) }()
			waitFor(t, 5*time.Second, func() bool { _, tok := snap.Backends[0].Prefilling(); return tok > 0 })
			var wg sync.WaitGroup
			std, crit := answer{}, answer{code: http.StatusOK}
			wg.Add(1)
			go func() { defer wg.Done(); std = post(t, gw.url, small, nil) }()
			if demand { // without demand, no critical request: its arrival would be the demand
				wg.Add(1)
				go func() { defer wg.Done(); crit = post(t, gw.url, small, critical) }()
			}
			wg.Wait()
			if a := <-done; a.code != http.StatusOK || std.code != http.StatusOK || crit.code != http.StatusOK {
				t.Fatalf("statuses: long %d, standard %d, critical %d", a.code, std.code, crit.code)
			}
			queued := histogramByLabel(t, gw.reg, "switchyard_queue_wait_seconds", "priority", "standard")
			// A critical request that arrives while the standard one waits passes through the queue, ahead of
			// it (priority bands), so it may be counted there; it must not wait for the prefill.
			if w := histogramSum(t, gw.reg, "switchyard_queue_wait_seconds", "priority", "critical"); w > 0.1 {
				t.Errorf("critical requests waited %.3f s in the queue, want no wait for the prefill", w)
			}
			if demand && (queued != 1 || histogramSum(t, gw.reg, "switchyard_queue_wait_seconds", "priority",
				"standard") < 0.2) {
				t.Errorf("%d standard requests waited in the queue behind the long prefill, want 1 that waited for it",
					queued)
			}
			if !demand && queued != 0 {
				t.Errorf("%d standard requests waited in the queue without critical demand, want none", queued)
			}
		})
	}
}
