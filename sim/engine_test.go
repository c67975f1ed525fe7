package sim

import (
	"bytes"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// vclock is a virtual clock: the harness moves it from event to event.
type vclock struct{ t time.Time }

func (c *vclock) Now() time.Time { return c.t }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// harness drives an engine on a virtual clock, event by event (exactly as the real loop would, minus the
// sleeping), and records when each tracked sequence got each token.
type harness struct {
	t     *testing.T
	clk   *vclock
	e     *engine
	seqs  []*seq
	times map[*seq][]time.Duration
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	clk := &vclock{t: t0}
	return &harness{t: t, clk: clk, e: newEngine(cfg, clk), times: make(map[*seq][]time.Duration)}
}

// submit runs the engine until at, then submits a request with the given prompt tokens.
func (h *harness) submit(at time.Duration, promptTokens, maxTokens int, hashes []uint64) *seq {
	h.t.Helper()
	h.runUntil(at)
	s := newSeq(promptTokens, maxTokens, hashes)
	if err := h.e.submit(s); err != nil {
		h.t.Fatal(err)
	}
	h.seqs = append(h.seqs, s)
	return s
}

// runUntil processes every event up to and including t0+d.
func (h *harness) runUntil(d time.Duration) {
	target := t0.Add(d)
	for {
		h.e.mu.Lock()
		next, busy := h.e.nextEvent(h.clk.t)
		if !busy || next.After(target) {
			h.clk.t = target
			h.e.advance(target)
			h.e.mu.Unlock()
			h.record()
			return
		}
		if next.After(h.clk.t) {
			h.clk.t = next
		}
		h.e.advance(h.clk.t)
		h.e.mu.Unlock()
		h.record()
	}
}

// runIdle runs until the engine has nothing left to do (bounded, so a bug cannot hang the test).
func (h *harness) runIdle() {
	h.t.Helper()
	for range 1_000_000 {
		h.e.mu.Lock()
		next, busy := h.e.nextEvent(h.clk.t)
		h.e.mu.Unlock()
		if !busy {
			return
		}
		h.runUntil(next.Sub(t0))
	}
	h.t.Fatal("engine never went idle")
}

func (h *harness) record() {
	for _, s := range h.seqs {
		for n := int(s.emitted.Load()); len(h.times[s]) < n; {
			h.times[s] = append(h.times[s], h.clk.t.Sub(t0))
		}
	}
}

// ttft is the time from submission to the first token.
func (h *harness) ttft(s *seq) time.Duration {
	h.t.Helper()
	if len(h.times[s]) == 0 {
		h.t.Fatal("no first token")
	}
	return h.times[s][0] - s.arrival.Sub(t0)
}

func within(got, want time.Duration, frac float64) bool {
	return math.Abs(float64(got-want)) <= frac*float64(want)
}

func metricValue(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var pb dto.Metric
	if err := c.Write(&pb); err != nil {
		t.Fatal(err)
	}
	switch {
	case pb.Gauge != nil:
		return pb.Gauge.GetValue()
	case pb.Counter != nil:
		return pb.Counter.GetValue()
	case pb.Histogram != nil:
		return float64(pb.Histogram.GetSampleCount())
	}
	t.Fatal("unknown metric type")
	return 0
}

// prompt returns n bytes of text made of prefix repeated (so tests can build shared prefixes).
func promptBytes(prefix string, n int) []byte {
	return bytes.Repeat([]byte(prefix), n/len(prefix)+1)[:n]
}

func TestEngineLoneRequest(t *testing.T) {
	// The worked example: a 1,000-token prompt at 10,000 tokens/s and 20 ms per token, max_tokens 500.
	h := newHarness(t, DefaultConfig())
	s := h.submit(0, 1000, 500, nil)
	h.runIdle()
	if got := len(h.times[s]); got != 500 {
		t.Fatalf("got %d tokens, want 500", got)
	}
	first, last := h.times[s][0], h.times[s][499]
	if !within(first, 110*time.Millisecond, 0.02) {
		t.Errorf("first token at %v, want about 110ms", first)
	}
	if !within(last, 10100*time.Millisecond, 0.02) {
		t.Errorf("last token at %v, want about 10.1s", last)
	}
	// The model is exact: 10ms overhead + 100ms prefill, then 499 steps of 20ms.
	if first != 110*time.Millisecond || last != 10090*time.Millisecond {
		t.Errorf("first, last = %v, %v; want exactly 110ms, 10.09s", first, last)
	}
	if s.end.Load() != endLength || s.state != stateDone {
		t.Errorf("end = %d, state = %d; want length, done", s.end.Load(), s.state)
	}
	if got := metricValue(t, h.e.m.success[reasonLength]); got != 1 {
		t.Errorf("request_success_total{length} = %v, want 1", got)
	}
	if got := metricValue(t, h.e.m.genToken); got != 500 {
		t.Errorf("generation_tokens_total = %v, want 500", got)
	}
	if got := metricValue(t, h.e.m.itl); got != 499 {
		t.Errorf("inter_token_latency observations = %v, want 499", got)
	}
	if got := metricValue(t, h.e.m.kvUsage); got != 0 {
		t.Errorf("kv usage after the request = %v, want 0", got)
	}
}

func TestEngineTTFTGrowsWithQueuedPrefill(t *testing.T) {
	// A 1,000-token probe submitted together with requests holding queued prefill ahead of it. Expected values
	// follow the step rule by hand (budget 4096 tokens per step; a decoding sequence adds 20ms + 0.1ms each):
	tests := []struct {
		name   string
		ahead  []int // prompt tokens of the requests queued before the probe
		want   time.Duration
		stepsy string
	}{
		{"nothing ahead", nil, 110 * time.Millisecond, "10ms overhead + 1000/10000 s"},
		{"2000 ahead", []int{2000}, 310 * time.Millisecond, "one step of 3000 prefill tokens"},
		{"4000 ahead", []int{4000}, 530 * time.Millisecond,
			"step of 4096 (409.6ms), then A decodes while the probe's 904 finish (90.4+20ms)"},
		{"8000 ahead", []int{4000, 4000}, 950100 * time.Microsecond,
			"409.6ms; then 4095 prefill + 1 decode (429.5ms); then 809 prefill + 2 decoding (101ms)"},
	}
	var prev time.Duration
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, DefaultConfig())
			for _, p := range tc.ahead {
				h.submit(0, p, 1000, nil)
			}
			probe := h.submit(0, 1000, 10, nil)
			h.runUntil(5 * time.Second)
			got := h.ttft(probe)
			if got != tc.want {
				t.Errorf("TTFT = %v, want %v (%s)", got, tc.want, tc.stepsy)
			}
			if got <= prev {
				t.Errorf("TTFT %v did not grow over %v with more queued prefill", got, prev)
			}
			prev = got
		})
	}
}

