package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/cache"
	"github.com/switchyard/switchyard/internal/redistest"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// The tenants of these tests: alpha may opt in with "X-Switchyard-Cache: on", beta may not.
const (
	alphaSecret = "sk-alpha-secret-0123456789"
	betaSecret  = "sk-beta-secret-9876543210"
)

var (
	alphaAuth = map[string]string{"Authorization": "Bearer " + alphaSecret}
	betaAuth  = map[string]string{"Authorization": "Bearer " + betaSecret}
)

// tenantGateway is a gateway with the keys alpha-tenant (cache opt-in) and beta-tenant (none) and a response
// cache in store for sim-model, shared by the keys when shared (scope: model).
func tenantGateway(t *testing.T, store cache.Store, shared bool, urls ...string) *gateway {
	t.Helper()
	alpha := key("alpha-tenant", alphaSecret, admission.Standard, 0)
	alpha.CacheOptIn = true
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 2, urls...), alpha,
		key("beta-tenant", betaSecret, admission.Standard, 0))
	snap.Models["sim-model"].Cache = &ResponseCache{Store: store, TTL: time.Minute, MaxEntryBytes: 1 << 20,
		Shared: shared, Timeout: time.Second, OnError: func(op string, err error) { t.Errorf("%s: %v", op, err) }}
	return startGateway(t, snap, Options{})
}

