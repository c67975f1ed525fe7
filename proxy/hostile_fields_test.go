package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// Issue 14's two findings about how the gateway reads a request body, reproduced through the real gateway over
// loopback against the simulator (docs/security.md).

// TestHostileTokenQuota: max_completion_tokens 4000 with max_tokens 1 reserved 1 token while the engine (vLLM,
// the simulator) generated 4000, so a 3,000 tokens/min key got 12,006 tokens from three concurrent requests. The
// engine must not generate past the key's limit: what is admitted reserves what it will generate.
func TestHostileTokenQuota(t *testing.T) {
	t.Parallel()
	const limit = 3000
	for _, tc := range []struct {
		name          string
		maxCompletion int
		admitted      int // how many of the three concurrent requests fit the limit
	}{
		{"one alone is over the limit", 4000, 0},
		{"the third is over the limit", 1400, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			be := startSim(t, "a", func(c *sim.Config) { c.ITL = 20 * time.Microsecond; c.Overhead = 0 })
			k := key("team-a", "sk-a", admission.Standard, 0)
			k.TokensPerMinute = limit
			gw := startGateway(t, withAdmission(snapshotOf(&routing.RoundRobin{}, 0, be.URL()), k), Options{})
			body := `{"model":"sim-model","max_completion_tokens":` + strconv.Itoa(tc.maxCompletion) +
				`,"max_tokens":1,"messages":[{"role":"user","content":"Write a long story."}]}`

			var wg sync.WaitGroup
			answers := make([]answer, 3)
			errs := make([]error, 3)
			for i := range answers {
				wg.Go(func() { answers[i], errs[i] = postKey(gw.url, body, "sk-a") })
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			generated, ok := 0, 0
			for i, a := range answers {
				switch a.code {
				case http.StatusOK:
					var r struct {
						Usage struct {
							CompletionTokens int `json:"completion_tokens"`
						} `json:"usage"`
					}
					if err := json.Unmarshal([]byte(a.body), &r); err != nil {
						t.Fatalf("request %d: %v: %s", i, err, a.body)
					}
					generated += r.Usage.CompletionTokens
					ok++
				case http.StatusTooManyRequests:
					if code := errorCode(t, a.body); code != "rate_limit_exceeded" {
						t.Errorf("request %d: 429 with code %q", i, code)
					}
				default:
					t.Errorf("request %d: %d %s", i, a.code, a.body)
				}
			}
			if generated > limit {
				t.Errorf("the engine generated %d tokens for a key of %d tokens/min (%d of 3 requests admitted)", generated, limit, ok)
			}
			if ok != tc.admitted {
				t.Errorf("%d of 3 requests admitted, want %d", ok, tc.admitted)
			}
		})
	}
}

// TestHostileFieldsNeverReachTheBackend: a body in which a member the gateway acts on is repeated or spelled in
// another case is refused with 400 before any backend sees it. Go engines (encoding/json, the simulator, Ollama)
// match member names case-insensitively, so {"model":"pub-a","MODEL":"other"} passed the allow-list on pub-a
// and was served as other.
func TestHostileFieldsNeverReachTheBackend(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	var hits atomic.Int64
	counted := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		be.ServeHTTP(w, r)
	}))
	t.Cleanup(counted.Close)
	// The key may use pub-a, which the gateway serves as the engine's sim-model.
	snap := snapshotOf(&routing.RoundRobin{}, 0, counted.URL)
	m := snap.Models["sim-model"]
	m.Name, m.Endpoints = "pub-a", AllEndpoints
	snap.Models = map[string]*Model{"pub-a": m}
	snap.ModelNames = []string{"pub-a"}
	gw := startGateway(t, withAdmission(snap, key("team-a", "sk-a", admission.Standard, 0, "pub-a")), Options{})
	auth := map[string]string{"Authorization": "Bearer sk-a"}
	const msgs = `"messages":[{"role":"user","content":"hi"}]`

	// The route works for a plain body.
	if a := post(t, gw.url, `{"model":"pub-a","max_tokens":2,`+msgs+`}`, auth); a.code != http.StatusOK {
		t.Fatalf("a plain request: %d %s", a.code, a.body)
	}
	before := hits.Load()
	for _, tc := range []struct {
		name, path, body, param string
	}{
		{"case-variant model", "/v1/chat/completions", `{"model":"pub-a","MODEL":"other",` + msgs + `}`, "model"},
		{"case-variant model first", "/v1/chat/completions", `{"Model":"other","model":"pub-a",` + msgs + `}`, "model"},
		{"duplicate model", "/v1/chat/completions", `{"model":"other","model":"pub-a",` + msgs + `}`, "model"},
		{"escaped duplicate model", "/v1/chat/completions", `{"model":"pub-a","m\u006fdel":"other",` + msgs + `}`, "model"},
		{"stray Stream", "/v1/chat/completions", `{"model":"pub-a","Stream":false,` + msgs + `}`, "stream"},
		{"Kelvin-sign max_tokens", "/v1/chat/completions", `{"model":"pub-a","max_tokens":1,"max_to\u212aens":4000,` + msgs + `}`, "max_tokens"},
		{"completions", "/v1/completions", `{"model":"pub-a","prompt":"x","MODEL":"other"}`, "model"},
		{"responses", "/v1/responses", `{"model":"pub-a","input":"x","Model":"other"}`, "model"},
		{"pass-through route", "/tokenize", `{"model":"pub-a","prompt":"x","MODEL":"other"}`, "model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, out := rawPost(t, gw.url, tc.path, []byte(tc.body), auth)
			var e struct {
				Error struct {
					Type  string  `json:"type"`
					Param *string `json:"param"`
				} `json:"error"`
			}
			_ = json.Unmarshal(out, &e)
			if resp.StatusCode != http.StatusBadRequest || e.Error.Type != "invalid_request_error" ||
				e.Error.Param == nil || *e.Error.Param != tc.param {
				t.Errorf("%s: %d %s, want 400 invalid_request_error with param %q", tc.body, resp.StatusCode, out, tc.param)
			}
		})
	}
	if n := hits.Load() - before; n != 0 {
		t.Errorf("the backend saw %d of the refused requests", n)
	}
}

// postKey posts a chat request with an API key; unlike post it may run outside the test's goroutine.
func postKey(url, body, secret string) (answer, error) {
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return answer{code: resp.StatusCode, body: string(b), header: resp.Header}, err
}
