package proxy

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/routing"
)

// decisionRig is a Server that never serves, with a resolved snapshot of n backends that are never dialled (tweak
// may change it first), and an exchange routed to its model: the request path's decisions run on it as plain
// function calls.
func decisionRig(t *testing.T, n, retries int, tweak ...func(*Snapshot)) (*Server, *exchange) {
	t.Helper()
	return decisionRigOn(t, systemClock{}, n, retries, tweak...)
}

// decisionRigOn is decisionRig on clk, which the queues and the request path read from the start.
func decisionRigOn(t *testing.T, clk clock, n, retries int, tweak ...func(*Snapshot)) (*Server, *exchange) {
	t.Helper()
	urls := make([]string, n)
	for i := range urls {
		urls[i] = "http://127.0.0.1:1" // never dialled: these tests stop before any send
	}
	snap := snapshotOf(&routing.RoundRobin{}, retries, urls...)
	for _, f := range tweak {
		f(snap)
	}
	s, err := New(Static{S: snap}, Options{Metrics: metrics.New(prometheus.NewRegistry())})
	if err != nil {
		t.Fatal(err)
	}
	s.clock = clk
	res := s.follow(snap)
	ex := s.acquireExchange()
	m := snap.Models["sim-model"]
	ex.snap, ex.asked, ex.model, ex.rec = snap, m, m, res.models[m]
	ex.rreq.Model = m.Name
	ex.wd = &watchdog{}
	t.Cleanup(func() {
		if ex.cur != nil {
			ex.endAttempt(ex.cur, nil)
			ex.cur = nil
		}
		ex.wd = nil // never started: nothing to stop
		s.releaseExchange(ex)
	})
	return s, ex
}

// fail records that attempt a was dispatched and failed with err, as run does.
func fail(ex *exchange, a *attempt, err error) {
	ex.attempts++
	ex.tried = append(ex.tried, a.target.Backend)
	ex.endAttempt(a, err)
}

// TestRetryDecisions drives exchange.next, the decision whether a failure before the first byte is retried on
// another backend and whether the retry budget pays for it, without a network.
func TestRetryDecisions(t *testing.T) {
	status := func(code int) error { return &upstreamError{kind: kindStatus, backend: "b0", status: code} }
	for _, tc := range []struct {
		name     string
		retries  int // the model's
		stream   bool
		last     error
		failures int  // attempts that failed before last
		spent    int  // retry-budget slots already taken by other requests
		retry    bool // a retry is sent
		budgeted bool // and it holds a retry-budget slot
	}{
		{"5xx is retried within the budget", 2, false, status(503), 0, 0, true, true},
		{"429 is retried", 2, false, status(429), 0, 0, true, true},
		{"4xx is the client's", 2, false, status(400), 0, 0, false, false},
		{"first-byte timeout is budgeted", 2, false, &upstreamError{kind: kindFirstByte, backend: "b0"}, 0, 0, true, true},
		{"a refused connection moves outside the budget", 2, false, &upstreamError{kind: kindConnect, backend: "b0"}, 0, 0, true, false},
		{"the model's retries bound it", 1, false, status(503), 1, 0, false, false},
		{"no retries configured", 0, false, status(503), 0, 0, false, false},
		{"an exhausted budget refuses", 2, false, status(503), 0, 3, false, false},
		{"an exhausted budget lets a dead backend's request move", 2, false, &upstreamError{kind: kindConnect, backend: "b0"}, 0, 3, true, false},
		{"a broken stream is not retried for a streaming client", 2, true, &upstreamError{kind: kindStream, backend: "b0"}, 0, 0, false, false},
		{"a broken stream is retried for a client that waits for the whole answer", 2, false, &upstreamError{kind: kindStream, backend: "b0"}, 0, 0, true, false},
		{"the client leaving is final", 2, false, errClientGone, 0, 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, ex := decisionRig(t, 3, tc.retries)
			ex.sum.Stream = tc.stream
			for range tc.spent {
				if !s.retries.Allow() {
					t.Fatal("budget refused while filling it")
				}
			}
			first, err := ex.next(nil)
			if err != nil {
				t.Fatal(err)
			}
			fail(ex, first, tc.last)
			for range tc.failures {
				a, err := ex.next(tc.last)
				if err != nil {
					t.Fatalf("setup retry: %v", err)
				}
				fail(ex, a, tc.last)
			}
			held := s.retries.Retries()
			a, err := ex.next(tc.last)
			if !tc.retry {
				if a != nil || !errors.Is(err, tc.last) {
					t.Fatalf("next = %v, %v; want no retry and the last failure", a, err)
				}
				if s.retries.Retries() != held {
					t.Fatalf("retries in flight %d, want %d: a refused retry holds no slot", s.retries.Retries(), held)
				}
				return
			}
			if err != nil {
				t.Fatalf("next = %v, want a retry", err)
			}
			if ex.triedContains(a.target.Backend) {
				t.Fatalf("the retry went to %s, which this request tried", a.name)
			}
			if got := s.retries.Retries() - held; got != b2i(tc.budgeted) {
				t.Fatalf("retry-budget slots taken %d, want %d", got, b2i(tc.budgeted))
			}
			ex.endAttempt(a, errNotSent)
			if s.retries.Retries() != held {
				t.Fatalf("retries in flight %d after the retry ended, want %d: its permit gives the slot back",
					s.retries.Retries(), held)
			}
		})
	}
}

// TestRetriesSkipOpenBreakers checks that a retry never picks a backend whose breaker refuses it, and that with
// every backend tried the last failure is the answer.
func TestRetriesSkipOpenBreakers(t *testing.T) {
	s, ex := decisionRig(t, 2, 3)
	last := &upstreamError{kind: kindConnect, backend: "b0"}
	a, err := ex.next(nil)
	if err != nil {
		t.Fatal(err)
	}
	other := ex.model.Targets[0].Backend
	if other == a.target.Backend {
		other = ex.model.Targets[1].Backend
	}
	for range s.brk.settings.ConsecutiveFailures { // open the other backend's breaker
		done, err := s.brk.get(other).Allow()
		if err != nil {
			t.Fatal(err)
		}
		done(&upstreamError{kind: kindConnect, backend: other.Name()})
	}
	other.SetHealthy(true) // a stale health flag: the permit's breaker must still refuse
	fail(ex, a, last)
	if r, err := ex.next(last); r != nil || !errors.Is(err, last) {
		t.Fatalf("next = %v, %v; want the last failure: the only other backend's breaker is open", r, err)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
