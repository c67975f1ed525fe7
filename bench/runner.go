package bench

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Action is something done at a time on the load's timeline while a run is in progress (a scenario event such as
// slowing a backend down). A run's actions are done one at a time, in time order, in a goroutine of their own;
// Do must return promptly when ctx is done.
type Action struct {
	At    time.Duration
	Label string
	Do    func(ctx context.Context) error
}

// EventRecord is an Action as it happened.
type EventRecord struct {
	At    time.Duration `json:"at_ns"`
	Label string        `json:"label"`
	Err   string        `json:"error,omitempty"`
}

// RunConfig says what to run against what.
type RunConfig struct {
	// Name labels the run in reports (a target, strategy or column name).
	Name string
	// BaseURL is the OpenAI API's base, without /v1 (e.g. "http://127.0.0.1:8080").
	BaseURL string
	Plan    *Plan
	// Timeout bounds each request from send to last byte; default 2 minutes.
	Timeout time.Duration
	// MaxInflight caps requests in flight; an arrival over the cap is recorded as ErrOverload and not sent, never
	// delayed (delaying it would close the loop). Default 50,000.
	MaxInflight int
	// Headers are added to every request.
	Headers http.Header
	// Actions run at their times during the load.
	Actions []Action
	// Picker, when set, chooses each request's base URL just before it is sent (the oracle column); BaseURL then
	// only labels the run. The pick's own time does not count in the request's latencies (Sample.Pick).
	Picker Picker
	// Lead is the delay between Run being called and time 0 of the timeline, so that the first arrivals are not
	// late because of set-up; default 20ms.
	Lead time.Duration
}

// Picker chooses the target of one request: the base URL of the OpenAI API (without /v1) to send it to. It is
// called from the request's own goroutine, concurrently for requests in flight, and must return when ctx is done.
type Picker interface {
	Pick(ctx context.Context, it *Item) (string, error)
}

// Result is the raw outcome of a run: one Sample per plan item, in plan order.
type Result struct {
	Name    string
	Plan    *Plan
	Start   time.Time // time 0 of the timeline
	Samples []Sample
	Events  []EventRecord
	// Elapsed is from time 0 to the last response.
	Elapsed time.Duration
}

// Run sends the plan open-loop: a single scheduler goroutine sleeps until each item's scheduled time and hands it
// to a goroutine of its own, so no response, however slow, delays a later send. Session turns wait for their
// previous turn's answer in their own goroutine. Run returns when every request has finished (each is bounded by
// the timeout) or, after ctx is cancelled, when the in-flight ones have been cancelled; unsent items are then
// marked ErrCanceled. Actions run concurrently at their times and are waited for.
func Run(ctx context.Context, cfg RunConfig) (*Result, error) {
	if cfg.Plan == nil || cfg.BaseURL == "" {
		return nil, fmt.Errorf("bench: run: a plan and a base URL are required")
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.MaxInflight <= 0 {
		cfg.MaxInflight = 50_000
	}
	if cfg.Lead <= 0 {
		cfg.Lead = 20 * time.Millisecond
	}
	items := cfg.Plan.Items
	client := NewClient(cfg.BaseURL, cfg.Timeout, cfg.Headers)
	defer client.Close()

	res := &Result{Name: cfg.Name, Plan: cfg.Plan, Samples: make([]Sample, len(items))}
	// done[i] is closed when item i has finished, for the session turn that waits on it.
	done := make([]chan struct{}, len(items))
	for i := range items {
		if a := items[i].After; a >= 0 && done[a] == nil {
			done[a] = make(chan struct{})
		}
	}
	start := time.Now().Add(cfg.Lead)
	res.Start = start

	var (
		wg       sync.WaitGroup
		inflight atomic.Int64
		lastEnd  atomic.Int64
	)
	// Actions run one after the other in time order, in one goroutine, so that two due at once (or a late
	// wake-up) can never apply a reset before the fault it resets.
	actions := slices.Clone(cfg.Actions)
	slices.SortStableFunc(actions, func(a, b Action) int { return cmp.Compare(a.At, b.At) })
	if len(actions) > 0 {
		wg.Go(func() {
			t := time.NewTimer(time.Hour)
			defer t.Stop()
			for _, a := range actions {
				t.Reset(time.Until(start.Add(a.At)))
				select {
				case <-ctx.Done():
					return
				case <-t.C:
				}
				rec := EventRecord{At: time.Since(start), Label: a.Label}
				if err := a.Do(ctx); err != nil {
					rec.Err = err.Error()
				}
				res.Events = append(res.Events, rec) // read only after wg.Wait

			}
		})
	}

	finish := func(i int, s Sample) {
		res.Samples[i] = s
		if end := int64(s.SendAt + s.E2E); s.Sent && end > lastEnd.Load() {
			for {
				old := lastEnd.Load()
				if end <= old || lastEnd.CompareAndSwap(old, end) {
					break
				}
			}
		}
		if done[i] != nil {
			close(done[i])
		}
	}

	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	next := 0
schedule:
	for ; next < len(items); next++ {
		it := &items[next]
		due := start.Add(it.At)
		if d := time.Until(due); d > 0 {
			timer.Reset(d)
			select {
			case <-ctx.Done():
				break schedule
			case <-timer.C:
			}
		} else if ctx.Err() != nil {
			break
		}
		i := next
		if inflight.Load() >= int64(cfg.MaxInflight) {
			finish(i, Sample{Index: i, Stream: it.Stream, Err: ErrOverload, SendAt: it.At})
			continue
		}
		inflight.Add(1)
		wg.Go(func() {
			defer inflight.Add(-1)
			origin := due
			var wait time.Duration
			if a := it.After; a >= 0 {
				select {
				case <-done[a]:
				case <-ctx.Done():
					finish(i, Sample{Index: i, Stream: it.Stream, Err: ErrCanceled, SendAt: it.At})
					return
				}
				if now := time.Now(); now.After(due) {
					// Held back by the previous answer: a user cannot type the next turn before reading it.
					wait, origin = now.Sub(due), now
				}
			}
			var s Sample
			if cfg.Picker == nil {
				s = client.Do(ctx, it, start, origin)
			} else {
				s = pickAndDo(ctx, cfg.Picker, client, it, start, origin)
			}
			s.SessionWait = wait
			finish(i, s)
		})
	}
	for ; next < len(items); next++ {
		finish(next, Sample{Index: next, Stream: items[next].Stream, Err: ErrCanceled, SendAt: items[next].At})
	}
	wg.Wait()
	res.Elapsed = time.Duration(lastEnd.Load())
	return res, ctx.Err()
}

// pickAndDo asks p where to send it, then sends it there. The pick's time is taken out of the latencies: they
// count from origin plus the pick (so from the real request's send when it was on time), and a late send stays
// late by what it was late before the pick. A failed pick is recorded as ErrPick, not sent.
func pickAndDo(ctx context.Context, p Picker, c *Client, it *Item, start, origin time.Time) Sample {
	t0 := time.Now()
	base, err := p.Pick(ctx, it)
	pick := time.Since(t0)
	if err != nil {
		kind := ErrPick
		if ctx.Err() != nil { // the run was stopped during the pick
			kind = ErrCanceled
		}
		return Sample{Index: it.Index, Stream: it.Stream, Err: kind, ErrMsg: err.Error(), SendAt: t0.Sub(start), Pick: pick}
	}
	s := c.DoAt(ctx, base, it, start, origin.Add(pick))
	s.Pick = pick
	return s
}
