package cache

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

var t0 = time.Unix(1_700_000_000, 0)

func prompt(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 1))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + r.IntN(26))
	}
	return b
}

func TestAppendHashesChains(t *testing.T) {
	a := prompt(1, 64*10+30) // 10 full blocks and a partial one
	b := bytes.Clone(a)
	b[64*6+3] ^= 1 // differ in block 6
	ha := AppendHashes(nil, Seed("m"), a, 0)
	hb := AppendHashes(nil, Seed("m"), b, 0)
	if len(ha) != 10 {
		t.Fatalf("got %d hashes, want 10 (the partial block is not hashed)", len(ha))
	}
	for i := range ha {
		if same := ha[i] == hb[i]; same != (i < 6) {
			t.Fatalf("block %d: equal=%v, want %v", i, same, i < 6)
		}
	}
	if hm := AppendHashes(nil, Seed("other"), a, 0); hm[0] == ha[0] {
		t.Fatal("two models share block 0")
	}
	if got := AppendHashes(nil, Seed("m"), a, 4); len(got) != 4 || got[3] != ha[3] {
		t.Fatalf("maxBlocks 4: %v", got)
	}
	// The chain makes block i depend on every earlier block, not only on its own bytes.
	c := bytes.Clone(a)
	c[0] ^= 1
	if hc := AppendHashes(nil, Seed("m"), c, 0); hc[9] == ha[9] {
		t.Fatal("block 9's hash ignores block 0")
	}
}

func TestAppendHashesDoesNotAllocate(t *testing.T) {
	p := prompt(2, 8192)
	hb := AcquireHashBuf()
	defer ReleaseHashBuf(hb)
	if n := testing.AllocsPerRun(100, func() {
		hb.Hashes = AppendHashes(hb.Hashes[:0], 7, p, 0)
	}); n != 0 {
		t.Fatalf("allocs = %v, want 0", n)
	}
}

func owners(t *testing.T, ix *Index, n, capacity int) []*Owner {
	t.Helper()
	os := make([]*Owner, n)
	for i := range os {
		o, err := ix.NewOwner(fmt.Sprint("b", i), capacity)
		if err != nil {
			t.Fatal(err)
		}
		os[i] = o
	}
	return os
}

func lookup(ix *Index, hs []uint64, os []*Owner) []int {
	c := make([]int, len(os))
	ix.Lookup(hs, os, c)
	return c
}

func TestLookupCountsLeadingBlocksPerOwner(t *testing.T) {
	ix := NewIndex(Options{})
	os := owners(t, ix, 3, 0)
	p := prompt(3, 64*20)
	hs := AppendHashes(nil, 1, p, 0)
	os[0].Confirm(hs[:12], t0)
	os[1].Insert(hs[:5], t0)
	// Owner 2 holds blocks 0..3 and 6..9: only the leading run counts.
	os[2].Confirm(hs[:4], t0)
	os[2].Confirm(hs[6:10], t0)
	c := make([]int, 3)
	if longest := ix.Lookup(hs, os, c); longest != 12 {
		t.Fatalf("longest = %d, want 12", longest)
	}
	if c[0] != 12 || c[1] != 5 || c[2] != 4 {
		t.Fatalf("counts = %v, want [12 5 4]", c)
	}
	// A prompt that diverges at block 2 matches 2 blocks on every owner.
	q := bytes.Clone(p)
	q[64*2] ^= 1
	if got := lookup(ix, AppendHashes(nil, 1, q, 0), os); got[0] != 2 || got[1] != 2 || got[2] != 2 {
		t.Fatalf("diverging prompt: %v", got)
	}
	// Owners not asked about do not count, and a nil owner counts 0.
	if got := lookup(ix, hs, []*Owner{nil, os[1]}); got[0] != 0 || got[1] != 5 {
		t.Fatalf("subset: %v", got)
	}
}

