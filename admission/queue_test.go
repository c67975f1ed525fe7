package admission

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

// job is a queued request; the dispatch function writes the backend it was bound to.
type job struct {
	id      int
	class   Class
	backend string
}

// fleet is a fake pool of backends with free slots. dispatch binds a job to the first backend with a free slot
// at dispatch time (late binding), as the request path's dispatch re-runs routing.
type fleet struct {
	mu      sync.Mutex
	free    map[string]int
	names   []string
	order   []int // ids in dispatch order
	calls   int
	refuse  map[int]error // ids to answer with an error instead
	busy    map[int]bool  // ids no backend can take now (e.g. too long for the free ones)
	running int
	maxRun  int
}

func newFleet(names ...string) *fleet {
	return &fleet{free: map[string]int{}, names: names, refuse: map[int]error{}, busy: map[int]bool{}}
}

func (f *fleet) dispatch(j *job) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if err := f.refuse[j.id]; err != nil {
		return err
	}
	if f.busy[j.id] {
		return ErrNoCapacity
	}
	for _, b := range f.names {
		if f.free[b] > 0 {
			f.free[b]--
			j.backend = b
			f.order = append(f.order, j.id)
			f.running++
			f.maxRun = max(f.maxRun, f.running)
			return nil
		}
	}
	return ErrNoCapacity
}

// setRefuse makes dispatch answer err for ids (nil: dispatch them as usual again).
func (f *fleet) setRefuse(err error, ids ...int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if err == nil {
			delete(f.refuse, id)
		} else {
			f.refuse[id] = err
		}
	}
}

func (f *fleet) add(backend string, n int) {
	f.mu.Lock()
	f.free[backend] += n
	f.mu.Unlock()
}

func (f *fleet) release(backend string) {
	f.mu.Lock()
	f.free[backend]++
	f.running--
	f.mu.Unlock()
}

func (f *fleet) dispatched() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.order)
}

type answer struct {
	j   *job
	err error
}

// waiters starts Wait calls one at a time, each fully queued (synctest.Wait) before the next, so that arrival
// order is the order given.
type waiters struct {
	t   *testing.T
	q   *Queue[*job]
	clk Clock
	out chan answer
	n   int
}

func newWaiters(t *testing.T, q *Queue[*job], clk Clock) *waiters {
	return &waiters{t: t, q: q, clk: clk, out: make(chan answer, 1000)}
}

func (w *waiters) start(ctx context.Context, id int, c Class, timeout time.Duration) *job {
	return w.startWith(ctx, id, c, timeout, w.q.Wait)
}

// startWith is start with another of the queue's waits (WaitAhead, or WaitCalling with its callback bound).
func (w *waiters) startWith(ctx context.Context, id int, c Class, timeout time.Duration,
	wait func(context.Context, *job, Class, time.Time) error) *job {
	j := &job{id: id, class: c}
	dl := w.clk.Now().Add(timeout)
	w.n++
	go func() { w.out <- answer{j, wait(ctx, j, c, dl)} }()
	synctest.Wait()
	return j
}

// answers collects the n answers already given (or fails), keyed by id.
func (w *waiters) answers(n int) map[int]error {
	w.t.Helper()
	synctest.Wait()
	got := map[int]error{}
	for range n {
		select {
		case a := <-w.out:
			got[a.j.id] = a.err
		default:
			w.t.Fatalf("only %d of %d waiters answered: %v", len(got), n, got)
		}
	}
	select {
	case a := <-w.out:
		w.t.Fatalf("unexpected answer for %d: %v", a.j.id, a.err)
	default:
	}
	return got
}

func TestQueueOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		f := newFleet("a")
		q := newQueue(QueueConfig[*job]{Dispatch: f.dispatch, Clock: clk})
		w := newWaiters(t, q, clk)
		ctx := context.Background()
		// Arrivals, with their queue timeouts: within a band, earliest deadline first, then arrival order.
		w.start(ctx, 1, Sheddable, 10*time.Second)
		w.start(ctx, 2, Standard, 10*time.Second)
		w.start(ctx, 3, Critical, 10*time.Second)
		w.start(ctx, 4, Standard, 10*time.Second)
		w.start(ctx, 5, Sheddable, 10*time.Second)
		w.start(ctx, 6, Critical, 10*time.Second)
		w.start(ctx, 7, Standard, 2*time.Second) // arrives last, due first among standard
		w.start(ctx, 8, Critical, 10*time.Second)
		if q.Len() != 8 {
			t.Fatalf("Len = %d, want 8", q.Len())
		}
		// Capacity for 3: strictly the critical band first.
		f.add("a", 3)
		q.pump()
		if got := w.answers(3); len(got) != 3 || got[3] != nil || got[6] != nil || got[8] != nil {
			t.Fatalf("first three answers = %v, want 3, 6, 8 dispatched", got)
		}
		f.add("a", 5)
		q.pump()
		w.answers(5)
		if got, want := f.dispatched(), []int{3, 6, 8, 7, 2, 4, 1, 5}; !slices.Equal(got, want) {
			t.Errorf("dispatch order = %v, want %v", got, want)
		}
		if q.Len() != 0 {
			t.Errorf("Len = %d after draining", q.Len())
		}
	})
}

// TestQueueWaitAhead: a request whose work is under way (WaitAhead) goes before every waiter of its band that is
// not, whatever their deadlines, and after the bands above it; among such requests, earliest deadline first.
func TestQueueWaitAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		f := newFleet("a")
		q := newQueue(QueueConfig[*job]{Dispatch: f.dispatch, Clock: clk})
		w := newWaiters(t, q, clk)
		ctx := context.Background()
		ahead := func(id int, c Class, timeout time.Duration) { w.startWith(ctx, id, c, timeout, q.WaitAhead) }
		w.start(ctx, 1, Standard, time.Second)
		ahead(2, Standard, 30*time.Second)
		w.start(ctx, 3, Critical, 10*time.Second)
		ahead(4, Standard, 20*time.Second)
		w.start(ctx, 5, Standard, 2*time.Second)
		ahead(6, Sheddable, 30*time.Second)
		w.start(ctx, 7, Sheddable, time.Second)
		w.start(ctx, 8, Sheddable, 5*time.Second)
		// Deadlines pass behind a waiter that goes ahead of them: they expire all the same.
		clk.Advance(1500 * time.Millisecond)
		q.pump()
		if got := w.answers(2); got[1] != ErrQueueTimeout || got[7] != ErrQueueTimeout {
			t.Fatalf("after 1.5 s: %v, want 1 and 7 timed out", got)
		}
		f.add("a", 6)
		q.pump()
		w.answers(6)
		if got, want := f.dispatched(), []int{3, 4, 2, 5, 6, 8}; !slices.Equal(got, want) {
			t.Errorf("dispatch order = %v, want %v", got, want)
		}
	})
}

// TestQueueWaitCalling: a request that nobody of its class or above waits ahead of is offered to Dispatch at once,
// though less important ones wait, and WaitCalling calls queued only for a request that is queued.
func TestQueueWaitCalling(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		f := newFleet("a")
		q := newQueue(QueueConfig[*job]{Dispatch: f.dispatch, Clock: clk})
		w := newWaiters(t, q, clk)
		ctx := context.Background()
		f.busy[1] = true
		w.start(ctx, 1, Standard, 10*time.Second) // no backend takes it: it waits
		f.add("a", 1)
		var queued []int
		critical := func(id int) {
			w.startWith(ctx, id, Critical, 10*time.Second, func(ctx context.Context, j *job, c Class, dl time.Time) error {
				return q.WaitCalling(ctx, j, c, dl, func() { queued = append(queued, id) })
			})
		}
		critical(2) // a standard request waits, but behind it: dispatched at once
		if got := w.answers(1); got[2] != nil || len(queued) != 0 {
			t.Fatalf("critical 2: %v, queued %v; want dispatched at once, never queued", got, queued)
		}
		critical(3) // no capacity: queued
		critical(4) // 3 waits ahead of it: queued without an offer
		if !slices.Equal(queued, []int{3, 4}) || q.Len() != 3 {
			t.Fatalf("queued %v, Len %d; want [3 4], 3", queued, q.Len())
		}
		f.add("a", 2)
		q.pump()
		if got := w.answers(2); got[3] != nil || got[4] != nil {
			t.Fatalf("after two seats freed: %v, want 3 and 4 dispatched", got)
		}
		if got, want := f.dispatched(), []int{2, 3, 4}; !slices.Equal(got, want) {
			t.Errorf("dispatch order = %v, want %v", got, want)
		}
		q.Close()
		if got := w.answers(1); got[1] != ErrClosed {
			t.Errorf("the standard request at close: %v, want ErrClosed", got)
		}
	})
}