func TestEngineITLGrowsWithBatch(t *testing.T) {
	tests := []struct {
		seqs int
		want time.Duration
	}{
		{1, 20 * time.Millisecond},
		{10, 20*time.Millisecond + 9*100*time.Microsecond},
		{100, 20*time.Millisecond + 99*100*time.Microsecond},
		{256, 20*time.Millisecond + 255*100*time.Microsecond},
	}
	var prev time.Duration
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.seqs), func(t *testing.T) {
			h := newHarness(t, DefaultConfig())
			for range tc.seqs {
				h.submit(0, 16, 40, nil)
			}
			h.runIdle()
			for _, s := range h.seqs {
				times := h.times[s]
				if len(times) != 40 {
					t.Fatalf("got %d tokens, want 40", len(times))
				}
				// Every sequence was admitted in the first step, so every later step is a pure decode step.
				for i := 1; i < len(times); i++ {
					if gap := times[i] - times[i-1]; gap != tc.want {
						t.Fatalf("gap %d = %v, want %v", i, gap, tc.want)
					}
				}
			}
			if tc.want <= prev {
				t.Errorf("ITL %v did not grow over %v", tc.want, prev)
			}
			prev = tc.want
		})
	}
}

func TestEnginePrefillStretchesDecodeSteps(t *testing.T) {
	// A decoding sequence shares its step with a newcomer's 2,000-token prefill: that step lasts 200ms + 20ms.
	h := newHarness(t, DefaultConfig())
	a := h.submit(0, 16, 100, nil)
	h.runUntil(time.Second)
	h.submit(time.Second, 2000, 1, nil)
	h.runIdle()
	var longest time.Duration
	for i := 1; i < len(h.times[a]); i++ {
		longest = max(longest, h.times[a][i]-h.times[a][i-1])
	}
	if want := 220 * time.Millisecond; longest != want {
		t.Errorf("longest gap = %v, want %v", longest, want)
	}
}

