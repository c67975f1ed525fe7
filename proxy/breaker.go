package proxy

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
)

// BreakerSettings tune the circuit breaker every backend has. Zero fields take the defaults.
type BreakerSettings struct {
	// ConsecutiveFailures opens the breaker after this many failed attempts in a row. Default 3.
	ConsecutiveFailures uint32
	// FailureRatio opens the breaker when at least MinRequests attempts in the counting window failed in this
	// proportion. Default 0.5.
	FailureRatio float64
	// MinRequests is the smallest window in which FailureRatio applies. Default 10.
	MinRequests uint32
	// Window is the counting interval of the closed state: counts older than this are forgotten (gobreaker's
	// Interval, rolled in one-second buckets). Default 10 s.
	Window time.Duration
	// OpenFor is how long an open breaker keeps the backend out of rotation before it is probed again with
	// real traffic (half-open). Default 5 s.
	OpenFor time.Duration
	// Probes is how many requests a half-open breaker lets through; that many successes close it. Default 2.
	Probes uint32
}

func (s *BreakerSettings) setDefaults() {
	if s.ConsecutiveFailures == 0 {
		s.ConsecutiveFailures = 3
	}
	if s.FailureRatio <= 0 {
		s.FailureRatio = 0.5
	}
	if s.MinRequests == 0 {
		s.MinRequests = 10
	}
	if s.Window <= 0 {
		s.Window = 10 * time.Second
	}
	if s.OpenFor <= 0 {
		s.OpenFor = 5 * time.Second
	}
	if s.Probes == 0 {
		s.Probes = 2
	}
}

// breakers holds one circuit breaker per backend (github.com/sony/gobreaker/v2, two-step: Allow at dispatch, done
// when the attempt ends). They outlive policy reloads with the *routing.Backend they guard.
//
// An open breaker marks its backend unhealthy, so every strategy leaves it out; after OpenFor it is marked healthy
// again, and the next request routed there finds the breaker half-open and probes it. Client hang-ups and the
// backend's 4xx (including 429) never count against it.
//
// With a SharedBreakers (Redis), a breaker that opens is published to the other replicas, and a backend another
// replica reports open is kept out of rotation here too until that replica's OpenFor ends (remoteUntil), without
// touching the local breaker's counts: health is "neither breaker says open".
type breakers struct {
	settings BreakerSettings
	m        sync.Map // *routing.Backend -> *breaker
	onState  func(b *routing.Backend, st gobreaker.State)
	shared   *SharedBreakers // nil: breakers are this replica's own
}

type breaker struct {
	cb          *gobreaker.TwoStepCircuitBreaker[struct{}]
	b           *routing.Backend
	remoteUntil atomic.Int64 // UnixNano until which another replica reports the breaker open; 0: none
}

var _ admission.Breaker = (*breaker)(nil)

// Allow implements admission.Breaker: gobreaker's two-step permission.
func (br *breaker) Allow() (func(error), error) { return br.cb.Allow() }

func newBreakers(s BreakerSettings, onState func(*routing.Backend, gobreaker.State)) *breakers {
	s.setDefaults()
	return &breakers{settings: s, onState: onState}
}

// get returns b's breaker, creating it on first use.
func (bs *breakers) get(b *routing.Backend) *breaker {
	if v, ok := bs.m.Load(b); ok {
		return v.(*breaker)
	}
	br := &breaker{b: b}
	s := bs.settings
	br.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:         b.Name(),
		MaxRequests:  s.Probes,
		Interval:     s.Window,
		BucketPeriod: time.Second,
		Timeout:      s.OpenFor,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			return c.ConsecutiveFailures >= s.ConsecutiveFailures ||
				(c.Requests >= s.MinRequests && float64(c.TotalFailures) >= s.FailureRatio*float64(c.Requests))
		},
		IsSuccessful: func(err error) bool {
			if err == nil {
				return true
			}
			ue := asUpstream(err)
			return ue != nil && !ue.backendFault()
		},
		IsExcluded: func(err error) bool {
			// A hedge that lost its race was cancelled by the gateway: not the backend's failure (the slower of
			// two healthy engines lost every race and had its breaker opened before this).
			return errors.Is(err, errClientGone) || errors.Is(err, errShutdown) || errors.Is(err, errNotSent) ||
				errors.Is(err, admission.ErrNotSent) || errors.Is(err, errHedgeLost) || errors.Is(err, errYield)
		},
		OnStateChange: func(_ string, _, to gobreaker.State) { bs.changed(br, to) },
	})
	if v, loaded := bs.m.LoadOrStore(b, br); loaded {
		return v.(*breaker)
	}
	return br
}

func (bs *breakers) changed(br *breaker, to gobreaker.State) {
	if to == gobreaker.StateOpen {
		br.b.SetHealthy(false)
		// State moves an expired open breaker to half-open; a breaker that opened again meanwhile stays out.
		time.AfterFunc(bs.settings.OpenFor, func() { bs.refresh(br, br.cb.State() == gobreaker.StateOpen, time.Now()) })
		if bs.shared != nil {
			bs.shared.opened(br.b.Name(), bs.settings.OpenFor)
		}
	} else {
		// gobreaker calls this under its lock: the state is to, and asking the breaker would deadlock.
		bs.refresh(br, false, time.Now())
	}
	if bs.onState != nil {
		bs.onState(br.b, to)
	}
}

// refresh sets br's backend healthy unless its own breaker is open (localOpen) or another replica reports it
// open.
func (bs *breakers) refresh(br *breaker, localOpen bool, now time.Time) {
	remote := br.remoteUntil.Load()
	if remote != 0 && now.UnixNano() >= remote {
		br.remoteUntil.CompareAndSwap(remote, 0)
		remote = 0
	}
	br.b.SetHealthy(remote == 0 && !localOpen)
}

// setRemote records that another replica reports b's breaker open for the next d (d <= 0: it reports nothing)
// and updates b's health.
func (bs *breakers) setRemote(b *routing.Backend, d time.Duration, now time.Time) {
	br := bs.get(b)
	if d > 0 {
		br.remoteUntil.Store(now.Add(d).UnixNano())
	} else {
		br.remoteUntil.Store(0)
	}
	bs.refresh(br, br.cb.State() == gobreaker.StateOpen, now)
}

// peek returns b's breaker, or nil when it has none yet.
func (bs *breakers) peek(b *routing.Backend) *breaker {
	if v, ok := bs.m.Load(b); ok {
		return v.(*breaker)
	}
	return nil
}

// state returns b's breaker state, "closed" for a backend that never had one.
func (bs *breakers) state(b *routing.Backend) gobreaker.State {
	if v, ok := bs.m.Load(b); ok {
		return v.(*breaker).cb.State()
	}
	return gobreaker.StateClosed
}

// errNotSent marks an attempt that ended before anything was sent (nothing to learn about the backend).
var errNotSent = errors.New("proxy: attempt not sent")
