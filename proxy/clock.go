package proxy

import "time"

// clock tells the request path the time and makes the timers of its decisions: when an attempt started, how
// long it waited for its first token, when a hedge goes, and, through the queues it is given to as their
// admission.Clock, when a waiting request's deadline passes. Tests put a virtual clock in Server.clock so that
// those decisions run without sleeping. Network deadlines (fasthttp's, the connections') stay on the wall
// clock: a virtual clock is for tests whose attempts do not reach the network (Server.attemptHook).
type clock interface {
	Now() time.Time
	NewTimer(d time.Duration) timer
}

// timer is a time.Timer as the request path uses it.
type timer interface {
	C() <-chan time.Time
	Stop() bool
}

// systemClock is the wall clock.
type systemClock struct{}

func (systemClock) Now() time.Time                 { return time.Now() }
func (systemClock) NewTimer(d time.Duration) timer { return systemTimer{time.NewTimer(d)} }

// systemTimer is a time.Timer behind the timer interface (one pointer: it fits the interface without an
// allocation of its own).
type systemTimer struct{ t *time.Timer }

func (t systemTimer) C() <-chan time.Time { return t.t.C }
func (t systemTimer) Stop() bool          { return t.t.Stop() }
