package proxy

import (
	"errors"
	"sync"
	"time"

	"github.com/sony/gobreaker/v2"

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
type breakers struct {
	settings BreakerSettings
	m        sync.Map // *routing.Backend -> *breaker
	onState  func(b *routing.Backend, st gobreaker.State)
}

type breaker struct {
	cb *gobreaker.TwoStepCircuitBreaker[struct{}]
	b  *routing.Backend
}

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
			var ue *upstreamError
			return err == nil || (errors.As(err, &ue) && !ue.backendFault())
		},
		IsExcluded: func(err error) bool {
			return errors.Is(err, errClientGone) || errors.Is(err, errShutdown) || errors.Is(err, errNotSent)
		},
		OnStateChange: func(_ string, _, to gobreaker.State) { bs.changed(br, to) },
	})
	if v, loaded := bs.m.LoadOrStore(b, br); loaded {
		return v.(*breaker)
	}
	return br
}

func (bs *breakers) changed(br *breaker, to gobreaker.State) {
	switch to {
	case gobreaker.StateOpen:
		br.b.SetHealthy(false)
		time.AfterFunc(bs.settings.OpenFor, func() {
			// State moves an expired open breaker to half-open; a breaker that opened again meanwhile stays out.
			if br.cb.State() != gobreaker.StateOpen {
				br.b.SetHealthy(true)
			}
		})
	default:
		br.b.SetHealthy(true)
	}
	if bs.onState != nil {
		bs.onState(br.b, to)
	}
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
