package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// control posts body to b's /sim/control and returns the status and the decoded state.
func control(t *testing.T, b *Backend, body string) (int, faultsJSON) {
	t.Helper()
	resp := post(t.Context(), t, b.URL()+"/sim/control", []byte(body))
	defer resp.Body.Close()
	var f faultsJSON
	if resp.StatusCode == http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&f); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, f
}

func getControl(t *testing.T, b *Backend) faultsJSON {
	t.Helper()
	resp, err := http.Get(b.URL() + "/sim/control")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var f faultsJSON
	if err := json.NewDecoder(resp.Body).Decode(&f); err != nil {
		t.Fatal(err)
	}
	return f
}

// ttftOf streams a chat request and returns the time to its first content chunk and its status.
func ttftOf(t *testing.T, b *Backend, content string, maxTokens int) (time.Duration, int) {
	t.Helper()
	start := time.Now()
	resp := post(t.Context(), t, b.URL()+"/v1/chat/completions", chatBody(t, content, maxTokens, true, false))
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, resp.StatusCode
	}
	events, err := readEvents(resp.Body)
	if err != nil || len(events) < 2 {
		t.Fatalf("stream: %d events, %v", len(events), err)
	}
	return events[1].at.Sub(start), resp.StatusCode
}

func TestControlState(t *testing.T) {
	b := startBackend(t, func(c *Config) { fastConfig(c); c.FailRate = 0.25 })
	base := getControl(t, b)
	if base.Slowdown != 1 || base.FailRate != 0.25 || base.Stall != "0s" || base.Down || base.StartedAt == "" {
		t.Errorf("baseline = %+v, want slowdown 1, the configured fail_rate, no stall, up", base)
	}
	code, f := control(t, b, `{"slowdown":3,"fail_rate":0.2,"stall":"5s"}`)
	if code != 200 || f.Slowdown != 3 || f.FailRate != 0.2 || f.Stall != "5s" || f.Down {
		t.Errorf("after setting: %d %+v", code, f)
	}
	if got := b.Faults(); got.Slowdown != 3 || got.Stall != 5*time.Second {
		t.Errorf("Faults() = %+v", got)
	}
	// A POST replaces the whole state: fields left out return to the baseline.
	if _, f := control(t, b, `{"stall":"1s"}`); f.Slowdown != 1 || f.FailRate != 0.25 || f.Stall != "1s" {
		t.Errorf("after a partial POST: %+v, want the other fields at their baseline", f)
	}
	if _, f := control(t, b, `{}`); f != base {
		t.Errorf("after {}: %+v, want the baseline %+v", f, base)
	}
	for _, bad := range []string{
		`{"slowdonw":3}`, `{"slowdown":0}`, `{"slowdown":-1}`, `{"fail_rate":1.5}`, `{"stall":"soon"}`,
		`{"stall":"-1s"}`, `{"down":"yes"}`, `{} {}`, `[1]`, ``,
	} {
		if code, _ := control(t, b, bad); code != http.StatusBadRequest {
			t.Errorf("POST %s: %d, want 400", bad, code)
		}
	}
	if got := getControl(t, b); got != base {
		t.Errorf("a rejected POST changed the state: %+v", got)
	}
	if err := b.SetFaults(Faults{Slowdown: 0}); err == nil {
		t.Error("SetFaults accepted slowdown 0")
	}
}

// engineTTFT runs one streamed request and returns the client's TTFT and the engine's own TTFT for it (from
// vllm:time_to_first_token_seconds_sum, on the model's schedule, so exact even on a loaded machine).
func engineTTFT(t *testing.T, b *Backend, content string) (client, engine time.Duration) {
	t.Helper()
	before := scrape(t, b, "vllm:time_to_first_token_seconds_sum")
	client, code := ttftOf(t, b, content, 2)
	if code != 200 {
		t.Fatalf("status %d", code)
	}
	after := scrape(t, b, "vllm:time_to_first_token_seconds_sum")
	return client, time.Duration((after - before) * 1e9).Round(time.Microsecond)
}