func TestManyOwnersUseHighWords(t *testing.T) {
	ix := NewIndex(Options{})
	os := owners(t, ix, 200, 0)
	hs := AppendHashes(nil, 1, prompt(4, 64*8), 0)
	for i, o := range os {
		o.Confirm(hs[:i%9], t0)
	}
	got := lookup(ix, hs, os)
	for i := range os {
		if got[i] != i%9 {
			t.Fatalf("owner %d: %d blocks, want %d", i, got[i], i%9)
		}
	}
}

func TestDropRemovesOnlySpeculative(t *testing.T) {
	ix := NewIndex(Options{})
	os := owners(t, ix, 1, 0)
	hs := AppendHashes(nil, 1, prompt(5, 64*6), 0)
	os[0].Confirm(hs[:3], t0)
	os[0].Insert(hs, t0) // blocks 3..5 are new and speculative
	os[0].Drop(hs)
	if got := lookup(ix, hs, os); got[0] != 3 {
		t.Fatalf("after drop: %d blocks, want the 3 confirmed", got[0])
	}
	if os[0].Len() != 3 {
		t.Fatalf("len = %d, want 3", os[0].Len())
	}
}

func TestConfirmedCountsTheLeadingConfirmedEntries(t *testing.T) {
	ix := NewIndex(Options{})
	os := owners(t, ix, 1, 0)
	hs := AppendHashes(nil, 1, prompt(7, 64*40), 0)
	o := os[0]
	if got := o.Confirmed(hs); got != 0 {
		t.Fatalf("nothing held: %d confirmed", got)
	}
	o.Insert(hs[:25], t0)
	if got := o.Confirmed(hs[:25]); got != 0 {
		t.Fatalf("all speculative: %d confirmed", got)
	}
	for _, n := range []int{1, 2, 7, 13, 24, 25} {
		o.Confirm(hs[:n], t0)
		if got := o.Confirmed(hs[:25]); got != n {
			t.Fatalf("%d of 25 confirmed: got %d", n, got)
		}
	}
	if got := o.Confirmed(hs); got != 25 {
		t.Fatalf("25 confirmed, 15 not held: got %d", got)
	}
	o.Insert(hs, t0) // the first 25 stay confirmed; 15 more, speculative
	if got := o.Confirmed(hs); got != 25 {
		t.Fatalf("25 confirmed, 15 speculative: got %d", got)
	}
	o.Confirm(hs, t0)
	if got := o.Confirmed(hs); got != 40 {
		t.Fatalf("all confirmed: got %d", got)
	}
}

func TestSpeculativeEntriesExpireUnlessConfirmed(t *testing.T) {
	ix := NewIndex(Options{SpecTTL: 2 * time.Second})
	os := owners(t, ix, 2, 0)
	hs := AppendHashes(nil, 1, prompt(6, 64*4), 0)
	os[0].Insert(hs, t0)
	os[1].Insert(hs, t0)
	os[1].Confirm(hs, t0.Add(500*time.Millisecond))
	ix.Sweep(t0.Add(1999 * time.Millisecond))
	if got := lookup(ix, hs, os); got[0] != 4 || got[1] != 4 {
		t.Fatalf("before the TTL: %v", got)
	}
	ix.Sweep(t0.Add(2 * time.Second))
	if got := lookup(ix, hs, os); got[0] != 0 || got[1] != 4 {
		t.Fatalf("after the TTL: %v, want [0 4]", got)
	}
}

func TestSpeculativeReinsertExtendsLife(t *testing.T) {
	ix := NewIndex(Options{SpecTTL: 2 * time.Second})
	os := owners(t, ix, 1, 0)
	hs := AppendHashes(nil, 1, prompt(7, 64*2), 0)
	os[0].Insert(hs, t0)
	os[0].Insert(hs, t0.Add(time.Second)) // a second request with the same prefix
	ix.Sweep(t0.Add(2500 * time.Millisecond))
	if got := lookup(ix, hs, os); got[0] != 2 {
		t.Fatalf("re-inserted entry expired early: %v", got)
	}
	ix.Sweep(t0.Add(3 * time.Second))
	if got := lookup(ix, hs, os); got[0] != 0 {
		t.Fatalf("re-inserted entry never expired: %v", got)
	}
}

