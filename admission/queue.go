package admission

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

// Queue defaults (limits.queue_size and routing.md 4.6.3's dispatcher period).
const (
	DefaultQueueSize = 1024
	DefaultQueueTick = 10 * time.Millisecond
)

// QueueConfig configures a Queue. Dispatch is required; every other zero field takes its default.
type QueueConfig[T any] struct {
	// Name labels the queue's metrics (the "queue" label of switchyard_queue_length): the model it serves.
	Name string
	// Size bounds the requests waiting, all classes together. Default DefaultQueueSize (1024).
	Size int
	// Tick is the period of the dispatcher's timer while requests wait: it retries dispatch (capacity may free
	// without a Signal, e.g. on another model's backend) and answers expired waiters. Default
	// DefaultQueueTick (10ms).
	Tick time.Duration
	// Dispatch offers a waiting request to the backends: late binding, so it should re-run the routing Pick
	// over the backends whose Cap is not full, then Cap.TryAcquire the pick. It returns nil when the request
	// may go (the waiter's Wait returns nil and the caller owns what Dispatch acquired), ErrNoCapacity when no
	// backend can take it now (it keeps its place and, by strict priority, nothing behind it is offered), or
	// any other error to answer the waiter with it (e.g. routing.ErrNoBackend when no backend is healthy).
	//
	// It runs with the queue's lock held, on whichever goroutine is dispatching (the owner's, or a Wait
	// caller's): it must be quick, must not block or do I/O, and must not call the Queue. It may write to the
	// item: the waiter's goroutine reads it only after Wait returns.
	Dispatch func(T) error
	// Clock reads the time for deadlines and wait times; nil means the system clock. (The dispatcher's timer
	// runs on real time.)
	Clock Clock
	// Metrics receives switchyard_queue_length, switchyard_queue_wait_seconds and the queue's refusals in
	// switchyard_shed_total; nil disables them.
	Metrics *metrics.Gateway
}

// Queue is the gateway queue of one pool of backends (typically one model): requests that cannot start now
// wait in it until a backend frees, their deadline passes, a more important request takes their place, their
// client leaves, or the queue closes. Every waiter is answered; none is forgotten.
//
//   - Bands: one per class, strict priority: a request is offered to Dispatch only when every more important
//     one was dispatched; if the head cannot go (ErrNoCapacity), nothing behind it is offered, unless what is
//     left is capacity only less important classes may take (ErrNoCapacityForClass): then the next band is.
//   - Within a band, earliest deadline first (EDF), then first come first served. Deadlines come from the
//     caller (Shedder.Deadline: queue_timeout, shortened by the SLO).
//   - Late binding: a waiter is not bound to a backend; Dispatch re-runs routing when capacity frees, so a
//     request whose cache-affine backend frees first goes there.
//   - Dispatch runs when a request arrives, on every Signal (the request path signals each first token and
//     request end) and on the owner's timer every Tick while requests wait, which also answers the expired
//     ones with ErrQueueTimeout.
//   - Bounded: at Size, the least important, newest waiter is evicted (ErrEvicted) to make room, or the new
//     request is refused (ErrQueueFull) when none is less important than it.
//
// Owner and lifetime: NewQueue starts one goroutine (the dispatcher timer); whoever creates the queue must Close
// it, which answers every waiter with ErrClosed and stops the goroutine. Queues should outlive policy reloads
// (keep one per model name) so that waiters are not dropped by a reload. All methods are safe for concurrent use.
type Queue[T any] struct {
	dispatch func(T) error
	clock    Clock
	base     time.Time
	size     int
	tick     time.Duration

	mu     sync.Mutex
	bands  [2 * NumClasses]waitHeap[T] // per class, from the most important: its WaitAhead waiters, then the others
	seq    uint64
	closed bool

	n      atomic.Int64             // waiting requests, read lock-free by Len and Signal
	bandN  [NumClasses]atomic.Int64 // waiting requests by class, read lock-free by ExpectedWait
	slot   afloat                   // moving average of the time the head waits for a slot, ns; 0: unknown
	lastGo int64                    // when a waiter or an arrival was last dispatched (ns since base); under mu

	pool      sync.Pool
	wake      chan struct{}
	stop      chan struct{}
	exited    chan struct{}
	closeOnce sync.Once

	length   [NumClasses]prometheus.Gauge
	waitHist [NumClasses]prometheus.Observer
	shed     shedCounters
}