func TestEnginePrefixCache(t *testing.T) {
	// A first request fills the cache with a 4,000-token (16,000-byte) prefix; the second shares it.
	shared := promptBytes("The quick brown fox jumps over the lazy dog. ", 16000)
	tests := []struct {
		name       string
		second     []byte
		wantCached int
		wantTTFT   time.Duration
	}{
		{"4000 cached, 100 new", append(bytes.Clone(shared), promptBytes("tail ", 400)...), 4000,
			10*time.Millisecond + 10*time.Millisecond},
		{"identical prompt recomputes its last block", bytes.Clone(shared), 3984,
			10*time.Millisecond + 1600*time.Microsecond},
		{"different prefix", promptBytes("Another story entirely, no sharing. ", 16000), 0,
			10*time.Millisecond + 400*time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, DefaultConfig())
			first := h.submit(0, len(shared)/4, 5, AppendBlockHashes(nil, shared))
			h.runIdle()
			if first.cachedTokens() != 0 {
				t.Fatalf("first request cached %d tokens, want 0", first.cachedTokens())
			}
			second := h.submit(10*time.Second, (len(tc.second)+3)/4, 5, AppendBlockHashes(nil, tc.second))
			h.runIdle()
			if got := second.cachedTokens(); got != tc.wantCached {
				t.Errorf("cached tokens = %d, want %d", got, tc.wantCached)
			}
			if got := h.ttft(second); got != tc.wantTTFT {
				t.Errorf("TTFT = %v, want %v (prefill of the uncached rest only)", got, tc.wantTTFT)
			}
			if got := metricValue(t, h.e.m.prefixHits); got != float64(tc.wantCached) {
				t.Errorf("prefix_cache_hits_total = %v, want %d", got, tc.wantCached)
			}
			wantQueries := float64(len(shared)/4 + (len(tc.second)+3)/4)
			if got := metricValue(t, h.e.m.prefixQueries); got != wantQueries {
				t.Errorf("prefix_cache_queries_total = %v, want %v", got, wantQueries)
			}
		})
	}
}

func TestEngineSharesPrefixWhileRunning(t *testing.T) {
	// The second request arrives while the first is still decoding: its computed prompt blocks are already
	// cached, and held by both.
	shared := promptBytes("system prompt: be brief. ", 6400) // 100 blocks
	h := newHarness(t, DefaultConfig())
	h.submit(0, 1600, 1000, AppendBlockHashes(nil, shared))
	h.runUntil(time.Second)
	usedBefore := h.e.pool.size() - h.e.pool.free
	p2 := append(bytes.Clone(shared), promptBytes("question ", 64)...)
	b := h.submit(time.Second, len(p2)/4, 1000, AppendBlockHashes(nil, p2))
	h.runUntil(1100 * time.Millisecond)
	if b.cachedTokens() != 1600 {
		t.Errorf("cached = %d, want 1600", b.cachedTokens())
	}
	// b holds the 100 shared blocks plus its own: 1 for its tail, maybe 1 more as a's and b's output grow.
	own := h.e.pool.size() - h.e.pool.free - usedBefore
	if own > 3 {
		t.Errorf("second request took %d new blocks; the shared prefix should not be copied", own)
	}
}