// TestQueueHeadBlocks: strict priority; when the head cannot go, nothing behind it is offered, even what could
// go, and Dispatch is asked once per pump, not once per waiter.
func TestQueueHeadBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		f := newFleet("a")
		q := newQueue(QueueConfig[*job]{Dispatch: f.dispatch, Clock: clk})
		w := newWaiters(t, q, clk)
		for i := range 9 {
			w.start(context.Background(), i, ClassAt(i%NumClasses), time.Minute)
		}
		f.mu.Lock()
		f.calls = 0
		f.busy[0] = true // the critical head cannot go, though capacity is free for the others
		f.mu.Unlock()
		f.add("a", 10)
		q.pump()
		q.pump()
		if f.calls != 2 {
			t.Errorf("Dispatch called %d times for two pumps with a blocked head, want 2", f.calls)
		}
		w.answers(0)
		f.mu.Lock()
		f.busy[0] = false
		f.mu.Unlock()
		q.pump()
		w.answers(9)
		if got, want := f.dispatched(), []int{0, 3, 6, 1, 4, 7, 2, 5, 8}; !slices.Equal(got, want) {
			t.Errorf("dispatch order = %v, want %v", got, want)
		}
	})
}

// TestQueueHeadLeavesWhatItMayNotTake: a head that cannot go because the capacity left is not for its class
// (ErrNoCapacityForClass) lets the next band have it; within its own band, and behind a plain ErrNoCapacity,
// nothing overtakes.
func TestQueueHeadLeavesWhatItMayNotTake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		f := newFleet("a")
		q := newQueue(QueueConfig[*job]{Dispatch: f.dispatch, Clock: clk})
		w := newWaiters(t, q, clk)
		for i := range 4 { // 0, 2: critical; 1, 3: standard
			w.start(context.Background(), i, ClassAt(i%2), time.Minute)
		}
		if !errors.Is(ErrNoCapacityForClass, ErrNoCapacity) {
			t.Fatal("ErrNoCapacityForClass is not ErrNoCapacity")
		}
		f.setRefuse(ErrNoCapacityForClass, 0, 2)
		f.add("a", 1)
		q.pump()
		if got := f.dispatched(); !slices.Equal(got, []int{1}) {
			t.Fatalf("dispatched %v with the critical head refused for its class, want the first standard one", got)
		}
		f.setRefuse(ErrNoCapacity, 0)
		f.add("a", 1)
		q.pump()
		if got := f.dispatched(); !slices.Equal(got, []int{1}) {
			t.Errorf("dispatched %v behind a head with no capacity at all, want nothing more", got)
		}
		f.setRefuse(nil, 0, 2)
		f.add("a", 2)
		q.pump()
		w.answers(4)
	})
}

// TestQueueLateBinding: a waiter is bound to whichever backend frees first, at dispatch time.
func TestQueueLateBinding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		f := newFleet("a", "b")
		q := newQueue(QueueConfig[*job]{Dispatch: f.dispatch, Clock: clk})
		w := newWaiters(t, q, clk)
		j1 := w.start(context.Background(), 1, Standard, time.Minute)
		j2 := w.start(context.Background(), 2, Standard, time.Minute)
		f.add("b", 1)
		q.pump()
		w.answers(1)
		f.add("a", 1)
		q.pump()
		w.answers(1)
		if j1.backend != "b" || j2.backend != "a" {
			t.Errorf("bound to %q and %q, want b (freed first) and a", j1.backend, j2.backend)
		}
	})
}

func TestQueueDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		m := metrics.New(reg)
		clk := newFakeClock()
		f := newFleet("a")
		q := newQueue(QueueConfig[*job]{Name: "m", Dispatch: f.dispatch, Clock: clk, Metrics: m})
		w := newWaiters(t, q, clk)
		ctx := context.Background()
		w.start(ctx, 1, Critical, 1*time.Second)
		w.start(ctx, 2, Standard, 2*time.Second)
		w.start(ctx, 3, Sheddable, 3*time.Second)
		w.start(ctx, 4, Standard, 0) // already past its deadline: answered at once
		if got := w.answers(1); !errors.Is(got[4], ErrQueueTimeout) {
			t.Fatalf("expired on arrival: %v", got)
		}
		clk.Advance(1500 * time.Millisecond)
		q.pump()
		if got := w.answers(1); !errors.Is(got[1], ErrQueueTimeout) {
			t.Fatalf("after 1.5s: %v, want 1 timed out", got)
		}
		clk.Advance(500 * time.Millisecond) // exactly at 2's deadline
		q.pump()
		if got := w.answers(1); !errors.Is(got[2], ErrQueueTimeout) {
			t.Fatalf("at 2s: %v, want 2 timed out", got)
		}
		if q.Len() != 1 {
			t.Fatalf("Len = %d, want 1", q.Len())
		}
		// Capacity frees after 3's deadline: it is answered, not dispatched late.
		clk.Advance(2 * time.Second)
		f.add("a", 1)
		q.pump()
		if got := w.answers(1); !errors.Is(got[3], ErrQueueTimeout) {
			t.Fatalf("at 4s: %v, want 3 timed out", got)
		}
		if len(f.dispatched()) != 0 {
			t.Errorf("dispatched %v after their deadlines", f.dispatched())
		}
		if got := value(t, m.Shed.WithLabelValues(ReasonQueueTimeout, "standard")); got != 2 {
			t.Errorf("shed{queue_timeout,standard} = %v, want 2", got)
		}
		if got := value(t, m.QueueLength.WithLabelValues("m", "sheddable")); got != 0 {
			t.Errorf("queue length gauge = %v after all left", got)
		}
		if got := value(t, m.QueueWait.WithLabelValues("critical").(prometheus.Metric)); got != 1 {
			t.Errorf("queue wait observations (critical) = %v, want 1", got)
		}
	})
}

func TestQueueEviction(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		f := newFleet("a")
		q := newQueue(QueueConfig[*job]{Dispatch: f.dispatch, Clock: clk, Size: 3})
		w := newWaiters(t, q, clk)
		ctx := context.Background()
		w.start(ctx, 1, Sheddable, time.Minute)
		w.start(ctx, 2, Sheddable, time.Minute)
		w.start(ctx, 3, Standard, time.Minute)
		w.answers(0)

		step := func(id int, c Class, want map[int]error) {
			t.Helper()
			w.start(ctx, id, c, time.Minute)
			got := w.answers(len(want))
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("after %d (%v) arrived: answers %v, want %v", id, c, got, want)
			}
			if q.Len() != 3 {
				t.Fatalf("Len = %d, want 3", q.Len())
			}
		}
		step(4, Critical, map[int]error{2: ErrEvicted})    // the newest sheddable gives way
		step(5, Sheddable, map[int]error{5: ErrQueueFull}) // nobody is less important than it
		step(6, Standard, map[int]error{1: ErrEvicted})    // the last sheddable gives way
		step(7, Standard, map[int]error{7: ErrQueueFull})  // standard cannot evict standard
		step(8, Critical, map[int]error{6: ErrEvicted})    // the newest standard gives way
		step(9, Critical, map[int]error{3: ErrEvicted})
		step(10, Critical, map[int]error{10: ErrQueueFull})

		f.add("a", 3)
		q.pump()
		w.answers(3)
		if got, want := f.dispatched(), []int{4, 8, 9}; !slices.Equal(got, want) {
			t.Errorf("dispatched %v, want %v", got, want)
		}
	})
}