// waiter is one queued request. Waiters are pooled by their Queue; done is reused and is empty whenever the
// waiter is in the pool.
type waiter[T any] struct {
	item     T
	class    Class
	deadline int64 // ns since the queue's base
	enq      int64 // ns since the queue's base
	seq      uint64
	idx      int // position in its band's heap; -1 when not queued
	band     int // its heap in Queue.bands (bandOf)
	done     chan error
}

// NewQueue returns a running queue. Close it when done with it.
func NewQueue[T any](cfg QueueConfig[T]) *Queue[T] {
	q := newQueue(cfg)
	q.exited = make(chan struct{})
	go q.run()
	return q
}

// newQueue builds a queue without its goroutine: tests drive pump directly.
func newQueue[T any](cfg QueueConfig[T]) *Queue[T] {
	if cfg.Dispatch == nil {
		panic("admission: QueueConfig.Dispatch is nil")
	}
	q := &Queue[T]{
		dispatch: cfg.Dispatch,
		clock:    orSystem(cfg.Clock),
		size:     cfg.Size,
		tick:     cfg.Tick,
		wake:     make(chan struct{}, 1),
		stop:     make(chan struct{}),
	}
	if q.size <= 0 {
		q.size = DefaultQueueSize
	}
	if q.tick <= 0 {
		q.tick = DefaultQueueTick
	}
	q.base = q.clock.Now()
	q.pool.New = func() any { return &waiter[T]{idx: -1, done: make(chan error, 1)} }
	if m := cfg.Metrics; m != nil {
		for i := range NumClasses {
			c := ClassAt(i).String()
			q.length[i] = m.QueueLength.WithLabelValues(cfg.Name, c)
			q.waitHist[i] = m.QueueWait.WithLabelValues(c)
		}
	}
	q.shed = newShedCounters(cfg.Metrics, ReasonQueueFull, ReasonEvicted, ReasonQueueTimeout)
	return q
}

// Len returns the number of waiting requests. Lock-free; the Shedder uses it (ShedInput.Queued) so that no
// new request overtakes waiting ones.
func (q *Queue[T]) Len() int { return int(q.n.Load()) }

// ExpectedWait estimates how long a request of class c that cannot start now would wait, by Little's law:
// (requests waiting at least as important as c, plus one) times the time the queue's head has waited for each
// slot lately (a moving average over dispatches from the queue, weight 0.2; 0 before the first). It counts
// neither the more important requests that will arrive and overtake it nor those ahead that the queue will
// refuse: the Shedder's Calibration corrects it by the error measured on admitted requests. Lock-free; for
// ShedInput.Wait.
func (q *Queue[T]) ExpectedWait(c Class) time.Duration {
	ahead := int64(1)
	for i := 0; i <= c.Index(); i++ {
		ahead += q.bandN[i].Load()
	}
	return time.Duration(float64(ahead) * q.slot.load())
}

// Wait queues item with class and deadline and blocks until it is dispatched (nil), or refused. When nobody
// waits ahead of it (no waiter of its class or above: it would be the head), it first offers item to Dispatch in
// the caller's goroutine, so a request that finds capacity free neither queues nor blocks nor allocates.
//
// The error is Dispatch's own error (other than ErrNoCapacity), ErrQueueTimeout when deadline passes first,
// ErrQueueFull when the queue is full of requests at least as important, ErrEvicted when a more important
// request took its place, ErrClosed when the queue is closed, or ctx.Err() when ctx ends first (the client
// left; cancel ctx when it does) -- except that a request dispatched at the moment ctx ended returns nil: the
// caller then owns what Dispatch acquired and releases it as for any admitted request.
//
// Call it when the Shedder says Enqueue, or when Admit's Cap.TryAcquire failed; with the item the Dispatch
// function will be given. The item must not be touched by the caller until Wait returns.
func (q *Queue[T]) Wait(ctx context.Context, item T, class Class, deadline time.Time) error {
	return q.wait(ctx, item, class, deadline, false, nil)
}

// WaitCalling is Wait that calls queued once item is queued: when the dispatch it was first offered found no
// capacity, or when requests of its class or above already wait. It is not called for an item dispatched at
// once. queued runs in the caller's goroutine, outside the queue's lock, while the item waits (the item may be
// dispatched meanwhile). A critical request that must wait asks a stream for its seat there (proxy/yield.go).
func (q *Queue[T]) WaitCalling(ctx context.Context, item T, class Class, deadline time.Time, queued func()) error {
	return q.wait(ctx, item, class, deadline, false, queued)
}

