package routing

import (
	"testing"
	"time"

	"github.com/switchyard/switchyard/cache"
)

// TestHashesOutliveTheirRequest: an attempt's first token is the last use of its request's prefix hashes, so the
// request may give them back then and the index still judges the engine's cached_tokens; an attempt that
// outlives its request (a hedge that lost and reads on) keeps its own copy, and confirms its own prompt's blocks
// even after the request's buffer went to another request.
func TestHashesOutliveTheirRequest(t *testing.T) {
	f := newFleet(t, local(1)...)
	f.train("b0", simLaw, 200)
	b := f.b("b0")
	p := text(7, 4096) // 64 blocks
	holds := func() int {
		hs := cache.AppendHashes(nil, cache.Seed("m"), p, cache.DefaultMaxBlocks)
		return b.prefixOwner().Confirmed(hs)
	}

	t.Run("released after the first token", func(t *testing.T) {
		r := &Request{Model: "m", Prompt: p}
		r.hashes(cache.DefaultMaxBlocks)
		a := b.Dispatch(r)
		f.clk.Advance(100 * time.Millisecond)
		a.FirstToken()
		r.ReleaseHashes()
		if r.hb != nil {
			t.Fatal("the request still holds its hash buffer")
		}
		alpha := b.alpha.load()
		a.ObserveUsage(Usage{PromptTokens: 1024, CompletionTokens: 10, CachedTokens: 0, HasCached: true})
		a.End(false)
		if holds() != 64 {
			t.Fatalf("the index holds %d confirmed blocks of the prompt, want 64", holds())
		}
		// The engine says it found nothing of a prompt the index believed it held (once confirmed above, the
		// second dispatch counts it): the capacity judgement still runs after the hashes went back.
		r2 := &Request{Model: "m", Prompt: p}
		r2.hashes(cache.DefaultMaxBlocks)
		a2 := b.Dispatch(r2)
		a2.FirstToken()
		r2.ReleaseHashes()
		a2.ObserveUsage(Usage{PromptTokens: 1024, CompletionTokens: 10, CachedTokens: 0, HasCached: true})
		a2.End(false)
		if got := b.alpha.load(); got >= alpha {
			t.Errorf("alpha %.3f after a miss of a held prefix, was %.3f: usage not judged once the hashes were released", got, alpha)
		}
	})

	t.Run("kept by an attempt that outlives its request", func(t *testing.T) {
		q := text(8, 4096)
		r := &Request{Model: "m", Prompt: q}
		r.hashes(cache.DefaultMaxBlocks)
		a := b.Dispatch(r)
		a.KeepHashes()
		r.Reset() // the request ended; its buffer goes to the next one
		other := cache.AcquireHashBuf()
		other.Hashes = cache.AppendHashes(other.Hashes[:0], cache.Seed("m"), text(9, 4096), cache.DefaultMaxBlocks)
		f.clk.Advance(100 * time.Millisecond)
		a.FirstToken()
		cache.ReleaseHashBuf(other)
		hs := cache.AppendHashes(nil, cache.Seed("m"), q, cache.DefaultMaxBlocks)
		if got := b.prefixOwner().Confirmed(hs); got != len(hs) {
			t.Errorf("the attempt confirmed %d of its prompt's %d blocks: it confirmed another request's hashes", got, len(hs))
		}
		a.End(false)
	})
}
