package admission

import (
	"context"
	"errors"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/switchyard/switchyard/metrics"
)

// Budget is an API key's money budget: what its requests may cost per period, in the currency of the policy's
// prices (dollars by convention). A zero Limit and Soft mean no budget.
type Budget struct {
	// Limit is the hard limit: once the period's spend (settled, plus what requests in flight reserved) reaches
	// it, requests are refused with ErrBudgetExhausted until the period ends. 0: none.
	Limit float64
	// Soft is the soft limit: past it, requests of a model with a degrade_to are served by that model
	// (brownout) for the rest of the period. 0: none; below Limit when both are set.
	Soft float64
	// Period is the length of a budget period. Periods are aligned to the Unix epoch (24h: UTC days), so every
	// replica agrees on where one ends. Must be > 0 when Limit or Soft is set.
	Period time.Duration
}

// Enabled reports whether b limits anything.
func (b Budget) Enabled() bool { return b.Period > 0 && (b.Limit > 0 || b.Soft > 0) }

// ReasonBudget is the shed reason of a request refused for its key's spent budget.
const ReasonBudget = "budget"

// ErrBudgetExhausted: the key has spent its money budget for the period. Its Retry-After is the time until the
// period ends (Spend.Reset), which replaces this default.
var ErrBudgetExhausted = &Error{Status: 429, Type: "insufficient_quota", Code: "insufficient_quota",
	Reason: ReasonBudget, RetryAfter: time.Minute,
	Message: "this API key has spent its budget for the current period; retry after the time in Retry-After, when the next period begins"}

// nanos is money in billionths of a unit: integers add exactly, in process and in Redis alike. A request
// priced below a nano-dollar (a token at under $1000 per million) rounds to 0.
func nanos(v float64) int64 { return int64(math.Round(max(v, 0) * 1e9)) }

// Spend is a budget decision and the key's standing after it, for the x-ratelimit-*-budget headers. The zero
// Spend (a key without a budget) reserves nothing and sends no headers.
type Spend struct {
	// Err is ErrBudgetExhausted when the request is refused; nil otherwise.
	Err error
	// Soft says the period's spend is past the soft limit: the request should be degraded.
	Soft bool
	// Limit is the hard limit (or, without one, the soft limit); Remaining what is left of it after this
	// request's reservation, never below 0; Reset the time until the period ends.
	Limit, Remaining float64
	Reset            time.Duration

	reserved int64 // nano-units reserved, to settle
	window   int64 // the period the reservation was taken in
	fallback bool  // taken by the local fallback of a shared spender
}

// Active reports whether s holds a decision (the key has a budget), so that its headers are sent.
func (s *Spend) Active() bool { return s.Limit > 0 }

// The budget headers, in the family of OpenAI's x-ratelimit-* (ratelimit.go): money left of the hard limit.
const (
	HeaderLimitBudget     = "x-ratelimit-limit-budget"
	HeaderRemainingBudget = "x-ratelimit-remaining-budget"
	HeaderResetBudget     = "x-ratelimit-reset-budget"
)

// AppendHeaders calls set with s's three budget headers (none for an inactive Spend); buf is scratch space,
// returned grown. Amounts are written with up to 6 decimals, the reset as x-ratelimit-reset-* writes it.
func (s *Spend) AppendHeaders(buf []byte, set func(name string, value []byte)) []byte {
	if !s.Active() {
		return buf
	}
	buf = strconv.AppendFloat(buf[:0], s.Limit, 'f', -1, 64)
	set(HeaderLimitBudget, buf)
	buf = strconv.AppendFloat(buf[:0], math.Floor(s.Remaining*1e6)/1e6, 'f', -1, 64)
	set(HeaderRemainingBudget, buf)
	buf = AppendDuration(buf[:0], s.Reset)
	set(HeaderResetBudget, buf)
	return buf
}

// Spender keeps each key's spend per budget period. LocalSpender is the in-process one; RedisSpender shares
// the spend across replicas. Implementations are safe for concurrent use.
type Spender interface {
	// Reserve decides a request of key that may cost up to estimate: refused (Spend.Err) once the period's spend
	// and the reservations in flight reach the key's limit, else admitted with estimate reserved. A request
	// admitted with money left can overrun it by its own cost: the spend stops within one request of the limit.
	Reserve(key *Key, estimate float64) Spend
	// Settle replaces s's reservation with what the request cost. Call it once for every admitted Spend,
	// however the request ended (actual 0 when no backend answered).
	Settle(key *Key, s *Spend, actual float64)
}

