package sim

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

// gaps returns the times between s's consecutive tokens.
func (h *harness) gaps(s *seq) []time.Duration {
	var out []time.Duration
	for i := 1; i < len(h.times[s]); i++ {
		out = append(out, h.times[s][i]-h.times[s][i-1])
	}
	return out
}

// hashesFor is the hashes a backend of h's block size computes for prompt.
func (h *harness) hashesFor(prompt []byte) []uint64 {
	return appendBlockHashes(nil, prompt, h.e.cfg.blockSize()*4)
}

func TestSeatsStepLaw(t *testing.T) {
	// Five seats, the time factor rising from 1 (one in flight) to 3 (five): each interval's factor is set when
	// it starts, from the sequences in flight then.
	seats := func(c *Config) { c.Batching, c.MaxNumSeqs, c.LoadFactor = BatchSeats, 5, 3 }
	t.Run("lone request", func(t *testing.T) {
		cfg := DefaultConfig()
		seats(&cfg)
		h := newHarness(t, cfg)
		s := h.submit(0, 1000, 20, nil)
		h.runIdle()
		if got, want := h.ttft(s), 10*time.Millisecond+100*time.Millisecond; got != want {
			t.Errorf("TTFT %v, want %v (overhead + prefill at factor 1)", got, want)
		}
		for i, g := range h.gaps(s) {
			if g != cfg.ITL {
				t.Fatalf("gap %d = %v, want ITL %v", i, g, cfg.ITL)
			}
		}
	})
	t.Run("saturated", func(t *testing.T) {
		cfg := DefaultConfig()
		seats(&cfg)
		h := newHarness(t, cfg)
		var ss []*seq
		for range 6 {
			ss = append(ss, h.submit(0, 1000, 20, nil))
		}
		h.runIdle()
		// Admitted together, the k-th prefills at factor 1+0.5(k-1); every later interval runs at factor 3.
		for k, s := range ss[:5] {
			want := 10*time.Millisecond + time.Duration(float64(100*time.Millisecond)*(1+0.5*float64(k)))
			if got := h.ttft(s); got != want {
				t.Errorf("seat %d: TTFT %v, want %v", k, got, want)
			}
			if g := h.gaps(s)[0]; g != 3*cfg.ITL {
				t.Errorf("seat %d: first gap %v, want %v (five in flight)", k, g, 3*cfg.ITL)
			}
		}
		// The sixth waits for the first seat to free, at the first request's last token.
		sixth, first := ss[5], ss[0]
		if h.times[sixth][0] <= h.times[first][19] {
			t.Errorf("sixth request's first token at %v, before a seat was free at %v", h.times[sixth][0],
				h.times[first][19])
		}
	})
	t.Run("load factor 1 does not slow with the batch", func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.Batching, cfg.MaxNumSeqs = BatchSeats, 8
		h := newHarness(t, cfg)
		for range 8 {
			h.submit(0, 16, 30, nil)
		}
		h.runIdle()
		for _, s := range h.seqs {
			for _, g := range h.gaps(s) {
				if g != cfg.ITL {
					t.Fatalf("gap %v with 8 in flight, want %v (stepped would add ITLPerSeq per sequence)", g, cfg.ITL)
				}
			}
		}
	})
}

func TestBlockSizeHits(t *testing.T) {
	// A 1,000-token (4,000-byte) prefix, then the same prefix with another tail: the hit is the prefix's whole
	// blocks at each granularity. The default backend's hashes are the gateway's 64-byte blocks.
	shared := promptBytes("the shared system prompt. ", 4000)
	second := append(bytes.Clone(shared), promptBytes("a different question ", 400)...)
	for _, bs := range []int{1, 8, 16, 64, 128} {
		t.Run(fmt.Sprint(bs), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.BlockSize = bs
			h := newHarness(t, cfg)
			h.submit(0, 1000, 2, h.hashesFor(shared))
			h.runIdle()
			s := h.submit(time.Second, len(second)/4, 2, h.hashesFor(second))
			h.runIdle()
			if want := 1000 / bs * bs; s.cachedTokens() != want {
				t.Errorf("cached %d tokens, want %d", s.cachedTokens(), want)
			}
			if got := h.ttft(s); got != cfg.Overhead+time.Duration(len(second)/4-s.cachedTokens())*100*time.Microsecond {
				t.Errorf("TTFT %v: not the prefill of the uncached tokens only", got)
			}
		})
	}
	if got, want := appendBlockHashes(nil, shared, BlockBytes), AppendBlockHashes(nil, shared); !slices.Equal(got, want) {
		t.Error("the default block size does not hash as the gateway does")
	}
}

