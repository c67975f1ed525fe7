package routing

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"
)

// The idle probe: docs/design.md, "Idle probes". Routing avoids a backend its TTFT model predicts slow, and a
// backend without traffic would never show that it recovered; so the Monitor sends a backend that has gone a
// while without a first token a one-token completion and teaches the model its latency. Two rules keep the
// probe to that case, and keep it from costing real traffic anything:
//
//   - Idle means idle for its share of the traffic. A backend whose fair share of its models' first tokens
//     comes at ρ a second is probed only after idleGaps/ρ without one (at least Monitor.IdleProbeAfter, 2 s by
//     default, at most maxIdleProbeAfter). With a fixed 2 s, a fleet of 64 engines at some 12 requests/s per
//     gateway replica went 2 s without a first token on most engines most of the time: the probes were two
//     requests for every request of traffic through one gateway and 4.6 through two replicas (the routing
//     matrix's 64-engine cells), to engines that real traffic kept measured anyway. A backend whose
//     model the regime detector rescaled for a slowdown it has not seen end (slowed) is probed at the floor:
//     it is the backend routing avoids, and the probe is how its recovery is seen.
//   - A probe takes no seat that a request needs: it is sent only while the engine, as routing sees it now,
//     has nothing waiting and room for the probe and one more request (or, its seats unknown, runs nothing).
//     Through two replicas a replica probed engines its traffic did not reach but the other replica's filled:
//     135 of 2,592 probes found all four seats taken, and a conversation's next turn, seeing the probe queued,
//     moved off its backend.

const (
	// idleGaps is how many of its fair-share gaps between first tokens a backend may go without one before it
	// is probed. Under its fair share of Poisson traffic a backend goes that long without a first token e^-4,
	// about 2% of the time, so one that routing serves normally is seldom probed, and one that routing avoids
	// (its share far below fair) is probed after a few of its expected gaps. The figure is a tail probability,
	// not a tuned delay: it holds for any engine and fleet size, as the gap it multiplies is measured.
	idleGaps = 4
	// maxIdleProbeAfter bounds the wait however sparse the traffic (none at all included): a backend routing
	// avoids is looked at again within 30 s, as long as the outlier detector's first ejection of a backend
	// lasts (admission/outlier.go, BaseEjection), after which the proxy tries an ejected backend again anyway.
	maxIdleProbeAfter = 30 * time.Second
	// idleRateWindow is the time constant of each backend's first-token rate: long enough to hold a few tens of
	// first tokens at the sparse rates where the rule matters (a backend of 64 at 12 requests/s has one in five
	// seconds), short enough that a fleet whose traffic grows shortens its waits within seconds.
	idleRateWindow = 10 * time.Second
)

// idleState is a backend's side of the idle probe. firsts, after, probes and rate are safe for concurrent use;
// last, at and seeded belong to the Monitor's sweeping goroutine.
type idleState struct {
	firsts atomic.Uint64 // first tokens of traffic (not of idle probes) observed
	after  atomic.Int64  // nanoseconds without a first token before a probe is due; 0: the Monitor's floor
	probes atomic.Uint64 // idle probes sent
	rate   afloat        // first tokens a second, smoothed over idleRateWindow

	last   uint64    // firsts at the last sweep
	at     time.Time // the last sweep, on the Monitor's clock
	seeded bool      // rate holds a measurement
}

// sweepIdle measures each backend's first-token rate since the last sweep and sets how long it may go without
// one before it is probed: idleGaps over its fair share of the first tokens of the models it serves (each
// model's rate over its healthy backends, summed over the backend's models), within [IdleProbeAfter,
// maxIdleProbeAfter]. Called from the Monitor's sweeping goroutine only.
func (m *Monitor) sweepIdle(now time.Time) {
	floor := m.opts.IdleProbeAfter
	if floor < 0 {
		return
	}
	bs := m.reg.Backends()
	type share struct {
		rate float64
		n    int
	}
	models := make(map[string]*share)
	for _, b := range bs {
		st := &b.idle
		n := st.firsts.Load()
		if dt := now.Sub(st.at).Seconds(); !st.at.IsZero() && dt > 0 {
			x := float64(n-st.last) / dt
			if st.seeded {
				x = st.rate.load() + (1-math.Exp(-dt/idleRateWindow.Seconds()))*(x-st.rate.load())
			}
			st.rate.store(x)
			st.seeded = true
		}
		st.last, st.at = n, now
		for _, name := range b.Config().Models {
			sh := models[name]
			if sh == nil {
				sh = &share{}
				models[name] = sh
			}
			sh.rate += st.rate.load()
			if b.Healthy() {
				sh.n++
			}
		}
	}
	for _, b := range bs {
		var fair float64 // first tokens a second b would get with its fair share of each of its models
		for _, name := range b.Config().Models {
			if sh := models[name]; sh.n > 0 {
				fair += sh.rate / float64(sh.n)
			}
		}
		after := maxIdleProbeAfter
		if fair > 0 {
			after = min(duration(idleGaps/fair), maxIdleProbeAfter)
		}
		if b.slowed() {
			after = floor
		}
		b.idle.after.Store(int64(max(after, floor)))
	}
}

