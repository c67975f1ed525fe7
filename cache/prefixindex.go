package cache

import (
	"errors"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"
)

// MaxOwners is the most owners (backends) one Index tracks at once.
const MaxOwners = 1024

const (
	numShards = 256 // a power of two; shard = hash & (numShards-1)
	hiWords   = MaxOwners/64 - 1

	// DefaultSpecTTL is how long a speculative entry (inserted at dispatch) lives without being confirmed by a
	// first token: llm-d's speculative indexing uses 2 s.
	DefaultSpecTTL = 2 * time.Second
	// DefaultTTL is how long an entry lives without being used again (AIBrix's 20 minutes).
	DefaultTTL = 20 * time.Minute
	// DefaultCapacity is an owner's capacity in blocks when nothing better is known: GIE's default
	// (31,250 16-token blocks, Llama-3-8B's KV cache on an 80 GB GPU).
	DefaultCapacity = 31250
)

// ErrTooManyOwners is returned by NewOwner when the index already tracks MaxOwners owners.
var ErrTooManyOwners = errors.New("cache: too many prefix-index owners")

// Options configure an Index. The zero value gives the defaults.
type Options struct {
	// SpecTTL is how long a speculative entry lives unconfirmed; DefaultSpecTTL when zero.
	SpecTTL time.Duration
	// TTL is how long an entry lives unused; DefaultTTL when zero.
	TTL time.Duration
}

// Index is the approximate prefix index: which backend ("owner") is believed to hold which prompt blocks in its KV
// cache, learned from the gateway's own routing decisions rather than from the engines. Keys are chained block
// hashes (AppendHashes), so holding hash i means holding the whole prefix up to block i.
//
// Structure: a 256-way sharded map from block hash to the set of owners holding it (a bitset), read by Lookup; and,
// per owner, a bounded CLOCK (second-chance) ring of the hashes it holds, which decides evictions. Entries also
// expire: speculative ones after SpecTTL unless confirmed, all after TTL unused (see Sweep).
//
// Concurrency: all methods are safe for concurrent use. Lookup takes shard read locks only; Owner methods take
// the owner's mutex and then shard write locks (never two shard locks at once).
type Index struct {
	specTTL, ttl int64 // nanoseconds

	shards [numShards]shard

	mu       sync.Mutex // guards owners and lastTTLSweep
	owners   [MaxOwners]*Owner
	lastTTL  int64
	nowners  int
	sweeping sync.Mutex // serialises Sweep
}

type shard struct {
	mu sync.RWMutex
	m  map[uint64]ownerSet
	_  [32]byte // keep neighbouring shards' locks off one cache line
}

// ownerSet is a bitset of owner ids; ids >= 64 live in hi, allocated only for the few entries that need it.
type ownerSet struct {
	lo uint64
	hi *[hiWords]uint64
}

func (s ownerSet) word(w int) uint64 {
	if w == 0 {
		return s.lo
	}
	if s.hi == nil {
		return 0
	}
	return s.hi[w-1]
}

func (s *ownerSet) set(id uint32) {
	if id < 64 {
		s.lo |= 1 << id
		return
	}
	if s.hi == nil {
		s.hi = new([hiWords]uint64)
	}
	s.hi[id/64-1] |= 1 << (id % 64)
}

// clear removes id and reports whether the set became empty.
func (s *ownerSet) clear(id uint32) (empty bool) {
	if id < 64 {
		s.lo &^= 1 << id
	} else if s.hi != nil {
		s.hi[id/64-1] &^= 1 << (id % 64)
	}
	if s.lo != 0 {
		return false
	}
	if s.hi != nil {
		for _, w := range s.hi {
			if w != 0 {
				return false
			}
		}
	}
	return true
}

// NewIndex returns an empty Index.
func NewIndex(opts Options) *Index {
	ix := &Index{specTTL: int64(opts.SpecTTL), ttl: int64(opts.TTL)}
	if ix.specTTL <= 0 {
		ix.specTTL = int64(DefaultSpecTTL)
	}
	if ix.ttl <= 0 {
		ix.ttl = int64(DefaultTTL)
	}
	for i := range ix.shards {
		ix.shards[i].m = make(map[uint64]ownerSet)
	}
	return ix
}

