package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/redistest"
	"github.com/switchyard/switchyard/sim"
)

// blackHole is a "Redis" that accepts connections and never answers, nor closes them: the worst a Redis
// behind a broken proxy or a frozen host can do, since nothing fails fast. It counts what it accepted and how
// many connections were open at once.
type blackHole struct {
	ln       net.Listener
	accepted atomic.Int64
	open     atomic.Int64
	peak     atomic.Int64

	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

// listenBlackHole starts a black hole on addr ("127.0.0.1:0" for any port); it is closed when t ends.
func listenBlackHole(t testing.TB, addr string) *blackHole {
	t.Helper()
	var ln net.Listener
	var err error
	for range 50 { // a port just left by a killed redis-server may linger
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	h := &blackHole{ln: ln}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			h.accepted.Add(1)
			n := h.open.Add(1)
			for p := h.peak.Load(); n > p && !h.peak.CompareAndSwap(p, n); p = h.peak.Load() {
			}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
			h.wg.Add(1)
			go func() { // read and drop what the client sends, until it hangs up
				defer h.wg.Done()
				_, _ = io.Copy(io.Discard, c)
				h.open.Add(-1)
			}()
		}
	}()
	t.Cleanup(h.Close)
	return h
}

func (h *blackHole) Addr() string { return h.ln.Addr().String() }

// Close stops accepting, hangs up every connection and waits for its goroutines.
func (h *blackHole) Close() {
	_ = h.ln.Close()
	h.mu.Lock()
	for _, c := range h.conns {
		_ = c.Close()
	}
	h.conns = nil
	h.mu.Unlock()
	h.wg.Wait()
}

// fastSim makes a simulator answer a two-token request in a few milliseconds, so that a Redis wait stands out.
func fastSim(c *sim.Config) { c.Overhead = time.Millisecond }

// cachedKeyPolicy is a policy whose every request uses Redis on its path twice: the key's rate limit and the
// model's response cache (a temperature-0 request looks its answer up).
func cachedKeyPolicy(sims []*sim.Backend, redis string, keys string) string {
	pol := policyFor(sims, "round_robin", redis, "api_keys:\n"+keys)
	return strings.Replace(pol, "retries: 2}", "retries: 2, response_cache: {}}", 1)
}

const cachedChat = `{"model":"sim-model","max_tokens":2,"temperature":0,"messages":[{"role":"user","content":"hello"}]}`