func TestEvictionRules(t *testing.T) {
	// 300 blocks; A, B and C are 100-block prompts (max_tokens 1) that fill the cache, then A is sent again (a
	// 99-block hit: the last block is recomputed, in a block taken by eviction), then D, a fourth 100-block
	// prompt, then E, a 30-block one. The hits are probed with predict, which touches nothing.
	//
	// lru and radix: A's repeat evicts B's last block (B was released longest ago); D evicts the rest of B
	// (99 blocks) and E the last 30 of C, which keeps C's first 70 blocks as a shorter prefix.
	// fifo: A's repeat evicts A's own last block (cached first among the free ones), which A then caches again;
	// D evicts A's first 99 blocks and B's first, so neither A nor B hits; E evicts 30 more of B, from its head.
	prompts := map[string][]byte{}
	for _, n := range []string{"A", "B", "C", "D", "E"} {
		prompts[n] = promptBytes(n+" says something long. ", 6400)
	}
	tests := []struct {
		rule       string
		a, b, c    int // hits after D
		cAfterE    int
		bAfterE    int
		repeatOfA  int
		afterDNote string
	}{
		{EvictLRU, 1584, 0, 1584, 70 * 16, 0, 1584, "B evicted, A and C kept"},
		{EvictRadix, 1584, 0, 1584, 70 * 16, 0, 1584, "B evicted, A and C kept"},
		{EvictFIFO, 0, 0, 1584, 1584, 0, 1584, "A's and B's heads evicted, C kept"},
	}
	for _, tc := range tests {
		t.Run(tc.rule, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.KVBlocks, cfg.Eviction = 300, tc.rule
			h := newHarness(t, cfg)
			at := time.Duration(0)
			run := func(name string, tokens int) int {
				at += time.Second
				p := prompts[name][:tokens*4]
				s := h.submit(at, tokens, 1, h.hashesFor(p))
				h.runIdle()
				return s.cachedTokens()
			}
			hits := func(name string) int {
				p, err := h.e.predict(probe{prompt: 1600, maxTokens: 1, hashes: h.hashesFor(prompts[name])})
				if err != nil {
					t.Fatal(err)
				}
				return p.CachedTokens
			}
			run("A", 1600)
			run("B", 1600)
			run("C", 1600)
			if got := run("A", 1600); got != tc.repeatOfA {
				t.Errorf("A's repeat hit %d, want %d", got, tc.repeatOfA)
			}
			run("D", 1600)
			if a, b, c := hits("A"), hits("B"), hits("C"); a != tc.a || b != tc.b || c != tc.c {
				t.Errorf("after D: A, B, C hit %d, %d, %d; want %d, %d, %d (%s)", a, b, c, tc.a, tc.b, tc.c, tc.afterDNote)
			}
			run("E", 480)
			if b, c := hits("B"), hits("C"); b != tc.bAfterE || c != tc.cAfterE {
				t.Errorf("after E: B, C hit %d, %d; want %d, %d", b, c, tc.bAfterE, tc.cAfterE)
			}
		})
	}
}

func TestRadixEvictsLeavesOnly(t *testing.T) {
	// A shared 50-block prefix with two continuations. Under radix a block is evicted only once nothing cached
	// continues it, so evicting 50 blocks takes the older branch whole and leaves the root and the newer one.
	cfg := DefaultConfig()
	cfg.KVBlocks, cfg.Eviction = 160, EvictRadix
	h := newHarness(t, cfg)
	root := promptBytes("a common root. ", 3200)
	left := append(bytes.Clone(root), promptBytes("left branch ", 3200)...)
	right := append(bytes.Clone(root), promptBytes("right branch ", 3200)...)
	h.submit(0, 1600, 1, h.hashesFor(left))
	h.runIdle()
	h.submit(time.Second, 1600, 1, h.hashesFor(right))
	h.runIdle()
	// 150 blocks cached (root 50, two branches of 50) and 10 blank: a 60-block newcomer evicts 50.
	h.submit(2*time.Second, 960, 1, h.hashesFor(promptBytes("unrelated ", 3840)))
	h.runIdle()
	p, err := h.e.predict(probe{prompt: 1600, maxTokens: 1, hashes: h.hashesFor(right)})
	if err != nil {
		t.Fatal(err)
	}
	if p.CachedTokens != 1584 {
		t.Errorf("right branch hits %d, want 1584 (the root and the right leaf kept)", p.CachedTokens)
	}
	for b := range h.e.pool.ref {
		if h.e.pool.hashed[b] && h.e.pool.kids[b] < 0 {
			t.Fatalf("block %d has %d children", b, h.e.pool.kids[b])
		}
	}
}

