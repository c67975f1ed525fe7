// Package admission decides whether a request runs now, waits, is downgraded or is refused: API keys and priority
// classes (keys.go, class.go), per-key rate limits (ratelimit.go), SLO-aware shedding (shed.go), the bounded
// gateway queue with late binding (queue.go), adaptive per-backend concurrency caps (concurrency.go), retry and
// hedge budgets (budget.go), brownout to a degraded model (brownout.go), passive outlier ejection
// (outlier.go), and the Permit through which one attempt holds a backend's breaker, cap and outlier probe (permit.go).
//
// Everything here is decision logic: it reads time through a Clock and is safe for concurrent use unless a type
// says otherwise, and it does no I/O, with one exception: RedisLimiter (redislimit.go), the per-key limits that
// gateway replicas share through Redis, bounded by a timeout and falling back to LocalLimiter. The request path (proxy) calls it; README.md lists each mechanism's rule,
// its defaults and exactly when the request path calls what. Refusals are *Error values that carry their HTTP
// rendering (status, OpenAI type and code, Retry-After, x-should-retry), so the proxy maps them in one place.
package admission
