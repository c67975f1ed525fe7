// Package routing holds the backend registry and each backend's live state (in flight, queued prefill, scraped engine
// metrics, RTT), the online latency models, and the strategies that pick a backend for a request
// (filter -> cost -> pick). Its request path reads immutable snapshots and atomics and never blocks on I/O.
//
// The request path uses it in this order, for each request:
//
//	r := &routing.Request{Model: model, PromptTokens: n, Prompt: canonical}   // or reuse one after r.Reset()
//	t, err := strategy.Pick(r, targets)             // again for each retry or hedge, without the tried targets
//	a := t.Backend.Dispatch(r)                      // right before sending upstream to t.Backend
//	a.FirstToken()                                  // at the first token
//	a.ObserveUsage(routing.Usage{...})              // when the usage chunk arrives
//	a.End(backendFailed)                            // exactly once per Dispatch
//	r.Reset()                                       // after every attempt for r has ended
//
// A Monitor (started by the command wiring) scrapes the engines, probes RTT and expires prefix-index entries;
// Registry.Status feeds /debug/backends. README.md states each strategy's formula.
package routing
