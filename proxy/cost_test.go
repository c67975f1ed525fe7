package proxy

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/internal/redistest"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// pricedSnapshot routes sim-model to the given simulators, each at its price.
func pricedSnapshot(urls []string, prices []routing.Price) *Snapshot {
	snap := snapshotOf(&routing.RoundRobin{}, 2, urls...)
	m := snap.Models["sim-model"]
	for i, b := range snap.Backends {
		cfg := *b.Config()
		cfg.Price = prices[i]
		snap.Backends[i] = routing.NewBackend(&cfg)
		m.Targets[i].Backend = snap.Backends[i]
	}
	return snap
}

type usageBody struct {
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// TestCostCounterMatchesEngineUsage: the cost counter equals the engine's own usage (as the client received
// it) times each backend's price, cached prompt tokens at their discount, within 1%; the status page's
// decisions carry each request's cost.
func TestCostCounterMatchesEngineUsage(t *testing.T) {
	t.Parallel()
	prices := []routing.Price{{Input: 3, CachedInput: 0.3, Output: 15}, {Input: 0.5, CachedInput: 0.5, Output: 1.5}}
	a := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	b := startSim(t, "b", func(c *sim.Config) { c.ITL = time.Millisecond })
	snap := pricedSnapshot([]string{a.URL(), b.URL()}, prices)
	gw := startGateway(t, snap, Options{})
	want, cachedSeen := 0.0, 0
	for i := range 40 {
		// Repeated long system prompts, so the engines report prefix-cache hits.
		body := fmt.Sprintf(`{"model":"sim-model","max_tokens":%d,"messages":[{"role":"system","content":%q},{"role":"user","content":"question %d"}]}`,
			8+i%17, fmt.Sprintf("%0800d", i%3), i)
		ans := post(t, gw.url, body, nil)
		if ans.code != 200 {
			t.Fatalf("request %d: %d %s", i, ans.code, ans.body)
		}
		var u usageBody
		if err := json.Unmarshal([]byte(ans.body), &u); err != nil {
			t.Fatal(err)
		}
		p := prices[0]
		if ans.backend == "b1" {
			p = prices[1]
		}
		want += p.Of(routing.Usage{PromptTokens: u.Usage.PromptTokens, CompletionTokens: u.Usage.CompletionTokens,
			CachedTokens: u.Usage.PromptTokensDetails.CachedTokens, HasCached: true})
		cachedSeen += u.Usage.PromptTokensDetails.CachedTokens
	}
	got := counterValue(t, gw.reg, "switchyard_cost_dollars_total")
	if want == 0 || math.Abs(got-want)/want > 0.01 {
		t.Fatalf("switchyard_cost_dollars_total = %.8f, want %.8f (tokens x price) within 1%%", got, want)
	}
	if cachedSeen == 0 {
		t.Error("the engines reported no cached tokens: the cached price went untested")
	}
	sum := 0.0
	for _, d := range gw.s.rings.dec.recent(64) {
		sum += d.Cost
	}
	if math.Abs(sum-want)/want > 0.01 {
		t.Errorf("the decisions' costs sum to %.8f, want %.8f", sum, want)
	}
	t.Logf("cost %.8f for %d cached prompt tokens; counter %.8f", want, cachedSeen, got)
}

// budgetSnapshot is a priced single-backend snapshot with admission, a key "k" (secret "sk") with budget b, and
// a degrade_to model on a second backend.
func budgetSnapshot(t *testing.T, url string, b admission.Budget) *Snapshot {
	snap := withAdmission(pricedSnapshot([]string{url}, []routing.Price{{Input: 10, CachedInput: 10, Output: 100}}),
		admission.KeyConfig{Name: "k", Hash: sha256.Sum256([]byte("sk")), Class: admission.Standard, Budget: b})
	snap.Spender = admission.NewLocalSpender(snap.Keys, nil, nil, nil)
	return snap
}

// TestBudgetSoftAndHard: past the soft limit the key's requests are served by the model's degrade_to; at the
// hard limit they get 429 insufficient_quota with Retry-After; every answer carries the budget headers.
func TestBudgetSoftAndHard(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	lite := startSim(t, "lite", func(c *sim.Config) { c.ITL = time.Millisecond })
	snap := budgetSnapshot(t, be.URL(), admission.Budget{Limit: 0.02, Soft: 0.01, Period: time.Hour})
	lb := routing.NewBackend(&routing.BackendConfig{Name: "lite", URL: lite.URL(), Region: "local", Models: []string{"sim-model"},
		Price: routing.Price{Input: 1, CachedInput: 1, Output: 10}})
	snap.Backends = append(snap.Backends, lb)
	degraded := &Model{Name: "sim-model-lite", Strategy: &routing.RoundRobin{}, Targets: []routing.Target{{Backend: lb, Model: "sim-model"}}}
	snap.Models[degraded.Name], snap.ModelNames = degraded, append(snap.ModelNames, degraded.Name)
	snap.Models["sim-model"].DegradeTo = degraded
	gw := startGateway(t, snap, Options{})
	hdr := map[string]string{"Authorization": "Bearer sk"}
	body := `{"model":"sim-model","max_tokens":20,"messages":[{"role":"user","content":"hello there"}]}`
	var sawSoft bool
	for i := range 200 {
		a := post(t, gw.url, body, hdr)
		if a.header.Get(admission.HeaderLimitBudget) != "0.02" || a.header.Get(admission.HeaderResetBudget) == "" {
			t.Fatalf("request %d: budget headers %v", i, a.header)
		}
		if a.code == 429 {
			if errorCode(t, a.body) != "insufficient_quota" || a.header.Get("Retry-After") == "" {
				t.Fatalf("hard limit: %s (Retry-After %q)", a.body, a.header.Get("Retry-After"))
			}
			if a.header.Get(admission.HeaderRemainingBudget) != "0" {
				t.Errorf("remaining at the hard limit: %q", a.header.Get(admission.HeaderRemainingBudget))
			}
			if !sawSoft {
				t.Fatal("the hard limit came before any request was degraded at the soft limit")
			}
			spent := snap.Spender.(*admission.LocalSpender).Spent(snap.Keys.All()[0])
			if spent < 0.02-0.003 || spent > 0.02+0.003 { // a request here costs at most 0.0023
				t.Fatalf("spent %.5f at the refusal, want within one request of 0.02", spent)
			}
			return
		}
		if a.code != 200 {
			t.Fatalf("request %d: %d %s", i, a.code, a.body)
		}
		if a.backend == "lite" {
			sawSoft = true
		}
	}
	t.Fatal("200 requests never reached the hard limit")
}

// TestBudgetTwoReplicasShareRedis: two real gateways whose spenders share one Redis serve one key
// concurrently; the key's spend, by both gateways' cost counters, stops within one request of its limit.
func TestBudgetTwoReplicasShareRedis(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	c := redistest.Client(t, redistest.Addr(t))
	prefix := redistest.Prefix(t)
	const limit = 0.05
	var gws []*gateway
	for range 2 {
		snap := budgetSnapshot(t, be.URL(), admission.Budget{Limit: limit, Period: 24 * time.Hour})
		snap.Spender = admission.NewRedisSpender(c, prefix, 2*time.Second, snap.Spender.(*admission.LocalSpender),
			func(op string, err error) { t.Errorf("redis (%s): %v", op, err) })
		gws = append(gws, startGateway(t, snap, Options{}))
	}
	hdr := map[string]string{"Authorization": "Bearer sk"}
	body := `{"model":"sim-model","max_tokens":16,"messages":[{"role":"user","content":"summarise this"}]}`
	var wg sync.WaitGroup
	var mu sync.Mutex
	most := 0.0 // the dearest request served: "one request" of the bound
	for w := range 6 {
		wg.Add(1)
		go func(gw *gateway) {
			defer wg.Done()
			for range 400 {
				a := post(t, gw.url, body, hdr)
				if a.code == 429 {
					return
				}
				if a.code != 200 {
					t.Errorf("%d %s", a.code, a.body)
					return
				}
				var u usageBody
				if err := json.Unmarshal([]byte(a.body), &u); err == nil {
					cost := (float64(u.Usage.PromptTokens)*10 + float64(u.Usage.CompletionTokens)*100) / 1e6
					mu.Lock()
					most = max(most, cost)
					mu.Unlock()
				}
			}
			t.Error("a worker never reached the limit")
		}(gws[w%2])
	}
	wg.Wait()
	spent := counterValue(t, gws[0].reg, "switchyard_cost_dollars_total") + counterValue(t, gws[1].reg, "switchyard_cost_dollars_total")
	if spent > limit+most+1e-9 || spent < limit-most-1e-9 {
		t.Fatalf("the two replicas spent %.6f against a limit of %.2f; want within one request (%.6f)", spent, limit, most)
	}
	t.Logf("two replicas spent %.6f of %.2f (one request costs up to %.6f)", spent, limit, most)
}

// TestAccessLogCost: the access log line carries the request's cost, as the counter adds it.
func TestAccessLogCost(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	var buf syncBuffer
	snap := pricedSnapshot([]string{be.URL()}, []routing.Price{{Input: 2, CachedInput: 2, Output: 8}})
	gw := startGateway(t, snap, Options{AccessLog: slog.New(slog.NewJSONHandler(&buf, nil))})
	if a := post(t, gw.url, `{"model":"sim-model","max_tokens":6,"messages":[{"role":"user","content":"hello"}]}`, nil); a.code != 200 {
		t.Fatalf("%d %s", a.code, a.body)
	}
	waitFor(t, 5*time.Second, func() bool { return strings.Count(buf.String(), "\n") >= 1 })
	line := buf.lines(t)[0]
	want := (line["tokens_in"].(float64)*2 + line["tokens_out"].(float64)*8) / 1e6
	if got, _ := line["cost"].(float64); math.Abs(got-want) > 1e-12 || got == 0 {
		t.Fatalf("access log cost %v, want %v", line["cost"], want)
	}
	if c := counterValue(t, gw.reg, "switchyard_cost_dollars_total"); math.Abs(c-want) > 1e-12 {
		t.Fatalf("counter %v, want %v", c, want)
	}
}