// TestSilentRedisCostsNoWaitPerRequest: a Redis that accepts connections and never answers makes at most the
// first few requests wait for redis.timeout; once the breaker opens, requests (every one answered from local
// state) no longer wait, and the black hole sees no new connection per request: at most one per probe, never
// more open at once than the pool size.
func TestSilentRedisCostsNoWaitPerRequest(t *testing.T) {
	const (
		timeout  = 100 * time.Millisecond
		pool     = 4
		failures = 5
		coolDown = time.Second
		run      = 3 * time.Second
	)
	hole := listenBlackHole(t, "127.0.0.1:0")
	sims := startSims(t, 1, fastSim)
	redis := fmt.Sprintf("{url: 'redis://%s/0', key_prefix: '%s', timeout: %v, sync_interval: 50ms, pool_size: %d, "+
		"breaker_failures: %d, breaker_cool_down: %v}", hole.Addr(), redistest.Prefix(t), timeout, pool, failures, coolDown)
	rep := startServe(t, cachedKeyPolicy(sims, redis, keyLine("team", "sk-team", 1_000_000)))

	type sample struct {
		lat    time.Duration
		opened bool // the breaker was open (or probing) before the request was sent
	}
	var samples []sample
	var acceptedAtOpen int64 = -1
	var openedAt time.Time
	start := time.Now()
	for time.Since(start) < run {
		opened := metricValue(t, rep, "switchyard_redis_breaker_state") != 0
		if opened && acceptedAtOpen < 0 {
			acceptedAtOpen, openedAt = hole.accepted.Load(), time.Now()
		}
		t0 := time.Now()
		if r := chat(t, http.DefaultClient, rep.api, "sk-team", cachedChat); r.code != 200 {
			t.Fatalf("request %d: status %d", len(samples), r.code)
		}
		samples = append(samples, sample{time.Since(t0), opened})
	}
	if acceptedAtOpen < 0 {
		t.Fatalf("the breaker never opened in %v against a silent Redis", run)
	}
	var before, after []time.Duration
	slow := 0
	for _, s := range samples {
		if s.lat >= timeout {
			slow++
		}
		if s.opened {
			after = append(after, s.lat)
		} else {
			before = append(before, s.lat)
		}
	}
	slowAfter := 0
	for _, l := range after {
		if l >= timeout {
			slowAfter++
		}
	}
	probes := int(time.Since(openedAt)/coolDown) + 1
	accepted, peak := hole.accepted.Load(), hole.peak.Load()
	t.Logf("%d requests in %v: %d before the breaker opened (median %v), %d after (median %v, %d of them waited >= %v: probes)",
		len(samples), run, len(before), median(before), len(after), median(after), slowAfter, timeout)
	t.Logf("black hole: %d connections accepted (%d by the opening, %d after it, at most %d open at once); pool_size %d",
		accepted, acceptedAtOpen, accepted-acceptedAtOpen, peak, pool)
	t.Logf("redis errors counted: %v", metricValue(t, rep, "switchyard_redis_errors_total"))

	// Before the opening a request waits up to twice the timeout (rate limit and cache lookup); the breaker
	// opens after `failures` failed operations, background ones included, so few requests pay.
	if slow > failures+probes+1 {
		t.Errorf("%d requests waited >= %v; want at most the %d failures that open the breaker plus one per probe (%d)",
			slow, timeout, failures, probes)
	}
	if len(after) < 10 {
		t.Fatalf("only %d requests after the opening", len(after))
	}
	if m := median(after); m >= timeout/2 {
		t.Errorf("median latency after the opening %v: requests still wait on Redis", m)
	}
	// go-redis drops a connection whose reply is late (the reply may still come) and frees the pool turn just
	// before it closes the socket, and the black hole sees a close only when its reader goroutine next runs:
	// on 2 loaded cores (the whole suite under -race) two dropped connections were still counted when the pool
	// dialled again. The bound still catches a pool that dials past its size.
	if peak > pool+2 {
		t.Errorf("%d connections open at once, more than pool_size %d (+2 being closed)", peak, pool)
	}
	// Each failed operation costs at most the connection it dropped: the idle two, the streak that opened the
	// breaker, the operations in flight when it opened (at most the pool), one per probe.
	if got := accepted - acceptedAtOpen; got > int64(probes+pool) {
		t.Errorf("%d connections accepted over %d requests after the opening; want at most one per probe (%d) and the %d in flight",
			got, len(after), probes, pool)
	}
	if accepted > int64(2+failures+pool+probes) {
		t.Errorf("%d connections accepted in all; want at most %d", accepted, 2+failures+pool+probes)
	}
	if metricValue(t, rep, "switchyard_redis_errors_total") == 0 {
		t.Error("the failures were not counted in switchyard_redis_errors_total")
	}
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestRedisBreakerClosesWhenRedisAnswers: two replicas whose Redis goes silent open their breakers; once a
// real redis-server answers on the same address their breakers close within a few cool-downs and the state is
// shared again (a fresh 5/minute key admits 5 across both replicas, not 5 each).
func TestRedisBreakerClosesWhenRedisAnswers(t *testing.T) {
	srv := redistest.Start(t)
	srv.Kill(t)
	hole := listenBlackHole(t, srv.Addr())
	sims := startSims(t, 1, fastSim)
	redis := fmt.Sprintf("{url: 'redis://%s/0', key_prefix: '%s', timeout: 50ms, sync_interval: 50ms, breaker_cool_down: 200ms}",
		srv.Addr(), redistest.Prefix(t))
	pol := cachedKeyPolicy(sims, redis, keyLine("bulk", "sk-bulk", 1_000_000)+keyLine("probe", "sk-probe", 5))
	reps := []gwReplica{startServe(t, pol), startServe(t, pol)}

	state := func(r gwReplica) float64 { return metricValue(t, r, "switchyard_redis_breaker_state") }
	waitFor := func(what string, ok func(gwReplica) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for _, r := range reps {
			for !ok(r) {
				if time.Now().After(deadline) {
					t.Fatalf("%s: breaker state %v", what, state(r))
				}
				if c := chat(t, http.DefaultClient, r.api, "sk-bulk", cachedChat); c.code != 200 {
					t.Fatalf("%s: status %d", what, c.code)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	waitFor("silent Redis", func(r gwReplica) bool { return state(r) != 0 })
	hole.Close()
	srv.Restart(t)
	back := time.Now()
	waitFor("Redis back", func(r gwReplica) bool { return state(r) == 0 })
	t.Logf("both breakers closed %v after redis-server answered again", time.Since(back).Round(time.Millisecond))
	admitted := 0
	for i := range 10 {
		if r := chat(t, http.DefaultClient, reps[i%2].api, "sk-probe", cachedChat); r.code == 200 {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("after Redis came back a 5/minute key admitted %d across two replicas, want 5 (shared again)", admitted)
	}
	// The response cache is shared again too: the other replica finds the answer the first one kept.
	body := `{"model":"sim-model","max_tokens":2,"temperature":0,"messages":[{"role":"user","content":"shared again"}]}`
	if r := chat(t, http.DefaultClient, reps[0].api, "sk-bulk", body); r.header.Get("X-Switchyard-Cache") != "miss" {
		t.Fatalf("first lookup: %q", r.header.Get("X-Switchyard-Cache"))
	}
	deadline := time.Now().Add(5 * time.Second)
	for chat(t, http.DefaultClient, reps[1].api, "sk-bulk", body).header.Get("X-Switchyard-Cache") != "hit" {
		if time.Now().After(deadline) {
			t.Fatal("the other replica never found the answer in the shared response cache")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
