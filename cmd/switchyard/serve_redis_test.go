package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/redistest"
	"github.com/switchyard/switchyard/sim"
)

// These tests run two gateway replicas in one process, each the real `switchyard serve` wiring on a policy
// file of its own, in front of the same simulated backends, sharing one real redis-server (SWITCHYARD_TEST_REDIS,
// or one a test starts and kills itself).

// gwReplica is one running `serve`.
type gwReplica struct{ api, admin string }

func startServe(t testing.TB, policy string) gwReplica {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan gwReplica, 1)
	done := make(chan error, 1)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	go func() {
		done <- serve(ctx, path, log, func(api, admin string) { ready <- gwReplica{"http://" + api, "http://" + admin} })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("serve did not stop")
		}
	})
	select {
	case r := <-ready:
		// As a load balancer does: traffic once /readyz says so (after the gateway's first measure of its
		// engines, their seat probes included).
		deadline := time.Now().Add(15 * time.Second)
		for {
			resp, err := http.Get(r.admin + "/readyz")
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return r
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("serve not ready after 15 s: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	case err := <-done:
		t.Fatalf("serve: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not start")
	}
	return gwReplica{}
}

func startSims(t testing.TB, n int, mut func(*sim.Config)) []*sim.Backend {
	t.Helper()
	var bs []*sim.Backend
	for i := range n {
		c := sim.DefaultConfig()
		c.Name = fmt.Sprintf("s%d", i)
		c.ITL = 2 * time.Millisecond
		c.Seed = uint64(i + 1)
		if mut != nil {
			mut(&c)
		}
		b, err := sim.Start(context.Background(), c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		bs = append(bs, b)
	}
	return bs
}

// policyFor writes a policy for the sims, with redis (a YAML value, "" for none) and extra top-level YAML.
func policyFor(sims []*sim.Backend, strategy, redis, extra string) string {
	var b strings.Builder
	b.WriteString("listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nlimits: {drain_timeout: 1s}\n")
	if redis != "" {
		b.WriteString("redis: " + redis + "\n")
	}
	b.WriteString("backends:\n")
	for i, s := range sims {
		fmt.Fprintf(&b, "  - {name: b%d, url: %s, models: [sim-model]}\n", i, s.URL())
	}
	fmt.Fprintf(&b, "models:\n  - {name: sim-model, strategy: %s, retries: 2}\n", strategy)
	b.WriteString("  - name: warm\n    strategy: round_robin\n    targets:\n")
	for i := range sims {
		fmt.Fprintf(&b, "      - {backend: b%d, model: sim-model}\n", i)
	}
	b.WriteString(extra)
	return b.String()
}

func redisValue(t testing.TB, addr string) string {
	// A short breaker cool-down: a test that restarts Redis finds it used again within a fraction of a second.
	return fmt.Sprintf("{url: 'redis://%s/0', key_prefix: '%s', timeout: 250ms, sync_interval: 50ms, breaker_cool_down: 200ms}",
		addr, redistest.Prefix(t))
}

func keyLine(name, secret string, rpm int) string {
	sum := sha256.Sum256([]byte(secret))
	return fmt.Sprintf("  - {name: %s, key: 'sha256:%s', limits: {requests_per_minute: %d}}\n", name, hex.EncodeToString(sum[:]), rpm)
}

type reply struct {
	code    int
	backend string
	header  http.Header
}

func chat(t testing.TB, client *http.Client, base, key, body string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("request: %v", err)
		return reply{}
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return reply{resp.StatusCode, resp.Header.Get("X-Switchyard-Backend"), resp.Header}
}

const smallChat = `{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"hello"}]}`

// TestSharedRateLimitAcrossReplicas: a key limited to N requests per minute gets exactly N across two replicas
// together with Redis, and N per replica (2N) without; the 429s carry Retry-After and x-ratelimit-*.
func TestSharedRateLimitAcrossReplicas(t *testing.T) {
	const n = 20
	sims := startSims(t, 1, nil)
	addr := redistest.Addr(t)
	for _, tc := range []struct {
		name, redis string
		want        int
	}{
		{"redis", redisValue(t, addr), n},
		{"embedded", "", 2 * n},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pol := policyFor(sims, "round_robin", tc.redis, "api_keys:\n"+keyLine("team", "sk-team", n))
			reps := []gwReplica{startServe(t, pol), startServe(t, pol)}
			var mu sync.Mutex
			admitted := 0
			var wg sync.WaitGroup
			for w := range 6 {
				wg.Go(func() {
					for i := range 12 {
						r := chat(t, http.DefaultClient, reps[(w+i)%2].api, "sk-team", smallChat)
						switch r.code {
						case 200:
							mu.Lock()
							admitted++
							mu.Unlock()
							if r.header.Get("x-ratelimit-limit-requests") != strconv.Itoa(n) {
								t.Errorf("admitted without x-ratelimit-limit-requests: %v", r.header)
							}
						case 429:
							ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
							if ra < 1 || ra > 3 || r.header.Get("x-ratelimit-remaining-requests") != "0" ||
								r.header.Get("x-ratelimit-reset-requests") == "" {
								t.Errorf("429 headers: %v", r.header)
							}
						default:
							t.Errorf("status %d", r.code)
						}
					}
				})
			}
			wg.Wait()
			t.Logf("%s: a limit of %d requests/minute admitted %d of 72 across two replicas", tc.name, n, admitted)
			if admitted != tc.want {
				t.Fatalf("admitted %d, want exactly %d", admitted, tc.want)
			}
		})
	}
}