// LocalSpender is the in-process Spender: one counter pair (spent, reserved) per key for the current period.
// A reload keeps each key's spend by name. Each key's pair has a mutex of its own, held for a few additions.
type LocalSpender struct {
	clock Clock
	keys  map[string]*spendState
	shed  shedCounters
}

type spendState struct {
	mu              sync.Mutex
	window          int64 // the period: Unix nanoseconds / Period
	spent, reserved int64 // nano-units
}

var _ Spender = (*LocalSpender)(nil)

// NewLocalSpender returns a spender for the keys with a budget, keeping the spend prev (nil: none) had for keys
// of the same name, on clock (nil: the system clock), counting refusals in m (nil: none).
func NewLocalSpender(keys *Keys, prev *LocalSpender, clock Clock, m *metrics.Gateway) *LocalSpender {
	if clock == nil {
		clock = SystemClock{}
	}
	l := &LocalSpender{clock: clock, keys: map[string]*spendState{}, shed: newShedCounters(m, ReasonBudget)}
	for _, k := range keys.All() {
		if !k.Budget.Enabled() {
			continue
		}
		st := new(spendState)
		if prev != nil && prev.keys[k.Name] != nil {
			st = prev.keys[k.Name]
		}
		l.keys[k.Name] = st
	}
	return l
}

// period returns the period of b that now falls in, and the time left in it.
func period(b Budget, now time.Time) (int64, time.Duration) {
	ns := now.UnixNano()
	w := ns / int64(b.Period)
	return w, time.Duration((w+1)*int64(b.Period) - ns)
}

// decide is the rule both spenders apply to a period's spend and reservations (nano-units) before a request.
func decide(b Budget, spent, reserved, estimate int64, reset time.Duration) Spend {
	s := Spend{Limit: b.Limit, Reset: reset}
	if b.Limit <= 0 {
		s.Limit = b.Soft
	}
	used := spent + reserved
	switch {
	case b.Limit > 0 && used >= nanos(b.Limit):
		s.Err = ErrBudgetExhausted
	default:
		s.reserved = estimate
		used += estimate
	}
	s.Soft = b.Soft > 0 && spent+reserved >= nanos(b.Soft)
	s.Remaining = max(float64(nanos(s.Limit)-used)/1e9, 0)
	return s
}

// Reserve implements Spender. It does not allocate.
func (l *LocalSpender) Reserve(key *Key, estimate float64) Spend {
	st := l.state(key)
	if st == nil {
		return Spend{}
	}
	w, reset := period(key.Budget, l.clock.Now())
	st.mu.Lock()
	if st.window != w {
		st.window, st.spent, st.reserved = w, 0, 0
	}
	s := decide(key.Budget, st.spent, st.reserved, nanos(estimate), reset)
	st.reserved += s.reserved
	st.mu.Unlock()
	s.window = w
	if s.Err != nil {
		l.shed.count(s.Err, key.Class)
	}
	return s
}

// Settle implements Spender. A request that outlived its period is charged to the current one.
func (l *LocalSpender) Settle(key *Key, s *Spend, actual float64) {
	st := l.state(key)
	if st == nil || s.Err != nil || !s.Active() {
		return
	}
	w, _ := period(key.Budget, l.clock.Now())
	st.mu.Lock()
	if st.window == s.window {
		st.reserved -= s.reserved
	} else if st.window != w {
		st.window, st.spent, st.reserved = w, 0, 0
	}
	st.spent += nanos(actual)
	st.mu.Unlock()
	s.reserved = 0
}

// Spent returns what key has spent in the current period (settled requests only).
func (l *LocalSpender) Spent(key *Key) float64 {
	st := l.state(key)
	if st == nil {
		return 0
	}
	w, _ := period(key.Budget, l.clock.Now())
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.window != w {
		return 0
	}
	return float64(st.spent) / 1e9
}

func (l *LocalSpender) state(key *Key) *spendState {
	if key == nil || !key.Budget.Enabled() {
		return nil
	}
	return l.keys[key.Name]
}

// RedisSpender is the Spender that replicas share: each key's period is one Redis hash (spent, reserved in
// nano-units) at Prefix+"budget:{name}:<period>", and every decision is one atomic Lua script, so the fleet
// together stops within one request of the limit. Periods come from each replica's clock (they are aligned
// to the epoch, so replicas with synchronised clocks agree); a period's hash expires one period after it ends.
//
// Redis sits on the request path for at most Timeout, at Reserve and at Settle (which runs when the request
// has ended, only for keys with a budget). On an error the local fallback decides (each replica then keeps its
// own spend until Redis answers again), and Settle follows the reservation to where it was taken.
type RedisSpender struct {
	c       redis.UniversalClient
	prefix  string
	timeout time.Duration
	onError func(op string, err error)
	local   *LocalSpender
}

