// Package admission decides whether a request runs now, waits, is downgraded or is refused: API keys and priority
// classes, per-key rate limits, SLO-aware shedding, the bounded gateway queue with late binding, adaptive
// per-backend concurrency caps and brownout.
package admission
