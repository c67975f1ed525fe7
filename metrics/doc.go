// Package metrics declares every Prometheus metric Switchyard exports, in one place, with the OpenTelemetry GenAI
// names and bucket boundaries for client-facing latencies and switchyard_* names for gateway internals. It imports
// nothing internal.
package metrics