func TestPrefillModes(t *testing.T) {
	// A decodes; B's 8,000-token prompt arrives. on: B's prefill rides in A's steps (two chunks of at most
	// 4,096 tokens), so A keeps getting a token each step. unmixed: B's chunks run in prefill-only steps, A
	// waits for both. off: B's whole prompt runs in one prefill-only step and A waits for it.
	tests := []struct {
		mode       string
		longestGap time.Duration
		ttftB      time.Duration
	}{
		// A's decode takes one token of the 4,096 budget: chunks of 4,095 and 3,905, each with A's 20ms.
		{PrefillMixed, 409500*time.Microsecond + 20*time.Millisecond,
			10*time.Millisecond + 409500*time.Microsecond + 20*time.Millisecond + 390500*time.Microsecond + 20*time.Millisecond},
		// 800ms of prefill-only steps, then a decode step of A and B (20.1ms).
		{PrefillUnmixed, 800*time.Millisecond + 20100*time.Microsecond, 10*time.Millisecond + 800*time.Millisecond},
		{PrefillOff, 800*time.Millisecond + 20100*time.Microsecond, 10*time.Millisecond + 800*time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.mode, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.ChunkedPrefill = tc.mode
			h := newHarness(t, cfg)
			a := h.submit(0, 16, 200, nil)
			h.runUntil(500 * time.Millisecond)
			b := h.submit(500*time.Millisecond, 8000, 3, nil)
			h.runIdle()
			if got := slices.Max(h.gaps(a)); got != tc.longestGap {
				t.Errorf("A's longest gap %v, want %v", got, tc.longestGap)
			}
			if got := h.ttft(b); !within(got, tc.ttftB, 0.03) {
				t.Errorf("B's TTFT %v, want about %v", got, tc.ttftB)
			}
			// While B prefills (from the end of the step running when B joined the queue), A gets a token only
			// when the mode mixes them.
			start, end := b.arrival.Sub(t0)+cfg.Overhead+cfg.ITL, h.times[b][0]
			during := 0
			for _, at := range h.times[a] {
				if at > start && at < end {
					during++
				}
			}
			if mixed := tc.mode == PrefillMixed; (during > 0) != mixed {
				t.Errorf("A got %d tokens during B's prefill (mixed: %v)", during, mixed)
			}
		})
	}
}

func TestPrefillOffRunsWholePrompts(t *testing.T) {
	// With chunked prefill off a prompt longer than max_batched_tokens still runs in one step, alone.
	cfg := DefaultConfig()
	cfg.ChunkedPrefill, cfg.MaxBatchedTokens = PrefillOff, 1024
	h := newHarness(t, cfg)
	a := h.submit(0, 3000, 2, nil)
	b := h.submit(0, 500, 2, nil)
	h.runIdle()
	if got, want := h.ttft(a), 10*time.Millisecond+300*time.Millisecond; got != want {
		t.Errorf("A: TTFT %v, want %v (one prefill step of 3000 tokens)", got, want)
	}
	if got, want := h.ttft(b), 10*time.Millisecond+300*time.Millisecond+50*time.Millisecond; got != want {
		t.Errorf("B: TTFT %v, want %v (its own prefill step after A's)", got, want)
	}
}

func TestJitter(t *testing.T) {
	run := func(seed uint64, sigma float64) []time.Duration {
		cfg := DefaultConfig()
		cfg.Jitter, cfg.Seed = sigma, seed
		h := newHarness(t, cfg)
		s := h.submit(0, 16, 3001, nil)
		h.runIdle()
		return h.gaps(s)
	}
	a, b, c := run(1, 0.2), run(1, 0.2), run(2, 0.2)
	if !slices.Equal(a, b) {
		t.Error("the same seed gave other step times")
	}
	if slices.Equal(a, c) {
		t.Error("another seed gave the same step times")
	}
	for _, sigma := range []float64{0.05, 0.2, 0.5} {
		gaps := run(3, sigma)
		var sum, sumLog, sumLog2 float64
		for _, g := range gaps {
			f := float64(g) / float64(20*time.Millisecond)
			sum += f
			sumLog += math.Log(f)
			sumLog2 += math.Log(f) * math.Log(f)
		}
		n := float64(len(gaps))
		mean, meanLog := sum/n, sumLog/n
		sd := math.Sqrt(sumLog2/n - meanLog*meanLog)
		// 3,000 draws: the standard errors are about sigma/55 for the spread and sigma/55 for the mean.
		if math.Abs(sd-sigma) > 0.1*sigma || math.Abs(mean-1) > 0.1*sigma {
			t.Errorf("sigma %v: log spread %.4f, mean factor %.4f; want %v and 1", sigma, sd, mean, sigma)
		}
	}
}

