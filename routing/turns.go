package routing

import (
	"encoding/binary"
	"math"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/switchyard/switchyard/cache"
)

// The previous turn of a conversation, served through another replica (docs/design.md, "Load between replicas").
//
// A conversation whose turns alternate between two replicas sends its next turn the moment its previous answer
// ended. The replica that receives it judges the previous turn's backend on views taken while that answer was
// still running: the other replica's load report and its own scrape of the engine, each up to an interval old.
// Both still count the answer, so the backend, with a seat free again, looks full (64 engines of 4 seats: most
// moves across two replicas left a backend with three requests in it). The next turn itself says that the
// previous one ended: its prompt is the previous prompt, the answer and the new message (openai.Summary.PrevTurn).
// So every replica publishes, on the prefix-hint stream, when it dispatched each request and when it ended,
// keyed by a hash of the prompt; the replica that receives the next turn looks its previous prompt up, and takes
// the request off each view that surely counted it: a view taken after the dispatch and before the end, the end
// being the published one or, when none has come yet, no earlier than the records' measured latency ago (had it
// ended before, its record would be here). Every rule errs towards counting the request, and only the backend
// that served the previous turn is corrected, for this pick only.

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

// peerTurn is one request as the turn records told of it.
type peerTurn struct {
	b          *Backend
	replica    string
	dispatched time.Time // on this replica's clock, estimated late (zero: no dispatch record came)
	ended      time.Time // estimated early; zero until its end record came
	seen       int       // dispatches of this prompt seen, by any replica this one included: 1 to trust it
	slot       int       // its place in the eviction ring
}

// turnLog holds the other replicas' recent requests by prompt key, and the latency of their records.
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

// add folds in one record of another replica, received at now.
func (l *turnLog) add(b *Backend, replica string, key uint64, kind byte, at, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.entry(key)
	switch kind {
	case turnDispatched:
		t.seen++
		t.b, t.replica, t.dispatched, t.ended = b, replica, at, time.Time{}
	case turnEnded:
		if t.b == b && t.replica == replica && !t.dispatched.IsZero() {
			t.ended = at
		}
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

// turnViews are the views of a backend a pick reads, with when each was taken (on this replica's clock).
type turnViews struct {
	report      reportSpan // the served replica's load report installed now; zero if none
	scrapeSent  time.Time  // the engine scrape in use was sent...
	scrapeAt    time.Time  // ...and answered; zero if none
	rtt, margin time.Duration
}

// counted says which views surely counted t, a request that has ended by now (the next turn of its conversation
// came) and whose records arrive within lat: the load report if its counts were read after the dispatch and before
// the end, the scrape if it was sent after the request reached the engine (a round trip after the dispatch) and
// answered before it ended there (a round trip before the replica saw the end). Without an end record the end is
// no earlier than lat ago. margin covers the clocks' offsets through Redis.
func (t peerTurn) counted(v turnViews, now time.Time, lat time.Duration) (report, scrape bool) {
	if t.b == nil || t.seen != 1 || t.dispatched.IsZero() {
		return false, false
	}
	end := t.ended
	if end.IsZero() {
		end = now.Add(-lat)
	}
	from := t.dispatched.Add(v.margin)
	report = !v.report.from.IsZero() && !v.report.from.Before(from) && v.report.to.Add(v.margin).Before(end)
	scrape = !v.scrapeSent.IsZero() && !v.scrapeSent.Before(from.Add(v.rtt)) && v.scrapeAt.Add(v.margin+v.rtt).Before(end)
	return report, scrape
}

// turnLess is what a pick takes off one backend's views: the previous turn of the request's conversation, which
// another replica served and which has ended. The zero value takes nothing off.
type turnLess struct {
	b              *Backend
	report, engine float64 // 1 when that view counted it
}

// on returns what t takes off b's views.
func (t turnLess) on(b *Backend) turnLess {
	if t.b != b {
		return turnLess{}
	}
	return t
}

// prevTurn returns what r's previous turn takes off the views of the backend that served it through another
// replica, at now. Nothing without peers, without a previous turn in r's prompt, or without its records.
func (p *Peers) prevTurn(r *Request, now time.Time) turnLess {
	if p == nil || r.PrevTurn <= 0 || r.PrevTurn > len(r.Prompt) {
		return turnLess{}
	}
	t, lat, ok := p.turns.lookup(turnKey(r.Model, r.Prompt[:r.PrevTurn]))
	if !ok || t.b == nil {
		return turnLess{}
	}
	b := t.b
	v := turnViews{rtt: time.Duration(b.rtt() * float64(time.Second)), margin: p.margin()}
	if pl := b.peerLoad(now); pl != nil && pl.reports != nil {
		v.report = pl.reports.at[t.replica]
	}
	if e := b.engine.Load(); e != nil && !e.Stale {
		v.scrapeSent, v.scrapeAt = e.sent, e.At
	}
	report, scrape := t.counted(v, now, lat)
	less := turnLess{b: b}
	if report {
		less.report = 1
	}
	if scrape {
		less.engine = 1
	}
	return less
}

// turnsOf returns the Peers of the registry that targets' backends belong to, or nil.
func turnsOf(targets []Target) *Peers {
	if len(targets) == 0 || targets[0].Backend.hints == nil {
		return nil
	}
	return targets[0].Backend.hints.p.Load()
}

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

// decodeTurns calls fn for each record in b; it stops at the first malformed one.
func decodeTurns(b []byte, fn func(kind byte, name string, key uint64, age time.Duration)) error {
	for len(b) > 0 {
		if len(b) < 2 {
			return errBadHints
		}
		kind, nl := b[0], int(b[1])
		if len(b) < 2+nl+8 {
			return errBadHints
		}
		name := string(b[2 : 2+nl])
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
	_ = decodeTurns(payload, func(kind byte, name string, key uint64, age time.Duration) {
		for _, b := range backends {
			if b.Name() == name {
				p.turns.add(b, replica, key, kind, added.Add(-age), now)
				return
			}
		}
	})
}
