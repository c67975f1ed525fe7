package routing

import (
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/redistest"
)

func TestPrevTurnCounted(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	span := func(ms int) reportSpan { return reportSpan{from: at(ms - 1), to: at(ms)} }
	b := &Backend{}
	const lat = 3 * time.Millisecond
	for _, tc := range []struct {
		name           string
		turn           peerTurn
		v              turnViews
		nowMs          int
		report, scrape bool
	}{
		{name: "both views taken while it ran, no end record yet",
			turn: peerTurn{b: b, seen: 1, dispatched: at(0)}, nowMs: 3000,
			v:      turnViews{report: span(2900), scrapeSent: at(2850), scrapeAt: at(2860)},
			report: true, scrape: true},
		{name: "views taken just now: its end may be in them",
			turn: peerTurn{b: b, seen: 1, dispatched: at(0)}, nowMs: 3000,
			v: turnViews{report: span(2999), scrapeSent: at(2997), scrapeAt: at(2999)}},
		{name: "views older than its dispatch",
			turn: peerTurn{b: b, seen: 1, dispatched: at(0)}, nowMs: 3000,
			v: turnViews{report: span(-50), scrapeSent: at(-30), scrapeAt: at(-20)}},
		{name: "ended before the views were taken",
			turn: peerTurn{b: b, seen: 1, dispatched: at(0), ended: at(2000)}, nowMs: 3000,
			v: turnViews{report: span(2500), scrapeSent: at(2400), scrapeAt: at(2410)}},
		{name: "ended after the views were taken",
			turn: peerTurn{b: b, seen: 1, dispatched: at(0), ended: at(2000)}, nowMs: 3000,
			v:      turnViews{report: span(1900), scrapeSent: at(1800), scrapeAt: at(1810)},
			report: true, scrape: true},
		{name: "the margin keeps a view taken at the dispatch",
			turn: peerTurn{b: b, seen: 1, dispatched: at(0)}, nowMs: 3000,
			v: turnViews{report: span(1), scrapeSent: at(1), scrapeAt: at(2), margin: 2 * time.Millisecond}},
		{name: "a scrape sent within a round trip of the dispatch may have missed it",
			turn: peerTurn{b: b, seen: 1, dispatched: at(0)}, nowMs: 3000,
			v:      turnViews{report: span(5), scrapeSent: at(5), scrapeAt: at(7), rtt: 10 * time.Millisecond},
			report: true},
		{name: "a scrape answered within a round trip of the end may not count it",
			turn: peerTurn{b: b, seen: 1, dispatched: at(0), ended: at(2000)}, nowMs: 3000,
			v:      turnViews{report: span(1995), scrapeSent: at(1990), scrapeAt: at(1995), rtt: 10 * time.Millisecond},
			report: true},
		{name: "the same prompt dispatched twice",
			turn: peerTurn{b: b, seen: 2, dispatched: at(0)}, nowMs: 3000,
			v: turnViews{report: span(2900), scrapeSent: at(2850), scrapeAt: at(2860)}},
		{name: "only its end was seen",
			turn: peerTurn{b: b, seen: 0, ended: at(2000)}, nowMs: 3000,
			v: turnViews{report: span(1900), scrapeSent: at(1800), scrapeAt: at(1810)}},
		{name: "no views",
			turn: peerTurn{b: b, seen: 1, dispatched: at(0)}, nowMs: 3000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			report, scrape := tc.turn.counted(tc.v, at(tc.nowMs), lat)
			if report != tc.report || scrape != tc.scrape {
				t.Fatalf("counted: report %v, scrape %v; want %v, %v", report, scrape, tc.report, tc.scrape)
			}
		})
	}
}

func TestTurnEncoding(t *testing.T) {
	flush := time.Unix(2000, 0)
	evs := []turnEvent{
		{name: "x", key: 42, kind: turnDispatched, at: flush.Add(-1500 * time.Microsecond)},
		{name: "backend-y", key: 1 << 63, kind: turnEnded, at: flush},
		{name: "z", key: 7, kind: turnEnded, at: flush.Add(time.Second)}, // after the flush: no negative age
	}
	b := encodeTurns(nil, evs, flush)
	type rec struct {
		kind byte
		name string
		key  uint64
		age  time.Duration
	}
	var got []rec
	if err := decodeTurns(b, func(kind byte, name string, key uint64, age time.Duration) {
		got = append(got, rec{kind, name, key, age})
	}); err != nil {
		t.Fatal(err)
	}
	want := []rec{{'d', "x", 42, 1500 * time.Microsecond}, {'e', "backend-y", 1 << 63, 0}, {'e', "z", 7, 0}}
	if len(got) != len(want) {
		t.Fatalf("decoded %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("record %d: %v, want %v", i, got[i], want[i])
		}
	}
	// A kind this version does not know is skipped; a truncated record stops the decoding.
	other := append([]byte{'z', 1, 'q'}, make([]byte, 9)...)
	n := 0
	if err := decodeTurns(append(other, b...), func(byte, string, uint64, time.Duration) { n++ }); err != nil || n != 3 {
		t.Fatalf("with an unknown kind first: %d records, %v; want 3, nil", n, err)
	}
	whole := map[int]bool{}
	for i := range evs {
		whole[len(encodeTurns(nil, evs[:i], flush))] = true
	}
	for cut := 1; cut < len(b); cut++ {
		if err := decodeTurns(b[:cut], func(byte, string, uint64, time.Duration) {}); err == nil && !whole[cut] {
			t.Fatalf("truncated at %d of %d bytes: no error", cut, len(b))
		}
	}
}

