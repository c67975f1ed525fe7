package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// endCause is how a committed stream ended (docs/design.md, "How a stream ends"; the metric is
// switchyard_stream_ends_total in docs/metrics.md). Each cause is decided where the failure happens, never read
// back from an error's text: the watchdog knows whether it aborted for a client that left, a client too slow to
// take a write, or the drain; the attempt knows which of its deadlines it set last (idle or total) and whether the
// connection ended cleanly or failed; the relay knows an engine's error event. The first cause wins, as the
// watchdog's first abort reason does.
type endCause uint8

const (
	endNone               endCause = iota // not decided yet
	endComplete                           // [DONE] or the API's terminal event
	endClientGone                         // the client closed its connection
	endClientWriteTimeout                 // the client took in nothing for Options.WriteTimeout
	endUpstreamIdle                       // the backend sent nothing for its timeouts.idle
	endUpstreamTotal                      // the attempt passed its backend's timeouts.total
	endUpstreamClosed                     // the backend ended the stream (or its connection) without [DONE]
	endUpstreamReset                      // the connection to the backend failed (reset, broken framing)
	endUpstreamInvalid                    // the backend sent an event the gateway cannot read
	endUpstreamErrorEvent                 // the engine sent an error event
	endGatewayLimit                       // an event passed a bound of the gateway (maxEventBytes)
	endShutdown                           // the drain timeout ended the stream
	endPanic                              // the gateway's code panicked while relaying
	endNotResumed                         // it yielded its engine seat and could not go on (yield.go)
	numEndCauses
)

var endCauseNames = [numEndCauses]string{
	endNone:               "none",
	endComplete:           "complete",
	endClientGone:         "client_gone",
	endClientWriteTimeout: "client_write_timeout",
	endUpstreamIdle:       "upstream_idle_timeout",
	endUpstreamTotal:      "upstream_total_timeout",
	endUpstreamClosed:     "upstream_closed",
	endUpstreamReset:      "upstream_reset",
	endUpstreamInvalid:    "upstream_invalid",
	endUpstreamErrorEvent: "upstream_error_event",
	endGatewayLimit:       "gateway_limit",
	endShutdown:           "shutdown",
	endPanic:              "panic",
	endNotResumed:         "not_resumed",
}

func (c endCause) String() string {
	if c < numEndCauses {
		return endCauseNames[c]
	}
	return "unknown"
}

// errClientSlow ends a stream whose client took in nothing within the write timeout. It is an errClientGone (499,
// never the backend's fault): nothing more can be written to that connection.
var errClientSlow = fmt.Errorf("%w: it took in nothing within the write timeout", errClientGone)

// streamEnds are one backend's children of switchyard_stream_ends_total, one per cause, resolved with the
// backend's record (records.go) so that the relay counts without a label lookup.
type streamEnds [numEndCauses]prometheus.Counter

func newStreamEnds(vec *prometheus.CounterVec, backend string) *streamEnds {
	var e streamEnds
	for c := endComplete; c < numEndCauses; c++ {
		e[c] = vec.WithLabelValues(backend, c.String())
	}
	return &e
}

// causeOf is the cause of a stream that ended with err (nil: complete).
func causeOf(err error) endCause {
	switch {
	case err == nil:
		return endComplete
	case errors.Is(err, errClientSlow):
		return endClientWriteTimeout
	case errors.Is(err, errClientGone):
		return endClientGone
	case errors.Is(err, errShutdown):
		return endShutdown
	case errors.Is(err, errPanic):
		return endPanic
	case errors.Is(err, errNotResumed):
		return endNotResumed
	}
	if ue := asUpstream(err); ue != nil && ue.cause != endNone {
		return ue.cause
	}
	return endUpstreamReset
}

// noteEnd decides how the committed stream ends, unless a cause came first (an engine's error event, then the
// connection closing, is the engine's error event).
func (ex *exchange) noteEnd(fail error) {
	if ex.end != endNone {
		return
	}
	if ex.upstreamError {
		ex.end = endUpstreamErrorEvent
		return
	}
	ex.end = causeOf(fail)
}

// endMessage is the error event's message for a stream that broke: whose failure it was, in plain words, with the
// bound that ended it and the setting that holds the bound.
func (ex *exchange) endMessage(a *attempt) string {
	const tail = "; the answer is incomplete"
	var idle, total time.Duration
	if a != nil {
		idle, total = a.to.Idle, a.to.Total
	}
	switch ex.end {
	case endUpstreamIdle:
		return "the backend sent nothing for " + idle.String() + " (timeouts.idle)" + tail
	case endUpstreamTotal:
		return "the backend's answer took longer than " + total.String() + " (timeouts.total)" + tail
	case endUpstreamClosed:
		return "the backend ended the stream without finishing it" + tail
	case endUpstreamReset:
		return "the connection to the backend failed" + tail
	case endUpstreamInvalid:
		return "the backend sent an event the gateway cannot read" + tail
	case endGatewayLimit:
		return "the backend sent an event larger than the gateway accepts (docs/security.md lists the bounds)" + tail
	case endShutdown:
		return "the gateway is shutting down" + tail
	case endPanic:
		return "internal error in the gateway; it has been logged" + tail
	case endNotResumed:
		return "the stream gave its engine seat to a critical request and could not resume (models[].preempt)" + tail
	}
	return "the backend's stream broke off" + tail
}

// countEnd counts the committed stream's end on its backend's record and, when it broke, writes one warn line
// with whose failure it was and how much had been relayed (hook: finish, once per stream).
func (ex *exchange) countEnd(a *attempt) {
	if !ex.committed {
		return
	}
	if ex.end == endNone {
		ex.end = endComplete
	}
	backend := "none"
	switch {
	case a != nil:
		backend = a.name
	case ex.yieldFrom != "":
		backend = ex.yieldFrom // it yielded its seat there, and could not resume (yield.go)
	}
	if a != nil && a.end != nil {
		a.end.ends[ex.end].Inc()
	} else {
		ex.s.m.StreamEnds.WithLabelValues(backend, ex.end.String()).Inc()
	}
	if ex.end == endComplete {
		return
	}
	ex.s.log.LogAttrs(context.Background(), slog.LevelWarn, "stream ended before its answer did",
		slog.String("request_id", string(ex.reqID)),
		slog.String("backend", backend),
		slog.String("cause", ex.end.String()),
		slog.Int64("bytes", ex.sent),
		slog.Int("tokens", ex.tokens),
		slog.Float64("elapsed_ms", millis(time.Since(ex.arrival))),
	)
}