// affinity sends each of several prompt prefixes alternately to the two replicas, several workers at once
// (each with a think time between turns), and returns the share of requests that landed on the backend the
// previous request of the same prefix (sent through the other replica) landed on.
func affinity(t testing.TB, reps []gwReplica) (float64, int) {
	t.Helper()
	// Warm up, as in a fleet that has been running for a while: each replica sends unrelated long prompts to
	// every backend in turn (the "warm" model routes round robin to the same backends), so that every replica has
	// measured every backend's prefill rate. Without it the adaptive router sends every new prefix to the one
	// backend it has measured, which then has to spread its prefixes under load.
	// Every warm-up prompt is new to the backends: one that hit an engine's cache would teach the replica that
	// prefill costs nothing.
	for i := range 8 {
		for j, r := range reps {
			body, _ := json.Marshal(map[string]any{"model": "warm", "max_tokens": 2, "messages": []map[string]string{
				{"role": "user", "content": strings.Repeat(fmt.Sprintf("warm-up %d of replica %d. ", i, j), 150)}}})
			if got := chat(t, http.DefaultClient, r.api, "", string(body)); got.code != 200 {
				t.Fatalf("warm-up: %d", got.code)
			}
		}
	}
	const prefixes, turns = 6, 8
	var same, total atomic.Int64
	var wg sync.WaitGroup
	for p := range prefixes {
		wg.Go(func() {
			system := fmt.Sprintf("You are assistant number %d. ", p) + strings.Repeat(fmt.Sprintf("Rule %d: be precise and kind. ", p), 130)
			// Conversations start 250 ms apart, so that a backend is never busy enough for the router to
			// spread a prefix on purpose (it trades the prefill saved against the queue): what scatters a
			// prefix here is only what one replica does not know about the other's choices.
			time.Sleep(time.Duration(p) * 250 * time.Millisecond)
			prev := ""
			for turn := range turns {
				body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 4, "messages": []map[string]string{
					{"role": "system", "content": system}, {"role": "user", "content": fmt.Sprintf("question %d", turn)}}})
				r := chat(t, http.DefaultClient, reps[(p+turn)%2].api, "", string(body))
				if r.code != 200 {
					t.Errorf("status %d", r.code)
					return
				}
				if prev != "" {
					total.Add(1)
					if r.backend == prev {
						same.Add(1)
					}
				}
				prev = r.backend
				time.Sleep(time.Duration(200+(p*37+turn*53)%60) * time.Millisecond) // a user reading the answer
			}
		})
	}
	wg.Wait()
	return float64(same.Load()) / float64(total.Load()), int(total.Load())
}

