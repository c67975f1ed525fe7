package policy

import (
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/cache"
	"github.com/switchyard/switchyard/proxy"
)

// Shared says how compiled snapshots share state with the other gateway replicas
// (docs/design.md, "State shared through Redis"). The command builds it from the policy's redis section (which is
// static) and hands it to the Watcher, which applies it to every snapshot it compiles. The zero value shares nothing.
type Shared struct {
	// Limiter, when set, returns the rate limiter a snapshot uses around the one it compiled (the local
	// buckets, which become its fallback): the Redis-backed limiter. The returned limiter should have a
	// Local() *admission.LocalLimiter method, so that the next reload keeps the local buckets.
	Limiter func(local *admission.LocalLimiter) admission.RateLimiter
	// Spender, when set, returns the budget spender a snapshot uses around the one it compiled (the local
	// spend, its fallback): the Redis-backed spender. The result should have a Local() *admission.LocalSpender
	// method, so that the next reload keeps the local spend.
	Spender func(local *admission.LocalSpender) admission.Spender
	// ResponseStore, when set, keeps every model's cached answers (cache.RedisStore, shared by the replicas);
	// nil gives each model with response_cache a memory store of its own (kept across reloads while its
	// max_bytes stays the same).
	ResponseStore cache.Store
	// CacheTimeout bounds a response-cache lookup on the request path (redis.timeout); 0: the proxy's default.
	CacheTimeout time.Duration
	// OnError is told of failed response-cache operations; nil ignores them.
	OnError func(op string, err error)
}

// WatcherOption configures a Watcher.
type WatcherOption func(*Watcher)

// WithShared makes the Watcher's snapshots share state as sh says.
func WithShared(sh Shared) WatcherOption { return func(w *Watcher) { w.shared = sh } }

// apply installs the shared state in s, compiled from c; prev is the snapshot s replaces (nil at start). It
// also builds the models' response caches, which live outside the snapshot's compile because their stores
// outlive it.
func (sh Shared) apply(c *Config, s, prev *proxy.Snapshot) {
	if sh.Limiter != nil {
		if local, ok := s.Limiter.(*admission.LocalLimiter); ok {
			s.Limiter = sh.Limiter(local)
		}
	}
	if sh.Spender != nil {
		if local, ok := s.Spender.(*admission.LocalSpender); ok {
			s.Spender = sh.Spender(local)
		}
	}
	for _, m := range c.Models {
		rc := m.ResponseCache
		pm := s.Models[m.Name]
		if !rc.Enabled() || pm == nil {
			continue
		}
		store := sh.ResponseStore
		if store == nil {
			if old := prevCache(prev, m.Name); old != nil && old.maxBytes == int(rc.MaxBytes) {
				store = old.Store
			} else {
				store = cache.NewMemoryStore(int(rc.MaxBytes), nil)
			}
		}
		pm.Cache = &proxy.ResponseCache{Store: store, TTL: rc.TTL, MaxEntryBytes: int(rc.MaxEntryBytes),
			Shared: rc.Shared(), Timeout: sh.CacheTimeout, OnError: sh.OnError}
	}
}

// keptCache is a previous model's response cache and the memory bound its store was built with.
type keptCache struct {
	*proxy.ResponseCache
	maxBytes int
}

// prevCache returns the response cache model had in prev, with its store's bound (0 when it is not a memory
// store), or nil.
func prevCache(prev *proxy.Snapshot, model string) *keptCache {
	if prev == nil || prev.Models[model] == nil || prev.Models[model].Cache == nil {
		return nil
	}
	rc := prev.Models[model].Cache
	k := &keptCache{ResponseCache: rc}
	if ms, ok := rc.Store.(*cache.MemoryStore); ok {
		k.maxBytes = ms.MaxBytes()
	}
	return k
}
