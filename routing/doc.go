// Package routing holds the backend registry and each backend's live state (in flight, queued prefill, scraped engine
// metrics, RTT), the online latency models, and the strategies that pick a backend for a request
// (filter -> cost -> pick). Its request path reads immutable snapshots and atomics and never blocks on I/O.
package routing
