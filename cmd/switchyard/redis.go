package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/cache"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/policy"
	"github.com/switchyard/switchyard/proxy"
	"github.com/switchyard/switchyard/routing"
)

// sharedState is what a gateway shares with its replicas through Redis (docs/design.md, "State shared through Redis")
// when the policy sets redis: the client, the rate limiter each snapshot wraps, the breaker sharing and the load and
// prefix hints. Its zero value (no redis) shares nothing. It owns the client and the loops: start after the server
// exists, stop before the process ends.
type sharedState struct {
	client   redis.UniversalClient
	cfg      policy.Redis
	errs     *redisErrors
	breaker  *redisBreaker // a hook on client: every use of Redis goes through it
	breakers *proxy.SharedBreakers
	peers    *routing.Peers
	limits   *admission.RedisLimiter // each policy's limiter shares its client and settle queue (WithLocal)
}

// newSharedState builds the client and the sharing for cfg (nil, nil when cfg is not enabled). Redis being
// down is not an error: the gateway starts on local state and shares once Redis answers. The client carries
// the breaker (redisbreaker.go) before anything uses it, so no use of Redis bypasses it.
func newSharedState(cfg policy.Redis, reg *routing.Registry, m *metrics.Gateway, log *slog.Logger) (*sharedState, error) {
	if !cfg.Enabled() {
		return nil, nil
	}
	opts, err := cfg.Options()
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	redis.SetLogger(redisLogger{log}) // go-redis's own messages (dial failures) are ours at debug level
	c := redis.NewUniversalClient(opts)
	failures, coolDown := cfg.BreakerFailures, cfg.BreakerCoolDown
	if failures <= 0 {
		failures = 5 // policy's default; a Redis built in code may leave it out
	}
	if coolDown <= 0 {
		coolDown = time.Second
	}
	bl := &breakerLog{m: m, log: log, every: 10 * time.Second, failures: failures, coolDown: coolDown, now: time.Now}
	breaker := newRedisBreaker(failures, coolDown, time.Now, bl.transition)
	c.AddHook(breaker)
	if m != nil {
		m.RedisBreakerState.Set(float64(breakerClosed))
	}
	errs := &redisErrors{m: m, log: log, every: 10 * time.Second, last: map[string]time.Time{}, hidden: map[string]int{}}
	s := &sharedState{client: c, cfg: cfg, errs: errs, breaker: breaker}
	s.breakers = proxy.NewSharedBreakers(c, proxy.SharedBreakersOptions{Prefix: cfg.KeyPrefix,
		Interval: cfg.SyncInterval, OnError: errs.report})
	s.peers = routing.NewPeers(c, reg, routing.PeersOptions{Prefix: cfg.KeyPrefix, Interval: cfg.SyncInterval,
		OnError: errs.report})
	s.limits = admission.NewRedisLimiter(c, admission.RedisLimiterOptions{Prefix: cfg.KeyPrefix, Timeout: cfg.Timeout,
		OnError: errs.report, Metrics: m})
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		log.Warn("redis is not reachable; starting on local state, sharing begins once it answers", "error", err.Error())
	}
	return s, nil
}

// shared returns what the policy watcher applies to each snapshot.
func (s *sharedState) shared() policy.Shared {
	if s == nil {
		return policy.Shared{}
	}
	return policy.Shared{
		Limiter: func(local *admission.LocalLimiter) admission.RateLimiter {
			return s.limits.WithLocal(local)
		},
		Spender: func(local *admission.LocalSpender) admission.Spender {
			return admission.NewRedisSpender(s.client, s.cfg.KeyPrefix, s.cfg.Timeout, local, s.errs.report)
		},
		ResponseStore: cache.NewRedisStore(s.client, s.cfg.KeyPrefix),
		CacheTimeout:  s.cfg.Timeout,
		OnError:       s.errs.report,
	}
}

// sharedBreakers returns the breaker sharing for proxy.Options (nil without redis).
func (s *sharedState) sharedBreakers() *proxy.SharedBreakers {
	if s == nil {
		return nil
	}
	return s.breakers
}

func (s *sharedState) start() {
	if s == nil {
		return
	}
	s.limits.Start()
	s.breakers.Start()
	s.peers.Start()
}

func (s *sharedState) stop() {
	if s == nil {
		return
	}
	s.peers.Stop()
	s.breakers.Stop()
	s.limits.Stop()
	_ = s.client.Close()
}

// redisErrors counts every failed Redis operation in switchyard_redis_errors_total{op} and logs at most one
// line per op per interval (with how many it did not log), so an outage is visible without flooding the log.
type redisErrors struct {
	m     *metrics.Gateway
	log   *slog.Logger
	every time.Duration

	mu     sync.Mutex
	last   map[string]time.Time
	hidden map[string]int
}

func (r *redisErrors) report(op string, err error) {
	if r.m != nil {
		r.m.RedisErrors.WithLabelValues(op).Inc()
	}
	now := time.Now()
	r.mu.Lock()
	if now.Sub(r.last[op]) < r.every {
		r.hidden[op]++
		r.mu.Unlock()
		return
	}
	hidden := r.hidden[op]
	r.last[op], r.hidden[op] = now, 0
	r.mu.Unlock()
	r.log.Warn("redis operation failed; this replica uses its local state for it", "op", op, "error", err.Error(),
		"unlogged_since_last", hidden)
}

// breakerLog shows the Redis breaker's transitions: switchyard_redis_breaker_state follows every one, and the
// log says at warn when the breaker opens and when it closes. While Redis stays silent the breaker probes once
// per cool-down; a failed probe is logged at warn at most once per interval (with how many failed), the
// half-open moment that precedes it at debug. It runs under the breaker's lock, so it needs none of its own.
type breakerLog struct {
	m        *metrics.Gateway
	log      *slog.Logger
	every    time.Duration
	failures int
	coolDown time.Duration
	now      func() time.Time

	openedAt   time.Time
	probes     int // probes failed since the breaker opened
	lastLogged time.Time
}

func (l *breakerLog) transition(from, to breakerState, cause error) {
	if l.m != nil {
		l.m.RedisBreakerState.Set(float64(to))
	}
	now := l.now()
	msg := ""
	if cause != nil {
		msg = cause.Error()
	}
	switch {
	case from == breakerClosed && to == breakerOpen:
		l.openedAt, l.probes, l.lastLogged = now, 0, now
		l.log.Warn("redis breaker opened: Redis is not answering; every use of Redis falls back to local state until a probe succeeds",
			"failures", l.failures, "cool_down", l.coolDown, "error", msg)
	case to == breakerClosed:
		l.log.Warn("redis breaker closed: Redis answers again; shared state resumes",
			"open_for", now.Sub(l.openedAt).Round(time.Millisecond), "failed_probes", l.probes)
	case to == breakerHalfOpen:
		l.log.Debug("redis breaker half-open: probing")
	default: // a probe failed
		l.probes++
		if now.Sub(l.lastLogged) >= l.every {
			l.lastLogged = now
			l.log.Warn("redis breaker still open: the probe failed", "failed_probes", l.probes,
				"open_for", now.Sub(l.openedAt).Round(time.Millisecond), "error", msg)
		}
	}
}

// redisLogger sends go-redis's internal messages to slog at debug level: failures reach the operator through
// redisErrors already.
type redisLogger struct{ l *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	if r.l.Enabled(ctx, slog.LevelDebug) {
		r.l.Debug(fmt.Sprintf(format, v...), "component", "go-redis")
	}
}
