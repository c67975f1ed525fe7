package policy

import (
	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/proxy"
)

// Shared says how compiled snapshots share state with the other gateway replicas (DESIGN.md section 7). The
// command builds it from the policy's redis section (which is static) and hands it to the Watcher, which
// applies it to every snapshot it compiles. The zero value shares nothing.
type Shared struct {
	// Limiter, when set, returns the rate limiter a snapshot uses around the one it compiled (the local
	// buckets, which become its fallback): the Redis-backed limiter. The returned limiter should have a
	// Local() *admission.LocalLimiter method, so that the next reload keeps the local buckets.
	Limiter func(local *admission.LocalLimiter) admission.RateLimiter
}

// WatcherOption configures a Watcher.
type WatcherOption func(*Watcher)

// WithShared makes the Watcher's snapshots share state as sh says.
func WithShared(sh Shared) WatcherOption { return func(w *Watcher) { w.shared = sh } }

// apply installs the shared state in s, compiled from c.
func (sh Shared) apply(_ *Config, s *proxy.Snapshot) {
	if sh.Limiter != nil {
		if local, ok := s.Limiter.(*admission.LocalLimiter); ok {
			s.Limiter = sh.Limiter(local)
		}
	}
}
