package main

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/policy"
	"github.com/switchyard/switchyard/routing"
)

// TestRedisErrorsAreCountedAndLoggedSparingly: every failure is counted by op; the log gets one line per op
// per interval, saying how many it left out.
func TestRedisErrorsAreCountedAndLoggedSparingly(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	var log bytes.Buffer
	r := &redisErrors{m: m, log: slog.New(slog.NewTextHandler(&log, nil)), every: time.Hour,
		last: map[string]time.Time{}, hidden: map[string]int{}}
	for range 5 {
		r.report("ratelimit", errors.New("dial tcp: connection refused"))
	}
	r.report("load", errors.New("i/o timeout"))
	if got := counter(t, m.RedisErrors.WithLabelValues("ratelimit")); got != 5 {
		t.Errorf("counted %v ratelimit errors, want 5", got)
	}
	if got := counter(t, m.RedisErrors.WithLabelValues("load")); got != 1 {
		t.Errorf("counted %v load errors, want 1", got)
	}
	if n := strings.Count(log.String(), "\n"); n != 2 {
		t.Fatalf("%d log lines, want one per op:\n%s", n, log.String())
	}
	r.last["ratelimit"] = time.Now().Add(-2 * time.Hour) // the interval has passed
	r.report("ratelimit", errors.New("dial tcp: connection refused"))
	if !strings.Contains(log.String(), "unlogged_since_last=4") {
		t.Errorf("the next line does not say 4 were left out:\n%s", log.String())
	}
}

// TestSharedStateWithRedisDown: a gateway whose Redis is unreachable at start still builds its shared state (it
// shares once Redis answers); without redis there is none.
func TestSharedStateWithRedisDown(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	log := slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))
	s, err := newSharedState(policy.Redis{URL: "redis://127.0.0.1:1/0", Mode: "single", KeyPrefix: "x:",
		Timeout: 5 * time.Millisecond, SyncInterval: 50 * time.Millisecond}, routing.NewRegistry(), m, log)
	if err != nil || s == nil {
		t.Fatalf("%v %v", s, err)
	}
	s.start()
	time.Sleep(100 * time.Millisecond)
	s.stop()
	if counter(t, m.RedisErrors.WithLabelValues("load")) == 0 {
		t.Error("the failed load sharing was not counted")
	}
	if s, err := newSharedState(policy.Redis{}, routing.NewRegistry(), m, log); s != nil || err != nil {
		t.Fatalf("without redis: %v %v", s, err)
	}
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestRedisBreakerLog: the gauge follows every transition; the log says at warn when the breaker opens and
// closes, and the failed probes of a long outage at most once per interval, with their count.
func TestRedisBreakerLog(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	var out bytes.Buffer
	clk := newFakeClock()
	l := &breakerLog{m: m, log: slog.New(slog.NewTextHandler(&out, nil)), every: 10 * time.Second, failures: 5,
		coolDown: time.Second, now: clk.now}
	gauge := func() float64 {
		var d dto.Metric
		if err := m.RedisBreakerState.Write(&d); err != nil {
			t.Fatal(err)
		}
		return d.GetGauge().GetValue()
	}
	l.transition(breakerClosed, breakerOpen, errTimeout)
	if gauge() != 2 {
		t.Fatalf("gauge %v when open", gauge())
	}
	for range 30 { // 30 s of failed probes
		clk.add(time.Second)
		l.transition(breakerOpen, breakerHalfOpen, nil)
		if gauge() != 1 {
			t.Fatalf("gauge %v when half-open", gauge())
		}
		l.transition(breakerHalfOpen, breakerOpen, errTimeout)
	}
	l.transition(breakerOpen, breakerHalfOpen, nil)
	l.transition(breakerHalfOpen, breakerClosed, nil)
	if gauge() != 0 {
		t.Fatalf("gauge %v when closed", gauge())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 || !strings.Contains(lines[0], "redis breaker opened") || !strings.Contains(lines[4], "redis breaker closed") ||
		!strings.Contains(lines[4], "failed_probes=30") {
		t.Fatalf("want the opening, three probe summaries and the closing, got:\n%s", out.String())
	}
	for _, line := range lines {
		if !strings.Contains(line, "level=WARN") {
			t.Errorf("not at warn: %s", line)
		}
	}
}
