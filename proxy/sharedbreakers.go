package proxy

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
)

// SharedBreakers shares circuit-breaker openings among gateway replicas through Redis, so that a backend one
// replica finds dead is avoided by all within one Interval (docs/design.md, "State shared through Redis"), and it
// never makes a request wait on Redis: a breaker that opens only queues its name (a non-blocking send), and one
// goroutine publishes and reads the shared state every Interval.
//
// State: one Redis hash, Prefix+"{fleet}:breakers", field per backend name, value the time (ms, Redis TIME)
// until which the backend is open. Opening publishes now+OpenFor (never shortening a later time); every tick
// the script deletes the expired fields and returns the others as time left, which each replica applies on its
// own clock (no clock skew between replicas matters). A backend reported open is unhealthy here until then;
// its own breaker keeps its own counts.
//
// When Redis fails, the failure is reported through OnError, openings not yet published are dropped (the
// replicas that see the backend fail open their own breakers), reported openings still expire on time, and the
// loop retries every Interval.
type SharedBreakers struct {
	c        redis.UniversalClient
	key      string
	interval time.Duration
	timeout  time.Duration
	onError  func(op string, err error)

	events chan openEvent
	mu     sync.Mutex
	s      *Server
	cancel context.CancelFunc
	done   chan struct{}
}

type openEvent struct {
	name string
	d    time.Duration
}

// SharedBreakersOptions configure SharedBreakers.
type SharedBreakersOptions struct {
	// Prefix starts the Redis key, e.g. "switchyard:".
	Prefix string
	// Interval is how often openings are published and the others' read. Default 200ms.
	Interval time.Duration
	// OnError is told of every failed Redis operation ("breakers"); nil ignores them. It must not block.
	OnError func(op string, err error)
}

// NewSharedBreakers returns breaker sharing through c. Pass it in Options.SharedBreakers; Start it once the
// Server exists.
func NewSharedBreakers(c redis.UniversalClient, o SharedBreakersOptions) *SharedBreakers {
	if o.Interval <= 0 {
		o.Interval = 200 * time.Millisecond
	}
	return &SharedBreakers{c: c, key: o.Prefix + "{fleet}:breakers", interval: o.Interval,
		timeout: max(o.Interval, 100*time.Millisecond), onError: o.OnError, events: make(chan openEvent, 256)}
}

// opened queues the publication of a breaker that opened for d. It never blocks: when the queue is full the
// opening is not shared (the other replicas' own breakers still see the backend fail).
func (sb *SharedBreakers) opened(name string, d time.Duration) {
	select {
	case sb.events <- openEvent{name, d}:
	default:
	}
}

// Start begins sharing the breakers of s (the Server built with this SharedBreakers in its Options).
func (sb *SharedBreakers) Start() {
	ctx, cancel := context.WithCancel(context.Background())
	sb.mu.Lock()
	sb.cancel, sb.done = cancel, make(chan struct{})
	sb.mu.Unlock()
	go sb.loop(ctx)
}

// Stop stops sharing and waits for the loop to end. Openings reported by others expire by themselves.
func (sb *SharedBreakers) Stop() {
	sb.mu.Lock()
	cancel, done := sb.cancel, sb.done
	sb.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

func (sb *SharedBreakers) attach(s *Server) {
	sb.mu.Lock()
	sb.s = s
	sb.mu.Unlock()
}

func (sb *SharedBreakers) loop(ctx context.Context) {
	defer close(sb.done)
	t := time.NewTicker(sb.interval)
	defer t.Stop()
	sb.sync(ctx, nil)
	for {
		select {
		case <-ctx.Done():
			return
		case ev := <-sb.events:
			sb.sync(ctx, &ev) // an opening is published at once, not at the next tick
		case <-t.C:
			sb.sync(ctx, nil)
		}
	}
}

// breakerScript publishes openings (ARGV: count, then name and open ms for each) and returns every backend
// still open, with the ms left, deleting the expired ones. Times are Redis TIME.
var breakerScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = tonumber(ARGV[1])
local longest = 0
for i = 1, n do
  local name, ms = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  local cur = tonumber(redis.call('HGET', KEYS[1], name) or '0') or 0
  if now + ms > cur then redis.call('HSET', KEYS[1], name, now + ms) end
  if ms > longest then longest = ms end
end
local out = {}
local all = redis.call('HGETALL', KEYS[1])
local last = 0
for i = 1, #all, 2 do
  local u = tonumber(all[i + 1]) or 0
  if u <= now then redis.call('HDEL', KEYS[1], all[i]) else
    out[#out + 1] = all[i]
    out[#out + 1] = u - now
    if u - now > last then last = u - now end
  end
end
if last > 0 then redis.call('PEXPIRE', KEYS[1], last + 1000) end
return out
`)

// sync publishes first (if any) and the other queued openings, reads the shared state and applies it to the
// current backends.
func (sb *SharedBreakers) sync(ctx context.Context, first *openEvent) {
	sb.mu.Lock()
	s := sb.s
	sb.mu.Unlock()
	if s == nil {
		return
	}
	args := []any{0}
	if first != nil {
		args = append(args, first.name, first.d.Milliseconds())
	}
	for more := true; more && len(args) < 1+2*256; {
		select {
		case ev := <-sb.events:
			args = append(args, ev.name, ev.d.Milliseconds())
		default:
			more = false
		}
	}
	args[0] = (len(args) - 1) / 2
	cctx, cancel := context.WithTimeout(ctx, sb.timeout)
	res, err := breakerScript.Run(cctx, sb.c, []string{sb.key}, args...).Slice()
	cancel()
	now := time.Now()
	snap := s.src.Snapshot()
	if snap == nil {
		return
	}
	if err != nil {
		if ctx.Err() == nil && sb.onError != nil {
			sb.onError("breakers", err)
		}
		// Openings reported earlier still end on time.
		for _, b := range snap.Backends {
			if br := s.brk.peek(b); br != nil && br.remoteUntil.Load() != 0 {
				s.brk.refresh(br, br.cb.State() == gobreaker.StateOpen, now)
			}
		}
		return
	}
	open := make(map[string]time.Duration, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		name, _ := res[i].(string)
		var ms int64
		switch v := res[i+1].(type) {
		case int64:
			ms = v
		case string:
			ms, _ = strconv.ParseInt(v, 10, 64)
		}
		open[name] = time.Duration(ms) * time.Millisecond
	}
	for _, b := range snap.Backends {
		d, ok := open[b.Name()]
		if !ok {
			if br := s.brk.peek(b); br == nil || br.remoteUntil.Load() == 0 {
				continue // nothing reported, nothing to undo: do not create a breaker for it
			}
		}
		s.brk.setRemote(b, d, now)
	}
}