func (ix *Index) shard(h uint64) *shard { return &ix.shards[h&(numShards-1)] }

func (ix *Index) setBit(h uint64, id uint32) {
	s := ix.shard(h)
	s.mu.Lock()
	set := s.m[h]
	set.set(id)
	s.m[h] = set
	s.mu.Unlock()
}

func (ix *Index) clearBit(h uint64, id uint32) {
	s := ix.shard(h)
	s.mu.Lock()
	if set, ok := s.m[h]; ok {
		if set.clear(id) {
			delete(s.m, h)
		} else {
			s.m[h] = set
		}
	}
	s.mu.Unlock()
}

// NewOwner registers a new owner (one backend) holding nothing, able to hold capacity blocks (DefaultCapacity when
// capacity <= 0). name is for diagnostics only. It fails with ErrTooManyOwners beyond MaxOwners owners.
func (ix *Index) NewOwner(name string, capacity int) (*Owner, error) {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for id := range ix.owners {
		if ix.owners[id] == nil {
			o := &Owner{ix: ix, id: uint32(id), name: name, capacity: capacity, pos: make(map[uint64]int32)}
			ix.owners[id] = o
			ix.nowners++
			return o, nil
		}
	}
	return nil, ErrTooManyOwners
}

// Remove forgets o: its entries are wiped and its id is freed for a new owner. Later calls on o do nothing.
func (ix *Index) Remove(o *Owner) {
	if o == nil || o.ix != ix {
		return
	}
	o.mu.Lock()
	if o.removed.Load() {
		o.mu.Unlock()
		return
	}
	o.clearLocked()
	o.removed.Store(true)
	o.mu.Unlock()
	ix.mu.Lock()
	ix.owners[o.id] = nil
	ix.nowners--
	ix.mu.Unlock()
}

// Lookup reports, for each owner in owners, how many leading hashes of hashes it holds, into counts[i] (counts
// must be at least as long as owners), and returns the largest count. A nil owner, one of another index and one
// removed count 0. The walk stops at the first block no candidate holds.
//
// It takes one shard read lock per block walked and does not allocate.
func (ix *Index) Lookup(hashes []uint64, owners []*Owner, counts []int) (longest int) {
	var alive [MaxOwners / 64]uint64
	var depth [MaxOwners]uint16
	nw := 0 // words of alive in use
	for i, o := range owners {
		counts[i] = 0
		if o == nil || o.ix != ix {
			continue
		}
		alive[o.id/64] |= 1 << (o.id % 64)
		if w := int(o.id/64) + 1; w > nw {
			nw = w
		}
	}
	if nw == 0 || len(hashes) == 0 {
		return 0
	}
	n := len(hashes)
	for i := range owners {
		if o := owners[i]; o != nil && o.ix == ix {
			depth[o.id] = uint16(min(n, 65535))
		}
	}
	for i, h := range hashes {
		s := ix.shard(h)
		s.mu.RLock()
		set := s.m[h]
		left := uint64(0)
		for w := 0; w < nw; w++ {
			a := alive[w]
			if a == 0 {
				continue
			}
			keep := a & set.word(w)
			for dropped := a &^ keep; dropped != 0; dropped &= dropped - 1 {
				depth[w*64+bits.TrailingZeros64(dropped)] = uint16(i)
			}
			alive[w] = keep
			left |= keep
		}
		s.mu.RUnlock()
		if left == 0 {
			break
		}
	}
	for i, o := range owners {
		if o == nil || o.ix != ix {
			continue
		}
		c := int(depth[o.id])
		if o.removed.Load() { // removed (and its id perhaps reused) while we walked
			c = 0
		}
		counts[i] = c
		longest = max(longest, c)
	}
	return longest
}

