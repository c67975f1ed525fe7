// Package cache holds the prefix index: chained hashes of 64-byte prompt blocks and, per backend, the blocks it is
// believed to hold in its KV cache (bounded, CLOCK eviction, TTLs), which lets routing keep requests that share a
// prompt prefix on the backend already holding it. The exact response cache and the Redis-backed stores that
// DESIGN.md section 7 describes are not built yet.
package cache
