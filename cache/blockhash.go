package cache

import (
	"encoding/binary"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// BlockBytes is the prefix-index block: 64 bytes of canonical prompt, which is 16 tokens at the gateway's estimate
// of 4 bytes per token, the size of one vLLM KV block. The simulator cuts its KV blocks at the same bytes.
const BlockBytes = 64

// DefaultMaxBlocks bounds how many leading blocks of a prompt are hashed when the caller does not say: 1,024 blocks
// are 64 KiB of prompt, about 16k tokens. Beyond it a prompt's blocks are neither indexed nor matched.
const DefaultMaxBlocks = 1024

// Seed returns the first link of a prompt's hash chain for a model: prompts of different models never share a block,
// because their chains start from different values.
func Seed(model string) uint64 { return xxhash.Sum64String(model) }

// AppendHashes appends to dst the chained hashes of the full 64-byte blocks at the start of prompt, at most maxBlocks
// of them (DefaultMaxBlocks when maxBlocks <= 0), and returns the extended slice. Hash i is
//
//	h_i = xxh64(prompt[64i : 64i+64] ‖ le64(h_{i-1})),  h_{-1} = seed
//
// so h_i stands for the whole prefix prompt[:64(i+1)]: two prompts share hash i exactly when they share their first
// i+1 blocks. A trailing partial block is not hashed: engines cache only full blocks.
//
// It does not allocate when dst has room (see AcquireHashes); hashing 8 KiB takes about a microsecond.
func AppendHashes(dst []uint64, seed uint64, prompt []byte, maxBlocks int) []uint64 {
	if maxBlocks <= 0 {
		maxBlocks = DefaultMaxBlocks
	}
	var buf [BlockBytes + 8]byte
	prev := seed
	for i, n := 0, 0; i+BlockBytes <= len(prompt) && n < maxBlocks; i, n = i+BlockBytes, n+1 {
		copy(buf[:BlockBytes], prompt[i:i+BlockBytes])
		binary.LittleEndian.PutUint64(buf[BlockBytes:], prev)
		prev = xxhash.Sum64(buf[:])
		dst = append(dst, prev)
	}
	return dst
}

// HashBuf is a reusable slice of block hashes, recycled through AcquireHashBuf and ReleaseHashBuf so that hashing a
// prompt on the request path allocates nothing in the steady state.
type HashBuf struct {
	// Hashes are the chained block hashes (see AppendHashes); the holder of the HashBuf owns them.
	Hashes []uint64
}

var hashPool = sync.Pool{New: func() any { return &HashBuf{Hashes: make([]uint64, 0, 256)} }}

// AcquireHashBuf returns an empty HashBuf with room for at least 256 hashes (16 KiB of prompt). Give it back with
// ReleaseHashBuf when nothing refers to its hashes any more.
func AcquireHashBuf() *HashBuf {
	h := hashPool.Get().(*HashBuf)
	h.Hashes = h.Hashes[:0]
	return h
}

// ReleaseHashBuf returns h to the pool; the caller must not use h or its hashes afterwards. A buffer that grew
// beyond 4,096 hashes is dropped rather than pinned in the pool.
func ReleaseHashBuf(h *HashBuf) {
	if h == nil || cap(h.Hashes) > 4096 {
		return
	}
	h.Hashes = h.Hashes[:0]
	hashPool.Put(h)
}