func TestEngineLRUEviction(t *testing.T) {
	// 300 blocks: each 100-block prompt fits, three fill the cache, a fourth evicts the least recently used.
	cfg := DefaultConfig()
	cfg.KVBlocks = 300
	h := newHarness(t, cfg)
	prompts := make([][]byte, 4)
	for i := range prompts {
		prompts[i] = promptBytes(fmt.Sprintf("document %d says hello. ", i), 6400)
	}
	run := func(at time.Duration, i int) *seq {
		s := h.submit(at, 1600, 1, AppendBlockHashes(nil, prompts[i]))
		h.runIdle()
		return s
	}
	run(0, 0)
	run(time.Second, 1)
	run(2*time.Second, 2)
	run(3*time.Second, 0) // touch 0: now 1 is the least recently used
	run(4*time.Second, 3) // needs 100 blocks: evicts prompt 1's
	if s := run(5*time.Second, 0); s.cachedTokens() != 1584 {
		t.Errorf("prompt 0 cached %d tokens, want 1584 (recently used, kept)", s.cachedTokens())
	}
	if s := run(6*time.Second, 1); s.cachedTokens() >= 1584 {
		t.Errorf("prompt 1 cached %d tokens, want it evicted (least recently used)", s.cachedTokens())
	}
}

func TestEngineWaitsForSeqSlotsAndBlocks(t *testing.T) {
	t.Run("max_num_seqs", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.MaxNumSeqs = 2
		h := newHarness(t, cfg)
		a := h.submit(0, 100, 10, nil)
		h.submit(0, 100, 10, nil)
		c := h.submit(0, 100, 10, nil)
		h.runUntil(50 * time.Millisecond)
		if got := metricValue(t, h.e.m.running); got != 2 {
			t.Errorf("running = %v, want 2", got)
		}
		if got := metricValue(t, h.e.m.waiting); got != 1 {
			t.Errorf("waiting = %v, want 1", got)
		}
		h.runIdle()
		if h.times[c][0] <= h.times[a][9] {
			t.Errorf("third request's first token at %v, before a slot was free at %v", h.times[c][0], h.times[a][9])
		}
	})
	t.Run("kv blocks", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.KVBlocks = 20
		h := newHarness(t, cfg)
		a := h.submit(0, 240, 10, nil) // 15 blocks, 16 by its end
		d := h.submit(0, 160, 10, nil) // 10 blocks: waits until a frees its blocks
		h.runUntil(200 * time.Millisecond)
		if got := metricValue(t, h.e.m.waiting); got != 1 {
			t.Errorf("waiting = %v, want 1 (out of KV blocks)", got)
		}
		h.runIdle()
		if h.times[d][0] <= h.times[a][9] {
			t.Errorf("second request's first token at %v, before the first freed its blocks at %v", h.times[d][0], h.times[a][9])
		}
		if got := metricValue(t, h.e.m.preemptions); got != 0 {
			t.Errorf("preemptions = %v, want 0: a new request waits, it does not preempt", got)
		}
		if len(h.times[d]) != 10 {
			t.Errorf("second request got %d tokens, want 10", len(h.times[d]))
		}
	})
}

