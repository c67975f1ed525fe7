// Package cache holds the prefix index (chained hashes of 64-byte prompt blocks, per-backend ownership with bounded
// capacity and eviction) that lets routing keep requests that share a prompt prefix on the backend already holding
// it, and the optional exact response cache; each has an in-memory store and a Redis-backed one.
package cache
