package admission

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/switchyard/switchyard/metrics"
)

// RedisLimiter is the RateLimiter that replicas share (ops.md B4.2): each key's two token buckets live in one
// Redis hash and every decision is one atomic Lua script (EVALSHA, EVAL when the server lost the script), so a
// key gets its limit across the whole fleet, not per replica. The arithmetic is LocalLimiter's, exact in whole
// milliseconds of Redis TIME (never a replica's clock): a full bucket admits a burst of exactly N, then one
// every RateWindow/N, and the x-ratelimit-* headers and Retry-After are the same. Every key expires once its
// buckets would be full again, which is the same as forgetting it.
//
// Redis sits on the request path for at most Timeout. On an error or a timeout the request is decided by the
// local fallback (each replica then limits on its own, so the fleet's bound becomes the limit per replica until
// Redis answers again), the failure is reported through OnError, and Settle follows the reservation to where
// it was taken. The go-redis client reconnects by itself.
//
// Settle never makes the response wait: once Start has run, settlements go to a queue that one goroutine
// sends to Redis (a settlement that finds the queue full is sent at once instead). Without Start they are sent
// synchronously (tests).
//
// Safe for concurrent use. A policy reload gets a limiter around its new local fallback with WithLocal, which
// shares the client, the settle queue and the state in Redis (kept by key name).
type RedisLimiter struct {
	*redisLimits
	local *LocalLimiter
}

// redisLimits is what the limiters of successive policies share.
type redisLimits struct {
	c       redis.UniversalClient
	prefix  string
	timeout time.Duration
	clock   Clock // nil: Redis TIME
	onError func(op string, err error)
	shed    shedCounters

	mu      sync.Mutex
	settles chan settlement // nil until Start
	done    chan struct{}
}

type settlement struct {
	key   *Key
	delta int64
}

// settleQueue bounds the settlements waiting for the goroutine.
const settleQueue = 4096

var _ RateLimiter = (*RedisLimiter)(nil)

// RedisLimiterOptions configure a RedisLimiter.
type RedisLimiterOptions struct {
	// Prefix starts every key, e.g. "switchyard:"; a key's buckets live at Prefix+"rl:{name}" (the braces make
	// the key name a Redis Cluster hash tag).
	Prefix string
	// Timeout bounds each decision's round trip; past it the local fallback decides. Default 5ms.
	Timeout time.Duration
	// Local decides when Redis cannot; required. It keeps its own buckets (it is the policy's LocalLimiter).
	Local *LocalLimiter
	// Clock, when set, replaces Redis TIME (tests drive the buckets on a virtual clock); nil in production.
	Clock Clock
	// OnError is told of every failed Redis call, with the operation ("ratelimit"); nil ignores them. It must
	// not block: it runs on the request path.
	OnError func(op string, err error)
	// Metrics receives the refusals in switchyard_shed_total; nil: none.
	Metrics *metrics.Gateway
}

// NewRedisLimiter returns a limiter sharing its buckets through c.
func NewRedisLimiter(c redis.UniversalClient, o RedisLimiterOptions) *RedisLimiter {
	if o.Timeout <= 0 {
		o.Timeout = 5 * time.Millisecond
	}
	return &RedisLimiter{local: o.Local, redisLimits: &redisLimits{c: c, prefix: o.Prefix, timeout: o.Timeout,
		clock: o.Clock, onError: o.OnError, shed: newShedCounters(o.Metrics, ReasonRateLimitRequests, ReasonRateLimitTokens)}}
}

// WithLocal returns a limiter that shares l's client, settle queue and Redis state, falling back to local: the
// limiter of a reloaded policy.
func (l *RedisLimiter) WithLocal(local *LocalLimiter) *RedisLimiter {
	return &RedisLimiter{redisLimits: l.redisLimits, local: local}
}

// Local returns the local fallback (the policy passes it on to the next policy's limiter, so that buckets
// survive a reload).
func (l *RedisLimiter) Local() *LocalLimiter { return l.local }