// TestQueueFullMakesRoomFirst: a full queue answers its expired waiters before refusing anyone.
func TestQueueFullMakesRoomFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		f := newFleet("a")
		q := newQueue(QueueConfig[*job]{Dispatch: f.dispatch, Clock: clk, Size: 2})
		w := newWaiters(t, q, clk)
		ctx := context.Background()
		w.start(ctx, 1, Standard, time.Second)
		w.start(ctx, 2, Standard, time.Minute)
		clk.Advance(2 * time.Second)
		w.start(ctx, 3, Sheddable, time.Minute)
		if got := w.answers(1); !errors.Is(got[1], ErrQueueTimeout) {
			t.Fatalf("answers %v, want 1 timed out and 3 queued", got)
		}
		if q.Len() != 2 {
			t.Errorf("Len = %d", q.Len())
		}
		q.Close()
		w.answers(2)
	})
}

func TestQueueCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		f := newFleet("a")
		q := newQueue(QueueConfig[*job]{Dispatch: f.dispatch, Clock: clk})
		w := newWaiters(t, q, clk)
		ctx, cancel := context.WithCancel(context.Background())
		w.start(context.Background(), 1, Standard, time.Minute)
		w.start(ctx, 2, Critical, time.Minute) // the head, until its client leaves
		w.start(context.Background(), 3, Standard, time.Minute)
		cancel()
		if got := w.answers(1); !errors.Is(got[2], context.Canceled) {
			t.Fatalf("answers %v, want 2 cancelled", got)
		}
		if q.Len() != 2 {
			t.Fatalf("Len = %d, want 2", q.Len())
		}
		f.add("a", 5)
		q.pump()
		w.answers(2)
		if got := f.dispatched(); !slices.Equal(got, []int{1, 3}) {
			t.Errorf("dispatched %v: a cancelled waiter was offered", got)
		}
		// A context already done never queues.
		if err := q.Wait(ctx, &job{id: 4}, Critical, clk.Now().Add(time.Minute)); !errors.Is(err, context.Canceled) {
			t.Errorf("Wait with a done context = %v", err)
		}
	})
}

// TestQueueDispatchError: Dispatch's own error answers that waiter, and dispatch goes on behind it.
func TestQueueDispatchError(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		f := newFleet("a")
		noBackend := errors.New("no healthy backend")
		f.refuse[1] = noBackend
		q := newQueue(QueueConfig[*job]{Dispatch: f.dispatch, Clock: clk})
		w := newWaiters(t, q, clk)
		// 1 is refused on arrival: nobody waits, so Wait tries Dispatch at once.
		w.start(context.Background(), 1, Standard, time.Minute)
		if got := w.answers(1); !errors.Is(got[1], noBackend) {
			t.Fatalf("answers %v", got)
		}
		w.start(context.Background(), 2, Standard, time.Minute)
		w.start(context.Background(), 3, Standard, time.Minute)
		f.refuse[2] = noBackend
		f.add("a", 1)
		q.pump()
		got := w.answers(2)
		if !errors.Is(got[2], noBackend) || got[3] != nil {
			t.Errorf("answers %v, want 2 refused by Dispatch and 3 dispatched", got)
		}
	})
}

func TestQueueClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := newFakeClock()
		f := newFleet("a")
		q := NewQueue(QueueConfig[*job]{Dispatch: f.dispatch, Clock: clk})
		w := newWaiters(t, q, clk)
		for i, c := range []Class{Critical, Standard, Sheddable, Standard, Critical} {
			w.start(context.Background(), i, c, time.Hour)
		}
		q.Close()
		for id, err := range w.answers(5) {
			if !errors.Is(err, ErrClosed) {
				t.Errorf("waiter %d: %v, want ErrClosed", id, err)
			}
		}
		if err := q.Wait(context.Background(), &job{}, Critical, clk.Now().Add(time.Hour)); !errors.Is(err, ErrClosed) {
			t.Errorf("Wait after Close = %v", err)
		}
		q.Close() // idempotent
		q.Signal()
	})
}

