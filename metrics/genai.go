package metrics

import "strconv"

// The OpenTelemetry GenAI semantic conventions' attributes, as Prometheus label names (dots become underscores).
// docs/metrics.md lists the values each one takes.
const (
	// LabelOperation is gen_ai.operation.name: the conventions' well-known values (OpChat, OpTextCompletion,
	// OpEmbeddings) for the generation APIs, the policy's endpoint group for the others.
	LabelOperation = "gen_ai_operation_name"
	// LabelProvider is gen_ai.provider.name: the engine of the backend that served (a name of the policy's
	// engines table: vllm, sglang, openai-hosted, ...), or ProviderGateway.
	LabelProvider = "gen_ai_provider_name"
	// LabelRequestModel is gen_ai.request.model: the public model the client asked for, as the policy names it.
	LabelRequestModel = "gen_ai_request_model"
	// LabelResponseModel is gen_ai.response.model: the public model that served, which differs from the one
	// asked for only under brownout (the model's degrade_to).
	LabelResponseModel = "gen_ai_response_model"
	// LabelTokenType is gen_ai.token.type: input or output.
	LabelTokenType = "gen_ai_token_type"
	// LabelErrorType is error.type: empty for a success (Prometheus treats an empty label as absent, as the
	// conventions want: the attribute is set only when the operation ended in an error), else ErrorType's value.
	LabelErrorType = "error_type"
)

// Label lists, in the order WithLabelValues takes the values.
var (
	// GenAILabels are the attributes every gen_ai_* metric carries: operation, provider, request model,
	// response model.
	GenAILabels = []string{LabelOperation, LabelProvider, LabelRequestModel, LabelResponseModel}
	// DurationLabels are GenAILabels then error_type.
	DurationLabels = []string{LabelOperation, LabelProvider, LabelRequestModel, LabelResponseModel, LabelErrorType}
	// TokenLabels are GenAILabels then gen_ai_token_type.
	TokenLabels = []string{LabelOperation, LabelProvider, LabelRequestModel, LabelResponseModel, LabelTokenType}
)

// Values of gen_ai_operation_name that the conventions define ("if one of them applies, then the respective
// value MUST be used").
const (
	// OpChat is chat completions, and the other conversational generation APIs the gateway speaks: the
	// Responses API and Anthropic's Messages API.
	OpChat = "chat"
	// OpTextCompletion is the legacy completions API (/v1/completions).
	OpTextCompletion = "text_completion"
	// OpEmbeddings is /v1/embeddings and /v2/embed.
	OpEmbeddings = "embeddings"
	// OpNone is a request refused before the gateway knew its endpoint (an unknown path). A custom value, as
	// the conventions allow when none of theirs applies.
	OpNone = "none"
)

// ProviderGateway is gen_ai_provider_name for a request no engine answered: the gateway refused it (shed, rate
// limited, no backend, bad request) or served it from its response cache.
const ProviderGateway = "switchyard"

// ErrorOther is the conventions' fallback error.type, for a failure the gateway has no kind for.
const ErrorOther = "_OTHER"

// ErrorType returns error_type for a request the gateway answered with HTTP status code: "" for a success
// (below 400), else the status as a decimal string ("503", "499" when the client left first), which is the
// low-cardinality error identifier the conventions ask for and the one their examples use ("500").
func ErrorType(code int) string {
	if code < 400 {
		return ""
	}
	return strconv.Itoa(code)
}