// Start begins sending settlements from a queue, off the request path. Stop ends it.
func (l *RedisLimiter) Start() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.settles != nil {
		return
	}
	l.settles, l.done = make(chan settlement, settleQueue), make(chan struct{})
	go func(q chan settlement, done chan struct{}) {
		defer close(done)
		for st := range q {
			l.settleRedis(st.key, st.delta)
		}
	}(l.settles, l.done)
}

// Stop sends the queued settlements (each within the timeout) and stops the goroutine; later settlements are
// sent synchronously.
func (l *RedisLimiter) Stop() {
	l.mu.Lock()
	q, done := l.settles, l.done
	l.settles = nil
	l.mu.Unlock()
	if q == nil {
		return
	}
	close(q)
	<-done
}

// rateScript holds both buckets of one key in one hash and applies a take or a settle atomically. Its
// arithmetic is LocalLimiter's in milliseconds: a bucket of limit L holds a whole number of units (level,
// negative in debt) and the fraction accrued towards the next one as resid, in ms*units (< W). Every product
// stays far below 2^53, where Lua's doubles are exact integers, and divisions are corrected to exact floors.
//
//	KEYS[1]  the key's hash: rl (requests level), rr (resid), rL (its limit), tl, tr, tL (tokens), t (last ms)
//	ARGV[1]  "take" or "settle"
//	ARGV[2]  requests per minute, ARGV[3] tokens per minute (0: unlimited)
//	ARGV[4]  take: tokens to reserve; settle: reserved - used (a refund, or negative: an overrun)
//	ARGV[5]  the time in ms, or "" to read Redis TIME
//
// take returns {code, retry_ms, req_remaining, req_reset_ms, tok_remaining, tok_reset_ms}, code 0 admitted, 1
// refused for requests, 2 for tokens, 3 the reservation exceeds tokens per minute; settle returns 0.
var rateScript = redis.NewScript(`
local W = 60000
local now
if ARGV[5] ~= '' then now = tonumber(ARGV[5]) else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local RL, TL, n = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local s = redis.call('HMGET', KEYS[1], 'rl', 'rr', 'rL', 'tl', 'tr', 'tL', 't')
local last = tonumber(s[7]) or now
local elapsed = now - last
if elapsed < 0 then elapsed = 0; now = last end

local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then q = q - 1; r = r + b elseif r >= b then q = q + 1; r = r - b end
  return q, r
end
-- a bucket: refilled at its old limit up to now, then given the new one (a new bucket starts full; a bucket
-- above a lowered limit is cut to it)
local function bucket(L, lv, rs, oldL)
  oldL = tonumber(oldL) or 0
  if L == 0 then return {L = 0, level = 0, resid = 0} end
  if lv == false or oldL == 0 then return {L = L, level = L, resid = 0} end
  local b = {L = oldL, level = tonumber(lv), resid = tonumber(rs) or 0}
  if b.level >= b.L then b.resid = 0 else
    local need = b.L - b.level
    local total = elapsed * b.L + b.resid
    if total >= need * W then b.level, b.resid = b.L, 0 else
      local add, rem = divmod(total, W)
      b.level, b.resid = b.level + add, rem
    end
  end
  b.L = L
  if b.level > L then b.level = L end
  return b
end
-- ms until the bucket holds u units (ceil)
local function wait(b, u)
  if b.L == 0 or b.level >= u then return 0 end
  local q, r = divmod((u - b.level) * W - b.resid, b.L)
  if r > 0 then q = q + 1 end
  return q
end
local function remaining(b) if b.level > 0 then return b.level end return 0 end

local req = bucket(RL, s[1], s[2], s[3])
local tok = bucket(TL, s[4], s[5], s[6])
local out = 0
if ARGV[1] == 'settle' then
  if tok.L > 0 then
    tok.level = tok.level + n
    if tok.level > tok.L then tok.level = tok.L end
  end
else
  local code, retry = 0, 0
  if TL > 0 and n > TL then code = 3 else
    local rw, tw = wait(req, 1), wait(tok, n)
    if rw > 0 then code = 1; retry = math.max(rw, tw)
    elseif tw > 0 then code = 2; retry = tw
    else
      if req.L > 0 then req.level = req.level - 1 end
      if tok.L > 0 then tok.level = tok.level - n end
    end
  end
  out = {code, retry, remaining(req), wait(req, req.L), remaining(tok), wait(tok, tok.L)}
end
local ttl = math.max(wait(req, req.L), wait(tok, tok.L))
if req.L == 0 and tok.L == 0 then redis.call('DEL', KEYS[1]) return out end
redis.call('HSET', KEYS[1], 'rl', req.level, 'rr', req.resid, 'rL', req.L, 'tl', tok.level, 'tr', tok.resid, 'tL', tok.L, 't', now)
redis.call('PEXPIRE', KEYS[1], ttl + 1000)
return out
`)