// TestPrefixAffinityAcrossReplicas: with Redis, the same prefix sent alternately to two replicas stays on one
// backend at least 90% of the time under cache_aware, the strategy that follows the prefix index alone; the
// figure without Redis (each replica learns alone) is measured and reported. BenchmarkPrefixAffinity measures
// the adaptive strategy too.
func TestPrefixAffinityAcrossReplicas(t *testing.T) {
	alone := measureAffinity(t, "cache_aware", false)
	if shared := measureAffinity(t, "cache_aware", true); shared < 0.9 {
		t.Fatalf("prefix affinity across replicas %.2f with Redis, want >= 0.90 (embedded: %.2f)", shared, alone)
	}
}

// BenchmarkPrefixAffinity reports the share of follow-up requests that land on their prefix's backend across
// two replicas, per strategy, with and without Redis (run with -benchtime=1x; it is a measurement, not a
// speed).
func BenchmarkPrefixAffinity(b *testing.B) {
	for _, strategy := range []string{"cache_aware", "adaptive"} {
		for _, shared := range []bool{false, true} {
			name := strategy + "/embedded"
			if shared {
				name = strategy + "/redis"
			}
			b.Run(name, func(b *testing.B) {
				for range b.N {
					b.ReportMetric(100*measureAffinity(b, strategy, shared), "%same-backend")
				}
			})
		}
	}
}

// measureAffinity runs the affinity workload on two fresh replicas with the strategy, sharing through Redis or
// not, on fresh backends (10,000 prefill tokens/s: the 1,000-token shared prefix is 100 ms of prefill), so
// that no run inherits another's KV caches.
func measureAffinity(tb testing.TB, strategy string, shared bool) float64 {
	redis, mode := "", "embedded"
	if shared {
		redis, mode = redisValue(tb, redistest.Addr(tb)), "redis"
	}
	pol := policyFor(startSims(tb, 4, nil), strategy, redis, "auth: none\n")
	got, n := affinity(tb, []gwReplica{startServe(tb, pol), startServe(tb, pol)})
	tb.Logf("%s, %s: %.0f%% of %d follow-up requests landed on the backend of the previous request of their prefix (sent through the other replica)",
		strategy, mode, 100*got, n)
	return got
}

