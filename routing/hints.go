package routing

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// PeerLoad is the load the other gateway replicas reported on one backend, summed over the replicas whose reports
// are fresh. Routing adds its Inflight to the backend's own (Backend.Inflight, which every strategy reads), its
// Decoding to the sequences the latency models see, and what is left of its PrefillTokens at the backend's
// learned prefill rate to the queued prefill (drain.go), until Until.
type PeerLoad struct {
	// Inflight, PrefillTokens and Decoding are the other replicas' requests in flight to the backend, the
	// uncached prompt tokens they dispatched without a first token yet and not yet drained (each report drained
	// by its age to At), and their requests decoding there.
	Inflight, PrefillTokens, Decoding int64
	// At is when PrefillTokens was left; Until is when the figures go stale (a replica that stopped reporting
	// stops counting).
	At, Until time.Time

	reports *reportTimes // when each replica's report in the sums was taken (turns.go)
}

// reportTimes are when the other replicas' load reports of one sync were taken, by replica, on this replica's
// clock.
type reportTimes struct{ at map[string]reportSpan }

// reportSpan is when a replica read the counts of its report: from no earlier than from to no later than to.
type reportSpan struct{ from, to time.Time }

// peerLoad returns b's fresh peer load, or nil.
func (b *Backend) peerLoad(now time.Time) *PeerLoad {
	p := b.peer.Load()
	if p == nil || !now.Before(p.Until) {
		return nil
	}
	return p
}

// hintCell is where a Registry's backends find the Peers that publishes their confirmed prefixes.
type hintCell struct{ p atomic.Pointer[Peers] }

// PeersOptions configure Peers. Zero fields take the defaults.
type PeersOptions struct {
	// Prefix starts every Redis key, e.g. "switchyard:". The keys are Prefix+"{fleet}:load" (a hash) and
	// Prefix+"{fleet}:prefixes" (a stream); the hash tag keeps them in one Redis Cluster slot.
	Prefix string
	// ID names this replica among the others; default a random one (a restarted replica is a new one; the old
	// one's load expires).
	ID string
	// Interval is how often this replica publishes its load and reads the others'. A report counts for three
	// intervals. Default 200ms.
	Interval time.Duration
	// HintFlush bounds how long a queued prefix hint waits for the publisher when its wake-up was missed.
	// Default min(Interval, 50ms).
	HintFlush time.Duration
	// MaxHintBlocks is how many leading 64-byte blocks of a prompt a hint carries (a longer shared prefix is
	// matched up to there on the other replicas). Default 128 (8 KiB of prompt, about 2,000 tokens).
	MaxHintBlocks int
	// Clock stamps load expiry and hint de-duplication; nil means the system clock.
	Clock Clock
	// OnError is told of every failed Redis operation, with the operation ("load" or "prefix_hints"); nil
	// ignores them. It must not block.
	OnError func(op string, err error)
}

// Peers shares what this gateway replica knows with the others through Redis, and folds in what they know
// (docs/design.md, "State shared through Redis"), entirely off the request path:
//
//   - Load hints. Every Interval it writes its own in-flight requests, queued prefill tokens and decoding
//     requests per backend into a Redis hash, field per replica, stamped with an expiry in Redis TIME, and reads
//     back the others' fresh entries in the same atomic script (expired ones are deleted there). The sums go to
//     each Backend as a PeerLoad valid for three intervals, so Inflight and the decoding count the fleet's
//     requests, and a replica that died stops counting within three intervals.
//   - Prefix ownership hints. When a request is dispatched to a backend, the backend's name and up to
//     MaxHintBlocks chained block hashes of its prompt are queued (one mutex, a copy, never a wait) and the
//     publisher is woken: it sends what is queued as one entry of a Redis stream (capped at about 10,000
//     entries, expiring 30 minutes after the last write), so hints batch by themselves under load and reach
//     the others within a round trip or two, before the request's prefill is done (the next request of a
//     conversation must find them). A reader follows the stream with blocking reads and confirms the other
//     replicas' hints in this replica's prefix index, so a prefix stays on one backend whichever replica
//     receives it; the index's own TTL and capacity expire them. The same prefix on the same backend is
//     published at most once a minute.
//   - Dispatches and ends. Each request's dispatch and end, keyed by a hash of its prompt, go out in the same
//     stream entries; the others bring their views of each backend (the reports, their scrapes) up to now with
//     them, and a conversation's next turn counts its previous one as ended (turns.go). Each load report says
//     when its counts were read, for the same purpose.
//
// A Redis failure costs nothing on the request path: the load hints in hand expire and routing falls back to
// this replica's own accounting, unpublished hints are dropped, each failure is reported through OnError, and
// both loops retry every interval (the go-redis client reconnects by itself), resuming the stream where they
// left it, or from its start when Redis came back empty.
//
// Start and Stop may be called from any goroutine, once each; Stop waits for the loops.
type Peers struct {
	c                   redis.UniversalClient
	reg                 *Registry
	o                   PeersOptions
	loadKey, streamKey  string
	stale               time.Duration
	opTimeout           time.Duration
	cancel              context.CancelFunc
	wg                  sync.WaitGroup
	published, received atomic.Uint64
	offsetMs            atomic.Int64 // Redis TIME minus this replica's clock, in ms, as the last load script saw it
	offsetErr           atomic.Int64 // how far offsetMs may be off, in ns: half the script's round trip
	offsetKnown         atomic.Bool
	turns               turnLog // the prompts dispatched lately, for a follow-up to find its previous turn (turns.go)

	kick    chan struct{} // wakes the publisher when a hint is queued
	mu      sync.Mutex
	pending []pendingHint
	hashes  []uint64
	// pendingTurns are this replica's dispatches and ends waiting for the publisher (turns.go).
	pendingTurns []turnEvent
	sent         map[uint64]int64 // deepest hash ^ backend name hash -> UnixNano when published or received
}

