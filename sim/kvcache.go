package sim

import (
	"encoding/binary"
	"maps"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// AppendBlockHashes appends to dst the chained hashes of prompt's full 64-byte blocks: block k's hash covers the
// hash of block k-1 and block k's bytes, so equal hashes mean equal prefixes. A trailing partial block has no
// hash (vLLM caches full blocks only). These are the gateway's blocks and the default backend's
// (Config.BlockSize 16); a backend with another block size hashes at its own granularity (appendBlockHashes).
func AppendBlockHashes(dst []uint64, prompt []byte) []uint64 {
	return appendBlockHashes(dst, prompt, BlockBytes)
}

// appendBlockHashes is AppendBlockHashes for blocks of size bytes.
func appendBlockHashes(dst []uint64, prompt []byte, size int) []uint64 {
	var d xxhash.Digest
	var prev [8]byte
	for off := 0; off+size <= len(prompt); off += size {
		d.Reset()
		if off > 0 {
			_, _ = d.Write(prev[:])
		}
		_, _ = d.Write(prompt[off : off+size])
		h := d.Sum64()
		binary.LittleEndian.PutUint64(prev[:], h)
		dst = append(dst, h)
	}
	return dst
}

// The eviction rules of the prefix cache (Config.Eviction): which free cached block a new block replaces.
const (
	// EvictLRU is vLLM's: the block released longest ago, any block of a prefix (vLLM's free block queue).
	EvictLRU = "lru"
	// EvictRadix is SGLang's radix cache: the leaf (a block no other cached block continues) released
	// longest ago, so a prefix is evicted from its end and never from its middle.
	EvictRadix = "radix"
	// EvictFIFO evicts the block cached first, however often it was hit since.
	EvictFIFO = "fifo"
)

// blockPool is the KV cache: n blocks, each free, cached (free but holding a prompt block's hash, reusable by a
// prefix hit until evicted) or held by running sequences (ref > 0). A new block is taken from the free blocks
// without a hash first (reusing them costs nothing), then by evicting a cached one, chosen by the eviction rule:
// each cached free block carries a stamp (lru and radix: when it was last released; fifo: when it was cached),
// and the evictable block with the oldest stamp goes first, from a heap. Under radix only leaves are evictable:
// a block whose continuation is still cached waits until its children are evicted. A sequence releases its
// blocks last first, so under lru too its tail goes before its (more often shared) head, as vLLM's free block
// queue does.
//
// Not safe for concurrent use: the engine holds its lock.
type blockPool struct {
	rule   string
	ref    []int32
	hash   []uint64
	hashed []bool
	stamp  []uint64
	parent []int32 // the cached block this one continues, -1 for a first block (radix's tree)
	kids   []int32 // cached blocks that continue this one
	pos    []int32 // index in evict, -1 when not in it
	clock  uint64  // the last stamp given

	blank  []int32 // free blocks without a hash
	evict  evictHeap
	free   int              // free blocks: blank, and cached ones whether evictable or not
	cached map[uint64]int32 // hash -> block
}

func newBlockPool(n int, rule string) *blockPool {
	p := &blockPool{
		rule:   rule,
		ref:    make([]int32, n),
		hash:   make([]uint64, n),
		hashed: make([]bool, n),
		stamp:  make([]uint64, n),
		parent: make([]int32, n),
		kids:   make([]int32, n),
		pos:    make([]int32, n),
		blank:  make([]int32, 0, n),
		cached: make(map[uint64]int32),
	}
	p.evict.p = p
	p.reset()
	return p
}

// clone returns a copy of p that shares no state with it (for engine.fork).
func (p *blockPool) clone() *blockPool {
	c := &blockPool{
		rule: p.rule, ref: slices.Clone(p.ref), hash: slices.Clone(p.hash), hashed: slices.Clone(p.hashed),
		stamp: slices.Clone(p.stamp), parent: slices.Clone(p.parent), kids: slices.Clone(p.kids),
		pos: slices.Clone(p.pos), clock: p.clock, blank: slices.Clone(p.blank), free: p.free,
		cached: maps.Clone(p.cached),
	}
	c.evict = evictHeap{p: c, b: slices.Clone(p.evict.b)}
	return c
}

// reset frees every block and forgets every hash (an engine restart).
func (p *blockPool) reset() {
	clear(p.cached)
	p.blank = p.blank[:0]
	p.evict.b = p.evict.b[:0]
	for b := len(p.ref) - 1; b >= 0; b-- { // popped from the end: block 0 is taken first
		p.ref[b], p.hashed[b], p.kids[b], p.parent[b], p.pos[b] = 0, false, 0, -1, -1
		p.blank = append(p.blank, int32(b))
	}
	p.free = len(p.ref)
}

// forgetUnheld forgets the hash of every block no sequence holds: they stay free, but no longer serve a prefix.
func (p *blockPool) forgetUnheld() {
	for _, b := range p.evict.b {
		p.pos[b] = -1
	}
	p.evict.b = p.evict.b[:0] // every member is a free cached block: all go
	for b := range p.ref {
		if p.ref[b] == 0 && p.hashed[b] {
			p.unhash(int32(b), false)
			p.blank = append(p.blank, int32(b))
		}
	}
}

func (p *blockPool) size() int { return len(p.ref) }

// usage is the share of blocks held by running sequences, vLLM's kv_cache_usage_perc (a fraction in [0, 1]).
func (p *blockPool) usage() float64 {
	if len(p.ref) == 0 {
		return 0
	}
	return float64(len(p.ref)-p.free) / float64(len(p.ref))
}

// unhash forgets b's hash and its place in the tree; b is not in the heap. Under radix a parent left without
// children becomes evictable and, if free and push is set, joins the heap.
func (p *blockPool) unhash(b int32, push bool) {
	delete(p.cached, p.hash[b])
	p.hashed[b] = false
	if par := p.parent[b]; par >= 0 {
		p.kids[par]--
		if push && p.rule == EvictRadix && p.kids[par] == 0 && p.ref[par] == 0 && p.hashed[par] {
			p.evict.push(par) // its last child went: the parent is a leaf now
		}
	}
	p.parent[b] = -1
}

// evictable reports whether a free cached block may be evicted now.
func (p *blockPool) evictable(b int32) bool { return p.rule != EvictRadix || p.kids[b] == 0 }

// alloc takes a free block, evicting a cached one if no blank one is left, and holds it once. The caller checks
// p.free first.
func (p *blockPool) alloc() int32 {
	var b int32
	if n := len(p.blank); n > 0 {
		b = p.blank[n-1]
		p.blank = p.blank[:n-1]
	} else {
		b = p.evict.pop()
		p.unhash(b, true)
	}
	p.free--
	p.ref[b] = 1
	return b
}

// lookup returns how many leading hashes are cached, at most max. It changes nothing (no LRU touch).
func (p *blockPool) lookup(hashes []uint64, max int) int {
	n := 0
	for n < len(hashes) && n < max {
		if _, ok := p.cached[hashes[n]]; !ok {
			break
		}
		n++
	}
	return n
}

// hold appends to dst the blocks of the first n hashes (which lookup found) and holds each once more.
func (p *blockPool) hold(dst []int32, hashes []uint64) []int32 {
	for _, h := range hashes {
		b := p.cached[h]
		if p.ref[b] == 0 {
			if p.pos[b] >= 0 {
				p.evict.remove(int(p.pos[b]))
			}
			p.free--
		}
		p.ref[b]++
		dst = append(dst, b)
	}
	return dst
}

// register records that block b, continuing block parent (-1 for a first block), holds the prompt block with
// hash h, unless another block already does (two sequences that computed the same block at once: the first one
// stays cached, as in vLLM).
func (p *blockPool) register(b, parent int32, h uint64) {
	if p.hashed[b] {
		return
	}
	if _, ok := p.cached[h]; ok {
		return
	}
	if p.rule != EvictRadix || parent >= 0 && !p.hashed[parent] {
		parent = -1 // only radix keeps the tree; a duplicate's continuation starts a tree of its own
	}
	p.cached[h] = b
	p.hash[b] = h
	p.hashed[b] = true
	p.parent[b] = parent
	if parent >= 0 {
		p.kids[parent]++
	}
	if p.rule == EvictFIFO {
		p.clock++
		p.stamp[b] = p.clock
	}
}

// release drops one hold on each block, last block first, so that a sequence's tail blocks are evicted before
// its (more often shared) head blocks.
func (p *blockPool) release(blocks []int32) {
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		p.ref[b]--
		if p.ref[b] > 0 {
			continue
		}
		p.free++
		if !p.hashed[b] {
			p.blank = append(p.blank, b)
			continue
		}
		if p.rule != EvictFIFO {
			p.clock++
			p.stamp[b] = p.clock
		}
		if p.evictable(b) {
			p.evict.push(b)
		}
	}
}