// debugBackends reads a replica's /debug/backends.
func debugBackends(t *testing.T, r gwReplica) []map[string]any {
	t.Helper()
	resp, err := http.Get(r.admin + "/debug/backends")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSharedBreakerAcrossReplicas: a backend replica A finds dead is out of replica B's rotation within 1 s,
// before B sends it anything.
func TestSharedBreakerAcrossReplicas(t *testing.T) {
	sims := startSims(t, 2, nil)
	pol := policyFor(sims, "round_robin", redisValue(t, redistest.Addr(t)), "auth: none\n")
	a, b := startServe(t, pol), startServe(t, pol)
	resp, err := http.Post(sims[0].URL()+"/sim/control", "application/json", strings.NewReader(`{"down":true}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	healthy := func(r gwReplica, name string) bool {
		for _, be := range debugBackends(t, r) {
			if be["name"] == name {
				return be["healthy"] == true
			}
		}
		t.Fatalf("no backend %s", name)
		return false
	}
	for i := 0; healthy(a, "b0"); i++ {
		if r := chat(t, http.DefaultClient, a.api, "", smallChat); r.code != 200 {
			t.Fatalf("request %d: %d", i, r.code)
		}
		if i > 50 {
			t.Fatal("replica A's breaker did not open")
		}
	}
	opened := time.Now()
	for healthy(b, "b0") {
		if time.Since(opened) > time.Second {
			t.Fatal("replica B still routes to the backend A found dead after 1 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("replica B took the dead backend out %v after replica A's breaker opened", time.Since(opened).Round(time.Millisecond))
	for range 5 {
		if r := chat(t, http.DefaultClient, b.api, "", smallChat); r.code != 200 || r.backend != "b1" {
			t.Fatalf("replica B: status %d from %s", r.code, r.backend)
		}
	}
}

// metricValue sums a counter's samples on a replica's /metrics.
func metricValue(t *testing.T, r gwReplica, name string) float64 {
	t.Helper()
	resp, err := http.Get(r.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, line := range bytes.Split(body, []byte("\n")) {
		if bytes.HasPrefix(line, []byte(name)) {
			f := bytes.Fields(line)
			v, _ := strconv.ParseFloat(string(f[len(f)-1]), 64)
			sum += v
		}
	}
	return sum
}

// TestRedisOutageUnderLoad: redis-server killed with SIGKILL under load costs no client request; the replicas
// count the failures, and once it is restarted on the same port they share again (a fresh 5/minute key admits
// 5 across both replicas, not 5 each).
func TestRedisOutageUnderLoad(t *testing.T) {
	srv := redistest.Start(t)
	sims := startSims(t, 2, nil)
	keys := "api_keys:\n" + keyLine("bulk", "sk-bulk", 1_000_000) + keyLine("probe", "sk-probe", 5)
	pol := policyFor(sims, "adaptive", redisValue(t, srv.Addr()), keys)
	reps := []gwReplica{startServe(t, pol), startServe(t, pol)}

	var ok, failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range 6 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if r := chat(t, client, reps[(w+i)%2].api, "sk-bulk", smallChat); r.code == 200 {
					ok.Add(1)
				} else {
					failed.Add(1)
					t.Errorf("status %d during the Redis outage test", r.code)
				}
			}
		})
	}
	time.Sleep(time.Second)
	before := ok.Load()
	srv.Kill(t)
	killed := time.Now()
	time.Sleep(1500 * time.Millisecond)
	duringOutage := ok.Load() - before
	srv.Restart(t)
	restarted := time.Now()
	t.Logf("redis-server down for %v", time.Since(killed).Round(time.Millisecond))
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	errs := metricValue(t, reps[0], "switchyard_redis_errors_total") + metricValue(t, reps[1], "switchyard_redis_errors_total")
	t.Logf("%d requests answered (%d while Redis was down), %d failed; %v Redis errors counted", ok.Load(), duringOutage, failed.Load(), errs)
	if failed.Load() != 0 || duringOutage == 0 {
		t.Fatalf("%d failed requests, %d answered during the outage", failed.Load(), duringOutage)
	}
	if errs == 0 {
		t.Error("the outage was not counted in switchyard_redis_errors_total")
	}
	// Sharing is back once each replica's Redis breaker has closed: within a cool-down of go-redis dialing
	// again, which it retries once a second after a run of failed dials.
	for _, r := range reps {
		for deadline := time.Now().Add(5 * time.Second); metricValue(t, r, "switchyard_redis_breaker_state") != 0; {
			if time.Now().After(deadline) {
				t.Fatalf("the Redis breaker was still open %v after the restart", time.Since(restarted).Round(time.Millisecond))
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	t.Logf("both Redis breakers closed %v after the restart", time.Since(restarted).Round(time.Millisecond))
	// Sharing is back: 5 per minute across both replicas.
	admitted := 0
	for i := range 10 {
		if r := chat(t, client, reps[i%2].api, "sk-probe", smallChat); r.code == 200 {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("after the restart a 5/minute key admitted %d across two replicas, want 5 (shared again)", admitted)
	}
}
