package proxy

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/openai"
)

// watchdog runs beside an exchange while it waits for admission, waits on backends, or relays a stream: every
// tick (CheckInterval) it checks that the client is still there and that the gateway is not past its drain
// deadline, and, once a stream is committed, sends a ": ping" comment when the stream has been silent for
// KeepAliveInterval. It aborts the exchange by moving every live attempt's read deadline to the past (and
// cancelling a queue wait). It also serialises writes to the client (mu), since pings and events go to the same
// connection.
//
// A hijacked stream's watchdog hands the client's liveness to the parker (watch): the client's close is
// reported at once instead of found by a peek, the drain aborts the stream through the server's set of watched
// watchdogs, and the ticks come only when a ping or a parked read's deadline is due. An open stream then costs
// no system call and no timer between its events (docs/design.md, "Parked streams").
//
// It is allocated per request and never reused, so that a tick that fires while the exchange is released, or a
// hedged attempt that outlives its exchange, finds a watchdog that is simply done, never another request. Its
// timer is reused (wdTimer), under the rule that makes that safe.
type watchdog struct {
	s         *Server
	client    net.Conn
	interval  time.Duration // between the ticks that peek (Options.CheckInterval)
	keepalive time.Duration // the silence before a ping (Options.KeepAliveInterval)
	why       atomic.Pointer[error]

	mu        sync.Mutex
	t         *wdTimer // nil once stopped
	done      bool
	live      [2]*attempt        // attempts whose connection an abort must reach
	cancelQ   context.CancelFunc // cancels a queue wait
	w         io.Writer          // the client's body writer once the stream is committed
	lastWrite time.Time
	nextTick  time.Time // when the timer fires next; zero before the first tick (within interval of the start)

	// The client's connection watched by the parker (watch).
	watchFd  int  // its descriptor plus one while it is in the parker's set; 0: never added
	watching bool // the parker reports its close: the ticks do not peek

	// A parked stream (hijack.go) waits for its engine without a goroutine: the parker or the timer wakes it
	// (wakeLocked), at the first of the engine's socket becoming readable, the read's deadline, or an abort.
	parked   bool
	deadline time.Time // the parked read's deadline; zero: none
	resume   func()    // continues the relay in a goroutine of its own; set when the stream is hijacked
}

// wdTimer is a watchdog's timer, pooled: a fresh time.AfterFunc per request cost two allocations (the timer
// and the method value), for a tick that most requests end before. Reuse is safe because a timer goes back to
// the pool only when Stop reports that it had not fired: then no tick of the old watchdog is running or will
// run (time.Timer.Stop's contract since Go 1.23), and the next owner stores its own watchdog before it arms it.
// A timer that had fired (its tick may still be running) is left to the garbage collector.
type wdTimer struct {
	t  *time.Timer
	wd atomic.Pointer[watchdog]
}

var wdTimers = sync.Pool{New: func() any {
	wt := &wdTimer{}
	wt.t = time.AfterFunc(time.Hour, wt.fire)
	wt.t.Stop()
	return wt
}}

func (wt *wdTimer) fire() {
	if wd := wt.wd.Load(); wd != nil {
		wd.tick()
	}
}

func newWatchdog(s *Server, client net.Conn) *watchdog {
	wd := &watchdog{s: s, client: client, interval: s.opts.CheckInterval, keepalive: s.opts.KeepAliveInterval}
	wt := wdTimers.Get().(*wdTimer)
	wt.wd.Store(wd)
	wd.mu.Lock() // the first tick must see wd.t
	wd.t = wt
	wt.t.Reset(wd.interval)
	wd.mu.Unlock()
	return wd
}

// stop ends the watchdog: no more ticks, no more writes. It is idempotent: only the first call touches the
// timer, which may belong to another request's watchdog afterwards.
func (wd *watchdog) stop() {
	wd.mu.Lock()
	wt := wd.t
	wd.done = true
	wd.t = nil
	wd.w = nil
	wd.parked, wd.resume = false, nil
	wd.live = [2]*attempt{}
	wd.cancelQ = nil
	fd := wd.watchFd
	wd.watchFd, wd.watching = 0, false
	wd.mu.Unlock()
	if wt != nil && wt.t.Stop() {
		wt.wd.Store(nil)
		wdTimers.Put(wt)
	}
	if fd != 0 {
		// Before the connection is served on or closed (the stream's end stops its watchdog first): a report
		// never reaches a stream that no longer owns the socket, and a later stream on it adds it again.
		getParker().remove(fd - 1)
		wd.s.watched.remove(wd)
	}
}

