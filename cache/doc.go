// Package cache holds the prefix index: chained hashes of 64-byte prompt blocks and, per backend, the blocks it is
// believed to hold in its KV cache (bounded, CLOCK eviction, TTLs), which lets routing keep requests that share a
// prompt prefix on the backend already holding it. It also holds the stores of the exact response cache
// (respcache.go): in memory (bounded, LRU, TTL) and in Redis (shared by the replicas:
// docs/design.md, "State shared through Redis").
package cache