func TestPrefillKnee(t *testing.T) {
	// n tokens from context c cost (n + ((c+n)^2 - c^2)/(2 knee)) / prefill_tps, whether in one chunk or many.
	for _, chunk := range []int{4096, 512} {
		t.Run(fmt.Sprint(chunk), func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.PrefillKnee, cfg.MaxBatchedTokens = 4000, chunk
			h := newHarness(t, cfg)
			s := h.submit(0, 4000, 1, nil)
			h.runIdle()
			// 4000 + 4000^2/8000 = 6000 tokens' worth at 10,000/s.
			if got, want := h.ttft(s), 10*time.Millisecond+600*time.Millisecond; got < want-time.Microsecond ||
				got > want+time.Microsecond {
				t.Errorf("TTFT %v, want %v", got, want)
			}
		})
	}
	// A cached prefix leaves the dearest, deepest tokens to compute: 800 new tokens after 3,200 cached cost
	// 800 + (4000^2 - 3200^2)/8000 = 1520 tokens' worth, where linear prefill would charge 800.
	cfg := DefaultConfig()
	cfg.PrefillKnee = 4000
	h := newHarness(t, cfg)
	first := promptBytes("a long document. ", 12800)
	h.submit(0, 3200, 1, h.hashesFor(first))
	h.runIdle()
	second := append(bytes.Clone(first), promptBytes("and more. ", 3200)...)
	s := h.submit(time.Second, 4000, 1, h.hashesFor(second))
	h.runIdle()
	if s.cachedTokens() != 3200 {
		t.Fatalf("cached %d, want 3200", s.cachedTokens())
	}
	if got, want := h.ttft(s), 10*time.Millisecond+152*time.Millisecond; got != want {
		t.Errorf("TTFT %v, want %v", got, want)
	}
}

func TestPredictUnderEveryPhysics(t *testing.T) {
	// For each preset (and jitter), the prediction is the TTFT the same request measures when submitted right
	// after it: the fork draws the same jitter as the engine.
	shared := promptBytes("You are a helpful assistant. ", 6000)
	probePrompt := append(bytes.Clone(shared), promptBytes("what now? ", 1200)...)
	for _, name := range PhysicsPresets() {
		for _, jitter := range []float64{0, 0.3} {
			t.Run(fmt.Sprintf("%s/jitter=%v", name, jitter), func(t *testing.T) {
				cfg := DefaultConfig()
				if err := cfg.SetPhysics(name); err != nil {
					t.Fatal(err)
				}
				cfg.Jitter, cfg.MaxNumSeqs, cfg.LoadFactor = jitter, 4, 2
				h := newHarness(t, cfg)
				h.submit(0, len(shared)/4, 40, h.hashesFor(shared))
				for i := range 5 {
					h.submit(time.Duration(i)*5*time.Millisecond, 300+100*i, 30, nil)
				}
				h.runUntil(400 * time.Millisecond) // the shared prefix is cached by now
				p := probe{prompt: len(probePrompt) / 4, maxTokens: 10, hashes: h.hashesFor(probePrompt)}
				pred, err := h.e.predict(p)
				if err != nil {
					t.Fatal(err)
				}
				s := h.submit(400*time.Millisecond, p.prompt, p.maxTokens, p.hashes)
				h.runIdle()
				if want := millis(h.ttft(s)); math.Abs(pred.TTFTMillis-want) > 1e-6 {
					t.Errorf("predicted %.4fms, measured %.4fms", pred.TTFTMillis, want)
				}
				if pred.CachedTokens != s.cachedTokens() || pred.CachedTokens == 0 {
					t.Errorf("predicted cached %d, got %d", pred.CachedTokens, s.cachedTokens())
				}
			})
		}
	}
}