// Sweep expires speculative entries older than SpecTTL and, at most once every TTL/40, entries unused for TTL.
// The owner of the index (routing's Monitor) calls it about once a second.
func (ix *Index) Sweep(now time.Time) {
	ix.sweeping.Lock()
	defer ix.sweeping.Unlock()
	t := now.UnixNano()
	ix.mu.Lock()
	var owners []*Owner
	for _, o := range ix.owners {
		if o != nil {
			owners = append(owners, o)
		}
	}
	full := t-ix.lastTTL >= ix.ttl/40
	if full {
		ix.lastTTL = t
	}
	ix.mu.Unlock()
	for _, o := range owners {
		o.expire(t, full)
	}
}

// Owner is one backend's share of an Index: the blocks it is believed to hold, at most its capacity, in a CLOCK
// ring. Its methods are safe for concurrent use.
type Owner struct {
	ix   *Index
	id   uint32
	name string

	removed atomic.Bool // set under mu; read lock-free by Lookup

	mu       sync.Mutex
	capacity int
	slots    []slot
	pos      map[uint64]int32 // hash -> index in slots
	free     []int32          // indexes of free slots
	used     int
	hand     int
	spec     []specRec // speculative insertions in time order, for expiry
	specHead int

	size atomic.Int64 // used, readable without the lock
}

type slot struct {
	hash    uint64
	touched int64 // UnixNano of the last insert or confirm
	state   uint8 // slotFree, slotSpec, slotConfirmed
	ref     bool  // CLOCK reference bit: used since the hand last passed
}

const (
	slotFree uint8 = iota
	slotSpec
	slotConfirmed
)

type specRec struct {
	slot  int32
	hash  uint64
	until int64
}

// Name returns the name the owner was registered with.
func (o *Owner) Name() string { return o.name }

// Index returns the index o belongs to.
func (o *Owner) Index() *Index { return o.ix }

// Len returns the number of blocks o is believed to hold.
func (o *Owner) Len() int { return int(o.size.Load()) }

// Capacity returns o's capacity in blocks.
func (o *Owner) Capacity() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.capacity
}

// SetCapacity changes o's capacity (at least 1 block), evicting at once down to it.
func (o *Owner) SetCapacity(blocks int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.capacity = max(blocks, 1)
	for o.used > o.capacity {
		o.evictOne()
	}
}

// Insert records that o is about to hold hashes: the request was dispatched to it. New entries are speculative
// (they count in lookups at once, so a burst of requests sharing a prefix stays together) and expire after
// SpecTTL unless confirmed; entries already held are marked used.
func (o *Owner) Insert(hashes []uint64, now time.Time) { o.add(hashes, slotSpec, now.UnixNano()) }

// Confirm records that o holds hashes: the request produced its first token there, so the engine prefilled its
// prompt. It turns speculative entries into confirmed ones and adds those missing.
func (o *Owner) Confirm(hashes []uint64, now time.Time) { o.add(hashes, slotConfirmed, now.UnixNano()) }