var _ Spender = (*RedisSpender)(nil)

// NewRedisSpender returns a spender sharing spend through c, under prefix, deciding on local when Redis
// cannot; timeout <= 0 means 5ms. onError (nil: ignored) is told of failed calls, as op "budget".
func NewRedisSpender(c redis.UniversalClient, prefix string, timeout time.Duration, local *LocalSpender, onError func(op string, err error)) *RedisSpender {
	if timeout <= 0 {
		timeout = 5 * time.Millisecond
	}
	return &RedisSpender{c: c, prefix: prefix, timeout: timeout, onError: onError, local: local}
}

// WithLocal returns a spender sharing s's client around local: the spender of a reloaded policy.
func (s *RedisSpender) WithLocal(local *LocalSpender) *RedisSpender {
	n := *s
	n.local = local
	return &n
}

// Local returns the local fallback.
func (s *RedisSpender) Local() *LocalSpender { return s.local }

// spendScript takes or settles one request in a key's period atomically.
//
//	KEYS[1]  the period's hash: s (spent), r (reserved), in nano-units
//	ARGV[1]  "take" or "settle"
//	ARGV[2]  take: the hard limit (0: none); settle: the reservation to release
//	ARGV[3]  take: the estimate to reserve; settle: the actual cost
//	ARGV[4]  the hash's time to live, in ms
//
// take returns {code, spent, reserved} before the request, code 0 reserved, 1 refused; settle returns 0.
var spendScript = redis.NewScript(`
local s = redis.call('HMGET', KEYS[1], 's', 'r')
local spent, reserved = tonumber(s[1]) or 0, tonumber(s[2]) or 0
local a, b = tonumber(ARGV[2]), tonumber(ARGV[3])
if ARGV[1] == 'settle' then
  redis.call('HSET', KEYS[1], 's', spent + b, 'r', math.max(reserved - a, 0))
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return 0
end
local code = 0
if a > 0 and spent + reserved >= a then code = 1 else
  redis.call('HSET', KEYS[1], 's', spent, 'r', reserved + b)
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
end
return {code, spent, reserved}
`)

func (s *RedisSpender) key(k *Key, w int64) string {
	return s.prefix + "budget:{" + k.Name + "}:" + strconv.FormatInt(w, 10)
}

// ttl keeps a period's hash one period past its end.
func ttl(b Budget, reset time.Duration) int64 { return (reset + b.Period).Milliseconds() + 1 }

// Reserve implements Spender.
func (s *RedisSpender) Reserve(key *Key, estimate float64) Spend {
	if key == nil || !key.Budget.Enabled() {
		return Spend{}
	}
	b := key.Budget
	w, reset := period(b, s.local.clock.Now())
	est := nanos(estimate)
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	res, err := spendScript.Run(ctx, s.c, []string{s.key(key, w)}, "take", nanos(b.Limit), est, ttl(b, reset)).Int64Slice()
	cancel()
	if err == nil && len(res) != 3 {
		err = errors.New("admission: budget script returned " + strconv.Itoa(len(res)) + " values")
	}
	if err != nil {
		if s.onError != nil {
			s.onError("budget", err)
		}
		sp := s.local.Reserve(key, estimate)
		sp.fallback = true
		return sp
	}
	sp := decide(b, res[1], res[2], est, reset)
	if (res[0] == 1) != (sp.Err != nil) { // the script's limit and decide's agree but for rounding: trust Redis
		if res[0] == 1 {
			sp.Err, sp.reserved = ErrBudgetExhausted, 0
		} else {
			sp.Err, sp.reserved = nil, est
		}
	}
	sp.window = w
	if sp.Err != nil {
		s.local.shed.count(sp.Err, key.Class)
	}
	return sp
}

// Settle implements Spender. A settlement Redis does not take in time is lost (reported through onError).
func (s *RedisSpender) Settle(key *Key, sp *Spend, actual float64) {
	if key == nil || !key.Budget.Enabled() || sp.Err != nil || !sp.Active() {
		return
	}
	if sp.fallback {
		s.local.Settle(key, sp, actual)
		return
	}
	b := key.Budget
	_, reset := period(b, s.local.clock.Now())
	ctx, cancel := context.WithTimeout(context.Background(), s.timeout)
	err := spendScript.Run(ctx, s.c, []string{s.key(key, sp.window)}, "settle", sp.reserved, nanos(actual), ttl(b, reset)).Err()
	cancel()
	if err != nil && !errors.Is(err, redis.Nil) && s.onError != nil {
		s.onError("budget", err)
	}
	sp.reserved = 0
}