func TestPhysicsPresetsAndOverrides(t *testing.T) {
	parse := func(args ...string) (Config, error) {
		c := DefaultConfig()
		fs := flag.NewFlagSet("sim", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.RegisterFlags(fs)
		return c, fs.Parse(args)
	}
	for _, args := range [][]string{
		{"-physics", "sglang", "-block-size", "8", "-jitter", "0.1"},
		{"-block-size", "8", "-jitter", "0.1", "-physics", "sglang"},
	} {
		c, err := parse(args...)
		if err != nil {
			t.Fatal(err)
		}
		// Named knobs win in either order; the rest is the preset's; kv_blocks keeps the default cache's tokens.
		if c.BlockSize != 8 || c.Jitter != 0.1 || c.Eviction != EvictRadix || c.ChunkedPrefill != PrefillUnmixed ||
			c.MaxBatchedTokens != 8192 || c.KVBlocks != defaultCacheTokens/8 || c.Physics != PhysicsSGLang {
			t.Errorf("%v: %+v", args, c)
		}
	}
	fleet := "- {name: a, eviction: fifo, physics: tgi}\n- {name: b, physics: llm-d-sim, max_num_seqs: 5, load_factor: 2}\n"
	cfgs, err := ParseFleet("f.yaml", []byte(fleet))
	if err != nil {
		t.Fatal(err)
	}
	if a := cfgs[0]; a.Eviction != EvictFIFO || a.BlockSize != 1 || a.ChunkedPrefill != PrefillOff ||
		a.KVBlocks != defaultCacheTokens {
		t.Errorf("a: %+v", a)
	}
	if b := cfgs[1]; b.Batching != BatchSeats || b.LoadFactor != 2 || b.MaxNumSeqs != 5 {
		t.Errorf("b: %+v", b)
	}
	// vllm-v1 is the zero physics: a preset-less Config runs the same engine.
	var v1 Config = DefaultConfig()
	if err := v1.SetPhysics(PhysicsVLLMV1); err != nil {
		t.Fatal(err)
	}
	d := DefaultConfig()
	if v1.blockSize() != d.blockSize() || v1.KVBlocks != d.KVBlocks || v1.MaxBatchedTokens != d.MaxBatchedTokens ||
		v1.loadFactor() != d.loadFactor() {
		t.Errorf("vllm-v1 %+v differs from the defaults", v1)
	}
	bad := []struct{ key, val, want string }{
		{"physics", "vllm-v2", "is not one of"},
		{"batching", "static", "is not one of"},
		{"load_factor", "0.5", "outside [1, 100]"},
		{"block_size", "2048", "must be in [1, 1024]"},
		{"eviction", "random", "is not one of"},
		{"chunked_prefill", "yes", "is not one of"},
		{"jitter", "1.5", "outside [0, 1]"},
		{"prefill_knee", "-1", "must be in [0,"},
	}
	for _, tc := range bad {
		_, err := ParseFleet("f.yaml", []byte("- {name: a, "+tc.key+": "+tc.val+"}\n"))
		if err == nil || !strings.Contains(err.Error(), "f.yaml:1: "+tc.key+": ") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %s: error %v, want %q", tc.key, tc.val, err, tc.want)
		}
	}
}

func TestServeHashesAtItsBlockSize(t *testing.T) {
	// Over the wire, a backend hashes prompts at its own block size: sharing "user:" and 403 bytes of content,
	// a one-token-block backend hits every whole token of the shared bytes, a default one every whole 64 bytes.
	content := strings.Repeat("shared words ", 31) // 403 bytes
	shared := len("user:" + content)
	for _, tc := range []struct {
		blockSize, want int
	}{{1, shared / 4}, {16, shared / 64 * 16}} {
		t.Run(fmt.Sprint(tc.blockSize), func(t *testing.T) {
			b := startBackend(t, func(c *Config) { fastConfig(c); c.BlockSize = tc.blockSize })
			if _, code := cachedTokens(t, b, content+"first"); code != 200 {
				t.Fatal(code)
			}
			if got, _ := cachedTokens(t, b, content+"second"); got != tc.want {
				t.Errorf("cached %d, want %d", got, tc.want)
			}
		})
	}
}

