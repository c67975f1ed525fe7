package proxy

import (
	"errors"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/admission"
)

// TestQueueDeadlineOnVirtualClock checks a queued request's deadline on a virtual clock: with every slot taken
// it waits; a slot freed before its queue_timeout admits it, and none by then answers ErrQueueTimeout.
func TestQueueDeadlineOnVirtualClock(t *testing.T) {
	const timeout = 2 * time.Second
	for _, tc := range []struct {
		name  string
		frees bool // a slot frees just before the deadline
	}{{"a slot frees in time", true}, {"the deadline passes", false}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			s, ex := decisionRigOn(t, clk, 1, 0, func(snap *Snapshot) {
				withAdmission(snap)
				snap.Queue.Timeout = timeout
			})
			ex.arrival = clk.Now()
			c := ex.rec.ends[0].guards.Cap
			for c.TryAcquire() { // every slot is taken
			}
			done := make(chan error, 1)
			go func() { done <- ex.admit(&fasthttp.RequestHeader{}) }()
			waitFor(t, 10*time.Second, func() bool { return ex.rec.queue.Len() == 1 })
			clk.Advance(timeout - time.Millisecond)
			if tc.frees {
				c.Release()
				ex.rec.queue.Signal()
				if err := <-done; err != nil || ex.cur == nil {
					t.Fatalf("admit = %v (attempt %v), want admitted on the freed slot", err, ex.cur != nil)
				}
				return
			}
			clk.Advance(time.Millisecond)
			if err := <-done; !errors.Is(err, admission.ErrQueueTimeout) {
				t.Fatalf("admit = %v, want ErrQueueTimeout at the deadline", err)
			}
			if s.retries.Retries() != 0 || ex.cur != nil {
				t.Fatal("a request that timed out in the queue holds an attempt")
			}
		})
	}
}