// slowed reports whether b's TTFT model was rescaled up by the regime detector (a slowdown seen in its first
// tokens) by more than the detector's own trigger, and not seen since to recover: routing avoids such a backend
// for what its model says, and only a probe shows it wrong once the backend gets no traffic. It is probed at the
// floor, as every backend was before its wait followed its share of the traffic.
func (b *Backend) slowed() bool { return b.lat.ttftSlowed.load() > regimeTrigger }

// idleAfter returns how long b may go without a first token before it is probed: the last sweep's figure, the
// floor before any.
func (b *Backend) idleAfter(floor time.Duration) time.Duration {
	if d := time.Duration(b.idle.after.Load()); d > 0 {
		return d
	}
	return floor
}

// idleProbeFits reports whether a probe sent to b now takes no seat a request needs: nothing waits in the engine
// and nothing is saturated, and either its seats (stated, measured, or a lower bound the engine has shown it
// runs) hold what is in it now, the probe and one more request, or, its seats unknown, nothing is in it.
func (b *Backend) idleProbeFits(now time.Time) bool {
	l := b.loadAt(now)
	if l.full || l.waiting > 0 {
		return false
	}
	seats, _ := b.seatsOf(b.engine.Load(), b.Config())
	if seats > 0 {
		return l.occupied+2 <= seats
	}
	return l.occupied == 0
}

// idleProbeDue reports whether the backend has gone its idle wait (idleAfter) without a first token or an idle
// probe, and a probe now would take no seat a request needs (idleProbeFits).
func (s *scraper) idleProbeDue() bool {
	floor := s.m.opts.IdleProbeAfter
	cfg := s.b.Config()
	if floor < 0 || !cfg.Spec().IdleProbes || len(cfg.Models) == 0 || !s.b.Healthy() {
		return false
	}
	now := s.b.clock.Now()
	after := s.b.idleAfter(floor)
	if now.Sub(time.Unix(0, s.b.lastTTFT.Load())) < after || now.Sub(s.lastIdleP) < after {
		return false
	}
	return s.b.idleProbeFits(now)
}

// idleProbe sends the backend a one-token completion and feeds its latency to the TTFT model as a one-token
// prompt under the backend's current load. A failed probe teaches nothing (health is the breaker's job), except
// a timeout, which is a TTFT of at least that long. Its first token is not traffic (idleState.firsts).
func (s *scraper) idleProbe(ctx context.Context, cl *http.Client) {
	b := s.b
	cfg := b.Config()
	ctx, cancel := context.WithTimeout(ctx, idleProbeTimeout)
	defer cancel()
	body := `{"model":` + strconv.Quote(cfg.Models[0]) + `,"prompt":"ping","max_tokens":1,"stream":false}`
	req, err := completionRequest(ctx, cfg, body)
	if err != nil {
		return
	}
	b.idle.probes.Add(1)
	l := b.loadAt(b.clock.Now())
	a := Attempt{b: b, uncached: 1, queued: l.queuedTok, runAt0: l.running, rtt: b.rtt(), seatWait: l.seatWait,
		probeGen: b.probeGen.Load(), idleProbe: true}
	a.predTTFT = b.lat.ttftMean(a.uncached, a.queued, a.runAt0)
	start := time.Now()
	resp, err := cl.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
			b.observeTTFT(&a, time.Since(start).Seconds(), b.clock.Now())
		}
		return
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		b.observeTTFT(&a, time.Since(start).Seconds(), b.clock.Now())
	}
}
