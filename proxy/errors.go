package proxy

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/openai"
	"github.com/switchyard/switchyard/routing"
)

// Failure kinds. Every error the request path produces is one of these (or wraps one), and status() maps them
// to an HTTP status and an OpenAI error body in exactly one place.
var (
	// errClientGone: the client closed its connection before the response ended. Logged as 499; never counts
	// against the backend.
	errClientGone = errors.New("proxy: client went away")
	// errShutdown: the gateway is draining and the drain timeout ended the request.
	errShutdown = errors.New("proxy: gateway shutting down")
)

// upstreamError is a failed attempt on one backend. It says whether the attempt reached the backend, whether
// anything was relayed, and whether another backend may be tried.
type upstreamError struct {
	kind    upstreamKind
	backend string
	status  int    // the backend's HTTP status for kindStatus
	message string // the backend's error message for kindStatus, when it gave one
	typ     string // the backend's error type for kindStatus
	err     error  // the underlying transport error, if any
	// cause is how a committed stream that this failure ended ends (streamend.go), decided where the failure
	// happened; endNone for failures before the commit, which are told apart by kind.
	cause endCause
	// body and contentType are the backend's error answer for kindStatus on routes that relay answers intact
	// (route.intact): the client gets them as they are, at most maxErrorBody bytes.
	body        []byte
	contentType string
}

type upstreamKind uint8

const (
	kindConnect   upstreamKind = iota + 1 // never reached the backend (dial failed, connection refused or reset)
	kindFirstByte                         // the backend did not answer (headers or first event) within the first-byte timeout
	kindStatus                            // the backend answered with an error status
	kindStream                            // the stream broke or went idle after it started
	kindProtocol                          // the backend answered something that is not a valid response
)

func (k upstreamKind) String() string {
	switch k {
	case kindConnect:
		return "connect"
	case kindFirstByte:
		return "timeout"
	case kindStatus:
		return "status"
	case kindStream:
		return "stream"
	case kindProtocol:
		return "protocol"
	}
	return "unknown"
}

func (e *upstreamError) Error() string {
	switch {
	case e.kind == kindStatus:
		return fmt.Sprintf("proxy: upstream %s: status %d: %s", e.backend, e.status, e.message)
	case e.err != nil:
		return fmt.Sprintf("proxy: upstream %s: %s: %v", e.backend, e.kind, e.err)
	}
	return fmt.Sprintf("proxy: upstream %s: %s", e.backend, e.kind)
}

func (e *upstreamError) Unwrap() error { return e.err }

// retryable reports whether another backend may be tried after e: the backend failed or refused (5xx, 429)
// before producing anything. A 4xx other than 429 is the client's fault and goes back as is.
func (e *upstreamError) retryable() bool {
	switch e.kind {
	case kindConnect, kindFirstByte, kindProtocol:
		return true
	case kindStatus:
		return e.status >= 500 || e.status == fasthttp.StatusTooManyRequests
	}
	return false
}

// backendFault reports whether e counts against the backend's health.
func (e *upstreamError) backendFault() bool {
	return e.kind != kindStatus || e.status >= 500
}

// apiError is an error with its HTTP rendering decided.
type apiError struct {
	status     int
	typ        string
	code       string
	param      string
	message    string
	retryAfter int // seconds; 0 means no Retry-After header
	noRetry    bool
}

// asUpstream returns the first *upstreamError in err's tree, or nil: errors.As without the heap-allocated
// target that errors.As(err, &ue) costs on every call (the request path asks once or twice per attempt).
func asUpstream(err error) *upstreamError {
	for err != nil {
		switch x := err.(type) {
		case *upstreamError:
			return x
		case interface{ Unwrap() error }:
			err = x.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range x.Unwrap() {
				if ue := asUpstream(e); ue != nil {
					return ue
				}
			}
			return nil
		default:
			return nil
		}
	}
	return nil
}