// WaitAhead is Wait for a request whose work is under way: a stream that gave its engine seat to a critical
// request and waits to go on (docs/design.md, "Yielding seats"). It goes before every waiter of its class that
// is not one too (earliest deadline first among them), so that work already admitted ends before new work of
// its class starts; the classes above it still go first.
func (q *Queue[T]) WaitAhead(ctx context.Context, item T, class Class, deadline time.Time) error {
	return q.wait(ctx, item, class, deadline, true, nil)
}

func (q *Queue[T]) wait(ctx context.Context, item T, class Class, deadline time.Time, ahead bool,
	queued func()) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return ErrClosed
	}
	now := q.now()
	band := bandOf(class, ahead)
	if q.headFor(band) {
		// Nobody waits ahead of it (strict priority): try the backends at once.
		err := q.dispatch(item)
		if !errors.Is(err, ErrNoCapacity) {
			if err == nil {
				q.lastGo = now
			}
			q.mu.Unlock()
			return err
		}
	}
	dl := int64(deadline.Sub(q.base))
	if dl <= now {
		q.mu.Unlock()
		q.shed.count(ErrQueueTimeout, class)
		return ErrQueueTimeout
	}
	if int(q.n.Load()) >= q.size {
		q.pumpLocked(now) // expired or dispatchable waiters may make room
		if int(q.n.Load()) >= q.size {
			if err := q.evictLocked(class, now); err != nil {
				q.mu.Unlock()
				q.shed.count(err, class)
				return err
			}
		}
	}
	w := q.pool.Get().(*waiter[T])
	w.item, w.class, w.deadline, w.enq, w.band = item, class, dl, now, band
	q.seq++
	w.seq = q.seq
	q.bands[w.band].push(w)
	q.n.Add(1)
	q.bandN[class.Index()].Add(1)
	if g := q.length[class.Index()]; g != nil {
		g.Inc()
	}
	q.mu.Unlock()
	// Dispatch was just tried (for the head, or for this request when nobody waits ahead of it): the next Signal
	// or tick offers it again. Wake the dispatcher so that its timer runs.
	q.wakeOwner()
	if queued != nil {
		queued()
	}

	var err error
	select {
	case err = <-w.done:
	case <-ctx.Done():
		q.mu.Lock()
		if w.idx >= 0 {
			q.bands[w.band].remove(w.idx)
			q.left(w, q.now())
			q.mu.Unlock()
			err = ctx.Err()
		} else {
			q.mu.Unlock()
			err = <-w.done // answered just before: take that answer
		}
	}
	var zero T
	w.item = zero
	q.pool.Put(w)
	return err
}

// Signal tells the queue that capacity may have freed: call it on every request's first token and end (after
// Cap.Release), and when a backend recovers. It wakes the dispatcher without blocking; with nobody waiting it
// returns at once. Lock-free; does not allocate.
func (q *Queue[T]) Signal() {
	if q.n.Load() == 0 {
		return
	}
	q.wakeOwner()
}

func (q *Queue[T]) wakeOwner() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// Close answers every waiter with ErrClosed, makes later Waits return ErrClosed and stops the dispatcher
// goroutine, waiting for it to exit. Idempotent.
func (q *Queue[T]) Close() {
	q.closeOnce.Do(func() {
		q.mu.Lock()
		q.closed = true
		now := q.now()
		for i := range q.bands {
			for q.bands[i].len() > 0 {
				q.answer(q.bands[i].remove(0), ErrClosed, now)
			}
		}
		q.mu.Unlock()
		close(q.stop)
		if q.exited != nil {
			<-q.exited
		}
	})
}

// run is the dispatcher: it pumps on every wake-up and, while requests wait, every tick.
func (q *Queue[T]) run() {
	defer close(q.exited)
	t := time.NewTimer(q.tick)
	armed := true
	for {
		select {
		case <-q.stop:
			t.Stop()
			return
		case <-q.wake:
		case <-t.C:
			armed = false
		}
		q.pump()
		if !armed && q.n.Load() > 0 {
			t.Reset(q.tick)
			armed = true
		}
	}
}

// pump answers expired waiters and dispatches from the head while Dispatch accepts.
func (q *Queue[T]) pump() {
	if q.n.Load() == 0 {
		return
	}
	q.mu.Lock()
	q.pumpLocked(q.now())
	q.mu.Unlock()
}

func (q *Queue[T]) pumpLocked(now int64) {
	for i := range q.bands {
		h := &q.bands[i]
		for h.len() > 0 && h.items[0].deadline <= now {
			q.answer(h.remove(0), ErrQueueTimeout, now)
		}
	}
	for i := 0; i < len(q.bands); i++ {
		h := &q.bands[i]
	band:
		for h.len() > 0 {
			err := q.dispatch(h.items[0].item)
			switch {
			case err == ErrNoCapacityForClass:
				i |= 1 // what is left is for less important classes: offer it to them
				break band
			case errors.Is(err, ErrNoCapacity):
				return // strict priority: nothing overtakes the head
			}
			q.answer(h.remove(0), err, now)
		}
	}
}

