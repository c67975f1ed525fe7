package routing

import (
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Seats learned from peers.
//
// vLLM does not export its batch limit (--max-num-seqs), so a backend whose policy does not state it learns its
// seats at its first queue (admission.Cap, "queue"), and until then routing cannot price the wait for a seat on
// it (seatWait). In a fleet of 64 such engines most of them met that first queue inside a 17 s run, each costing
// one request a whole answer's wait: adaptive's p99 TTFT was 6.2-6.4x round robin's with the seats left to
// discovery, against 0.95x with them stated (bench/results/routing-2026-12-02-matrix.md).
//
// Fleets are mostly replicas of one deployment: the same engine, serving the same models, with the same KV
// cache. Backends alike in all three (a peer group) take their seats from the peers that know theirs, while they
// know none of their own: the figure every member that knows its seats agrees on, which none contradicts. A
// member contradicts it by having run more sequences at once than that figure (its lower bound, SeatsFloor), and
// two members disagree when they know different seats; either way the group is not one deployment, and its
// figure goes until they agree again. A backend's own figure (stated, or measured at its queue) always wins over
// its peers'.
//
// Why the key is safe: the KV cache's size (vllm:cache_config_info's num_gpu_blocks x block_size, SGLang's
// max_total_num_tokens) follows the GPU, the model, its precision and the memory share, so two engines with the
// same size, engine and models are almost always one deployment. An engine that exports no KV size groups by
// engine and models alone; a wrong guess there is corrected by the rules above at the first batch that exceeds
// the figure or the first queue below it, the two events that teach a backend alone its seats anyway.

// seatPeers holds a Registry's peer groups.
type seatPeers struct {
	mu     sync.Mutex
	groups map[peerKey]*seatGroup
}

// peerKey is what makes backends peers: the same engine, serving the same models, with a KV cache of the same
// size in tokens (0: not exported).
type peerKey struct {
	engine, models string
	kvTokens       int64
}

// seatGroup is one peer group.
type seatGroup struct {
	key     peerKey
	mu      sync.Mutex
	members map[*Backend]peerFigure
	seats   atomic.Int64 // the figure the members agree on (seatGroup.agree); 0 when none
	floor   atomic.Int64 // the largest batch any member ran: a lower bound of every replica's seats
}

// peerFigure is what one member knows of its seats: exact (stated or measured), or a lower bound.
type peerFigure struct {
	seats int
	exact bool
}

func peerKeyOf(cfg *BackendConfig, st *EngineStats) peerKey {
	k := peerKey{engine: cfg.Engine, models: strings.Join(cfg.Models, "\x00")}
	if st != nil && st.Has&HasCacheConfig != 0 && st.BlockSize > 0 {
		k.kvTokens = int64(st.NumGPUBlocks) * int64(st.BlockSize)
	}
	return k
}

// String names the group as /debug/backends shows it.
func (k peerKey) String() string {
	s := k.engine + " " + strings.ReplaceAll(k.models, "\x00", ",")
	if k.kvTokens > 0 {
		s += " kv=" + strconv.FormatInt(k.kvTokens, 10)
	}
	return s
}

// join puts b in the group of key k (leaving its former group if that was another) and returns the group.
func (p *seatPeers) join(b *Backend, k peerKey) *seatGroup {
	if g := b.group.Load(); g != nil && g.key == k {
		return g
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if g := b.group.Load(); g != nil {
		if g.key == k {
			return g
		}
		p.leaveLocked(b, g)
	}
	g := p.groups[k]
	if g == nil {
		g = &seatGroup{key: k, members: make(map[*Backend]peerFigure)}
		p.groups[k] = g
	}
	b.group.Store(g)
	return g
}

// leave takes b out of its group (the registry forgot it).
func (p *seatPeers) leave(b *Backend) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if g := b.group.Load(); g != nil {
		p.leaveLocked(b, g)
	}
}

func (p *seatPeers) leaveLocked(b *Backend, g *seatGroup) {
	b.group.Store(nil)
	g.mu.Lock()
	delete(g.members, b)
	empty := len(g.members) == 0
	g.agree()
	g.mu.Unlock()
	if empty {
		delete(p.groups, g.key)
	}
}

// set records what member b knows of its seats, and updates the group's figure.
func (g *seatGroup) set(b *Backend, f peerFigure) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if old, ok := g.members[b]; ok && old == f {
		return
	}
	g.members[b] = f
	g.agree()
}

// agree sets the group's figures: floor, the largest lower bound of any member, and seats, the figure every
// member that knows its own agrees on if none has run more sequences at once than that (floor), else 0. Called
// with g.mu held.
func (g *seatGroup) agree() {
	seats, floor, disagree := 0, 0, false
	for _, f := range g.members {
		switch {
		case !f.exact:
			floor = max(floor, f.seats)
		case f.seats <= 0:
		case seats != 0 && f.seats != seats:
			disagree = true
		default:
			seats = f.seats
		}
	}
	if disagree || floor > seats {
		seats = 0
	}
	g.floor.Store(int64(floor))
	g.seats.Store(int64(seats))
}

// notePeers files b in its peer group after a scrape (st) and tells the group what b knows of its own seats.
// Called by b's scraper, off the request path.
func (b *Backend) notePeers(st *EngineStats) {
	p := b.peers
	if p == nil {
		return
	}
	cfg := b.Config()
	g := p.join(b, peerKeyOf(cfg, st))
	seats, exact := b.ownSeats(st, cfg)
	g.set(b, peerFigure{seats: int(seats), exact: exact})
}

// PeerSeats returns what b's peers (replicas of one deployment) know of their seats (admission.PeerEngine):
// seats, the figure those that know theirs agree on (0 when none do, they disagree, or one of them ran more at
// once), and floor, the largest batch any of them ran (0: none yet). Both 0 before b's first scrape.
func (b *Backend) PeerSeats() (seats, floor int) {
	if g := b.group.Load(); g != nil {
		return int(g.seats.Load()), int(g.floor.Load())
	}
	return 0, 0
}

// peerGroup names b's peer group ("" before its first scrape).
func (b *Backend) peerGroup() string {
	if g := b.group.Load(); g != nil {
		return g.key.String()
	}
	return ""
}