// TestQueueFastPath: with nobody waiting and capacity free, Wait dispatches in the caller and returns at once,
// without allocating.
func TestQueueFastPath(t *testing.T) {
	var slots atomic.Int64
	dispatch := func(*job) error {
		if slots.Add(-1) < 0 {
			slots.Add(1)
			return ErrNoCapacity
		}
		return nil
	}
	q := NewQueue(QueueConfig[*job]{Dispatch: dispatch})
	defer q.Close()
	j := &job{}
	ctx := context.Background()
	dl := time.Now().Add(time.Hour)
	allocs := testing.AllocsPerRun(100, func() {
		slots.Store(1)
		if err := q.Wait(ctx, j, Standard, dl); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("the fast path allocates %v times", allocs)
	}
}

// TestQueueDispatcherSignal: with the real dispatcher goroutine, Signal dispatches a waiter at once (no timer
// tick), and the timer alone dispatches within one Tick when capacity frees without a Signal.
func TestQueueDispatcherSignal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet("a")
		q := NewQueue(QueueConfig[*job]{Dispatch: f.dispatch}) // system clock: virtual inside the bubble
		defer q.Close()
		w := newWaiters(t, q, SystemClock{})
		w.start(context.Background(), 1, Standard, time.Minute)
		start := time.Now()
		f.add("a", 1)
		q.Signal()
		a := <-w.out
		if a.err != nil || time.Since(start) != 0 {
			t.Errorf("after Signal: %v after %v, want dispatched at once", a.err, time.Since(start))
		}

		w.start(context.Background(), 2, Standard, time.Minute)
		start = time.Now()
		f.add("a", 1) // no Signal: the timer must find it
		a = <-w.out
		if el := time.Since(start); a.err != nil || el <= 0 || el > DefaultQueueTick {
			t.Errorf("without Signal: %v after %v, want dispatched within one tick (%v)", a.err, el, DefaultQueueTick)
		}
	})
}

// TestQueueDispatcherDeadline: the dispatcher's timer answers an expired waiter within a tick of its deadline.
func TestQueueDispatcherDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet("a")
		q := NewQueue(QueueConfig[*job]{Dispatch: f.dispatch})
		defer q.Close()
		w := newWaiters(t, q, SystemClock{})
		start := time.Now()
		w.start(context.Background(), 1, Critical, 50*time.Millisecond)
		a := <-w.out
		if el := time.Since(start); !errors.Is(a.err, ErrQueueTimeout) || el < 50*time.Millisecond || el > 50*time.Millisecond+DefaultQueueTick {
			t.Errorf("got %v after %v, want ErrQueueTimeout at 50ms (+ one tick)", a.err, el)
		}
	})
}

