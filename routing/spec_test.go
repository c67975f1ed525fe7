package routing

import (
	"testing"
	"time"
)

// TestSpeculativeShareIsLearned: a request sent for a prefix that an earlier one is still prefilling is priced at
// the share of that prefix the engine has let such requests find cached (specShare), learned from the engines'
// cached_tokens, and placed by the cold rule (no backend holds it confirmed). On an engine that prefills the two
// side by side (a second request joins the first's step and finds nothing cached), one observation is enough for
// the next burst of a new prefix to go to the other backend, whose own queue is cheaper than the full prefill on
// the first's; on an engine that shares, the burst stays together. Neither outcome is taken for blocks the
// engine lost: the prefix index keeps its capacity.
func TestSpeculativeShareIsLearned(t *testing.T) {
	// Tokens of prefill queued on the other backend (one request in flight, as on the first's backend): the
	// second request costs about as much there as with half the prefix cached where the first went (near-tied,
	// the cheaper wins), more than with all of it, and less than with a quarter.
	const queued = 600
	for _, tc := range []struct {
		name   string
		shares bool  // the engine reports the speculative prefix cached
		want   []int // per burst, whether its second request followed the first (1) or not (0)
	}{
		{"the engine does not share", false, []int{1, 0, 0, 0}},
		{"the engine shares", true, []int{1, 1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFleet(t, local(2)...)
			f.train("b0", simLaw, 200)
			f.train("b1", simLaw, 200)
			s := adaptive(t, f, "")
			alpha := f.b("b0").alpha.load()
			for burst, want := range tc.want {
				p := text(uint64(100+burst), 4096) // 1,024 tokens, 64 blocks
				r1 := &Request{Model: "m", Prompt: p}
				tg, err := s.Pick(r1, f.targets)
				if err != nil {
					t.Fatal(err)
				}
				owner := tg.Backend
				other := f.b("b0")
				if other == owner {
					other = f.b("b1")
				}
				a1 := owner.Dispatch(r1)
				load := other.Begin(queued)
				r2 := &Request{Model: "m", Prompt: p}
				tg2, err := s.Pick(r2, f.targets)
				if err != nil {
					t.Fatal(err)
				}
				a2 := tg2.Backend.Dispatch(r2)
				if got := b2i(tg2.Backend == owner); got != want {
					t.Fatalf("burst %d: second request followed the first: %v, want %v (specShare %.2f)",
						burst, got == 1, want == 1, owner.specShareNow())
				}
				f.clk.Advance(200 * time.Millisecond)
				a1.FirstToken()
				a2.FirstToken()
				cached := 0
				if tg2.Backend == owner && tc.shares {
					cached = 1023
				}
				a1.ObserveUsage(Usage{PromptTokens: 1024, CompletionTokens: 10, HasCached: true})
				a2.ObserveUsage(Usage{PromptTokens: 1024, CompletionTokens: 10, CachedTokens: cached, HasCached: true})
				a1.End(false)
				a2.End(false)
				load.End(false)
				r1.Reset()
				r2.Reset()
				// Only specShare is to change between bursts: the TTFTs observed here (whatever the clock
				// gave) are trained over.
				f.train("b0", simLaw, 200)
				f.train("b1", simLaw, 200)
			}
			for _, name := range []string{"b0", "b1"} {
				b := f.b(name)
				if b.spec.n.Load() == 0 {
					continue
				}
				sh := b.spec.load()
				if tc.shares && sh < specPrior+0.2 || !tc.shares && sh > specPrior-0.2 {
					t.Errorf("%s: specShare %.2f after %d observations", name, sh, b.spec.n.Load())
				}
				if a := b.alpha.load(); a < alpha {
					t.Errorf("%s: the index's share of the KV cache shrank from %.2f to %.2f over timing alone", name, alpha, a)
				}
			}
		})
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
