package routing

import (
	"encoding/binary"
	"math"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/switchyard/switchyard/cache"
)

// The other replicas' requests, as their dispatch and end records tell (docs/design.md, "Load between replicas").
//
// A replica judges a backend on views that are up to an interval old: the other replicas' load reports and its
// own scrape of the engine. On engines of few seats the requests that ended since make a backend with a seat free
// look full, and a conversation whose turns alternate between two replicas, which sends its next turn the moment
// its previous answer ended, left its backend (64 engines of 4 seats: most moves across two replicas left a
// backend with three requests in it, and the views there counted two or three more). So every replica publishes,
// on the prefix-hint stream, when it dispatched each request and when it ended, keyed by a hash of its prompt, and
// the others bring each view up to now with them, as a replica does with its own traffic (engineOccupancy): a
// request a view surely counted that has ended since comes off it, one it may have missed that still runs goes on.
// A conversation's next turn says more: its prompt is the previous prompt, the answer and the new message
// (openai.Summary.PrevTurn), so the previous request has ended even when its end record has not come yet; it is
// taken to have ended no earlier than the records' measured latency ago (had it ended before, its record would be
// here). Every rule errs towards counting a request.

// Turn record kinds on the hint stream.
const (
	turnDispatched byte = 'd'
	turnEnded      byte = 'e'
)

// turnEvent is a dispatch or an end that this replica will publish.
type turnEvent struct {
	name string
	key  uint64
	kind byte
	at   time.Time
}

// maxPendingTurns bounds the turn records queued between two flushes; beyond it they are dropped (a follow-up
// then finds no record and nothing is corrected).
const maxPendingTurns = 8192

// turnLogSize bounds the other replicas' requests kept. A record matters until every view of its backend was
// taken after its end (a load report and a scrape are a fraction of a second old), so at 1,000 requests a second
// this keeps half a minute; at rates where it keeps less, a long answer's record is evicted before its end and its
// next turn is not corrected, which is the behaviour without records.
const turnLogSize = 1 << 15

// turnKey is the key of a request's turn: the hash of its canonical prompt (or of the first n bytes, the
// previous turn's) seeded with the model, as every replica computes it.
func turnKey(model string, prompt []byte) uint64 { return xxhash.Sum64(prompt) ^ cache.Seed(model) }

// peerTurn is a prompt as the dispatch records told of it: the backend of its last dispatch by another replica
// (nil if none), and how many dispatches of it any replica made, this one included. Its times are in the
// backend's list (peerReqs).
type peerTurn struct {
	b    *Backend
	seen int // 1 to trust it: a prompt dispatched twice (a shared opening message, a retry, a hedge) is ambiguous
	slot int // its place in the eviction ring
}

// turnLog holds the other replicas' recent prompts by key, for a follow-up turn to find its previous one, and the
// latency of their records.
type turnLog struct {
	mu     sync.Mutex
	m      map[uint64]*peerTurn
	ring   []uint64
	next   int
	lat    float64   // seconds: the records' latency, a maximum decaying by half every latHalfLife
	latAt  time.Time // when lat was last raised or decayed
	hasLat bool
}

// latHalfLife is how fast the records' latency forgets a slow record: the rule "no end record yet means a recent
// end" trusts it, so a spike of Redis latency is remembered for a while after it passed.
const latHalfLife = 10 * time.Second

func (l *turnLog) init() {
	l.m = make(map[uint64]*peerTurn)
	l.ring = make([]uint64, 0, 1024)
}

// entry returns the record of key, adding it (evicting the oldest beyond turnLogSize). l.mu is held.
func (l *turnLog) entry(key uint64) *peerTurn {
	if t := l.m[key]; t != nil {
		return t
	}
	t := &peerTurn{}
	if len(l.ring) < turnLogSize {
		t.slot = len(l.ring)
		l.ring = append(l.ring, key)
	} else {
		old := l.ring[l.next]
		if o := l.m[old]; o != nil && o.slot == l.next {
			delete(l.m, old)
		}
		t.slot = l.next
		l.ring[l.next] = key
		l.next = (l.next + 1) % turnLogSize
	}
	l.m[key] = t
	return t
}

// local notes this replica's own dispatch of a prompt: a prompt dispatched twice is ambiguous.
func (l *turnLog) local(key uint64) {
	l.mu.Lock()
	l.entry(key).seen++
	l.mu.Unlock()
}

// add folds in one record of another replica, of an event at at, received at now.
func (l *turnLog) add(b *Backend, key uint64, kind byte, at, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if kind == turnDispatched {
		t := l.entry(key)
		t.b = b
		t.seen++
	}
	l.observeLatency(now.Sub(at).Seconds(), now)
}

// observeLatency raises the records' latency to x seconds, after decaying it to now. l.mu is held.
func (l *turnLog) observeLatency(x float64, now time.Time) {
	x = max(x, 0)
	if l.hasLat {
		if dt := now.Sub(l.latAt); dt > 0 {
			l.lat *= math.Exp2(-dt.Seconds() / latHalfLife.Seconds())
		}
	}
	l.lat, l.latAt, l.hasLat = max(l.lat, x), now, true
}

