package policy

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/cache"
	"github.com/switchyard/switchyard/routing"
)

const cacheBase = "backends: [{name: b, url: 'http://h:1', models: [m, n]}]\n"

func TestResponseCacheSettings(t *testing.T) {
	c, err := Parse("f.yaml", []byte(openAuth(cacheBase+"models:\n  - {name: m, response_cache: {}}\n  - {name: n, response_cache: {ttl: 30s, max_entry_bytes: 4KiB, max_bytes: 1MiB}}\n")))
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Models[0].ResponseCache; got != (ResponseCache{TTL: 5 * time.Minute, MaxEntryBytes: 1 << 20, MaxBytes: 64 << 20, Scope: "key"}) {
		t.Errorf("defaults: %+v", got)
	}
	if got := c.Models[1].ResponseCache; got != (ResponseCache{TTL: 30 * time.Second, MaxEntryBytes: 4 << 10, MaxBytes: 1 << 20, Scope: "key"}) {
		t.Errorf("set: %+v", got)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"{ttl: 0s}", "f.yaml:3: models[0].response_cache.ttl: must be between 1s and 24h"},
		{"{max_entry_bytes: 10}", "f.yaml:3: models[0].response_cache.max_entry_bytes: must be between 1KiB and 64MiB"},
		{"{max_entry_bytes: 2MiB, max_bytes: 1MiB}", "f.yaml:3: models[0].response_cache.max_bytes: must be at least max_entry_bytes"},
		{"{scope: modle}", `f.yaml:3: models[0].response_cache.scope: unknown scope "modle" (one of: key, model); did you mean "model"?`},
		{"{scope: ''}", `f.yaml:3: models[0].response_cache.scope: unknown scope "" (one of: key, model)`},
	} {
		_, err := Parse("f.yaml", []byte(openAuth(cacheBase+"models:\n  - {name: m, response_cache: "+tc.yaml+"}\n")))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s:\n got %v\nwant %s...", tc.yaml, err, tc.want)
		}
	}
}

// TestResponseCacheCompiled: a model with response_cache gets a memory store (without redis), kept across a
// reload while its bound stays; a model without gets none.
func TestResponseCacheCompiled(t *testing.T) {
	src := cacheBase + "models:\n  - {name: m, response_cache: {max_bytes: 2MiB}}\n  - {name: n}\nauth: none\n"
	path := filepath.Join(t.TempDir(), "p.yaml")
	writeFile(t, path, src)
	c, s, err := Load(path, routing.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	rc := s.Models["m"].Cache
	if rc == nil || s.Models["n"].Cache != nil || rc.TTL != 5*time.Minute || rc.MaxEntryBytes != 1<<20 {
		t.Fatalf("compiled caches: m %+v, n %+v", rc, s.Models["n"].Cache)
	}
	if ms, ok := rc.Store.(*cache.MemoryStore); !ok || ms.MaxBytes() != 2<<20 {
		t.Fatalf("store %T", rc.Store)
	}
	s2, err := c.Compile(routing.NewRegistry(), s, nil)
	if err != nil {
		t.Fatal(err)
	}
	Shared{}.apply(c, s2, s)
	if s2.Models["m"].Cache.Store != rc.Store {
		t.Error("a reload emptied the model's memory cache")
	}
}

// TestResponseCacheTenancyCompiled: scope model compiles to a shared cache, the default to one partitioned by
// key; cache_opt_in reaches the compiled key, off by default.
func TestResponseCacheTenancyCompiled(t *testing.T) {
	src := cacheBase + "models:\n  - {name: m, response_cache: {scope: model}}\n  - {name: n, response_cache: {}}\n" +
		"api_keys:\n  - {name: a, key: 'sha256:" + sha("a") + "', cache_opt_in: true}\n  - {name: b, key: 'sha256:" + sha("b") + "'}\n"
	path := filepath.Join(t.TempDir(), "p.yaml")
	writeFile(t, path, src)
	_, s, err := Load(path, routing.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	if !s.Models["m"].Cache.Shared || s.Models["n"].Cache.Shared {
		t.Errorf("shared: m %v, n %v; want true, false", s.Models["m"].Cache.Shared, s.Models["n"].Cache.Shared)
	}
	opt := map[string]bool{}
	for _, k := range s.Keys.All() {
		opt[k.Name] = k.CacheOptIn
	}
	if !opt["a"] || opt["b"] {
		t.Errorf("cache_opt_in: %v; want a only", opt)
	}
	if _, err := Parse("f.yaml", []byte(cacheBase+"models: [{name: m}]\napi_keys:\n  - {name: a, key: 'sha256:"+sha("a")+"', cache_opt_in: yes please}\n")); err == nil ||
		!strings.Contains(err.Error(), "api_keys[0].cache_opt_in") {
		t.Errorf("a cache_opt_in that is not a bool: %v", err)
	}
}
