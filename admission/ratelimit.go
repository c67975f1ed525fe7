package admission

import (
	"math"
	"math/bits"
	"strconv"
	"sync"
	"time"

	"github.com/switchyard/switchyard/metrics"
)

// RateWindow is the period of per-key limits: requests_per_minute and tokens_per_minute.
const RateWindow = time.Minute

// DefaultCompletionTokens is the completion length per sequence EstimateTokens assumes for a request that sets
// no output limit. Settle corrects the reservation once the response's usage is known, so it only decides how far
// a key can overdraw its token budget for a moment.
const DefaultCompletionTokens = 512

// maxEstimate bounds EstimateTokens: far above any token limit (a request estimated at it is refused as
// ErrTokensExceedLimit), and exact in the float arithmetic of the Redis limiter's script.
const maxEstimate = 1 << 40

// EstimateTokens returns the tokens to reserve for a request at admission (the reservation model of ops.md
// B4.2: reserve at admission, reconcile with the real usage at the end): its estimated prompt tokens plus what
// the engine may generate, sequences times maxTokens, the output limit per sequence (openai.Summary's MaxTokens
// and Sequences(); docs/security.md gives them per endpoint). sequences below 1 count as 1; the result is at
// most maxEstimate.
//
// A request that sets no limit (maxTokens 0) gets the engine's default, which the gateway does not know (vLLM's
// is the rest of the context window): it reserves DefaultCompletionTokens per sequence, and what bounds it is
// the real usage Settle charges. An overrun leaves the key in debt, which it repays before it is admitted again,
// so a key spends beyond its limit only what its requests in flight generate past their reservations, and only
// until they end.
func EstimateTokens(promptTokens, maxTokens, sequences int) int64 {
	if maxTokens <= 0 {
		maxTokens = DefaultCompletionTokens
	}
	prompt, per, seqs := int64(max(promptTokens, 0)), int64(maxTokens), int64(max(sequences, 1))
	if prompt >= maxEstimate || per > (maxEstimate-prompt)/seqs {
		return maxEstimate
	}
	return prompt + per*seqs
}

// RateLimiter applies per-key request and token limits. LocalLimiter is the in-process implementation; a
// Redis-backed one (shared across replicas, ops.md B4.2) satisfies the same interface. Implementations are safe
// for concurrent use and count their own refusals in switchyard_shed_total.
type RateLimiter interface {
	// Take admits one request of key that may use tokens tokens (EstimateTokens), charging both limits at once,
	// or charges nothing and refuses it. Call it once per request after Authenticate and Authorize, before any
	// routing work; skip it when key is nil (no keys configured). The returned Quota carries the
	// x-ratelimit-* headers for the response either way, and Reserved for Settle.
	Take(key *Key, tokens int64) Quota
	// Settle reconciles an admitted request's reservation once its usage is known: q is the Quota Take
	// returned (its Reserved tokens, and where they were taken), used the prompt plus completion tokens the
	// backend reported (or the reservation, when it reported none). Unused tokens are refunded; an overrun is
	// charged, and may leave the key in debt until its budget refills. Call it exactly once per admitted request,
	// when the response ends (also when it fails or the client leaves: use what was generated, or 0 when nothing
	// reached a backend).
	Settle(key *Key, q *Quota, used int64)
}

// Quota is a rate-limit decision and the state of the key's limits after it.
type Quota struct {
	// Err is nil when the request is admitted, else ErrRateLimitRequests, ErrRateLimitTokens or
	// ErrTokensExceedLimit (429).
	Err error
	// RetryAfter, on a refusal, is how long until the same request would pass (0 for ErrTokensExceedLimit: it
	// never will). Send it as Retry-After (RetryAfterSeconds).
	RetryAfter time.Duration
	// Reserved is the number of tokens charged; pass it to Settle.
	Reserved int64
	// Requests and Tokens are the limits after the decision; a zero Limit means unlimited (send no headers).
	Requests, Tokens Allowance

	fallback bool // a shared limiter decided on its local fallback: Settle goes there too
}

// Allowance is one limit's state, as OpenAI's x-ratelimit-* headers report it.
type Allowance struct {
	// Limit is the limit per RateWindow; 0 means unlimited.
	Limit int64
	// Remaining is how many can be used now (never negative).
	Remaining int64
	// Reset is how long until the full Limit is available again.
	Reset time.Duration
}

// The rate-limit response headers OpenAI's API sends and SDKs read (ops.md A1.5).
const (
	HeaderLimitRequests     = "x-ratelimit-limit-requests"
	HeaderRemainingRequests = "x-ratelimit-remaining-requests"
	HeaderResetRequests     = "x-ratelimit-reset-requests"
	HeaderLimitTokens       = "x-ratelimit-limit-tokens"
	HeaderRemainingTokens   = "x-ratelimit-remaining-tokens"
	HeaderResetTokens       = "x-ratelimit-reset-tokens"
)