func TestTurnLogIsBounded(t *testing.T) {
	var l turnLog
	l.init()
	now := time.Unix(3000, 0)
	b := &Backend{}
	for i := range turnLogSize + 100 {
		l.add(b, "a", uint64(i), turnDispatched, now, now)
	}
	if len(l.m) != turnLogSize || len(l.ring) != turnLogSize {
		t.Fatalf("%d records, ring of %d; want %d", len(l.m), len(l.ring), turnLogSize)
	}
	if _, _, ok := l.lookup(50); ok {
		t.Fatal("the oldest record is still there")
	}
	if tr, _, ok := l.lookup(turnLogSize + 50); !ok || tr.seen != 1 {
		t.Fatalf("a recent record: %+v, %v", tr, ok)
	}
	// The latency is the largest seen, halved every latHalfLife.
	l.observeLatency(0.008, now)
	l.observeLatency(0.001, now.Add(latHalfLife))
	if _, lat, _ := l.lookup(turnLogSize + 50); lat != 4*time.Millisecond {
		t.Fatalf("latency %v, want 4ms", lat)
	}
}

// TestPrevTurnThroughAnotherReplica runs two replicas' Peers on a real Redis: replica a serves a conversation's
// turn on x beside three other requests; b, which receives the next turn, takes that turn off a's load report
// while the report still counts it, and off b's own scrape of x taken while it ran, so x, with a seat free
// again, does not look full.
func TestPrevTurnThroughAnotherReplica(t *testing.T) {
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	a := newReplica(t, redistest.Client(t, addr), prefix, "x", "y")
	b := newReplica(t, redistest.Client(t, addr), prefix, "x", "y")
	bx := b.backend("x")
	cfg := *bx.Config()
	cfg.MaxNumSeqs = 4
	bx.cfg.Store(&cfg)
	bx.hold.add(2) // a request holds a seat for 2 s
	waitUntil(t, 2*time.Second, "both replicas know Redis's clock", func() bool {
		return a.peers.offsetKnown.Load() && b.peers.offsetKnown.Load() // records and stamps need it
	})

	prev := []byte("system:" + strings.Repeat("You are a helpful assistant. ", 10) + "\nuser:What is a KV cache?\n")
	var others []Attempt
	for i := range 3 {
		others = append(others, a.backend("x").Dispatch(&Request{Model: "m", Prompt: []byte(strings.Repeat("z", 100+i))}))
	}
	turn := a.backend("x").Dispatch(&Request{Model: "m", Prompt: prev})
	key := turnKey("m", prev)
	waitUntil(t, 2*time.Second, "b has a's records and its report of four requests on x", func() bool {
		tr, _, ok := b.peers.turns.lookup(key)
		p := bx.peerLoad(time.Now())
		return ok && tr.b == bx && !tr.dispatched.IsZero() && p != nil && p.Inflight == 4
	})
	time.Sleep(50 * time.Millisecond)
	// b's own scrape of x, taken while the turn ran: four requests running, every seat taken.
	now := time.Now()
	bx.engine.Store(&EngineStats{Running: 4, Has: HasRunning | HasWaiting, sent: now.Add(-20 * time.Millisecond),
		At: now.Add(-15 * time.Millisecond)})
	if l := bx.loadAt(time.Now()); l.seatWait == 0 || l.inflight != 4 {
		t.Fatalf("before the end: seat wait %.3f s, %d in flight; want a wait, 4", l.seatWait, l.inflight)
	}

	turn.End(false) // the answer ended; the client sends its next turn at once, through b
	next := &Request{Model: "m", Prompt: append(append([]byte{}, prev...), "assistant:A cache of keys and values.\nuser:Why?\n"...),
		PrevTurn: len(prev)}
	deadline := time.Now().Add(300 * time.Millisecond)
	checks := 0
	for ; time.Now().Before(deadline); time.Sleep(3 * time.Millisecond) {
		now := time.Now()
		if bx.peerLoad(now) == nil {
			continue // a's report expired before b's next sync (a loaded machine): nothing to judge
		}
		checks++
		less := b.peers.prevTurn(next, now)
		if less.b != bx || less.engine != 1 {
			t.Fatalf("check %d: %+v; want the scrape of x corrected", checks, less)
		}
		l := bx.loadLess(now, less.on(bx))
		if l.inflight != 3 || l.seatWait != 0 || l.full {
			t.Fatalf("check %d: %d in flight, seat wait %.3f s, full %v; want 3, 0, false (report corrected: %v)",
				checks, l.inflight, l.seatWait, l.full, less.report)
		}
	}
	if checks < 10 {
		t.Fatalf("a's report was there for %d checks only", checks)
	}
	if tr, _, _ := b.peers.turns.lookup(key); tr.ended.IsZero() {
		t.Fatal("the end record did not reach b")
	}

	// A turn whose prompt was also dispatched elsewhere is not trusted; a request without a previous turn, or
	// routed by a replica without peers, corrects nothing.
	dup := b.backend("y").Dispatch(&Request{Model: "m", Prompt: prev})
	if less := b.peers.prevTurn(next, time.Now()); less.report != 0 || less.engine != 0 {
		t.Fatalf("an ambiguous previous turn corrected %+v", less)
	}
	dup.End(false)
	if less := b.peers.prevTurn(&Request{Model: "m", Prompt: next.Prompt}, time.Now()); less.b != nil {
		t.Fatalf("no previous turn: %+v", less)
	}
	var none *Peers
	if less := none.prevTurn(next, time.Now()); less.b != nil {
		t.Fatalf("no peers: %+v", less)
	}
	endAll(others)
}
