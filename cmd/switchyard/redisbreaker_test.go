package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// fakeClock is a clock tests move by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time      { return c.t }
func (c *fakeClock) add(d time.Duration) { c.t = c.t.Add(d) }
func newFakeClock() *fakeClock           { return &fakeClock{t: time.Unix(1_700_000_000, 0)} }
func transitions(log []string) string    { return strings.Join(log, " ") }
func recorder(log *[]string) func(from, to breakerState, _ error) {
	return func(from, to breakerState, _ error) { *log = append(*log, from.String()+">"+to.String()) }
}

var errTimeout = fmt.Errorf("redis: read: %w", context.DeadlineExceeded)

// TestRedisBreakerTransitions walks the breaker through its states on a virtual clock: closed -> open after N
// failures in a row within the window, open -> half-open after the cool-down (one probe, every other call
// refused), half-open -> closed on the probe's success and -> open on its failure or its silence.
func TestRedisBreakerTransitions(t *testing.T) {
	const n, coolDown = 5, time.Second
	fail := func(b *redisBreaker) {
		t.Helper()
		ticket, err := b.allow()
		if err != nil {
			t.Fatalf("a call was refused in state %v", b.State())
		}
		b.record(ticket, failed, errTimeout)
	}
	succeed := func(b *redisBreaker) {
		t.Helper()
		ticket, err := b.allow()
		if err != nil {
			t.Fatalf("a call was refused in state %v", b.State())
		}
		b.record(ticket, succeeded, nil)
	}
	refused := func(b *redisBreaker) {
		t.Helper()
		if _, err := b.allow(); !errors.Is(err, errRedisOpen) {
			t.Fatalf("a call went through in state %v (err %v)", b.State(), err)
		}
	}

	t.Run("opens after N failures in a row", func(t *testing.T) {
		clk, log := newFakeClock(), []string{}
		b := newRedisBreaker(n, coolDown, clk.now, recorder(&log))
		for range n - 1 {
			fail(b)
		}
		succeed(b) // a success ends the streak
		for range n - 1 {
			fail(b)
			clk.add(time.Millisecond)
		}
		if b.State() != breakerClosed {
			t.Fatalf("open after %d failures, want %d", n-1, n)
		}
		fail(b)
		if b.State() != breakerOpen || transitions(log) != "closed>open" {
			t.Fatalf("state %v, transitions %q", b.State(), transitions(log))
		}
		refused(b)
	})
	t.Run("failures spread over more than the window do not add up", func(t *testing.T) {
		clk := newFakeClock()
		b := newRedisBreaker(n, coolDown, clk.now, nil)
		for range 3 * n {
			fail(b)
			clk.add(failureWindow / time.Duration(n-2))
		}
		if b.State() != breakerClosed {
			t.Fatalf("opened on failures %v apart", failureWindow/time.Duration(n-2))
		}
	})
	t.Run("calls let through before the opening do not prolong it", func(t *testing.T) {
		clk := newFakeClock()
		b := newRedisBreaker(1, coolDown, clk.now, nil)
		late, _ := b.allow()
		fail(b)
		clk.add(coolDown)
		b.record(late, failed, errTimeout) // a slow call that was in flight when the breaker opened
		if ticket, err := b.allow(); err != nil || ticket == 0 {
			t.Fatalf("no probe after the cool-down: ticket %d, %v", ticket, err)
		}
	})
	t.Run("probe success closes", func(t *testing.T) {
		clk, log := newFakeClock(), []string{}
		b := newRedisBreaker(n, coolDown, clk.now, recorder(&log))
		for range n {
			fail(b)
		}
		clk.add(coolDown - time.Millisecond)
		refused(b)
		clk.add(time.Millisecond)
		ticket, err := b.allow()
		if err != nil || ticket == 0 || b.State() != breakerHalfOpen {
			t.Fatalf("after the cool-down: ticket %d, %v, state %v", ticket, err, b.State())
		}
		refused(b) // one probe at a time
		b.record(ticket, succeeded, nil)
		if b.State() != breakerClosed || transitions(log) != "closed>open open>half-open half-open>closed" {
			t.Fatalf("state %v, transitions %q", b.State(), transitions(log))
		}
		for range n - 1 { // a fresh streak
			fail(b)
		}
		if b.State() != breakerClosed {
			t.Fatal("the failures before the opening still counted after it closed")
		}
	})
	t.Run("probe failure opens again for a cool-down", func(t *testing.T) {
		clk, log := newFakeClock(), []string{}
		b := newRedisBreaker(n, coolDown, clk.now, recorder(&log))
		for range n {
			fail(b)
		}
		clk.add(coolDown)
		fail(b) // the probe
		if b.State() != breakerOpen {
			t.Fatalf("state %v after a failed probe", b.State())
		}
		clk.add(coolDown / 2)
		refused(b)
		clk.add(coolDown / 2)
		succeed(b)
		if want := "closed>open open>half-open half-open>open open>half-open half-open>closed"; transitions(log) != want {
			t.Fatalf("transitions %q, want %q", transitions(log), want)
		}
	})
	t.Run("a silent probe counts as failed", func(t *testing.T) {
		clk := newFakeClock()
		b := newRedisBreaker(n, coolDown, clk.now, nil)
		for range n {
			fail(b)
		}
		clk.add(coolDown)
		stuck, err := b.allow()
		if err != nil {
			t.Fatal(err)
		}
		clk.add(probeWait - time.Millisecond)
		refused(b)
		clk.add(time.Millisecond)
		refused(b)
		if b.State() != breakerOpen {
			t.Fatalf("state %v after the probe stayed silent for %v", b.State(), probeWait)
		}
		b.record(stuck, succeeded, nil) // its answer comes too late to count
		if b.State() != breakerOpen {
			t.Fatal("a probe given up on closed the breaker")
		}
		clk.add(coolDown)
		succeed(b)
		if b.State() != breakerClosed {
			t.Fatalf("state %v", b.State())
		}
	})
	t.Run("a cancelled probe lets another through", func(t *testing.T) {
		clk := newFakeClock()
		b := newRedisBreaker(n, coolDown, clk.now, nil)
		for range n {
			fail(b)
		}
		clk.add(coolDown)
		ticket, _ := b.allow()
		b.record(ticket, noVerdict, context.Canceled)
		if b.State() != breakerHalfOpen {
			t.Fatalf("state %v", b.State())
		}
		succeed(b)
		if b.State() != breakerClosed {
			t.Fatalf("state %v", b.State())
		}
	})
}