func TestControlSlowdown(t *testing.T) {
	b := startBackend(t, nil) // 1,000-token prompt: 10ms + 100ms, or 10ms + 300ms at slowdown 3
	content := strings.Repeat("b", 4000-len("user:\n"))
	control(t, b, `{"slowdown":3}`)
	client, engine := engineTTFT(t, b, content)
	if client < 300*time.Millisecond || engine != 310*time.Millisecond {
		t.Errorf("TTFT at slowdown 3: client %v, engine %v; want about 310ms, exactly 310ms", client, engine)
	}
	control(t, b, `{}`)
	if _, engine := engineTTFT(t, b, strings.Repeat("c", len(content))); engine != 110*time.Millisecond {
		t.Errorf("engine TTFT after reset = %v, want 110ms", engine)
	}
}

func TestControlStall(t *testing.T) {
	b := startBackend(t, fastConfig)
	control(t, b, `{"stall":"300ms"}`)
	client, engine := engineTTFT(t, b, "stalled")
	if client < 300*time.Millisecond || engine < 300*time.Millisecond || engine > 310*time.Millisecond {
		t.Errorf("TTFT with a 300ms stall: client %v, engine %v", client, engine)
	}
	control(t, b, `{}`)
	if _, engine := engineTTFT(t, b, "not stalled"); engine > 10*time.Millisecond {
		t.Errorf("engine TTFT after reset = %v", engine)
	}
}

func TestControlFailRate(t *testing.T) {
	b := startBackend(t, func(c *Config) { fastConfig(c); c.FailRate = 1 })
	resp := post(t.Context(), t, b.URL()+"/v1/chat/completions", chatBody(t, "fail", 3, true, false))
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 500 || !strings.Contains(string(body), `"type":"InternalServerError"`) ||
		!strings.Contains(string(body), `"code":500`) || strings.Contains(string(body), "data:") {
		t.Errorf("configured fail_rate 1: %d %s, want a 500 error body before any token", resp.StatusCode, body)
	}
	control(t, b, `{"fail_rate":0}`)
	if _, code := ttftOf(t, b, "ok", 2); code != 200 {
		t.Errorf("fail_rate 0: status %d", code)
	}
	// A share: about 20% of 200 requests fail (the draw is seeded, so this count is stable).
	control(t, b, `{"fail_rate":0.2}`)
	failed := 0
	for range 200 {
		resp := post(t.Context(), t, b.URL()+"/v1/completions", []byte(`{"prompt":"x","max_tokens":1}`))
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == 500 {
			failed++
		}
	}
	if failed < 20 || failed > 60 {
		t.Errorf("%d of 200 failed at fail_rate 0.2", failed)
	}
	control(t, b, `{}`)
	if _, code := ttftOf(t, b, "back to the baseline", 2); code != 500 {
		t.Errorf("after {}: status %d, want 500 (the configured fail_rate 1)", code)
	}
}

func TestControlDown(t *testing.T) {
	b := startBackend(t, func(c *Config) { c.ITL = 5 * time.Millisecond })
	resp := post(t.Context(), t, b.URL()+"/v1/chat/completions", chatBody(t, "a long one", 2000, true, false))
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if code, f := control(t, b, `{"down":true}`); code != 200 || !f.Down {
		t.Fatalf("going down: %d %+v", code, f)
	}
	rest, err := io.ReadAll(r)
	if err == nil || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("the running stream ended with %v, want an abrupt close (unexpected EOF)", err)
	}
	if strings.Contains(string(rest), "[DONE]") {
		t.Error("a dropped stream sent [DONE]")
	}
	for _, path := range []string{"/health", "/v1/models"} {
		resp, err := http.Get(b.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Errorf("%s while down: %d, want 503", path, resp.StatusCode)
		}
	}
	if _, code := ttftOf(t, b, "refused", 2); code != 503 {
		t.Errorf("new request while down: %d, want 503", code)
	}
	if got := scrape(t, b, "vllm:num_requests_running"); got != -1 {
		t.Errorf("/metrics answered while down")
	}
	control(t, b, `{}`)
	if _, code := ttftOf(t, b, "back up", 2); code != 200 {
		t.Errorf("after {}: %d, want 200", code)
	}
}