// TestQueueConcurrent drives many waiters of every class from concurrent goroutines against a fleet of 4 slots
// whose requests finish on timers and Signal, with clients leaving at random: every waiter is answered, the
// fleet never runs more than its slots, and nothing leaks (synctest fails on a goroutine left blocked).
func TestQueueConcurrent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, slots = 300, 4
		f := newFleet("a", "b")
		f.add("a", slots/2)
		f.add("b", slots/2)
		q := NewQueue(QueueConfig[*job]{Dispatch: f.dispatch, Size: 64})
		var wg sync.WaitGroup
		var ok, refused, cancelled atomic.Int64
		rng := rand.New(rand.NewPCG(1, 2))
		for i := range n {
			c := ClassAt(rng.IntN(NumClasses))
			arrive := time.Duration(rng.IntN(1000)) * time.Millisecond // 300/s against ~130/s of capacity
			serve := time.Duration(10+rng.IntN(40)) * time.Millisecond
			leave := time.Duration(rng.IntN(4000)) * time.Millisecond
			wg.Go(func() {
				<-time.After(arrive)
				ctx, cancel := context.WithTimeout(context.Background(), leave)
				defer cancel()
				j := &job{id: i, class: c}
				err := q.Wait(ctx, j, c, time.Now().Add(time.Second))
				switch {
				case err == nil:
					ok.Add(1)
					time.AfterFunc(serve, func() {
						f.release(j.backend)
						q.Signal()
					})
				case errors.Is(err, context.DeadlineExceeded):
					cancelled.Add(1)
				default:
					var e *Error
					if !errors.As(err, &e) || e.Status != 503 {
						t.Errorf("waiter %d: unexpected %v", i, err)
					}
					refused.Add(1)
				}
			})
		}
		wg.Wait()
		synctest.Wait() // let the last timers release
		q.Close()
		if got := ok.Load() + refused.Load() + cancelled.Load(); got != n {
			t.Errorf("answered %d of %d", got, n)
		}
		if f.maxRun > slots {
			t.Errorf("the fleet ran %d at once, more than its %d slots", f.maxRun, slots)
		}
		if ok.Load() == 0 || refused.Load() == 0 {
			t.Errorf("ok %d, refused %d, cancelled %d: the load did not exercise both", ok.Load(), refused.Load(), cancelled.Load())
		}
		if q.Len() != 0 {
			t.Errorf("Len = %d at the end", q.Len())
		}
	})
}

// TestQueueRealClock runs the dispatcher on the real clock (outside a synctest bubble): a waiter is dispatched
// by the timer after capacity frees in another goroutine without a Signal.
func TestQueueRealClock(t *testing.T) {
	f := newFleet("a")
	q := NewQueue(QueueConfig[*job]{Dispatch: f.dispatch})
	defer q.Close()
	done := make(chan error, 1)
	go func() { done <- q.Wait(context.Background(), &job{id: 1}, Standard, time.Now().Add(time.Minute)) }()
	for q.Len() == 0 {
		select {
		case err := <-done:
			t.Fatalf("Wait returned %v without capacity", err)
		default:
		}
		runtime.Gosched() // wait for the goroutine to enqueue
	}
	f.add("a", 1)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("not dispatched within 10s of capacity freeing")
	}
}

// TestQueueExpectedWait: Little's law over the queue's own dispatches. With a slot freeing every 100ms, a
// request that cannot start now expects to wait 100ms per request at least as important ahead of it, plus its
// own slot; one more important than every waiter expects only its own slot; before any dispatch from the
// queue nothing is known (0).
func TestQueueExpectedWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFleet("a")
		q := NewQueue(QueueConfig[*job]{Dispatch: f.dispatch})
		defer q.Close()
		w := newWaiters(t, q, SystemClock{})
		ctx := context.Background()
		if got := q.ExpectedWait(Standard); got != 0 {
			t.Errorf("fresh queue: ExpectedWait = %v, want 0", got)
		}
		for i := range 12 {
			w.start(ctx, i, Standard, time.Minute)
		}
		for range 8 { // a slot every 100ms: 8 dispatched, 4 still waiting
			time.Sleep(100 * time.Millisecond)
			f.add("a", 1)
			q.Signal()
			synctest.Wait()
		}
		if got := w.answers(8); len(got) != 8 {
			t.Fatalf("answers %v", got)
		}
		const slot = 100 * time.Millisecond
		for _, tc := range []struct {
			c    Class
			want time.Duration
		}{
			{Sheddable, 5 * slot}, // behind the 4 standard waiters
			{Standard, 5 * slot},
			{Critical, slot}, // overtakes them all
		} {
			if got := q.ExpectedWait(tc.c); got < tc.want*9/10 || got > tc.want*11/10 {
				t.Errorf("ExpectedWait(%v) = %v, want %v", tc.c, got, tc.want)
			}
		}
		for range 4 {
			f.add("a", 1)
		}
		q.Signal()
		w.answers(4)
	})
}