type pendingHint struct {
	name     string
	off, len int   // in Peers.hashes
	tok      int64 // the dispatch's uncached prompt tokens (drain.go)
}

const (
	hintRefresh    = time.Minute      // the same prefix on the same backend is published at most this often
	maxPendingHint = 4096             // hints queued between two flushes beyond this are dropped
	maxSent        = 1 << 17          // de-duplication entries kept
	streamMaxLen   = 10000            // batches kept in the stream (approximately)
	streamTTL      = 30 * time.Minute // the stream expires this long after the last batch
	replayWindow   = time.Minute      // a starting replica reads the hints of the last minute
)

// NewPeers returns the sharing of reg's backends through c. It does nothing until Start.
func NewPeers(c redis.UniversalClient, reg *Registry, o PeersOptions) *Peers {
	if o.Interval <= 0 {
		o.Interval = 200 * time.Millisecond
	}
	if o.HintFlush <= 0 {
		o.HintFlush = min(o.Interval, 50*time.Millisecond)
	}
	if o.MaxHintBlocks <= 0 {
		o.MaxHintBlocks = 128
	}
	if o.Clock == nil {
		o.Clock = SystemClock{}
	}
	if o.ID == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		o.ID = hex.EncodeToString(b[:])
	}
	p := &Peers{c: c, reg: reg, o: o, loadKey: o.Prefix + "{fleet}:load", streamKey: o.Prefix + "{fleet}:prefixes",
		stale: 3 * o.Interval, opTimeout: max(o.Interval, 100*time.Millisecond), sent: make(map[uint64]int64),
		kick: make(chan struct{}, 1)}
	p.turns.init()
	return p
}

// ID returns this replica's name among its peers.
func (p *Peers) ID() string { return p.o.ID }

// Counts returns how many prefix hints this replica published and how many of the others' it applied.
func (p *Peers) Counts() (published, received uint64) { return p.published.Load(), p.received.Load() }

// Start begins publishing and reading.
func (p *Peers) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.reg.hints.p.Store(p)
	p.wg.Add(2)
	go func() { defer p.wg.Done(); p.publishLoop(ctx) }()
	go func() { defer p.wg.Done(); p.readLoop(ctx) }()
}

// Stop stops both loops and waits for them; the peer load in hand expires by itself.
func (p *Peers) Stop() {
	p.reg.hints.p.CompareAndSwap(p, nil)
	if p.cancel != nil {
		p.cancel()
	}
	p.wg.Wait()
}

func (p *Peers) report(op string, err error) {
	if p.o.OnError != nil && err != nil {
		p.o.OnError(op, err)
	}
}

func (p *Peers) publishLoop(ctx context.Context) {
	load := time.NewTicker(p.o.Interval)
	defer load.Stop()
	flush := time.NewTicker(p.o.HintFlush)
	defer flush.Stop()
	p.syncLoad(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-load.C:
			p.syncLoad(ctx)
		case <-flush.C:
			p.flushHints(ctx)
		case <-p.kick:
			p.flushHints(ctx)
		}
	}
}