// TestRedisBreakerJudge: an answer from Redis (even an error reply) is a success, a caller that left is no
// verdict, anything else (a timeout, a broken connection, a full pool) is a failure.
func TestRedisBreakerJudge(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want verdict
	}{
		{"ok", context.Background(), nil, succeeded},
		{"nil reply", context.Background(), redis.Nil, succeeded},
		{"error reply", context.Background(), redisReply(t), succeeded},
		{"timeout", context.Background(), errTimeout, failed},
		{"i/o timeout", context.Background(), &net.OpError{Op: "read", Err: errors.New("i/o timeout")}, failed},
		{"pool timeout", context.Background(), redis.ErrPoolTimeout, failed},
		{"caller left", cancelled, context.Canceled, noVerdict},
		{"cancelled inside, caller still there", context.Background(), context.Canceled, failed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := judge(tc.ctx, tc.err); got != tc.want {
				t.Fatalf("judge(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

// redisReply returns a real error reply from go-redis's parser (a fake server answering "-ERR").
func redisReply(t *testing.T) error {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 512)
		for {
			if _, err := c.Read(buf); err != nil {
				return
			}
			_, _ = c.Write([]byte("-ERR unknown command\r\n"))
		}
	}()
	c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), Protocol: 2, DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	err = c.Get(context.Background(), "k").Err()
	var reply redis.Error
	if !errors.As(err, &reply) {
		t.Fatalf("not an error reply: %v", err)
	}
	return err
}

// TestRedisBreakerOpenSkipsTheNetwork: once open, every kind of call a Redis user makes (a command, a script,
// a pipeline, a blocking stream read) returns errRedisOpen at once and dials nothing.
func TestRedisBreakerOpenSkipsTheNetwork(t *testing.T) {
	var dials atomic.Int64
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1, PoolSize: 100,
		DisableIdentity: true, Dialer: func(context.Context, string, string) (net.Conn, error) {
			dials.Add(1)
			return nil, errors.New("dial: refused")
		}})
	defer c.Close()
	clk := newFakeClock()
	b := newRedisBreaker(3, time.Second, clk.now, nil)
	c.AddHook(b)
	ctx := context.Background()
	for range 3 {
		if err := c.Get(ctx, "k").Err(); err == nil || errors.Is(err, errRedisOpen) {
			t.Fatalf("closed breaker: %v", err)
		}
	}
	if b.State() != breakerOpen {
		t.Fatalf("state %v after 3 failed dials", b.State())
	}
	before := dials.Load()
	script := redis.NewScript("return 1")
	start := time.Now()
	for range 100 {
		for name, err := range map[string]error{
			"get":    c.Get(ctx, "k").Err(),
			"script": script.Run(ctx, c, []string{"k"}).Err(),
			"pipeline": func() error {
				_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error { p.Get(ctx, "a"); p.Get(ctx, "b"); return nil })
				return err
			}(),
			"xread": c.XRead(ctx, &redis.XReadArgs{Streams: []string{"s", "0-0"}, Block: time.Second}).Err(),
		} {
			if !errors.Is(err, errRedisOpen) {
				t.Fatalf("%s while open: %v", name, err)
			}
		}
	}
	if d := dials.Load() - before; d != 0 {
		t.Fatalf("%d dials while open", d)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("400 refused calls took %v: they should return at once", el)
	}
}