func TestControlRestart(t *testing.T) {
	b := startBackend(t, fastConfig)
	content := strings.Repeat("restart me please. ", 50)
	send := func() (cached int, status int) { return cachedTokens(t, b, content) }
	send()
	if cached, _ := send(); cached == 0 {
		t.Fatal("the repeated request found nothing cached")
	}
	started := scrape(t, b, "process_start_time_seconds")
	before := getControl(t, b).StartedAt
	time.Sleep(10 * time.Millisecond)
	if code, _ := control(t, b, `{"restart":true}`); code != 200 {
		t.Fatalf("restart: %d", code)
	}
	if got := scrape(t, b, "process_start_time_seconds"); got <= started {
		t.Errorf("process_start_time_seconds %v after restart, want later than %v", got, started)
	}
	if getControl(t, b).StartedAt == before {
		t.Error("started_at did not change")
	}
	if got := scrape(t, b, "vllm:generation_tokens_total"); got != 0 {
		t.Errorf("generation_tokens_total after restart = %v, want 0 (a new process)", got)
	}
	if cached, code := send(); code != 200 || cached != 0 {
		t.Errorf("after restart: %d, cached %d; want the cache wiped", code, cached)
	}
}

// TestControlEvictCache: evict_cache drops the cached prefixes and nothing else: the next request prefills
// again, and the engine has not restarted.
func TestControlEvictCache(t *testing.T) {
	b := startBackend(t, fastConfig)
	content := strings.Repeat("evict me please. ", 50)
	send := func() int {
		cached, _ := cachedTokens(t, b, content)
		return cached
	}
	send()
	if send() == 0 {
		t.Fatal("the repeated request found nothing cached")
	}
	started := scrape(t, b, "process_start_time_seconds")
	generated := scrape(t, b, "vllm:generation_tokens_total")
	if code, _ := control(t, b, `{"evict_cache":true}`); code != 200 {
		t.Fatalf("evict_cache: %d", code)
	}
	if cached := send(); cached != 0 {
		t.Errorf("after evict_cache: %d tokens cached, want 0", cached)
	}
	if send() == 0 {
		t.Error("the prefix was not cached again after the eviction")
	}
	if got := scrape(t, b, "process_start_time_seconds"); got != started {
		t.Errorf("process_start_time_seconds %v, want %v: evicting is not a restart", got, started)
	}
	if got := scrape(t, b, "vllm:generation_tokens_total"); got < generated {
		t.Errorf("generation_tokens_total fell from %v to %v: evicting is not a restart", generated, got)
	}
}

// TestControlStallRate: with stall_rate, only that share of new requests is stalled (a heavy TTFT tail).
func TestControlStallRate(t *testing.T) {
	b := startBackend(t, fastConfig)
	if code, f := control(t, b, `{"stall":"200ms","stall_rate":0.25}`); code != 200 || f.StallRate != 0.25 {
		t.Fatalf("control: %d %+v", code, f)
	}
	stalled := 0
	const n = 40
	for i := range n {
		if ttft, _ := ttftOf(t, b, "tail "+strings.Repeat("x", i), 1); ttft >= 200*time.Millisecond {
			stalled++
		}
	}
	if stalled < 3 || stalled > 20 {
		t.Errorf("%d of %d requests stalled at stall_rate 0.25", stalled, n)
	}
	if code, _ := control(t, b, `{"stall_rate":1.5}`); code != 400 {
		t.Errorf("stall_rate 1.5 accepted (%d)", code)
	}
}

// cachedTokens sends a two-token non-streaming chat request with content and returns the usage's cached_tokens
// and the status.
func cachedTokens(t *testing.T, b *Backend, content string) (int, int) {
	t.Helper()
	resp := post(t.Context(), t, b.URL()+"/v1/chat/completions", chatBody(t, content, 2, false, false))
	defer resp.Body.Close()
	var r struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&r)
	return r.Usage.PromptTokensDetails.CachedTokens, resp.StatusCode
}