// checkPool verifies the KV pool's bookkeeping: the free count, the heap's members and indexes, and (radix) the
// children counts.
func checkPool(t *testing.T, p *blockPool) {
	t.Helper()
	free, inHeap := 0, 0
	kids := make([]int32, len(p.ref))
	for b := range p.ref {
		if p.ref[b] < 0 {
			t.Fatalf("block %d: ref %d", b, p.ref[b])
		}
		if p.hashed[b] {
			if got := p.cached[p.hash[b]]; got != int32(b) {
				t.Fatalf("block %d: its hash names block %d", b, got)
			}
			if par := p.parent[b]; par >= 0 {
				kids[par]++
			}
		}
		if p.ref[b] == 0 {
			free++
		}
		if p.pos[b] >= 0 {
			inHeap++
			if p.evict.b[p.pos[b]] != int32(b) || p.ref[b] != 0 || !p.hashed[b] {
				t.Fatalf("block %d: heap index %d wrong, or held (%d) or unhashed", b, p.pos[b], p.ref[b])
			}
		} else if p.ref[b] == 0 && p.hashed[b] && p.evictable(int32(b)) {
			t.Fatalf("block %d: free, cached and evictable but not in the heap", b)
		}
	}
	if free != p.free || inHeap != len(p.evict.b) || len(p.cached) > len(p.ref) {
		t.Fatalf("free %d (counted %d), heap %d (members %d)", p.free, free, len(p.evict.b), inHeap)
	}
	for i := 1; i < len(p.evict.b); i++ {
		if p.evict.less(i, (i-1)/2) {
			t.Fatalf("heap order broken at %d", i)
		}
	}
	if p.rule == EvictRadix {
		for b := range p.ref {
			if p.hashed[b] && kids[b] != p.kids[b] {
				t.Fatalf("block %d: %d children counted, %d cached", b, p.kids[b], kids[b])
			}
		}
	}
}

func TestPoolBookkeepingUnderLoad(t *testing.T) {
	// Conversations that share and extend prefixes in a cache too small for them, with aborts and cache
	// evictions, under every rule and both batching laws; the pool's bookkeeping holds after every event.
	for _, rule := range []string{EvictLRU, EvictRadix, EvictFIFO} {
		for _, batching := range []string{BatchStepped, BatchSeats} {
			t.Run(rule+"/"+batching, func(t *testing.T) {
				cfg := DefaultConfig()
				cfg.KVBlocks, cfg.BlockSize, cfg.Eviction, cfg.Batching, cfg.MaxNumSeqs = 200, 4, rule, batching, 12
				h := newHarness(t, cfg)
				r := rand.New(rand.NewPCG(7, 7))
				var live []*seq
				for i := range 300 {
					at := time.Duration(i) * 15 * time.Millisecond
					conv := r.IntN(6)
					turns := 1 + r.IntN(4)
					prompt := promptBytes(fmt.Sprintf("conversation %d: ", conv), 300*turns+r.IntN(40))
					live = append(live, h.submit(at, len(prompt)/4, 1+r.IntN(30), h.hashesFor(prompt)))
					if r.IntN(10) == 0 {
						h.e.abort(live[r.IntN(len(live))])
					}
					if r.IntN(50) == 0 {
						h.e.evictCache()
					}
					checkPool(t, h.e.pool)
				}
				h.runIdle()
				checkPool(t, h.e.pool)
				if h.e.pool.free != h.e.pool.size() {
					t.Errorf("%d blocks held after every request ended", h.e.pool.size()-h.e.pool.free)
				}
				if hits, queries := metricValue(t, h.e.m.prefixHits), metricValue(t, h.e.m.prefixQueries); hits == 0 ||
					hits > 0.9*queries {
					t.Errorf("prefix hits %v of %v: the workload should both hit and miss", hits, queries)
				}
			})
		}
	}
}

func TestDecodeIntervalMatchesTheEngine(t *testing.T) {
	// The helper bench's capacity estimate can read gives the gaps the engine produces, under both laws.
	for _, batching := range []string{BatchStepped, BatchSeats} {
		for _, n := range []int{1, 3, 8} {
			cfg := DefaultConfig()
			cfg.Batching, cfg.MaxNumSeqs, cfg.LoadFactor = batching, 8, 2.5
			h := newHarness(t, cfg)
			for range n {
				h.submit(0, 16, 10, nil)
			}
			h.runIdle()
			if got, want := h.gaps(h.seqs[0])[1], cfg.DecodeInterval(n); got != want {
				t.Errorf("%s, %d decoding: gap %v, DecodeInterval %v", batching, n, got, want)
			}
		}
	}
	cfg := DefaultConfig()
	if err := cfg.SetPhysics(PhysicsSGLang); err != nil {
		t.Fatal(err)
	}
	if cfg.CacheTokens() != defaultCacheTokens || cfg.BlockSize != 1 {
		t.Errorf("sglang preset: %d cache tokens in blocks of %d", cfg.CacheTokens(), cfg.BlockSize)
	}
}
