package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// ResponseCache is a model's exact response cache (proxy.ResponseCache): an answer to a deterministic request is
// kept under the hash of its partition (Scope), the public model name and the request's canonical body (the
// JSON without stream, stream_options, user and model, keys sorted), and the same request in the same
// partition is answered from it, as JSON or replayed as an SSE stream, with "X-Switchyard-Cache: hit". Only
// chat and completions requests with temperature 0 (or "X-Switchyard-Cache: on" from a key with cache_opt_in,
// or from any client when there are no api_keys) use it; "X-Switchyard-Cache: off" never does. With redis the
// answers are shared by the replicas, partitioned the same way (and bounded by Redis's own maxmemory); without,
// each replica keeps up to MaxBytes per model. Writing the field (even {}) turns the cache on for the model.
type ResponseCache struct {
	// TTL is how long an answer is kept. Default 5m; in [1s, 24h].
	TTL time.Duration `yaml:"ttl"`
	// MaxEntryBytes is the largest answer kept (its JSON body). Default 1MiB; in [1KiB, 64MiB].
	MaxEntryBytes ByteSize `yaml:"max_entry_bytes"`
	// MaxBytes bounds the answers one replica keeps in memory for the model, least recently used evicted first
	// (not used with redis). Default 64MiB; at least MaxEntryBytes, at most 16GiB.
	MaxBytes ByteSize `yaml:"max_bytes"`
	// Scope says who shares the answers: "key" (each API key its own: a key is never answered with, and never
	// learns of, what another key asked) or "model" (every key of the model: a hit tells a key that another
	// asked the same). Without api_keys every client shares either way. Default "key".
	Scope string `yaml:"scope"`
}

// The response cache's scopes (ResponseCache.Scope).
const (
	ScopeKey   = "key"
	ScopeModel = "model"
)

// cacheScopes lists the scopes, the default first, for error messages.
var cacheScopes = []string{ScopeKey, ScopeModel}

// Shared reports whether every API key of the model shares its answers (scope model).
func (rc ResponseCache) Shared() bool { return rc.Scope == ScopeModel }

// Response cache defaults.
const (
	defaultCacheTTL      = 5 * time.Minute
	defaultCacheEntry    = 1 << 20
	defaultCacheMaxBytes = 64 << 20
)

// Enabled reports whether the model caches answers (the policy set response_cache).
func (rc ResponseCache) Enabled() bool { return rc.TTL > 0 }

// defaultResponseCache fills a set response_cache of models[i].
func (r *report) defaultResponseCache(rc *ResponseCache, p string) {
	if !r.set(p) {
		return
	}
	if !r.set(p + ".ttl") {
		rc.TTL = defaultCacheTTL
	}
	if !r.set(p + ".max_entry_bytes") {
		rc.MaxEntryBytes = defaultCacheEntry
	}
	if !r.set(p + ".max_bytes") {
		rc.MaxBytes = max(defaultCacheMaxBytes, rc.MaxEntryBytes)
	}
	if !r.set(p + ".scope") {
		rc.Scope = ScopeKey
	}
}

// validateResponseCache checks a set response_cache of a model at p.
func (r *report) validateResponseCache(rc ResponseCache, p string) {
	if !r.set(p) {
		return
	}
	if rc.TTL < time.Second || rc.TTL > 24*time.Hour {
		r.errorf(p+".ttl", "must be between 1s and 24h")
	}
	if rc.MaxEntryBytes < 1<<10 || rc.MaxEntryBytes > 64<<20 {
		r.errorf(p+".max_entry_bytes", "must be between 1KiB and 64MiB")
	}
	if rc.MaxBytes < rc.MaxEntryBytes || rc.MaxBytes > 16<<30 {
		r.errorf(p+".max_bytes", fmt.Sprintf("must be at least max_entry_bytes (%d) and at most 16GiB", rc.MaxEntryBytes))
	}
	if !slices.Contains(cacheScopes, rc.Scope) {
		msg := fmt.Sprintf("unknown scope %q (one of: %s)", rc.Scope, strings.Join(cacheScopes, ", "))
		if s := suggest(rc.Scope, cacheScopes); s != "" {
			msg += fmt.Sprintf("; did you mean %q?", s)
		}
		r.errorf(p+".scope", msg)
	}
}

// responseCaches fills in defaults and validates every model's response_cache.
func (r *report) responseCaches(c *Config, validate bool) {
	for i := range c.Models {
		p := fmt.Sprintf("models[%d].response_cache", i)
		if validate {
			r.validateResponseCache(c.Models[i].ResponseCache, p)
		} else {
			r.defaultResponseCache(&c.Models[i].ResponseCache, p)
		}
	}
}