// key returns the Redis key of an API key's buckets.
func (l *redisLimits) key(k *Key) string { return l.prefix + "rl:{" + k.Name + "}" }

func (l *redisLimits) nowArg() string {
	if l.clock == nil {
		return ""
	}
	return strconv.FormatInt(l.clock.Now().UnixMilli(), 10)
}

// Take implements RateLimiter.
func (l *RedisLimiter) Take(key *Key, tokens int64) Quota {
	tokens = max(tokens, 0)
	if key == nil || (key.RequestsPerMinute <= 0 && key.TokensPerMinute <= 0) {
		return Quota{Reserved: tokens}
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	res, err := rateScript.Run(ctx, l.c, []string{l.key(key)}, "take", key.RequestsPerMinute, key.TokensPerMinute,
		tokens, l.nowArg()).Int64Slice()
	cancel()
	if err == nil && len(res) != 6 {
		err = errors.New("admission: rate-limit script returned " + strconv.Itoa(len(res)) + " values")
	}
	if err != nil {
		if l.onError != nil {
			l.onError("ratelimit", err)
		}
		q := l.local.Take(key, tokens)
		q.fallback = true
		return q
	}
	ms := func(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
	q := Quota{Reserved: tokens,
		Requests: Allowance{Limit: max(key.RequestsPerMinute, 0), Remaining: res[2], Reset: ms(res[3])},
		Tokens:   Allowance{Limit: max(key.TokensPerMinute, 0), Remaining: res[4], Reset: ms(res[5])}}
	switch res[0] {
	case 1:
		q.Err, q.RetryAfter = ErrRateLimitRequests, ms(res[1])
	case 2:
		q.Err, q.RetryAfter = ErrRateLimitTokens, ms(res[1])
	case 3:
		q.Err = ErrTokensExceedLimit
	}
	if q.Err != nil {
		q.Reserved = 0
		l.shed.count(q.Err, key.Class)
	}
	return q
}

// Settle implements RateLimiter. A reservation taken by the local fallback is settled there; one taken in Redis
// is queued (after Start) or sent. A settlement Redis does not take in time is lost (reported through OnError):
// the key's budget is off by that one request's difference, as it would be had the request never been settled.
func (l *RedisLimiter) Settle(key *Key, q *Quota, used int64) {
	if key == nil || q.Reserved == used || key.TokensPerMinute <= 0 {
		return
	}
	if q.fallback {
		l.local.Settle(key, q, used)
		return
	}
	delta := q.Reserved - max(used, 0)
	l.mu.Lock()
	if l.settles != nil {
		select {
		case l.settles <- settlement{key, delta}:
			l.mu.Unlock()
			return
		default: // the queue is full (Redis is slow): send this one now
		}
	}
	l.mu.Unlock()
	l.settleRedis(key, delta)
}

func (l *redisLimits) settleRedis(key *Key, delta int64) {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	err := rateScript.Run(ctx, l.c, []string{l.key(key)}, "settle", key.RequestsPerMinute, key.TokensPerMinute,
		delta, l.nowArg()).Err()
	cancel()
	if err != nil && !errors.Is(err, redis.Nil) && l.onError != nil {
		l.onError("ratelimit", err)
	}
}