func TestIdleEntriesExpireAfterTTL(t *testing.T) {
	ix := NewIndex(Options{TTL: time.Minute})
	os := owners(t, ix, 1, 0)
	a := AppendHashes(nil, 1, prompt(8, 64*2), 0)
	b := AppendHashes(nil, 2, prompt(9, 64*2), 0)
	os[0].Confirm(a, t0)
	os[0].Confirm(b, t0)
	os[0].Confirm(b, t0.Add(50*time.Second)) // b is used again
	ix.Sweep(t0.Add(61 * time.Second))
	if ga, gb := lookup(ix, a, os)[0], lookup(ix, b, os)[0]; ga != 0 || gb != 2 {
		t.Fatalf("after TTL: a=%d b=%d, want 0 and 2", ga, gb)
	}
}

func TestClockEvictionGivesUsedEntriesASecondChance(t *testing.T) {
	ix := NewIndex(Options{})
	os := owners(t, ix, 1, 4)
	var hs [6][]uint64
	for i := range hs {
		hs[i] = AppendHashes(nil, uint64(i), prompt(uint64(10+i), 64), 0)
	}
	for i := range 4 {
		os[0].Confirm(hs[i], t0)
	}
	os[0].Confirm(hs[0], t0) // used again: survives the next eviction
	os[0].Confirm(hs[4], t0) // full: evicts the first unused entry, hs[1]
	if lookup(ix, hs[0], os)[0] != 1 || lookup(ix, hs[1], os)[0] != 0 || lookup(ix, hs[4], os)[0] != 1 {
		t.Fatal("CLOCK evicted the wrong entry")
	}
	if os[0].Len() != 4 {
		t.Fatalf("len = %d, want capacity 4", os[0].Len())
	}
	os[0].SetCapacity(2)
	if os[0].Len() != 2 {
		t.Fatalf("after shrinking: len = %d, want 2", os[0].Len())
	}
}

func TestClearAndRemove(t *testing.T) {
	ix := NewIndex(Options{})
	os := owners(t, ix, 2, 0)
	hs := AppendHashes(nil, 1, prompt(20, 64*3), 0)
	os[0].Confirm(hs, t0)
	os[1].Confirm(hs, t0)
	os[0].Clear()
	if got := lookup(ix, hs, os); got[0] != 0 || got[1] != 3 {
		t.Fatalf("after clear: %v", got)
	}
	os[0].Confirm(hs, t0) // still usable after Clear
	ix.Remove(os[1])
	os[1].Confirm(hs, t0) // ignored after Remove
	if got := lookup(ix, hs, os); got[0] != 3 || got[1] != 0 {
		t.Fatalf("after remove: %v", got)
	}
	n, err := ix.NewOwner("new", 0) // reuses the freed id, holding nothing
	if err != nil {
		t.Fatal(err)
	}
	if got := lookup(ix, hs, []*Owner{n}); got[0] != 0 {
		t.Fatalf("a new owner inherited entries: %v", got)
	}
	if len(ix.shards[hs[0]&(numShards-1)].m) == 0 {
		t.Fatal("entry held by owner 0 vanished")
	}
}

func TestTooManyOwners(t *testing.T) {
	ix := NewIndex(Options{})
	for i := range MaxOwners {
		if _, err := ix.NewOwner(fmt.Sprint(i), 1); err != nil {
			t.Fatalf("owner %d: %v", i, err)
		}
	}
	if _, err := ix.NewOwner("one too many", 1); err != ErrTooManyOwners {
		t.Fatalf("err = %v, want ErrTooManyOwners", err)
	}
}