func TestEnginePreemption(t *testing.T) {
	// 12 blocks; two 64-token prompts (4 blocks each) decoding 100 tokens each need 11 blocks apiece: the newer
	// one is preempted (recompute) when the older needs a block, and both still finish with every token.
	cfg := DefaultConfig()
	cfg.KVBlocks = 12
	h := newHarness(t, cfg)
	a := h.submit(0, 64, 100, nil)
	b := h.submit(0, 64, 100, nil)
	h.runIdle()
	if got := metricValue(t, h.e.m.preemptions); got < 1 {
		t.Fatalf("num_preemptions_total = %v, want >= 1", got)
	}
	for name, s := range map[string]*seq{"older": a, "newer": b} {
		if len(h.times[s]) != 100 || s.end.Load() != endLength {
			t.Errorf("%s: %d tokens, end %d; want 100, length", name, len(h.times[s]), s.end.Load())
		}
	}
	// The older sequence was never preempted: its gaps stay one step long (20ms, or 20.1ms while both decode).
	for i := 1; i < len(h.times[a]); i++ {
		if gap := h.times[a][i] - h.times[a][i-1]; gap > 21*time.Millisecond {
			t.Errorf("older sequence's gap %d = %v: it should not have been preempted", i, gap)
		}
	}
	// The newer one stalled while it waited and recomputed.
	var longest time.Duration
	for i := 1; i < len(h.times[b]); i++ {
		longest = max(longest, h.times[b][i]-h.times[b][i-1])
	}
	if longest < 100*time.Millisecond {
		t.Errorf("newer sequence's longest gap = %v, want a preemption stall", longest)
	}
	if h.e.pool.free != h.e.pool.size() {
		t.Errorf("%d blocks still held after both finished", h.e.pool.size()-h.e.pool.free)
	}
}

func TestEngineAbort(t *testing.T) {
	tests := []struct {
		name  string
		state int
		at    time.Duration
	}{
		{"pending (in overhead)", statePending, 5 * time.Millisecond},
		{"waiting (no slot)", stateWaiting, 50 * time.Millisecond},
		{"running (prefilling)", stateRunning, 15 * time.Millisecond},
		{"running (decoding)", stateRunning, 500 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxNumSeqs = 1
			h := newHarness(t, cfg)
			first := h.submit(0, 1000, 100, nil)
			victim := first
			if tc.state != stateRunning {
				victim = h.submit(0, 1000, 100, nil)
			}
			h.runUntil(tc.at)
			if victim.state != tc.state {
				t.Fatalf("victim state = %d at %v, want %d", victim.state, tc.at, tc.state)
			}
			waitingBefore, pendingBefore := metricValue(t, h.e.m.waiting), metricValue(t, h.e.m.pending)
			h.e.abort(victim)
			if victim.end.Load() != endAbort || victim.state != stateDone {
				t.Errorf("end %d state %d, want abort, done", victim.end.Load(), victim.state)
			}
			if got := metricValue(t, h.e.m.success[reasonAbort]); got != 1 {
				t.Errorf("request_success_total{abort} = %v, want 1", got)
			}
			if tc.state == stateRunning {
				if got := metricValue(t, h.e.m.running); got != 0 {
					t.Errorf("running = %v right after the abort, want 0", got)
				}
				if got := metricValue(t, h.e.m.kvUsage); got != 0 {
					t.Errorf("kv usage = %v right after the abort, want 0", got)
				}
			} else if want := waitingBefore - boolTo(tc.state == stateWaiting); metricValue(t, h.e.m.waiting) != want {
				// A pending request (still in its overhead) is not in the scheduler's queue: not counted waiting.
				t.Errorf("waiting = %v right after the abort, want %v", metricValue(t, h.e.m.waiting), want)
			} else if want := pendingBefore - boolTo(tc.state == statePending); metricValue(t, h.e.m.pending) != want {
				t.Errorf("sim_requests_pending = %v right after the abort, want %v", metricValue(t, h.e.m.pending), want)
			}
			h.runIdle()
			if n := victim.emitted.Load(); tc.state != stateRunning && n != 0 {
				t.Errorf("aborted request got %d tokens", n)
			}
			if tc.state != stateRunning && len(h.times[first]) != 100 {
				t.Errorf("the other request got %d tokens, want 100", len(h.times[first]))
			}
			if h.e.pool.free != h.e.pool.size() {
				t.Errorf("%d blocks still held", h.e.pool.size()-h.e.pool.free)
			}
		})
	}
}