// loadScript writes this replica's load report (ARGV[2]) under its id (ARGV[1]) with an expiry of ARGV[3] ms
// in Redis TIME, deletes the expired reports, and returns Redis TIME in ms followed by the others' fresh reports,
// each as two elements, "<ms until it expires> <report>" and the replica's id: a report's age is the expiry it was
// written with less that. (The reply's shape is this binary's own: each replica runs its own script.)
var loadScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], (now + ttl) .. ' ' .. ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl * 4)
local all = redis.call('HGETALL', KEYS[1])
local out = {tostring(now)}
for i = 1, #all, 2 do
  local v = all[i + 1]
  local sp = string.find(v, ' ', 1, true)
  local exp = sp and tonumber(string.sub(v, 1, sp - 1))
  if exp == nil or exp <= now then redis.call('HDEL', KEYS[1], all[i])
  elseif all[i] ~= ARGV[1] then
    out[#out + 1] = (exp - now) .. ' ' .. string.sub(v, sp + 1)
    out[#out + 1] = all[i]
  end
end
return out
`)

// syncLoad publishes this replica's load and installs the others'.
func (p *Peers) syncLoad(ctx context.Context) {
	backends := p.reg.Backends()
	var b strings.Builder
	from := p.o.Clock.Now()
	for _, be := range backends {
		inflight := be.LocalInflight()
		_, tok := be.Prefilling()
		dec := be.Decoding()
		if inflight == 0 && tok == 0 && dec == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(';')
		}
		b.WriteString(be.Name())
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(inflight, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(tok, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(dec, 10))
	}
	if p.offsetKnown.Load() {
		// When the counts were read, in Redis time (turns.go): an entry without '=', which parsePeerLoad skips.
		off := p.offsetMs.Load()
		if b.Len() > 0 {
			b.WriteByte(';')
		}
		b.WriteString("@")
		b.WriteString(strconv.FormatInt(from.UnixMilli()+off, 10))
		b.WriteByte(',')
		b.WriteString(strconv.FormatInt(p.o.Clock.Now().UnixMilli()+1+off, 10))
	}
	cctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	sent := p.o.Clock.Now()
	res, err := loadScript.Run(cctx, p.c, []string{p.loadKey}, p.o.ID, b.String(), p.stale.Milliseconds()).StringSlice()
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			p.report("load", err)
		}
		return // the load in hand expires by itself
	}
	read := p.o.Clock.Now()
	if len(res) == 0 {
		return
	}
	mid := sent.Add(read.Sub(sent) / 2) // the script ran between sent and read: take the middle (on loopback or in one zone, a millisecond)
	if redisMs, err := strconv.ParseInt(res[0], 10, 64); err == nil {
		p.offsetMs.Store(redisMs - mid.UnixMilli())
		p.offsetErr.Store(int64(read.Sub(sent) / 2))
		p.offsetKnown.Store(true)
	}
	res = res[1:]
	rates := make(map[string]float64, len(backends))
	for _, be := range backends {
		rates[be.Name()] = be.lat.prefillPerToken()
	}
	sums := make(map[string]*PeerLoad, len(backends))
	reports := &reportTimes{at: make(map[string]reportSpan, len(res)/2)}
	for i := 0; i+1 < len(res); i += 2 {
		left, report, ok := strings.Cut(res[i], " ")
		ms, err := strconv.ParseInt(left, 10, 64)
		if !ok || err != nil {
			continue
		}
		age := min(max(p.stale-time.Duration(ms)*time.Millisecond, 0), p.stale)
		parsePeerLoad(report, age, rates, sums)
		reports.at[res[i+1]] = p.reportSpan(report, mid.Add(-age))
	}
	until := read.Add(p.stale)
	for _, be := range backends {
		pl := PeerLoad{At: read, Until: until, reports: reports}
		if s := sums[be.Name()]; s != nil {
			pl.Inflight, pl.PrefillTokens, pl.Decoding = s.Inflight, s.PrefillTokens, s.Decoding
		}
		be.peer.Store(&pl)
	}
}

// reportSpan returns when the counts of report, written at written (on this replica's clock), were read: as
// its "@from,to" entry says, in Redis time; without one (a replica that predates it, or knew no offset yet),
// within the op timeout before the write.
func (p *Peers) reportSpan(report string, written time.Time) reportSpan {
	if i := strings.LastIndexByte(report, '@'); i >= 0 {
		a, b, _ := strings.Cut(report[i+1:], ",")
		from, err1 := strconv.ParseInt(a, 10, 64)
		to, err2 := strconv.ParseInt(b, 10, 64)
		if err1 == nil && err2 == nil && from <= to && p.offsetKnown.Load() {
			off := p.offsetMs.Load()
			return reportSpan{from: time.UnixMilli(from - off), to: time.UnixMilli(to - off)}
		}
	}
	return reportSpan{from: written.Add(-p.opTimeout), to: written}
}

// parsePeerLoad adds one replica's report ("name=inflight,prefill_tokens,decoding;...") of age age to sums, its
// prefill tokens drained by that age at rates[name] seconds per token (none for a backend not in rates).
// Malformed entries are skipped.
func parsePeerLoad(r string, age time.Duration, rates map[string]float64, sums map[string]*PeerLoad) {
	for entry := range strings.SplitSeq(r, ";") {
		name, nums, ok := strings.Cut(entry, "=")
		if !ok {
			continue
		}
		f := strings.Split(nums, ",")
		if len(f) != 3 {
			continue
		}
		var v [3]int64
		bad := false
		for i := range v {
			n, err := strconv.ParseInt(f[i], 10, 64)
			if err != nil || n < 0 {
				bad = true
				break
			}
			v[i] = n
		}
		if bad {
			continue
		}
		s := sums[name]
		if s == nil {
			s = &PeerLoad{}
			sums[name] = s
		}
		s.Inflight += v[0]
		if rate := rates[name]; rate > 0 {
			v[1] = max(v[1]-int64(age.Seconds()/rate), 0)
		}
		s.PrefillTokens += v[1]
		s.Decoding += v[2]
	}
}

// routed queues a prefix hint: a request with these prompt hashes and tok uncached prompt tokens was dispatched to
// b. It runs on the request path: it copies at most MaxHintBlocks hashes under a mutex, wakes the publisher
// without waiting, and never waits on Redis.
func (p *Peers) routed(b *Backend, hashes []uint64, tok int64, now time.Time) {
	n := min(len(hashes), p.o.MaxHintBlocks)
	if n == 0 {
		return
	}
	key := hashes[n-1] ^ b.nameHash // the deepest hash stands for the whole chain before it
	t := now.UnixNano()
	p.mu.Lock()
	defer p.mu.Unlock()
	if last, ok := p.sent[key]; ok && t-last < int64(hintRefresh) {
		return
	}
	if len(p.pending) >= maxPendingHint {
		return
	}
	if len(p.sent) >= maxSent {
		clear(p.sent)
	}
	p.sent[key] = t
	p.pending = append(p.pending, pendingHint{name: b.Name(), off: len(p.hashes), len: n, tok: max(tok, 0)})
	p.hashes = append(p.hashes, hashes[:n]...)
	select {
	case p.kick <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// flushHints publishes the queued hints as one stream entry.
func (p *Peers) flushHints(ctx context.Context) {
	p.mu.Lock()
	if len(p.pending) == 0 && len(p.pendingTurns) == 0 {
		p.mu.Unlock()
		return
	}
	payload := encodeHints(nil, p.pending, p.hashes)
	var toks []byte
	for _, h := range p.pending {
		toks = binary.AppendUvarint(toks, uint64(h.tok))
	}
	turns := encodeTurns(nil, p.pendingTurns, p.o.Clock.Now())
	count := len(p.pending)
	p.pending, p.hashes = p.pending[:0], p.hashes[:0]
	clear(p.pendingTurns) // the names
	p.pendingTurns = p.pendingTurns[:0]
	p.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	_, err := p.c.Pipelined(cctx, func(pl redis.Pipeliner) error {
		pl.XAdd(cctx, &redis.XAddArgs{Stream: p.streamKey, MaxLen: streamMaxLen, Approx: true,
			Values: []any{"r", p.o.ID, "d", payload, "q", toks, "t", turns}})
		pl.PExpire(cctx, p.streamKey, streamTTL)
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			p.report("prefix_hints", err)
		}
		return
	}
	p.published.Add(uint64(count))
}

// encodeHints appends the hints: per hint, the backend name's length (1 byte) and bytes, the number of hashes
// (2 bytes, little endian) and the hashes (8 bytes each, little endian).
func encodeHints(dst []byte, hs []pendingHint, hashes []uint64) []byte {
	for _, h := range hs {
		dst = append(dst, byte(len(h.name)))
		dst = append(dst, h.name...)
		dst = binary.LittleEndian.AppendUint16(dst, uint16(h.len))
		for _, x := range hashes[h.off : h.off+h.len] {
			dst = binary.LittleEndian.AppendUint64(dst, x)
		}
	}
	return dst
}

var errBadHints = errors.New("routing: malformed prefix hints")

// decodeHints calls fn for each hint in b; it stops at the first malformed one.
func decodeHints(b []byte, fn func(name string, hashes []uint64)) error {
	var hs []uint64
	for len(b) > 0 {
		nl := int(b[0])
		if len(b) < 1+nl+2 {
			return errBadHints
		}
		name := string(b[1 : 1+nl])
		n := int(binary.LittleEndian.Uint16(b[1+nl:]))
		b = b[1+nl+2:]
		if len(b) < 8*n {
			return errBadHints
		}
		hs = hs[:0]
		for i := range n {
			hs = append(hs, binary.LittleEndian.Uint64(b[8*i:]))
		}
		b = b[8*n:]
		fn(name, hs)
	}
	return nil
}

// readLoop follows the hint stream and applies the other replicas' hints.
func (p *Peers) readLoop(ctx context.Context) {
	last := strconv.FormatInt(p.o.Clock.Now().Add(-replayWindow).UnixMilli(), 10) + "-0"
	failed := false
	for ctx.Err() == nil {
		if failed {
			last = p.resume(ctx, last)
		}
		streams, err := p.c.XRead(ctx, &redis.XReadArgs{Streams: []string{p.streamKey, last}, Count: 256,
			Block: p.o.Interval}).Result()
		if errors.Is(err, redis.Nil) {
			failed = false
			continue // nothing new within the block time
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			p.report("prefix_hints", err)
			failed = true
			select {
			case <-ctx.Done():
				return
			case <-time.After(p.o.Interval):
			}
			continue
		}
		failed = false
		for _, s := range streams {
			for _, m := range s.Messages {
				last = m.ID
				r, _ := m.Values["r"].(string)
				if r == p.o.ID {
					continue
				}
				d, _ := m.Values["d"].(string)
				q, _ := m.Values["q"].(string) // absent from replicas that predate it
				t, _ := m.Values["t"].(string) // the same
				ms, _, _ := strings.Cut(m.ID, "-")
				at, _ := strconv.ParseInt(ms, 10, 64)
				p.apply([]byte(d), []byte(q), at)
				p.applyTurns(r, []byte(t), at)
			}
		}
	}
}

// resume returns where to read the stream after a failure: where we were, unless the stream's newest entry is
// older than that (Redis restarted empty, or failed over to a server whose stream is behind), then its start.
func (p *Peers) resume(ctx context.Context, last string) string {
	cctx, cancel := context.WithTimeout(ctx, p.opTimeout)
	defer cancel()
	top, err := p.c.XRevRangeN(cctx, p.streamKey, "+", "-", 1).Result()
	if err != nil {
		return last
	}
	if len(top) == 0 || streamIDLess(top[0].ID, last) {
		return "0-0"
	}
	return last
}

// streamIDLess compares two stream IDs ("ms-seq").
func streamIDLess(a, b string) bool {
	am, as, _ := strings.Cut(a, "-")
	bm, bs, _ := strings.Cut(b, "-")
	ai, _ := strconv.ParseUint(am, 10, 64)
	bi, _ := strconv.ParseUint(bm, 10, 64)
	if ai != bi {
		return ai < bi
	}
	asq, _ := strconv.ParseUint(as, 10, 64)
	bsq, _ := strconv.ParseUint(bs, 10, 64)
	return asq < bsq
}

// apply confirms another replica's hints in this replica's prefix index, and queues the prefill of each
// dispatch they announce (toks, one uvarint per hint; empty from older replicas) at its time: the stream entry's
// Redis time in ms (addedMs), less the clock offset, when that is known and the entry is fresher than a report.
func (p *Peers) apply(payload, toks []byte, addedMs int64) {
	backends := p.reg.Backends()
	now := p.o.Clock.Now()
	t := now.UnixNano()
	at, fresh := time.Time{}, false
	if p.offsetKnown.Load() {
		at = time.UnixMilli(addedMs - p.offsetMs.Load())
		fresh = now.Sub(at) < p.stale
	}
	_ = decodeHints(payload, func(name string, hashes []uint64) {
		tok, n := binary.Uvarint(toks)
		if n > 0 {
			toks = toks[n:]
		} else {
			tok, toks = 0, nil
		}
		for _, b := range backends {
			if b.Name() != name {
				continue
			}
			if fresh && tok > 0 {
				b.peerDispatched(at, float64(tok))
			}
			if o := b.prefixOwner(); o != nil && len(hashes) > 0 {
				o.Confirm(hashes, now)
				p.received.Add(1)
				p.mu.Lock()
				p.sent[hashes[len(hashes)-1]^b.nameHash] = t // it is known: no need to publish it again soon
				p.mu.Unlock()
			}
			return
		}
	})
}