func TestConcurrentUse(t *testing.T) {
	ix := NewIndex(Options{SpecTTL: time.Millisecond})
	os := owners(t, ix, 8, 64)
	prompts := make([][]uint64, 16)
	for i := range prompts {
		prompts[i] = AppendHashes(nil, 1, prompt(uint64(i%4), 64*(8+i)), 0)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := make([]int, len(os))
			for i := range 500 {
				hs := prompts[(g+i)%len(prompts)]
				o := os[(g*7+i)%len(os)]
				now := t0.Add(time.Duration(i) * time.Millisecond)
				ix.Lookup(hs, os, c)
				switch i % 3 {
				case 0:
					o.Insert(hs, now)
				case 1:
					o.Confirm(hs, now)
				default:
					o.Drop(hs)
				}
				if i%50 == 0 {
					ix.Sweep(now)
				}
				if i%200 == 0 && g == 0 {
					os[3].Clear()
				}
			}
		}()
	}
	wg.Wait()
	for _, o := range os {
		if o.Len() > 64 {
			t.Fatalf("owner %s holds %d blocks, capacity 64", o.Name(), o.Len())
		}
	}
}

func TestLookupDoesNotAllocate(t *testing.T) {
	ix := NewIndex(Options{})
	os := owners(t, ix, 64, 0)
	hs := AppendHashes(nil, 1, prompt(30, 8192), 0)
	os[5].Confirm(hs, t0)
	c := make([]int, len(os))
	if n := testing.AllocsPerRun(100, func() { ix.Lookup(hs, os, c) }); n != 0 {
		t.Fatalf("allocs = %v, want 0", n)
	}
}

// BenchmarkLookup8KB64Owners looks up an 8 KiB prompt (128 blocks) among 64 owners; each of 4 owners holds the
// whole prompt, the others hold its first 8 blocks (a shared system prompt), so the walk covers every block.
func BenchmarkLookup8KB64Owners(b *testing.B) {
	ix := NewIndex(Options{})
	os := make([]*Owner, 64)
	for i := range os {
		os[i], _ = ix.NewOwner(fmt.Sprint(i), 0)
	}
	hs := AppendHashes(nil, 1, prompt(40, 8192), 0)
	for i, o := range os {
		if i%16 == 0 {
			o.Confirm(hs, t0)
		} else {
			o.Confirm(hs[:8], t0)
		}
	}
	c := make([]int, len(os))
	b.ReportAllocs()
	start := processCPU()
	defer func() { reportCPU(b, start) }()
	for b.Loop() {
		ix.Lookup(hs, os, c)
	}
}

// BenchmarkHash8KB hashes an 8 KiB prompt into 128 chained blocks.
func BenchmarkHash8KB(b *testing.B) {
	p := prompt(41, 8192)
	hb := AcquireHashBuf()
	b.SetBytes(int64(len(p)))
	b.ReportAllocs()
	start := processCPU()
	defer func() { reportCPU(b, start) }()
	for b.Loop() {
		hb.Hashes = AppendHashes(hb.Hashes[:0], 1, p, 0)
	}
}

// BenchmarkInsertConfirm8KB is a request's index work at dispatch and first token for an 8 KiB prompt of which the
// first half is already held (a shared prefix) and the rest is new, on an owner at capacity, so that every new
// block evicts one.
func BenchmarkInsertConfirm8KB(b *testing.B) {
	ix := NewIndex(Options{})
	o, _ := ix.NewOwner("o", 4096)
	shared := prompt(42, 4096)
	p := make([]byte, 8192)
	copy(p, shared)
	hs := make([]uint64, 0, 128)
	i := 0
	b.ReportAllocs()
	start := processCPU()
	defer func() { reportCPU(b, start) }()
	for b.Loop() {
		i++
		for j := 4096; j < 8192; j += 8 {
			p[j], p[j+1], p[j+2], p[j+3] = byte(i), byte(i>>8), byte(i>>16), byte(i>>24)
		}
		hs = AppendHashes(hs[:0], 1, p, 0)
		now := t0.Add(time.Duration(i) * time.Millisecond)
		o.Insert(hs, now)
		o.Confirm(hs, now)
	}
}
