package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// errRedisOpen is what every Redis operation returns at once, without touching the network, while the breaker
// is open (or half-open with its probe out). Callers treat it as any other Redis failure: local state.
var errRedisOpen = errors.New("redis: breaker open, using local state")

// breakerState is a redisBreaker's state, as switchyard_redis_breaker_state shows it.
type breakerState int32

const (
	breakerClosed   breakerState = 0 // Redis is used
	breakerHalfOpen breakerState = 1 // one probe is out; every other operation is refused
	breakerOpen     breakerState = 2 // every operation is refused until the cool-down ends
)

func (s breakerState) String() string {
	switch s {
	case breakerClosed:
		return "closed"
	case breakerHalfOpen:
		return "half-open"
	}
	return "open"
}

// Breaker timings that are not policy: a streak of failures spread wider than failureWindow is not one outage,
// and a probe that has given no verdict after probeWait counts as failed (every operation but a blocking
// stream read ends within the one-second socket timeouts of policy.Redis.Options, so a probe still out after
// two seconds is stuck on a silent server).
const (
	failureWindow = 10 * time.Second
	probeWait     = 2 * time.Second
)

// redisBreaker is the circuit breaker in front of the gateway's one Redis client (docs/config.md, "redis"). It
// is a go-redis hook on that client, so every user of the client goes through it without knowing: the rate
// limiter (admission), the shared backend breakers (proxy), the load and prefix hints (routing), the response
// cache and the start-up ping. A Redis that is down, or that accepts connections and never answers, then costs
// at most `failures` operations' waits and the connections they used, not a wait and new connections per
// request:
//
//   - closed: operations go through. `failures` failed operations in a row (timeouts or connection errors,
//     none more than failureWindow after the first of the streak, no success between them) open it.
//   - open: every operation returns errRedisOpen at once. After coolDown the next operation is the probe and
//     the breaker is half-open.
//   - half-open: the probe goes through, every other operation returns errRedisOpen. The probe's success
//     closes the breaker, its failure opens it again (another cool-down), and a probe with no verdict after
//     probeWait counts as failed.
//
// An answer from Redis is a success even when it is an error reply (NOSCRIPT, WRONGTYPE, LOADING, MOVED):
// Redis answered, and what to do with the reply is the caller's. An operation whose own caller cancelled it
// (a loop stopping) proves nothing either way.
//
// Concurrency: safe for concurrent use. A closed breaker with no failures counted costs two atomic loads per
// operation; everything else takes mu, which is never held across a call to Redis. onChange runs under mu, in
// transition order: it must not block (it sets a gauge and logs).
type redisBreaker struct {
	failures int
	coolDown time.Duration
	now      func() time.Time
	onChange func(from, to breakerState, cause error)

	state atomic.Int32 // breakerState; written under mu
	fails atomic.Int32 // failures in the current streak; written under mu

	mu        sync.Mutex
	firstFail time.Time // the first failure of the streak
	openedAt  time.Time
	probe     uint64 // the ticket of the probe out, 0 when none
	probeAt   time.Time
	tickets   uint64 // the last probe ticket handed out
}

var _ redis.Hook = (*redisBreaker)(nil)

// newRedisBreaker returns a closed breaker that opens after failures failed operations in a row and probes
// after coolDown. now is the clock (time.Now in production); onChange, when set, hears every transition.
func newRedisBreaker(failures int, coolDown time.Duration, now func() time.Time,
	onChange func(from, to breakerState, cause error)) *redisBreaker {
	if onChange == nil {
		onChange = func(breakerState, breakerState, error) {}
	}
	return &redisBreaker{failures: max(failures, 1), coolDown: coolDown, now: now, onChange: onChange}
}

// verdict is what an operation's outcome says about Redis.
type verdict int

const (
	noVerdict verdict = iota // the caller cancelled it
	succeeded                // Redis answered
	failed                   // Redis did not answer in time, or the connection failed
)