// lookup returns the record of key and the records' latency, or false.
func (l *turnLog) lookup(key uint64) (peerTurn, time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.m[key]
	if t == nil || !l.hasLat {
		return peerTurn{}, 0, false
	}
	return *t, time.Duration(l.lat * float64(time.Second)), true
}

// peerReqs are the other replicas' requests on one backend, as their dispatch and end records told, kept while a
// view of the backend (a load report, a scrape) may still be older than their end. Safe for concurrent use.
type peerReqs struct {
	mu   sync.Mutex
	reqs []peerReq
}

type peerReq struct {
	key        uint64
	replica    string
	dispatched time.Time // on this replica's clock, estimated late
	ended      time.Time // estimated early; zero until its end record came
}

// maxPeerReqs bounds a backend's list: beyond it the oldest dispatch goes, which every view counts by then.
const maxPeerReqs = 1024

// add records a dispatch, dropping what ended before keepFrom (no view is older).
func (p *peerReqs) add(key uint64, replica string, at, keepFrom time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	kept := p.reqs[:0]
	for _, q := range p.reqs {
		if q.ended.IsZero() || !q.ended.Before(keepFrom) {
			kept = append(kept, q)
		}
	}
	clear(p.reqs[len(kept):])
	p.reqs = kept
	if len(p.reqs) >= maxPeerReqs {
		oldest := 0
		for i, q := range p.reqs {
			if q.dispatched.Before(p.reqs[oldest].dispatched) {
				oldest = i
			}
		}
		p.reqs = append(p.reqs[:oldest], p.reqs[oldest+1:]...)
	}
	p.reqs = append(p.reqs, peerReq{key: key, replica: replica, dispatched: at})
}

// end records an end.
func (p *peerReqs) end(key uint64, replica string, at time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := len(p.reqs) - 1; i >= 0; i-- {
		if q := &p.reqs[i]; q.key == key && q.replica == replica && q.ended.IsZero() {
			q.ended = at
			return
		}
	}
}

// running returns how many of the requests have no end record.
func (p *peerReqs) running() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, q := range p.reqs {
		if q.ended.IsZero() {
			n++
		}
	}
	return n
}

// turnViews are the views of a backend a pick reads, with when each was taken (on this replica's clock).
type turnViews struct {
	reports     *reportTimes // the replicas' load reports installed now; nil if none
	scrapeSent  time.Time    // the engine scrape in use was sent...
	scrapeAt    time.Time    // ...and answered; zero if none
	rtt, margin time.Duration
}

// peerAdjust is what the other replicas' records change in a backend's views: the requests to add to (or, when
// negative, take off) the sum of their load reports and the engine's scraped occupancy.
type peerAdjust struct{ report, engine float64 }

// adjust brings the views v up to now with the records: a request a view surely counted (taken after its
// dispatch, answered before its end) that has ended comes off it, and one still running that the view may have
// missed (dispatched after it was taken, or around it) goes on. prev, with prevEnd, is a request known to have
// ended by prevEnd although its end record has not come (turnLess). For the report of the replica that
// dispatched it; for the scrape, a round trip either side, for the request to reach the engine and its end to come
// back. Every rule errs towards counting a request.
func (p *peerReqs) adjust(v turnViews, prev uint64, prevEnd time.Time) peerAdjust {
	var a peerAdjust
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, q := range p.reqs {
		ended := q.ended
		if ended.IsZero() && prev != 0 && q.key == prev {
			ended = prevEnd
		}
		if v.reports != nil {
			if r, ok := v.reports.at[q.replica]; ok {
				switch {
				case ended.IsZero() && q.dispatched.Add(v.margin).After(r.from):
					a.report++ // running, and maybe not in the report
				case !ended.IsZero() && !q.dispatched.Add(v.margin).After(r.from) && r.to.Add(v.margin).Before(ended):
					a.report-- // in the report, and ended since
				}
			}
		}
		if !v.scrapeSent.IsZero() {
			reach := q.dispatched.Add(v.margin + v.rtt)
			switch {
			case ended.IsZero() && reach.After(v.scrapeSent):
				a.engine++
			case !ended.IsZero() && !reach.After(v.scrapeSent) && v.scrapeAt.Add(v.margin+v.rtt).Before(ended):
				a.engine--
			}
		}
	}
	return a
}

// turnLess is the previous turn of the request being routed, when another replica served it: its backend, its
// key, and when it ended at the latest, until its end record says: now less the records' latency (had it ended
// earlier, its record would be here). The zero value names none.
type turnLess struct {
	b   *Backend
	key uint64
	end time.Time
}

// on returns t for b, or none.
func (t turnLess) on(b *Backend) turnLess {
	if t.b != b {
		return turnLess{}
	}
	return t
}