// evictLocked makes room for a request of class c in a full queue: it evicts the newest waiter of the least
// important non-empty band if that band is less important than c, and otherwise returns ErrQueueFull.
func (q *Queue[T]) evictLocked(c Class, now int64) error {
	for i := len(q.bands) - 1; i > bandOf(c, false); i-- {
		h := &q.bands[i]
		if h.len() == 0 {
			continue
		}
		newest := 0
		for j, w := range h.items {
			if w.seq > h.items[newest].seq {
				newest = j
			}
		}
		q.answer(h.remove(newest), ErrEvicted, now)
		return nil
	}
	return ErrQueueFull
}

// answer sends err to a waiter already removed from its band.
func (q *Queue[T]) answer(w *waiter[T], err error, now int64) {
	q.left(w, now)
	if err == nil {
		q.observeSlot(w.enq, now)
	} else {
		q.shed.count(err, w.class)
	}
	w.done <- err // buffered; each waiter is answered once
}

// left does the bookkeeping of a waiter leaving the queue.
func (q *Queue[T]) left(w *waiter[T], now int64) {
	q.n.Add(-1)
	i := w.class.Index()
	q.bandN[i].Add(-1)
	if g := q.length[i]; g != nil {
		g.Dec()
	}
	if h := q.waitHist[i]; h != nil {
		h.Observe(time.Duration(now - w.enq).Seconds())
	}
}

// observeSlot folds into the time per slot how long the queue waited for the slot a waiter just got: from the
// later of the previous dispatch and the waiter's arrival, to now. With q.mu held.
func (q *Queue[T]) observeSlot(enq, now int64) {
	x := float64(max(now-max(q.lastGo, enq), 0))
	q.lastGo = now
	if old := q.slot.load(); old > 0 {
		x = 0.8*old + 0.2*x
	}
	q.slot.store(x)
}

func (q *Queue[T]) now() int64 { return int64(q.clock.Now().Sub(q.base)) }

// headFor reports whether a waiter put into band would be the queue's head: no waiter in it or in a band before
// it (strict priority). Under q.mu.
func (q *Queue[T]) headFor(band int) bool {
	if q.n.Load() == 0 {
		return true
	}
	for i := 0; i <= band; i++ {
		if q.bands[i].len() > 0 {
			return false
		}
	}
	return true
}

// bandOf returns the heap in Queue.bands of a waiter of class c: each class has two, its WaitAhead waiters' and
// then the others', so that each heap's head is its earliest deadline (pumpLocked expires from the heads).
func bandOf(c Class, ahead bool) int {
	if ahead {
		return 2 * c.Index()
	}
	return 2*c.Index() + 1
}

// waitHeap is one band: a binary min-heap on (deadline, seq) that tracks each waiter's index, so a waiter can be
// removed from the middle (client gone, eviction).
type waitHeap[T any] struct{ items []*waiter[T] }

func (h *waitHeap[T]) len() int { return len(h.items) }

func (h *waitHeap[T]) less(i, j int) bool {
	a, b := h.items[i], h.items[j]
	return a.deadline < b.deadline || (a.deadline == b.deadline && a.seq < b.seq)
}

func (h *waitHeap[T]) swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	h.items[i].idx, h.items[j].idx = i, j
}

func (h *waitHeap[T]) push(w *waiter[T]) {
	w.idx = len(h.items)
	h.items = append(h.items, w)
	h.up(w.idx)
}

// remove takes out the waiter at index i and returns it with idx -1.
func (h *waitHeap[T]) remove(i int) *waiter[T] {
	n := len(h.items) - 1
	if i != n {
		h.swap(i, n)
	}
	w := h.items[n]
	h.items[n] = nil
	h.items = h.items[:n]
	if i < n && !h.down(i) {
		h.up(i)
	}
	w.idx = -1
	return w
}

func (h *waitHeap[T]) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down sifts i down and reports whether it moved.
func (h *waitHeap[T]) down(i int) bool {
	start := i
	n := len(h.items)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		c := l
		if r := l + 1; r < n && h.less(r, l) {
			c = r
		}
		if !h.less(c, i) {
			break
		}
		h.swap(i, c)
		i = c
	}
	return i > start
}