// judge classifies an operation's error; ctx is the caller's.
func judge(ctx context.Context, err error) verdict {
	var reply redis.Error
	switch {
	case err == nil, errors.Is(err, redis.Nil), errors.As(err, &reply):
		return succeeded
	case errors.Is(err, context.Canceled) && errors.Is(ctx.Err(), context.Canceled):
		return noVerdict
	}
	return failed
}

// allow says whether an operation may go to Redis now. ticket is non-zero when the operation is the probe:
// pass it back to record.
func (b *redisBreaker) allow() (ticket uint64, err error) {
	if breakerState(b.state.Load()) == breakerClosed {
		return 0, nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	switch breakerState(b.state.Load()) {
	case breakerClosed: // closed since the load above
		return 0, nil
	case breakerOpen:
		if now.Sub(b.openedAt) < b.coolDown {
			return 0, errRedisOpen
		}
		b.set(breakerHalfOpen, nil)
	default: // half-open
		if b.probe != 0 {
			if now.Sub(b.probeAt) < probeWait {
				return 0, errRedisOpen
			}
			b.probe = 0
			b.openedAt = now
			b.set(breakerOpen, errors.New("redis: the probe gave no answer within "+probeWait.String()))
			return 0, errRedisOpen
		}
	}
	b.tickets++
	b.probe, b.probeAt = b.tickets, now
	return b.probe, nil
}

// record takes an operation's verdict; ticket is what allow returned for it.
func (b *redisBreaker) record(ticket uint64, v verdict, err error) {
	if v == noVerdict && ticket == 0 {
		return
	}
	if v == succeeded && ticket == 0 && b.fails.Load() == 0 {
		return // the fast path: closed and healthy
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	state := breakerState(b.state.Load())
	if ticket != 0 {
		if state != breakerHalfOpen || ticket != b.probe {
			return // a probe given up on: its verdict comes too late
		}
		b.probe = 0
		switch v {
		case succeeded:
			b.fails.Store(0)
			b.set(breakerClosed, nil)
		case failed:
			b.openedAt = b.now()
			b.set(breakerOpen, err)
		}
		return
	}
	if state != breakerClosed {
		return // an operation let through before the breaker opened: its outcome is known already
	}
	if v == succeeded {
		b.fails.Store(0)
		return
	}
	now := b.now()
	n := b.fails.Load()
	if n == 0 || now.Sub(b.firstFail) > failureWindow {
		n, b.firstFail = 0, now
	}
	n++
	b.fails.Store(n)
	if int(n) >= b.failures {
		b.fails.Store(0)
		b.openedAt = now
		b.set(breakerOpen, err)
	}
}

// set moves to state to (under mu) and tells onChange.
func (b *redisBreaker) set(to breakerState, cause error) {
	from := breakerState(b.state.Swap(int32(to)))
	if from != to {
		b.onChange(from, to, cause)
	}
}

// State returns the breaker's state.
func (b *redisBreaker) State() breakerState { return breakerState(b.state.Load()) }

// guarded marks the context of an operation the breaker let through: what go-redis runs inside it (the
// handshake of a new connection goes through the client's hooks with the operation's context) is part of it,
// not another operation.
type guarded struct{}

// DialHook implements redis.Hook: dials happen inside operations (or to refill the idle connections after one
// failed), which the breaker already gates.
func (b *redisBreaker) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook.
func (b *redisBreaker) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if ctx.Value(guarded{}) != nil {
			return next(ctx, cmd)
		}
		ticket, err := b.allow()
		if err != nil {
			cmd.SetErr(err)
			return err
		}
		err = next(context.WithValue(ctx, guarded{}, true), cmd)
		b.record(ticket, judge(ctx, err), err)
		return err
	}
}

// ProcessPipelineHook implements redis.Hook: a pipeline is one operation.
func (b *redisBreaker) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if ctx.Value(guarded{}) != nil {
			return next(ctx, cmds)
		}
		ticket, err := b.allow()
		if err != nil {
			for _, c := range cmds {
				c.SetErr(err)
			}
			return err
		}
		err = next(context.WithValue(ctx, guarded{}, true), cmds)
		b.record(ticket, judge(ctx, err), err)
		return err
	}
}
