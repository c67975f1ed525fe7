package admission

import (
	"errors"
	"time"
)

// Error is a refusal with its HTTP rendering decided, following ops.md A1.5: 429 means the caller is over its
// quota, 503 that the gateway is overloaded. The request path renders it as an OpenAI error body
// {"error":{"message","type","param":null,"code"}} with Status, a Retry-After header when RetryAfter > 0 (whole
// seconds, rounded up; a decision's own RetryAfter, when it has one, replaces this default) and
// "x-should-retry: false" when NoRetry is set.
//
// The package's refusals are the Err* values below; compare with errors.Is. They are shared: never modify one.
type Error struct {
	// Status is the HTTP status: 401, 403, 429 or 503.
	Status int
	// Type and Code are the OpenAI error type and code.
	Type string
	Code string
	// Message is the human-readable message sent to the client.
	Message string
	// Reason labels switchyard_shed_total for refusals that shed load ("" for authentication failures, which are
	// not load). Admission counts its own refusals; the request path must not count them again.
	Reason string
	// RetryAfter is the default Retry-After; 0 means none.
	RetryAfter time.Duration
	// NoRetry asks clients not to retry (x-should-retry: false): retrying cannot succeed.
	NoRetry bool
}

// Error returns the message prefixed with the package name, for logs; clients get Message alone.
func (e *Error) Error() string { return "admission: " + e.Message }

// Shed reasons, the reason label of switchyard_shed_total.
const (
	ReasonRateLimitRequests = "rate_limit_requests" // the key's requests per minute
	ReasonRateLimitTokens   = "rate_limit_tokens"   // the key's tokens per minute
	ReasonSaturated         = "saturated"           // the sheddable curve: the fleet is saturated
	ReasonSLO               = "slo"                 // the best predicted TTFT misses the class's objective
	ReasonQueueFull         = "queue_full"          // the queue was full and the request was the least important
	ReasonEvicted           = "evicted"             // a more important request took the queued request's place
	ReasonQueueTimeout      = "queue_timeout"       // the request's deadline passed while it waited
)

// Refusals. Authentication and permission errors are final (NoRetry); rate-limit refusals carry the quota's own
// Retry-After; overload refusals carry a short Retry-After (DefaultRetryAfter) so that SDKs back off.
var (
	// ErrMissingKey: keys are configured and the request has no "Authorization: Bearer <key>".
	ErrMissingKey = &Error{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key", NoRetry: true,
		Message: "missing API key: send it as \"Authorization: Bearer <key>\""}
	// ErrInvalidKey: the bearer key is not one the gateway knows.
	ErrInvalidKey = &Error{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key", NoRetry: true,
		Message: "invalid API key"}
	// ErrModelNotAllowed: the key may not use the requested model.
	ErrModelNotAllowed = &Error{Status: 403, Type: "permission_error", Code: "model_not_allowed", NoRetry: true,
		Message: "this API key may not use the requested model"}
	// ErrRateLimitRequests: the key's requests per minute are spent for now.
	ErrRateLimitRequests = &Error{Status: 429, Type: "requests", Code: "rate_limit_exceeded",
		Reason: ReasonRateLimitRequests, RetryAfter: time.Second,
		Message: "rate limit reached for requests per minute; retry after the time in Retry-After"}
	// ErrRateLimitTokens: the key's tokens per minute are spent for now.
	ErrRateLimitTokens = &Error{Status: 429, Type: "tokens", Code: "rate_limit_exceeded",
		Reason: ReasonRateLimitTokens, RetryAfter: time.Second,
		Message: "rate limit reached for tokens per minute; retry after the time in Retry-After"}
	// ErrTokensExceedLimit: the request alone needs more tokens than the key may use in a minute; it can never
	// pass, so clients must not retry it as is.
	ErrTokensExceedLimit = &Error{Status: 429, Type: "tokens", Code: "rate_limit_exceeded",
		Reason: ReasonRateLimitTokens, NoRetry: true,
		Message: "request too large: its prompt and max_tokens exceed the key's tokens per minute"}
	// ErrOverloaded: shed by the sheddable curve because the fleet is saturated.
	ErrOverloaded = &Error{Status: 503, Type: "server_error", Code: "overloaded", Reason: ReasonSaturated,
		RetryAfter: DefaultRetryAfter, Message: "the gateway is overloaded; retry later"}
	// ErrSLO: shed because the best predicted time to first token misses the request's objective.
	ErrSLO = &Error{Status: 503, Type: "server_error", Code: "overloaded", Reason: ReasonSLO,
		RetryAfter: DefaultRetryAfter, Message: "the gateway is overloaded: no backend can answer within the latency objective"}
	// ErrQueueFull: the gateway queue is full and the request was the least important.
	ErrQueueFull = &Error{Status: 503, Type: "server_error", Code: "overloaded", Reason: ReasonQueueFull,
		RetryAfter: DefaultRetryAfter, Message: "the gateway is overloaded: its queue is full"}
	// ErrEvicted: the request was waiting and a more important one took its place in the full queue.
	ErrEvicted = &Error{Status: 503, Type: "server_error", Code: "overloaded", Reason: ReasonEvicted,
		RetryAfter: DefaultRetryAfter, Message: "the gateway is overloaded: the request gave its place to more important traffic"}
	// ErrQueueTimeout: the request's queue deadline passed before a backend could take it.
	ErrQueueTimeout = &Error{Status: 503, Type: "server_error", Code: "overloaded", Reason: ReasonQueueTimeout,
		RetryAfter: DefaultRetryAfter, Message: "the gateway is overloaded: the request waited too long for a backend"}
	// ErrClosed: the queue was closed (the gateway is shutting down or the model was removed).
	ErrClosed = &Error{Status: 503, Type: "server_error", Code: "shutting_down", RetryAfter: time.Second,
		Message: "the gateway is shutting down"}
)

// ErrNoCapacity is what a queue's dispatch function returns when no backend can take the request now: the
// request keeps its place and is offered again at the next Signal or tick. It is never returned to a waiter.
var ErrNoCapacity = errors.New("admission: no capacity")

// ErrNoCapacityForClass is ErrNoCapacity (errors.Is) for a request whose class may not take the capacity that
// is left, which less important classes may: the probe past an engine's provisional seats (Cap.LimitFor), which
// a critical request must not take. A queue then offers its less important bands what is left, so that the probe
// that finds the seats is not held behind a critical request that cannot use it: under strict priority a
// burst of 200 requests/s, one in ten critical, held a 4,096-seat engine at 8 for three seconds.
var ErrNoCapacityForClass error = noCapacityForClass{}

type noCapacityForClass struct{}

func (noCapacityForClass) Error() string        { return "admission: no capacity for this class" }
func (noCapacityForClass) Is(target error) bool { return target == ErrNoCapacity }

// DefaultRetryAfter is the Retry-After of overload refusals (503) when the decision does not compute one.
const DefaultRetryAfter = time.Second

// RetryAfterSeconds returns d as the integer seconds of a Retry-After header: rounded up, at least 1 (RFC 9110
// section 10.2.3 allows only whole seconds, and 0 would invite an immediate retry).
func RetryAfterSeconds(d time.Duration) int {
	s := int((d + time.Second - 1) / time.Second)
	return max(s, 1)
}