func TestEngineFaults(t *testing.T) {
	t.Run("slowdown", func(t *testing.T) {
		h := newHarness(t, DefaultConfig())
		h.e.setFaults(Faults{Slowdown: 3, FailRate: 0})
		s := h.submit(0, 1000, 3, nil)
		h.runIdle()
		want := []time.Duration{310 * time.Millisecond, 370 * time.Millisecond, 430 * time.Millisecond}
		for i, w := range want {
			if h.times[s][i] != w {
				t.Errorf("token %d at %v, want %v", i, h.times[s][i], w)
			}
		}
	})
	t.Run("stall", func(t *testing.T) {
		h := newHarness(t, DefaultConfig())
		h.e.setFaults(Faults{Slowdown: 1, Stall: 5 * time.Second})
		s := h.submit(0, 1000, 2, nil)
		h.runIdle()
		if got, want := h.ttft(s), 5110*time.Millisecond; got != want {
			t.Errorf("TTFT = %v, want %v", got, want)
		}
		if gap := h.times[s][1] - h.times[s][0]; gap != 20*time.Millisecond {
			t.Errorf("ITL = %v, want 20ms: a stall holds first tokens only", gap)
		}
	})
	t.Run("down kills every sequence and refuses new ones", func(t *testing.T) {
		h := newHarness(t, DefaultConfig())
		a := h.submit(0, 100, 100, nil)
		h.runUntil(time.Second)
		h.e.setFaults(Faults{Slowdown: 1, Down: true})
		if a.end.Load() != endKilled {
			t.Errorf("running sequence end = %d, want killed", a.end.Load())
		}
		if err := h.e.submit(newSeq(10, 10, nil)); err != errDown {
			t.Errorf("submit while down: %v, want errDown", err)
		}
		h.e.setFaults(Faults{Slowdown: 1})
		b := h.submit(2*time.Second, 100, 2, nil)
		h.runIdle()
		if len(h.times[b]) != 2 {
			t.Errorf("after coming back up a request got %d tokens, want 2", len(h.times[b]))
		}
	})
	t.Run("restart wipes the cache and the metrics", func(t *testing.T) {
		p := promptBytes("restart me. ", 6400)
		h := newHarness(t, DefaultConfig())
		h.submit(0, 1600, 2, AppendBlockHashes(nil, p))
		h.runIdle()
		h.runUntil(time.Minute)
		h.e.restart()
		if !h.e.startTime().Equal(t0.Add(time.Minute)) {
			t.Errorf("start time = %v, want the restart time", h.e.startTime())
		}
		if got := metricValue(t, h.e.m.success[reasonLength]); got != 0 {
			t.Errorf("success counter after restart = %v, want 0", got)
		}
		s := h.submit(2*time.Minute, 1600, 2, AppendBlockHashes(nil, p))
		h.runIdle()
		if s.cachedTokens() != 0 {
			t.Errorf("cached tokens after restart = %d, want 0", s.cachedTokens())
		}
	})
}

// BenchmarkEngineStep is the engine's cost per continuous-batching step with a full batch of 256 decoding
// sequences (ending the step, emitting and waking 256 tokens, scheduling the next): it must not allocate.
func BenchmarkEngineStep(b *testing.B) {
	clk := &vclock{t: t0}
	e := newEngine(DefaultConfig(), clk)
	seqs := make([]*seq, 256)
	for i := range seqs {
		seqs[i] = newSeq(16, 1<<30, nil)
		if err := e.submit(seqs[i]); err != nil {
			b.Fatal(err)
		}
	}
	step := func() {
		next, busy := e.nextEvent(clk.t)
		if !busy {
			b.Fatal("idle")
		}
		clk.t = next
		e.advance(next)
		for _, s := range seqs { // what the handlers do: drain the wake-up
			select {
			case <-s.notify:
			default:
			}
		}
	}
	for range 100 { // past admission and the first blocks
		step()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		step()
	}
	b.StopTimer()
	if got := int(seqs[0].emitted.Load()); got < b.N {
		b.Fatalf("%d tokens after %d steps", got, b.N)
	}
}

func boolTo(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
