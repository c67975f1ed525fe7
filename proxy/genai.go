package proxy

import (
	"errors"
	"strconv"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/openai"
	"github.com/switchyard/switchyard/routing"
)

// The OpenTelemetry GenAI attributes of a request's metrics (metrics.GenAILabels). Every value comes from a
// bounded set: the route table, the policy's engines and models, HTTP statuses and the failure kinds below; the
// metrics package's Gateway comment says why nothing a request or an engine sends may become a label.

// operation returns gen_ai_operation_name for the exchange's route: the conventions' value for the generation
// APIs, the policy's endpoint group for the others (rerank, score, tokenize, audio; responses for the
// stored-response routes, messages for count_tokens).
func (ex *exchange) operation() string {
	rt := ex.rt
	if rt == nil {
		return metrics.OpNone
	}
	switch rt.api {
	case openai.Chat, openai.Responses, openai.Messages:
		return metrics.OpChat
	case openai.Completions:
		return metrics.OpTextCompletion
	case openai.Embeddings:
		return metrics.OpEmbeddings
	}
	if rt.group == EndpointEmbedV2 {
		return metrics.OpEmbeddings
	}
	return rt.group.name()
}

// models returns gen_ai_request_model (the public model asked for) and gen_ai_response_model (the one that
// served: the same, or its degrade_to under brownout); both "" before the model is known.
func (ex *exchange) models() (asked, served string) {
	if ex.asked != nil {
		asked = ex.asked.Name
	}
	if ex.model != nil {
		served = ex.model.Name
	}
	return asked, served
}

// provider returns gen_ai_provider_name for the backend named backend, one of the exchange's attempts (a few
// at most, so the scan is short): its engine, or metrics.ProviderGateway when no backend answered ("none",
// "cache").
func (ex *exchange) provider(backend string) string {
	for i := len(ex.tried) - 1; i >= 0; i-- {
		if b := ex.tried[i]; b.Name() == backend {
			return providerOf(b)
		}
	}
	return metrics.ProviderGateway
}

// providerOf returns gen_ai_provider_name for b: the name of its engine in the policy's engines table.
func providerOf(b *routing.Backend) string { return b.Config().Engine }

// attemptErrorType returns error_type for an upstream attempt that ended with outcome (nil: it answered in
// full): the backend's HTTP status when it answered with an error, else the kind of failure (connect,
// timeout, stream, protocol), or why the gateway ended it (client_gone, shutdown, panic). A hedge that lost its
// race is not observed: abandon ends its accounting before settle.
func attemptErrorType(outcome error) string {
	if outcome == nil {
		return "" // before the rest, whose errors.As target escapes: a success allocates nothing
	}
	var ue *upstreamError
	switch {
	case errors.Is(outcome, errClientGone):
		return "client_gone"
	case errors.Is(outcome, errShutdown):
		return "shutdown"
	case errors.Is(outcome, errPanic):
		return "panic"
	case errors.Is(outcome, errYield):
		return "yielded"
	case errors.As(outcome, &ue):
		if ue.kind == kindStatus {
			return strconv.Itoa(ue.status)
		}
		return ue.kind.String()
	}
	return metrics.ErrorOther
}