func (wd *watchdog) tick() {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	if wd.done {
		return
	}
	now := time.Now()
	if wd.parked && !wd.deadline.IsZero() && !now.Before(wd.deadline) {
		wd.wakeLocked() // the read it resumes finds its deadline passed
	}
	switch {
	case wd.s.drainExpired.Load():
		wd.abortLocked(errShutdown)
	case !wd.watching && wd.client != nil && clientGone(wd.client):
		wd.abortLocked(errClientGone)
	case wd.w != nil && now.Sub(wd.lastWrite) >= wd.keepalive:
		if err := wd.writeLocked(openai.Ping); err != nil {
			// errClientGone or errClientSlow: the upstream read the abort unblocks reports it, not a timeout.
			wd.abortLocked(err)
		}
	}
	next := wd.interval
	if wd.w != nil {
		// The next ping is due then. A watched stream needs no other tick; one that is not ticks at least every
		// interval to peek. (Not due, with an abort taking this tick instead of a ping: every interval.)
		if d := wd.keepalive - now.Sub(wd.lastWrite); d > 0 && (wd.watching || d < next) {
			next = d
		}
	}
	if wd.parked && !wd.deadline.IsZero() {
		next = min(next, max(wd.deadline.Sub(now), 0))
	}
	wd.nextTick = now.Add(next)
	wd.t.t.Reset(next) // wd.t is set while the watchdog is not done
}

// park arms the parker for the connection of the stream's attempt a and records that the stream waits without
// a goroutine until deadline (zero: no deadline), moving the timer up to it. It returns false, and the stream
// reads at once, when the watchdog is done, the exchange was aborted or the attempt killed (nothing would wake
// it then: a kill that comes after the park wakes it, one before finds the check here), or the parker cannot
// take the connection.
func (wd *watchdog) park(a *attempt, deadline time.Time) bool {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	// Under wd.mu, so that a report of the socket that comes at once finds the stream parked: its wake waits
	// for the lock.
	if wd.done || wd.resume == nil || wd.why.Load() != nil || a.killed.Load() != nil || !a.conn.park(getParker(), wd) {
		return false
	}
	wd.parked, wd.deadline = true, deadline
	// The timer only ever moves earlier, never later: a stream that parks more often than the watchdog ticks
	// must not keep postponing the tick that carries the drain's abort and the client checks. Before the first
	// tick nextTick is not known (a clock reading per request saved): that tick is due within an interval of the
	// watchdog's start, so only a deadline within an interval from now may come first (it may delay that one
	// tick to the deadline, by less than an interval).
	switch {
	case deadline.IsZero():
	case wd.nextTick.IsZero():
		if d := time.Until(deadline); d < wd.interval {
			wd.nextTick = deadline
			wd.t.t.Reset(max(d, 0))
		}
	case deadline.Before(wd.nextTick):
		wd.nextTick = deadline
		wd.t.t.Reset(max(time.Until(deadline), 0))
	}
	return true
}

// watch hands the client connection's liveness to the parker, for a hijacked stream whose socket is fd
// (watchdog). Without a parker, or when epoll refuses the socket, the ticks go on peeking.
func (wd *watchdog) watch(fd int) {
	p := getParker()
	if p == nil || fd < 0 {
		return
	}
	wd.mu.Lock()
	if wd.done || !p.watch(fd, wd) {
		wd.mu.Unlock()
		return
	}
	wd.watchFd, wd.watching = fd+1, true
	wd.mu.Unlock()
	wd.s.watched.add(wd)
	// A drain that ended before the add did not find this watchdog (watchedSet.abortAll): it aborts itself.
	if wd.s.drainExpired.Load() {
		wd.abort(errShutdown)
	}
}

// abort aborts the exchange (abortLocked) unless the watchdog is done.
func (wd *watchdog) abort(why error) {
	wd.mu.Lock()
	if !wd.done {
		wd.abortLocked(why)
	}
	wd.mu.Unlock()
}

// clientClosed is the parker's report that the client's connection was closed, reset or half-closed. The
// exchange is aborted as a peek that found the client gone would abort it; a half-close behind bytes the client
// sent (a pipelined request) is not a client gone, so then the ticks peek again from the next one on, as for
// a stream that is not watched.
func (wd *watchdog) clientClosed() {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	if wd.done || !wd.watching {
		return
	}
	wd.watching = false
	if clientGone(wd.client) {
		wd.abortLocked(errClientGone)
		return
	}
	wd.nextTick = time.Now().Add(wd.interval)
	wd.t.t.Reset(wd.interval)
}

// watchedSet holds the watchdogs of the streams whose client the parker watches: their ticks are as sparse as
// the keep-alive, so the drain's end aborts them itself (abortAll) instead of waiting for a tick.
type watchedSet struct {
	mu sync.Mutex
	m  map[*watchdog]struct{}
}