// AppendHeaders calls set with each x-ratelimit-* header of q (three per limited window, none for an
// unlimited one), formatting the values into buf, which it returns for reuse. A value is valid only during its
// set call. With a set that does not capture variables that escape, it does not allocate.
func (q *Quota) AppendHeaders(buf []byte, set func(name string, value []byte)) []byte {
	emit := func(a Allowance, limit, remaining, reset string) {
		if a.Limit <= 0 {
			return
		}
		buf = strconv.AppendInt(buf[:0], a.Limit, 10)
		set(limit, buf)
		buf = strconv.AppendInt(buf[:0], a.Remaining, 10)
		set(remaining, buf)
		buf = AppendDuration(buf[:0], a.Reset)
		set(reset, buf)
	}
	emit(q.Requests, HeaderLimitRequests, HeaderRemainingRequests, HeaderResetRequests)
	emit(q.Tokens, HeaderLimitTokens, HeaderRemainingTokens, HeaderResetTokens)
	return buf
}

// AppendDuration appends d rounded up to the millisecond in the form of time.Duration.String, which is how
// OpenAI writes x-ratelimit-reset-*: "20ms", "1s", "1.5s", "6m0s", "1h0m0s"; "0s" for d <= 0.
func AppendDuration(dst []byte, d time.Duration) []byte {
	if d <= 0 {
		return append(dst, "0s"...)
	}
	ms := int64((d + time.Millisecond - 1) / time.Millisecond)
	if ms < 1000 {
		return append(strconv.AppendInt(dst, ms, 10), "ms"...)
	}
	h, ms := ms/3_600_000, ms%3_600_000
	m, ms := ms/60_000, ms%60_000
	s, frac := ms/1000, ms%1000
	if h > 0 {
		dst = append(strconv.AppendInt(dst, h, 10), 'h')
	}
	if h > 0 || m > 0 {
		dst = append(strconv.AppendInt(dst, m, 10), 'm')
	}
	dst = strconv.AppendInt(dst, s, 10)
	if frac > 0 {
		digits := [3]byte{byte('0' + frac/100), byte('0' + frac/10%10), byte('0' + frac%10)}
		n := 3
		for digits[n-1] == '0' {
			n--
		}
		dst = append(append(dst, '.'), digits[:n]...)
	}
	return append(dst, 's')
}

// LocalLimiter is the in-process RateLimiter: one pair of token buckets per key, refilled continuously at
// limit/RateWindow and holding at most one window's worth (a full bucket admits a burst of exactly limit
// requests, then one every RateWindow/limit). Arithmetic is exact (integer, 128-bit where needed), so a key
// gets exactly N per window, never N+1 through rounding. Each replica limits on its own: with R replicas behind a
// balancer a key can get up to R times its limit, which is what the Redis-backed limiter fixes.
//
// A key's buckets are guarded by a mutex of their own, held for a few arithmetic operations; keys do not
// contend with each other. Safe for concurrent use.
type LocalLimiter struct {
	clock Clock
	base  time.Time
	keys  map[string]*keyState // by key name; immutable after construction
	shed  shedCounters
}

var _ RateLimiter = (*LocalLimiter)(nil)

type keyState struct {
	mu       sync.Mutex
	req, tok bucket
}

// bucket is a token bucket refilled at limit units per RateWindow. level counts whole units; resid carries the
// refill's fraction exactly, in units of 1/RateWindow-nanoseconds (ns*limit), always < RateWindow ns.
type bucket struct {
	limit int64  // units per RateWindow; 0 unlimited
	level int64  // whole units available; negative is debt (tokens used beyond the reservation)
	resid uint64 // fractional refill carried over, in ns*units, < window
	last  int64  // ns since the limiter's base of the last refill
}

const window = uint64(RateWindow)

// NewLocalLimiter returns a limiter for keys on clock (nil: the system clock), counting refusals in m (nil:
// none). Pass the limiter the previous policy used as prev (nil at start): keys that keep their name keep
// their buckets, so a reload neither refills nor empties a key's budget (the new limit applies at once; a
// bucket above a lowered limit is cut to it). The limiter shares those buckets, and prev's clock, with prev,
// which stays usable by requests still running on the old policy. A key the limiter does not know (not in
// keys) is unlimited.
func NewLocalLimiter(keys *Keys, prev *LocalLimiter, clock Clock, m *metrics.Gateway) *LocalLimiter {
	l := &LocalLimiter{clock: orSystem(clock), keys: make(map[string]*keyState, len(keys.All()))}
	l.base = l.clock.Now()
	if prev != nil {
		l.clock, l.base = prev.clock, prev.base
	}
	l.shed = newShedCounters(m, ReasonRateLimitRequests, ReasonRateLimitTokens)
	now := l.now()
	for _, k := range keys.All() {
		if k.RequestsPerMinute <= 0 && k.TokensPerMinute <= 0 {
			continue
		}
		var s *keyState
		if prev != nil {
			s = prev.keys[k.Name]
		}
		if s == nil {
			s = &keyState{}
		}
		s.mu.Lock()
		s.req.setLimit(k.RequestsPerMinute, now)
		s.tok.setLimit(k.TokensPerMinute, now)
		s.mu.Unlock()
		l.keys[k.Name] = s
	}
	return l
}