// status maps any error of the request path to what the client sees. It is the only place that does.
func status(err error) apiError {
	var re *openai.RequestError
	var ue *upstreamError
	var ae *admission.Error
	var se shedError
	switch {
	case errors.As(err, &ae):
		e := apiError{status: ae.Status, typ: ae.Type, code: ae.Code, message: ae.Message, noRetry: ae.NoRetry}
		if ae.RetryAfter > 0 {
			e.retryAfter = admission.RetryAfterSeconds(ae.RetryAfter)
		}
		if errors.As(err, &se) && se.retryAfter > 0 {
			e.retryAfter = admission.RetryAfterSeconds(se.retryAfter)
		}
		return e
	case errors.As(err, &re):
		return apiError{status: 400, typ: "invalid_request_error", code: "invalid_request", param: re.Param, message: re.Message}
	case errors.As(err, new(*responseError)):
		re := new(*responseError)
		errors.As(err, re)
		return apiError{status: (*re).status, typ: "invalid_request_error", param: (*re).param, message: (*re).message}
	case errors.As(err, new(*routeError)):
		return apiError{status: 404, typ: "invalid_request_error", code: "not_found", message: err.Error()}
	case errors.Is(err, errModelNotFound):
		return apiError{status: 404, typ: "invalid_request_error", code: "model_not_found", param: "model", message: err.Error()}
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return apiError{status: 413, typ: "invalid_request_error", code: "request_too_large", message: "request body is larger than the gateway accepts"}
	case errors.Is(err, routing.ErrNoBackend):
		return apiError{status: 503, typ: "server_error", code: "overloaded", message: "no healthy backend is available for this model", retryAfter: 1}
	case errors.Is(err, errShutdown):
		return apiError{status: 503, typ: "server_error", code: "shutting_down", message: "the gateway is shutting down", retryAfter: 1}
	case errors.Is(err, errPanic):
		return apiError{status: 500, typ: "server_error", code: "internal_error", message: "internal error in the gateway; it has been logged"}
	case errors.Is(err, errNotResumed):
		return apiError{status: 503, typ: "server_error", code: "overloaded", retryAfter: 1,
			message: "the stream gave its engine seat to a critical request and could not resume"}
	case errors.Is(err, errClientGone):
		return apiError{status: 499, typ: "invalid_request_error", code: "client_closed_request", message: "client closed the request"}
	case errors.As(err, &ue):
		switch ue.kind {
		case kindConnect:
			return apiError{status: 503, typ: "server_error", code: "overloaded", message: "no backend could be reached for this model", retryAfter: 1}
		case kindFirstByte:
			return apiError{status: 504, typ: "server_error", code: "upstream_timeout", message: "the backend did not answer in time"}
		case kindStatus:
			msg := ue.message
			if msg == "" {
				msg = fmt.Sprintf("backend answered %d", ue.status)
			}
			if ue.status >= 500 {
				return apiError{status: 502, typ: "server_error", code: "bad_gateway", message: msg}
			}
			if ue.status == fasthttp.StatusTooManyRequests {
				return apiError{status: 503, typ: "server_error", code: "overloaded", message: msg, retryAfter: 1}
			}
			typ := ue.typ
			if typ == "" || typ == "BadRequestError" {
				typ = "invalid_request_error"
			}
			return apiError{status: ue.status, typ: typ, code: "upstream_" + strconv.Itoa(ue.status), message: msg}
		default:
			if errors.Is(ue.err, errOverLimit) {
				return apiError{status: 502, typ: "server_error", code: "bad_gateway",
					message: "the backend's answer passed a bound of the gateway (" + strings.TrimPrefix(ue.err.Error(), errOverLimit.Error()+": ") + "); docs/security.md lists the bounds"}
			}
			return apiError{status: 502, typ: "server_error", code: "bad_gateway", message: "the backend's response broke off"}
		}
	}
	return apiError{status: 500, typ: "server_error", code: "internal_error", message: "internal error"}
}

var errModelNotFound = errors.New("model not found")

// writeError renders err on ctx as an OpenAI error body with its status and headers.
func writeError(ctx *fasthttp.RequestCtx, err error) apiError {
	e := status(err)
	if e.status == 499 {
		// Nobody is listening; still end the response cleanly for fasthttp.
		ctx.SetStatusCode(e.status)
		ctx.SetConnectionClose()
		return e
	}
	ctx.SetStatusCode(e.status)
	ctx.SetContentType("application/json")
	if e.retryAfter > 0 {
		ctx.Response.Header.Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	if e.noRetry {
		ctx.Response.Header.Set("X-Should-Retry", "false")
	}
	ctx.Response.SetBodyRaw(openai.AppendError(nil, e.message, e.typ, e.code, e.param))
	return e
}

// anthropicType is the Anthropic Messages API's error type for an HTTP status.
func anthropicType(status int) string {
	switch status {
	case 400, 422:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 503, 529:
		return "overloaded_error"
	}
	return "api_error"
}

// appendAnthropicError appends an Anthropic-shaped error object: {"type":"error","error":{"type":..,"message":..}}.
func appendAnthropicError(dst []byte, status int, message string) []byte {
	dst = append(dst, `{"type":"error","error":{"type":`...)
	dst = openai.AppendQuoted(dst, anthropicType(status))
	dst = append(dst, `,"message":`...)
	dst = openai.AppendQuoted(dst, message)
	return append(dst, "}}"...)
}

// writeErrorFor is writeError in the shape of the API the client called: Anthropic's for /v1/messages, whose
// SDKs read only that shape; OpenAI's for every other endpoint.
func writeErrorFor(ctx *fasthttp.RequestCtx, e openai.Endpoint, err error) apiError {
	ae := writeError(ctx, err)
	if e == openai.Messages && ae.status != 499 {
		ctx.Response.SetBodyRaw(appendAnthropicError(nil, ae.status, ae.message))
	}
	return ae
}

// appendStreamError appends the SSE event that tells a streaming client its answer broke off, in the shape of
// its API: a chat-style error object (then [DONE], which the caller adds) for chat and completions; the
// Responses API's "error" event, which also carries an "error" member so that SDKs which end a stream on one
// (the official ones do) report it as an error rather than pass it on as one more event; Anthropic's "error"
// event for Messages.
func appendStreamError(dst []byte, e openai.Endpoint, msg, typ, code string) []byte {
	switch e {
	case openai.Responses:
		dst = append(dst, "event: error\ndata: {\"type\":\"error\",\"code\":"...)
		dst = openai.AppendQuoted(dst, code)
		dst = append(dst, `,"message":`...)
		dst = openai.AppendQuoted(dst, msg)
		dst = append(dst, `,"param":null,"error":{"message":`...)
		dst = openai.AppendQuoted(dst, msg)
		dst = append(dst, `,"type":`...)
		dst = openai.AppendQuoted(dst, typ)
		dst = append(dst, `,"code":`...)
		dst = openai.AppendQuoted(dst, code)
		return append(dst, "}}\n\n"...)
	case openai.Messages:
		dst = append(dst, "event: error\ndata: "...)
		dst = appendAnthropicError(dst, 500, msg)
		return append(dst, "\n\n"...)
	}
	return openai.AppendErrorEvent(dst, msg, typ, code)
}
