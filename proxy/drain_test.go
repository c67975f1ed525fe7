package proxy

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/admission"
)

// TestDrainOnVirtualClock drives the drain's decisions without a network or a sleep (TestDrain checks the same
// on the wire): during the drain a queued request keeps waiting and /readyz says "draining"; when the drain
// timeout ends the queued request is answered 503 shutting_down, a stream's watchdog aborts it at its next tick
// with errShutdown, and Shutdown waits for the requests still in flight no longer than drainGrace on the
// server's clock.
func TestDrainOnVirtualClock(t *testing.T) {
	clk := newFakeClock()
	s, ex := decisionRigOn(t, clk, 1, 0, func(snap *Snapshot) {
		withAdmission(snap)
		snap.Queue.Timeout = time.Minute
	})
	ex.arrival = clk.Now()
	c := ex.rec.ends[0].guards.Cap
	for c.TryAcquire() { // every slot is taken: the request queues
	}
	queued := make(chan error, 1)
	go func() { queued <- ex.admit(&fasthttp.RequestHeader{}) }()
	waitFor(t, 10*time.Second, func() bool { return ex.rec.queue.Len() == 1 })

	// A stream in flight: its watchdog never ticks by itself here (an hour apart); the test ticks it.
	wd := newWatchdog(s, nil)
	defer wd.stop()
	wd.mu.Lock()
	wd.interval = time.Hour
	wd.t.t.Reset(time.Hour)
	wd.mu.Unlock()
	wd.tick()
	if why := wd.reason(); why != nil {
		t.Fatalf("a tick before the drain aborted the stream: %v", why)
	}
	s.active.Add(1) // that stream's request, which does not end before the grace does
	defer s.active.Done()

	// The listener's shutdown waits for the client connections, as it does when they are real (TestDrain).
	s.shutdownListener = func(ctx context.Context) error { <-ctx.Done(); return nil }
	ctx, drainTimeout := context.WithCancel(context.Background())
	defer drainTimeout()
	stopped := make(chan error, 1)
	go func() { stopped <- s.Shutdown(ctx) }()
	waitFor(t, 10*time.Second, func() bool { ok, why := s.Ready(); return !ok && why == "draining" })
	select {
	case err := <-queued:
		t.Fatalf("the queued request was answered during the drain: %v", err)
	default:
	}
	wd.tick()
	if why := wd.reason(); why != nil {
		t.Fatalf("a tick during the drain aborted the stream: %v", why)
	}

	drainTimeout()
	if err := <-queued; !errors.Is(err, admission.ErrClosed) {
		t.Fatalf("queued request = %v, want ErrClosed (503 shutting_down) when the drain timeout ends", err)
	}
	clk.awaitTimer(t) // the grace
	wd.tick()
	if why := wd.reason(); !errors.Is(why, errShutdown) {
		t.Fatalf("the stream's watchdog after the drain timeout: %v, want errShutdown", why)
	}
	clk.Advance(s.drainGrace() - time.Millisecond)
	select { // a wall-clock wait only to catch an early return: a correct Shutdown passes whatever the delay
	case err := <-stopped:
		t.Fatalf("Shutdown returned %v before the grace ended, with a request in flight", err)
	case <-time.After(100 * time.Millisecond):
	}
	clk.Advance(time.Millisecond)
	for {
		select {
		case err := <-stopped:
			if err != nil {
				t.Fatalf("Shutdown: %v", err)
			}
			return
		case <-clk.added: // the listener's last second, if its shutdown had not returned yet
			clk.Advance(time.Second)
		case <-time.After(10 * time.Second):
			t.Fatal("Shutdown did not return after its grace on the virtual clock")
		}
	}
}