// evictHeap is a binary min-heap of the evictable blocks by stamp, oldest first, keeping each block's index in
// pool.pos (hand-written rather than container/heap, whose interface boxes every block it moves).
type evictHeap struct {
	p *blockPool
	b []int32
}

func (h *evictHeap) less(i, j int) bool { return h.p.stamp[h.b[i]] < h.p.stamp[h.b[j]] }

func (h *evictHeap) swap(i, j int) {
	h.b[i], h.b[j] = h.b[j], h.b[i]
	h.p.pos[h.b[i]], h.p.pos[h.b[j]] = int32(i), int32(j)
}

func (h *evictHeap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(i, parent) {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

func (h *evictHeap) down(i int) {
	for {
		l := 2*i + 1
		if l >= len(h.b) {
			return
		}
		m := l
		if r := l + 1; r < len(h.b) && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			return
		}
		h.swap(i, m)
		i = m
	}
}

func (h *evictHeap) push(b int32) {
	h.p.pos[b] = int32(len(h.b))
	h.b = append(h.b, b)
	h.up(len(h.b) - 1)
}

func (h *evictHeap) pop() int32 {
	b := h.b[0]
	h.remove(0)
	return b
}

// remove takes out the block at index i.
func (h *evictHeap) remove(i int) {
	b := h.b[i]
	last := len(h.b) - 1
	if i != last {
		h.swap(i, last)
	}
	h.b = h.b[:last]
	h.p.pos[b] = -1
	if i < last {
		h.down(i)
		h.up(i)
	}
}