func (ws *watchedSet) add(wd *watchdog) {
	ws.mu.Lock()
	if ws.m == nil {
		ws.m = make(map[*watchdog]struct{})
	}
	ws.m[wd] = struct{}{}
	ws.mu.Unlock()
}

func (ws *watchedSet) remove(wd *watchdog) {
	ws.mu.Lock()
	delete(ws.m, wd)
	ws.mu.Unlock()
}

// abortAll aborts every watched stream with why.
func (ws *watchedSet) abortAll(why error) {
	ws.mu.Lock()
	all := make([]*watchdog, 0, len(ws.m))
	for wd := range ws.m {
		all = append(all, wd)
	}
	ws.mu.Unlock()
	for _, wd := range all {
		wd.abort(why)
	}
}

// wake resumes a parked stream (the parker: its engine's socket is readable); a stream that is not parked is
// left alone.
func (wd *watchdog) wake() {
	wd.mu.Lock()
	wd.wakeLocked()
	wd.mu.Unlock()
}

// wakeLocked resumes the stream if it is parked (wd.mu held): once, in a goroutine of its own.
func (wd *watchdog) wakeLocked() {
	if !wd.parked {
		return
	}
	wd.parked, wd.deadline = false, time.Time{}
	go wd.resume()
}

// reason returns why the exchange was aborted, or nil.
func (wd *watchdog) reason() error {
	if p := wd.why.Load(); p != nil {
		return *p
	}
	return nil
}

// abortLocked records why (the first reason wins) and unblocks everything the exchange may be waiting on.
// wd.mu is held.
func (wd *watchdog) abortLocked(why error) {
	wd.why.CompareAndSwap(nil, &why)
	for _, a := range wd.live {
		if a != nil && a.conn != nil {
			_ = a.conn.SetReadDeadline(time.Unix(1, 0))
		}
	}
	if wd.cancelQ != nil {
		wd.cancelQ()
	}
	wd.wakeLocked() // a parked stream reads, and finds the deadline in the past
}

// track makes a's connection reachable by aborts; untrack forgets it.
func (wd *watchdog) track(a *attempt) {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	for i := range wd.live {
		if wd.live[i] == nil {
			wd.live[i] = a
			return
		}
	}
}

func (wd *watchdog) untrack(a *attempt) {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	for i := range wd.live {
		if wd.live[i] == a {
			wd.live[i] = nil
		}
	}
}

// setConn publishes an attempt's connection (nil when it is released), applying an abort that came first.
func (wd *watchdog) setConn(a *attempt, c *upConn) {
	wd.mu.Lock()
	a.conn = c
	wd.mu.Unlock()
	if c != nil && a.aborted() != nil {
		_ = c.SetReadDeadline(time.Unix(1, 0))
	}
}

// kill aborts one attempt only (a hedge that lost the race, a stream that yields its seat: yield.go). A parked
// stream wakes, and its read finds the deadline in the past.
func (wd *watchdog) kill(a *attempt, why error) {
	a.killed.CompareAndSwap(nil, &why)
	wd.mu.Lock()
	if a.conn != nil {
		_ = a.conn.SetReadDeadline(time.Unix(1, 0))
	}
	wd.wakeLocked()
	wd.mu.Unlock()
}

// queueContext returns a context that an abort cancels, for a queue wait.
func (wd *watchdog) queueContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	wd.mu.Lock()
	wd.cancelQ = cancel
	aborted := wd.why.Load() != nil
	wd.mu.Unlock()
	if aborted {
		cancel()
	}
	return ctx, cancel
}

// commit hands the watchdog the client's body writer: from now on it pings during upstream silence. resume,
// for a hijacked stream, continues the relay after a park (nil: the stream never parks).
func (wd *watchdog) commit(w io.Writer, resume func()) error {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	wd.w = w
	wd.resume = resume
	wd.lastWrite = time.Now()
	return nil
}

// write writes one event to the client, serialised with the pings.
func (wd *watchdog) write(b []byte) error {
	wd.mu.Lock()
	defer wd.mu.Unlock()
	if wd.w == nil {
		return errClientGone
	}
	return wd.writeLocked(b)
}

// writeLocked writes b to the client within the write timeout (wd.mu held): a client that does not take it in
// that time is gone (errClientSlow), as is one whose connection failed (errClientGone), and the relay ends (its
// upstream attempt with it).
func (wd *watchdog) writeLocked(b []byte) error {
	now := time.Now()
	if wd.client != nil {
		_ = wd.client.SetWriteDeadline(now.Add(wd.s.opts.WriteTimeout))
	}
	if _, err := wd.w.Write(b); err != nil {
		wd.w = nil // nothing more goes to a connection whose write failed or timed out
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return errClientSlow
		}
		return errClientGone
	}
	wd.lastWrite = now
	return nil
}