// prevTurn returns r's previous turn, when another replica served it and its records are here. None without
// peers, without a previous turn in r's prompt, or when its prompt was dispatched more than once.
func (p *Peers) prevTurn(r *Request, now time.Time) turnLess {
	if p == nil || r.PrevTurn <= 0 || r.PrevTurn > len(r.Prompt) {
		return turnLess{}
	}
	key := turnKey(r.Model, r.Prompt[:r.PrevTurn])
	t, lat, ok := p.turns.lookup(key)
	if !ok || t.b == nil || t.seen != 1 {
		return turnLess{}
	}
	return turnLess{b: t.b, key: key, end: now.Add(-lat)}
}

// peerAdjustAt returns what the other replicas' records change in b's views at now (nothing without peers): their
// reports pl (nil if none fresh) and, when fresh, the scrape e; prev, b's or none, is taken as ended.
func (b *Backend) peerAdjustAt(pl *PeerLoad, e *EngineStats, fresh bool, prev turnLess) peerAdjust {
	if b.hints == nil {
		return peerAdjust{}
	}
	p := b.hints.p.Load()
	if p == nil {
		return peerAdjust{}
	}
	v := turnViews{rtt: time.Duration(b.rtt() * float64(time.Second)), margin: p.margin()}
	if pl != nil {
		v.reports = pl.reports
	}
	if fresh {
		v.scrapeSent, v.scrapeAt = e.sent, e.At
	}
	return b.peerReqs.adjust(v, prev.key, prev.end)
}

// turnsOf returns the Peers of the registry that targets' backends belong to, or nil.
func turnsOf(targets []Target) *Peers {
	if len(targets) == 0 || targets[0].Backend.hints == nil {
		return nil
	}
	return targets[0].Backend.hints.p.Load()
}

// keep is how long an ended request stays in a backend's list: as long as a load report counts (three
// intervals) or an engine scrape stays fresh, whichever is longer, and a second for the records' own delay.
func (p *Peers) keep() time.Duration { return max(p.stale, DefaultStaleAfter) + time.Second }

// margin is how far apart two replicas' clocks may be through Redis: this replica's offset's uncertainty twice
// (the other's is taken to be alike) and a millisecond for each of the two stream times' truncation.
func (p *Peers) margin() time.Duration {
	return 2*time.Duration(p.offsetErr.Load()) + 2*time.Millisecond
}

// turn queues a turn record for publishing. It runs on the request path: a mutex, an append, a wake-up that
// never waits.
func (p *Peers) turn(b *Backend, key uint64, kind byte, now time.Time) {
	p.mu.Lock()
	if len(p.pendingTurns) < maxPendingTurns {
		p.pendingTurns = append(p.pendingTurns, turnEvent{name: b.Name(), key: key, kind: kind, at: now})
	}
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// encodeTurns appends the records: per record, its kind (1 byte), the backend name's length (1 byte) and bytes,
// the key (8 bytes, little endian) and how long before flush the event was, in microseconds (uvarint).
func encodeTurns(dst []byte, ts []turnEvent, flush time.Time) []byte {
	for _, t := range ts {
		dst = append(dst, t.kind, byte(len(t.name)))
		dst = append(dst, t.name...)
		dst = binary.LittleEndian.AppendUint64(dst, t.key)
		dst = binary.AppendUvarint(dst, uint64(max(flush.Sub(t.at), 0)/time.Microsecond))
	}
	return dst
}

// decodeTurns calls fn for each record in b (name aliases b); it stops at the first malformed one.
func decodeTurns(b []byte, fn func(kind byte, name []byte, key uint64, age time.Duration)) error {
	for len(b) > 0 {
		if len(b) < 2 {
			return errBadHints
		}
		kind, nl := b[0], int(b[1])
		if len(b) < 2+nl+8 {
			return errBadHints
		}
		name := b[2 : 2+nl]
		key := binary.LittleEndian.Uint64(b[2+nl:])
		b = b[2+nl+8:]
		us, n := binary.Uvarint(b)
		if n <= 0 || us > uint64(math.MaxInt64/int64(time.Microsecond)) {
			return errBadHints
		}
		b = b[n:]
		if kind != turnDispatched && kind != turnEnded {
			continue // a kind a later version added
		}
		fn(kind, name, key, time.Duration(us)*time.Microsecond)
	}
	return nil
}

// applyTurns folds in another replica's turn records from a stream entry added at addedMs (Redis time). Without
// the clock offset nothing is kept: the times could not be compared with this replica's views.
func (p *Peers) applyTurns(replica string, payload []byte, addedMs int64) {
	if len(payload) == 0 || !p.offsetKnown.Load() {
		return
	}
	now := p.o.Clock.Now()
	added := time.UnixMilli(addedMs - p.offsetMs.Load())
	backends := p.reg.Backends()
	keepFrom := now.Add(-p.keep())
	_ = decodeTurns(payload, func(kind byte, name []byte, key uint64, age time.Duration) {
		for _, b := range backends {
			if b.Name() == string(name) { // no copy
				at := added.Add(-age)
				p.turns.add(b, key, kind, at, now)
				if kind == turnDispatched {
					b.peerReqs.add(key, replica, at, keepFrom)
				} else {
					b.peerReqs.end(key, replica, at)
				}
				return
			}
		}
	})
}