func (l *LocalLimiter) now() int64 { return int64(l.clock.Now().Sub(l.base)) }

// Take implements RateLimiter. It does not allocate.
func (l *LocalLimiter) Take(key *Key, tokens int64) Quota {
	tokens = max(tokens, 0)
	q := Quota{Reserved: tokens}
	if key == nil {
		return q
	}
	s := l.keys[key.Name]
	if s == nil {
		return q
	}
	now := l.now()
	s.mu.Lock()
	s.req.refill(now)
	s.tok.refill(now)
	if s.tok.limit > 0 && tokens > s.tok.limit {
		q.Err = ErrTokensExceedLimit
	} else {
		reqWait, tokWait := s.req.wait(1), s.tok.wait(tokens)
		switch {
		case reqWait > 0:
			q.Err, q.RetryAfter = ErrRateLimitRequests, max(reqWait, tokWait)
		case tokWait > 0:
			q.Err, q.RetryAfter = ErrRateLimitTokens, tokWait
		default:
			s.req.take(1)
			s.tok.take(tokens)
		}
	}
	q.Requests, q.Tokens = s.req.allowance(), s.tok.allowance()
	s.mu.Unlock()
	if q.Err != nil {
		q.Reserved = 0
		l.shed.count(q.Err, key.Class)
	}
	return q
}

// Settle implements RateLimiter.
func (l *LocalLimiter) Settle(key *Key, q *Quota, used int64) {
	l.settle(key, q.Reserved, used)
}

func (l *LocalLimiter) settle(key *Key, reserved, used int64) {
	if key == nil || reserved == used {
		return
	}
	s := l.keys[key.Name]
	if s == nil {
		return
	}
	now := l.now()
	s.mu.Lock()
	s.tok.refill(now)
	if s.tok.limit > 0 {
		s.tok.level = min(s.tok.level+reserved-max(used, 0), s.tok.limit)
	}
	s.mu.Unlock()
}

// setLimit installs a new limit; a new bucket starts full.
func (b *bucket) setLimit(limit, now int64) {
	if b.limit == 0 {
		*b = bucket{limit: limit, level: limit, last: now}
		return
	}
	b.refill(now)
	b.limit = limit
	b.level = min(b.level, limit)
	if limit == 0 {
		*b = bucket{}
	}
}

// refill adds what has accrued since the last refill, exactly: elapsed*limit/window units, carrying the
// remainder. A full bucket accrues nothing.
func (b *bucket) refill(now int64) {
	if b.limit == 0 {
		return
	}
	if b.level >= b.limit {
		// Full (also when a refund or a lowered limit just capped it): no fraction carries over, whether or not
		// time has passed, so the outcome never depends on how calls fall in time (the Redis script does the same).
		b.resid = 0
		b.last = max(b.last, now)
		return
	}
	if now <= b.last {
		return
	}
	elapsed := uint64(now - b.last)
	b.last = now
	need := uint64(b.limit - b.level)
	hi, lo := bits.Mul64(elapsed, uint64(b.limit))
	var c uint64
	lo, c = bits.Add64(lo, b.resid, 0)
	hi += c
	nhi, nlo := bits.Mul64(need, window)
	if hi > nhi || (hi == nhi && lo >= nlo) {
		b.level, b.resid = b.limit, 0
		return
	}
	// total < need*window < 2^64*window, so hi < window and the quotient fits.
	add, rem := bits.Div64(hi, lo, window)
	b.level += int64(add)
	b.resid = rem
}

// wait returns how long until the bucket holds n units (0 if it does now or is unlimited).
func (b *bucket) wait(n int64) time.Duration {
	if b.limit == 0 || b.level >= n {
		return 0
	}
	deficit := uint64(n - b.level)
	hi, lo := bits.Mul64(deficit, window)
	var c uint64
	lo, c = bits.Sub64(lo, b.resid, 0) // deficit*window >= window > resid
	hi -= c
	lo, c = bits.Add64(lo, uint64(b.limit-1), 0) // round up
	hi += c
	if hi >= uint64(b.limit) {
		return time.Duration(math.MaxInt64)
	}
	ns, _ := bits.Div64(hi, lo, uint64(b.limit))
	if ns > math.MaxInt64 {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(ns)
}

func (b *bucket) take(n int64) {
	if b.limit > 0 {
		b.level -= n
	}
}

func (b *bucket) allowance() Allowance {
	if b.limit == 0 {
		return Allowance{}
	}
	return Allowance{Limit: b.limit, Remaining: max(b.level, 0), Reset: b.wait(b.limit)}
}