// Confirmed returns how many leading hashes of hashes o holds confirmed (a first token came for them), as
// opposed to speculatively (dispatched, the prefill perhaps still running). Confirmation covers a request's whole
// prompt, so the confirmed entries of a prefix are its leading ones and the speculative ones extend it: the
// boundary is found by bisection, one map lookup when the whole prefix is confirmed and about log2(len) otherwise.
// Pass the prefix o holds (Lookup's count); a hash o does not hold counts as unconfirmed.
func (o *Owner) Confirmed(hashes []uint64) int {
	if len(hashes) == 0 {
		return 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	confirmed := func(h uint64) bool {
		i, ok := o.pos[h]
		return ok && o.slots[i].state == slotConfirmed
	}
	if confirmed(hashes[len(hashes)-1]) {
		return len(hashes)
	}
	lo, hi := 0, len(hashes)-1 // hashes[:lo] are taken as confirmed, hashes[hi] is not
	for lo < hi {
		m := (lo + hi) / 2
		if confirmed(hashes[m]) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return lo
}

// Drop removes the speculative entries among hashes: the request failed before its first token there, so the
// engine may never have prefilled it. Confirmed entries stay.
func (o *Owner) Drop(hashes []uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.removed.Load() {
		return
	}
	for _, h := range hashes {
		if i, ok := o.pos[h]; ok && o.slots[i].state == slotSpec {
			o.removeSlot(i)
		}
	}
}

// Clear forgets everything o holds: the backend restarted and its KV cache is empty.
func (o *Owner) Clear() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.removed.Load() {
		o.clearLocked()
	}
}

func (o *Owner) clearLocked() {
	for i := range o.slots {
		if o.slots[i].state != slotFree {
			o.ix.clearBit(o.slots[i].hash, o.id)
		}
	}
	o.slots = nil
	o.pos = make(map[uint64]int32)
	o.free = nil
	o.used, o.hand = 0, 0
	o.spec, o.specHead = nil, 0
	o.size.Store(0)
}

func (o *Owner) add(hashes []uint64, state uint8, now int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.removed.Load() {
		return
	}
	for _, h := range hashes {
		if i, ok := o.pos[h]; ok {
			s := &o.slots[i]
			s.ref = true
			s.touched = now
			if state == slotConfirmed {
				s.state = slotConfirmed
			} else if s.state == slotSpec {
				o.pushSpec(i, h, now)
			}
			continue
		}
		for o.used >= o.capacity {
			o.evictOne()
		}
		var i int32
		if n := len(o.free); n > 0 {
			i = o.free[n-1]
			o.free = o.free[:n-1]
		} else {
			o.slots = append(o.slots, slot{})
			i = int32(len(o.slots) - 1)
		}
		o.slots[i] = slot{hash: h, touched: now, state: state}
		o.pos[h] = i
		o.used++
		o.size.Store(int64(o.used))
		if state == slotSpec {
			o.pushSpec(i, h, now)
		}
		o.ix.setBit(h, o.id)
	}
	if len(o.spec)-o.specHead > maxSpecRecs {
		// Nobody calls Sweep (or insertions outrun it): expire what is due, then forget the oldest records.
		// Their entries stay until CLOCK or the TTL removes them, as if confirmed.
		o.expireLocked(now, false)
		if n := len(o.spec) - o.specHead; n > maxSpecRecs {
			o.specHead += n - maxSpecRecs/2
		}
	}
}

// maxSpecRecs bounds an owner's queue of speculative insertions awaiting expiry.
const maxSpecRecs = 1 << 16

func (o *Owner) pushSpec(i int32, h uint64, now int64) {
	if o.specHead > 1024 && o.specHead > len(o.spec)/2 {
		o.spec = append(o.spec[:0], o.spec[o.specHead:]...)
		o.specHead = 0
	}
	o.spec = append(o.spec, specRec{slot: i, hash: h, until: now + o.ix.specTTL})
}

// evictOne frees one used slot chosen by the CLOCK hand: a slot used since the hand last passed gets a second
// chance. Callers hold o.mu and know o.used > 0.
func (o *Owner) evictOne() {
	for range 2*len(o.slots) + 1 {
		if o.hand >= len(o.slots) {
			o.hand = 0
		}
		i := o.hand
		o.hand++
		s := &o.slots[i]
		switch {
		case s.state == slotFree:
		case s.ref:
			s.ref = false
		default:
			o.removeSlot(int32(i))
			return
		}
	}
}

func (o *Owner) removeSlot(i int32) {
	s := &o.slots[i]
	o.ix.clearBit(s.hash, o.id)
	delete(o.pos, s.hash)
	*s = slot{}
	o.free = append(o.free, i)
	o.used--
	o.size.Store(int64(o.used))
}

func (o *Owner) expire(now int64, full bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.removed.Load() {
		o.expireLocked(now, full)
	}
}

func (o *Owner) expireLocked(now int64, full bool) {
	for o.specHead < len(o.spec) && o.spec[o.specHead].until <= now {
		r := o.spec[o.specHead]
		o.specHead++
		s := &o.slots[r.slot]
		if s.state == slotSpec && s.hash == r.hash && s.touched+o.ix.specTTL <= now {
			o.removeSlot(r.slot)
		}
	}
	if o.specHead == len(o.spec) {
		o.spec, o.specHead = o.spec[:0], 0
	}
	if !full {
		return
	}
	for i := range o.slots {
		if s := &o.slots[i]; s.state != slotFree && s.touched+o.ix.ttl <= now {
			o.removeSlot(int32(i))
		}
	}
}