// withHeaders returns the union of header maps.
func withHeaders(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// storeAndHit sends body as auth until it is a hit (the answer is stored off the request path): the first
// answer must be a miss from the backend.
func storeAndHit(t *testing.T, url, body string, auth map[string]string) answer {
	t.Helper()
	if a := post(t, url, body, auth); a.code != 200 || a.header.Get(headerCache) != "miss" || a.backend != "b0" {
		t.Fatalf("first request: %d, cache %q from %q; want a miss from b0", a.code, a.header.Get(headerCache), a.backend)
	}
	var hit answer
	waitFor(t, 2*time.Second, func() bool {
		hit = post(t, url, body, auth)
		return hit.header.Get(headerCache) == "hit"
	})
	if hit.code != 200 || hit.backend != "cache" {
		t.Fatalf("hit: %d from %q", hit.code, hit.backend)
	}
	return hit
}

// TestResponseCachePartitionedByKey: with the default scope an answer kept for one key is never another key's:
// the other key's same request is a plain miss that reaches the backend, and then has its own entry. With
// scope model the keys share.
func TestResponseCachePartitionedByKey(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	body := chatBody(false, `,"temperature":0`)

	t.Run("scope key", func(t *testing.T) {
		gw := tenantGateway(t, cache.NewMemoryStore(1<<20, nil), false, be.URL())
		storeAndHit(t, gw.url, body, alphaAuth)
		if a := post(t, gw.url, body, betaAuth); a.code != 200 || a.header.Get(headerCache) != "miss" || a.backend != "b0" {
			t.Fatalf("beta after alpha's answer was kept: %d, cache %q from %q; want a miss from b0", a.code,
				a.header.Get(headerCache), a.backend)
		}
		waitFor(t, 2*time.Second, func() bool { // beta's miss kept beta's own entry
			return post(t, gw.url, body, betaAuth).header.Get(headerCache) == "hit"
		})
		if a := post(t, gw.url, body, alphaAuth); a.header.Get(headerCache) != "hit" {
			t.Fatalf("alpha lost its entry: cache %q", a.header.Get(headerCache))
		}
	})
	t.Run("scope model", func(t *testing.T) {
		gw := tenantGateway(t, cache.NewMemoryStore(1<<20, nil), true, be.URL())
		kept := storeAndHit(t, gw.url, body, alphaAuth)
		if a := post(t, gw.url, body, betaAuth); a.header.Get(headerCache) != "hit" || a.backend != "cache" || a.body != kept.body {
			t.Fatalf("beta with scope model: cache %q from %q", a.header.Get(headerCache), a.backend)
		}
	})
}

// TestResponseCacheOptInNeedsPermission: "X-Switchyard-Cache: on" caches a sampled request only for a key with
// CacheOptIn; from another key it is ignored, as if absent (no cache header, every request to the backend,
// nothing stored).
func TestResponseCacheOptInNeedsPermission(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	store := cache.NewMemoryStore(1<<20, nil)
	gw := tenantGateway(t, store, true, be.URL()) // shared: beta's "on" would be visible to alpha if it counted
	body := chatBody(false, `,"temperature":0.7`)
	on := map[string]string{headerCache: "on"}
	for i := range 3 {
		a := post(t, gw.url, body, withHeaders(betaAuth, on))
		if a.code != 200 || a.header.Get(headerCache) != "" || a.backend != "b0" {
			t.Fatalf("beta's opt-in %d: %d, cache %q from %q; want no caching, from b0", i, a.code,
				a.header.Get(headerCache), a.backend)
		}
	}
	storeAndHit(t, gw.url, body, withHeaders(alphaAuth, on)) // alpha's first is a miss: beta stored nothing
	if n, _ := store.Len(); n != 1 {
		t.Fatalf("%d entries kept; want alpha's one", n)
	}
}

// TestResponseCacheRedisPartitioned: replicas sharing a Redis share each key's entries and nothing across keys,
// and no Redis key holds API key material (the text, its hash, the key's name).
func TestResponseCacheRedisPartitioned(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	c := redistest.Client(t, redistest.Addr(t))
	ctx := context.Background()

	t.Run("scope key", func(t *testing.T) {
		prefix := redistest.Prefix(t)
		store := cache.NewRedisStore(c, prefix)
		gw1, gw2 := tenantGateway(t, store, false, be.URL()), tenantGateway(t, store, false, be.URL())
		body := chatBody(true, `,"temperature":0`)
		if a := post(t, gw1.url, body, alphaAuth); a.code != 200 || a.header.Get(headerCache) != "miss" {
			t.Fatalf("alpha on replica 1: %d %q", a.code, a.header.Get(headerCache))
		}
		waitFor(t, 2*time.Second, func() bool { return post(t, gw2.url, body, alphaAuth).header.Get(headerCache) == "hit" })
		if a := post(t, gw2.url, body, betaAuth); a.code != 200 || a.header.Get(headerCache) != "miss" || a.backend != "b0" {
			t.Fatalf("beta on replica 2: %d, cache %q from %q; want a miss from b0", a.code, a.header.Get(headerCache), a.backend)
		}
		waitFor(t, 2*time.Second, func() bool { return post(t, gw1.url, body, betaAuth).header.Get(headerCache) == "hit" })

		keys, err := c.Keys(ctx, prefix+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 2 {
			t.Fatalf("redis keys %q; want one per tenant", keys)
		}
		var forbidden []string
		for _, s := range []string{alphaSecret, betaSecret} {
			h := sha256.Sum256([]byte(s))
			forbidden = append(forbidden, s, hex.EncodeToString(h[:]), string(h[:]))
		}
		forbidden = append(forbidden, "alpha", "beta", "tenant")
		for _, k := range keys {
			rest := strings.TrimPrefix(k, prefix)
			for _, f := range forbidden {
				if strings.Contains(strings.ToLower(rest), strings.ToLower(f)) {
					t.Errorf("redis key %q holds %q", k, f)
				}
			}
		}
	})
	t.Run("scope model", func(t *testing.T) {
		store := cache.NewRedisStore(c, redistest.Prefix(t))
		gw1, gw2 := tenantGateway(t, store, true, be.URL()), tenantGateway(t, store, true, be.URL())
		body := chatBody(false, `,"temperature":0`)
		if a := post(t, gw1.url, body, alphaAuth); a.code != 200 || a.header.Get(headerCache) != "miss" {
			t.Fatalf("alpha on replica 1: %d %q", a.code, a.header.Get(headerCache))
		}
		waitFor(t, 2*time.Second, func() bool { return post(t, gw2.url, body, betaAuth).header.Get(headerCache) == "hit" })
	})
}

// TestResponseKeyPartitions: the same request has one store key per partition, the same across key sets built
// from the same policy (a reload, another replica), and a hex SHA-256 whatever the partition.
func TestResponseKeyPartitions(t *testing.T) {
	build := func() []*admission.Key {
		ks, err := admission.NewKeys([]admission.KeyConfig{key("a", "sk-a", admission.Standard, 0),
			key("b", "sk-b", admission.Standard, 0)})
		if err != nil {
			t.Fatal(err)
		}
		return ks.All()
	}
	ks, again := build(), build()
	canon := []byte(`{"messages":[]}`)
	seen := map[string]string{}
	for _, tc := range []struct {
		name  string
		part  *admission.Key
		model string
	}{
		{"shared", nil, "m"},
		{"key a", ks[0], "m"},
		{"key b", ks[1], "m"},
		{"key a, model n", ks[0], "n"},
		{"shared, model n", nil, "n"},
	} {
		k := responseKey(tc.part, tc.model, canon)
		if len(k) != 64 || strings.Trim(k, "0123456789abcdef") != "" {
			t.Errorf("%s: %q is not a hex SHA-256", tc.name, k)
		}
		if other, dup := seen[k]; dup {
			t.Errorf("%s has the key of %s", tc.name, other)
		}
		seen[k] = tc.name
	}
	if responseKey(ks[0], "m", canon) != responseKey(again[0], "m", canon) {
		t.Error("a rebuilt key set moved key a's partition")
	}
}
