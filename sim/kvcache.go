package sim

import (
	"encoding/binary"
	"maps"
	"slices"

	"github.com/cespare/xxhash/v2"
)

// AppendBlockHashes appends to dst the chained hashes of prompt's full 64-byte blocks: block k's hash covers the
// hash of block k-1 and block k's bytes, so equal hashes mean equal prefixes. A trailing partial block has no
// hash (vLLM caches full blocks only).
func AppendBlockHashes(dst []uint64, prompt []byte) []uint64 {
	var d xxhash.Digest
	var prev [8]byte
	for off := 0; off+BlockBytes <= len(prompt); off += BlockBytes {
		d.Reset()
		if off > 0 {
			_, _ = d.Write(prev[:])
		}
		_, _ = d.Write(prompt[off : off+BlockBytes])
		h := d.Sum64()
		binary.LittleEndian.PutUint64(prev[:], h)
		dst = append(dst, h)
	}
	return dst
}

// blockPool is the KV cache: n blocks, each free, cached (free but holding a prompt block's hash, reusable by a
// prefix hit until evicted) or held by running sequences (ref > 0). Free blocks sit in one queue, evicted from the
// head: blocks without a hash are pushed at the head (reusing them costs nothing) and released cached blocks at
// the tail, so cached blocks are evicted least recently used first, as vLLM's free block queue does.
//
// Not safe for concurrent use: the engine holds its lock.
type blockPool struct {
	ref        []int32
	hash       []uint64
	hashed     []bool
	prev, next []int32 // the free queue, a doubly linked list through block ids; -1 ends it
	head, tail int32
	free       int
	cached     map[uint64]int32 // hash -> block
}

func newBlockPool(n int) *blockPool {
	p := &blockPool{
		ref:    make([]int32, n),
		hash:   make([]uint64, n),
		hashed: make([]bool, n),
		prev:   make([]int32, n),
		next:   make([]int32, n),
		cached: make(map[uint64]int32),
	}
	p.reset()
	return p
}

// clone returns a copy of p that shares no state with it (for engine.fork).
func (p *blockPool) clone() *blockPool {
	return &blockPool{
		ref: slices.Clone(p.ref), hash: slices.Clone(p.hash), hashed: slices.Clone(p.hashed),
		prev: slices.Clone(p.prev), next: slices.Clone(p.next), head: p.head, tail: p.tail, free: p.free,
		cached: maps.Clone(p.cached),
	}
}

// reset frees every block and forgets every hash (an engine restart).
func (p *blockPool) reset() {
	clear(p.cached)
	p.head, p.tail, p.free = -1, -1, 0
	for b := range p.ref {
		p.ref[b] = 0
		p.hashed[b] = false
		p.pushTail(int32(b))
	}
}

// forgetUnheld forgets the hash of every block no sequence holds: they stay free, in LRU order, but no longer
// serve a prefix.
func (p *blockPool) forgetUnheld() {
	for b := range p.ref {
		if p.ref[b] == 0 && p.hashed[b] {
			delete(p.cached, p.hash[b])
			p.hashed[b] = false
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

func (p *blockPool) pushTail(b int32) {
	p.prev[b], p.next[b] = p.tail, -1
	if p.tail >= 0 {
		p.next[p.tail] = b
	} else {
		p.head = b
	}
	p.tail = b
	p.free++
}

func (p *blockPool) pushHead(b int32) {
	p.prev[b], p.next[b] = -1, p.head
	if p.head >= 0 {
		p.prev[p.head] = b
	} else {
		p.tail = b
	}
	p.head = b
	p.free++
}

func (p *blockPool) unlink(b int32) {
	if p.prev[b] >= 0 {
		p.next[p.prev[b]] = p.next[b]
	} else {
		p.head = p.next[b]
	}
	if p.next[b] >= 0 {
		p.prev[p.next[b]] = p.prev[b]
	} else {
		p.tail = p.prev[b]
	}
	p.free--
}

// alloc takes the head of the free queue, evicting its hash, and holds it once. The caller checks p.free first.
func (p *blockPool) alloc() int32 {
	b := p.head
	p.unlink(b)
	if p.hashed[b] {
		delete(p.cached, p.hash[b])
		p.hashed[b] = false
	}
	p.ref[b] = 1
	return b
}

// lookup returns how many leading hashes are cached, at most max.
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
			p.unlink(b)
		}
		p.ref[b]++
		dst = append(dst, b)
	}
	return dst
}

// register records that block b holds the prompt block with hash h, unless another block already does (two
// sequences that computed the same block at once: the first one stays cached, as in vLLM).
func (p *blockPool) register(b int32, h uint64) {
	if p.hashed[b] {
		return
	}
	if _, ok := p.cached[h]; ok {
		return
	}
	p.cached[h] = b
	p.hash[b] = h
	p.hashed[b] = true
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
		if p.hashed[b] {
			p.pushTail(b)
		} else {
			p.pushHead(b)
		}
	}
}
