package proxy

import (
	"bytes"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/openai"
)

// EndpointSet is a set of the client-facing endpoint groups a model serves (Model.Endpoints). The zero value
// means DefaultEndpoints, so a Snapshot built without the field serves what a policy without it serves.
type EndpointSet uint32

// The endpoint groups, by the name the policy uses for each (models[].endpoints).
const (
	EndpointChat        EndpointSet = 1 << iota // chat: POST /v1/chat/completions
	EndpointCompletions                         // completions: POST /v1/completions
	EndpointEmbeddings                          // embeddings: POST /v1/embeddings
	EndpointResponses                           // responses: /v1/responses and /v1/responses/{id}[/cancel|/input_items]
	EndpointMessages                            // messages: POST /v1/messages and /v1/messages/count_tokens (Anthropic)
	EndpointRerank                              // rerank: POST /v1/rerank, /rerank, /v2/rerank
	EndpointScore                               // score: POST /v1/score, /score
	EndpointEmbedV2                             // embed_v2: POST /v2/embed (Cohere-style)
	EndpointTokenize                            // tokenize: POST /tokenize, /detokenize
	EndpointAudio                               // audio: POST /v1/audio/transcriptions, /translations, /speech

	// DefaultEndpoints are the groups a model serves when the policy names none: the OpenAI generation APIs
	// every engine of the built-in table speaks. The others depend on the model (a reranker, a speech model)
	// and are enabled by name.
	DefaultEndpoints = EndpointChat | EndpointCompletions | EndpointEmbeddings | EndpointResponses | EndpointMessages
	// AllEndpoints is every group ("all" in the policy).
	AllEndpoints = EndpointAudio<<1 - 1
)

var endpointNames = [...]struct {
	name string
	set  EndpointSet
}{
	{"chat", EndpointChat}, {"completions", EndpointCompletions}, {"embeddings", EndpointEmbeddings},
	{"responses", EndpointResponses}, {"messages", EndpointMessages}, {"rerank", EndpointRerank},
	{"score", EndpointScore}, {"embed_v2", EndpointEmbedV2}, {"tokenize", EndpointTokenize},
	{"audio", EndpointAudio},
}

// ParseEndpoint returns the group a policy name stands for ("all" is AllEndpoints).
func ParseEndpoint(name string) (EndpointSet, bool) {
	if name == "all" {
		return AllEndpoints, true
	}
	for _, e := range endpointNames {
		if e.name == name {
			return e.set, true
		}
	}
	return 0, false
}

// EndpointNames lists the policy's names for the groups, in order, then "all".
func EndpointNames() []string {
	names := make([]string, 0, len(endpointNames)+1)
	for _, e := range endpointNames {
		names = append(names, e.name)
	}
	return append(names, "all")
}

// Has reports whether the set holds every group of e; the zero set is DefaultEndpoints.
func (s EndpointSet) Has(e EndpointSet) bool {
	if s == 0 {
		s = DefaultEndpoints
	}
	return s&e == e
}

// name returns the policy name of a single group.
func (s EndpointSet) name() string {
	for _, e := range endpointNames {
		if e.set == s {
			return e.name
		}
	}
	return "?"
}

// A route is one client-facing endpoint: which group it belongs to, how its body is read and how its answer is
// relayed. Routes are static (routeTable); the request path carries a pointer to one.
type route struct {
	group  EndpointSet
	method string
	// api is the wire format of the body for the summary (openai.Summary.Parse); 0 reads only the model and
	// the stream flag of a JSON body (openai.Generic), or of a multipart form when multipart is set.
	api       openai.Endpoint
	multipart bool
	// byID routes name a stored response in their path (/v1/responses/{id}...): they go to the backend that
	// created it (responses.go).
	byID bool
}

// intact reports whether the engine's answer goes back exactly as it came, status and body included, also
// for an error status: everything beyond the OpenAI generation APIs the gateway understands.
// The Responses and Messages APIs are among them: their SDKs read the engine's own error bodies, which the
// gateway's chat-shaped errors are not.
func (r *route) intact() bool { return r.api != openai.Chat && r.api != openai.Completions }

var (
	routeChat        = route{group: EndpointChat, method: fasthttp.MethodPost, api: openai.Chat}
	routeCompletions = route{group: EndpointCompletions, method: fasthttp.MethodPost, api: openai.Completions}
	routeResponses   = route{group: EndpointResponses, method: fasthttp.MethodPost, api: openai.Responses}
	routeMessages    = route{group: EndpointMessages, method: fasthttp.MethodPost, api: openai.Messages}
	// The stored-response routes (responses.go): /v1/responses/{id} (GET, DELETE), .../cancel, .../input_items.
	routeResponseGet    = route{group: EndpointResponses, method: fasthttp.MethodGet, byID: true}
	routeResponseDelete = route{group: EndpointResponses, method: fasthttp.MethodDelete, byID: true}
	routeResponseCancel = route{group: EndpointResponses, method: fasthttp.MethodPost, byID: true}
	routeResponseItems  = route{group: EndpointResponses, method: fasthttp.MethodGet, byID: true}
	routeEmbeddings     = route{group: EndpointEmbeddings, method: fasthttp.MethodPost, api: openai.Embeddings}
	routeRerank         = route{group: EndpointRerank, method: fasthttp.MethodPost}
	routeScore          = route{group: EndpointScore, method: fasthttp.MethodPost}
	routeEmbedV2        = route{group: EndpointEmbedV2, method: fasthttp.MethodPost}
	routeTokenize       = route{group: EndpointTokenize, method: fasthttp.MethodPost}
	routeAudioForm      = route{group: EndpointAudio, method: fasthttp.MethodPost, multipart: true}
	routeAudioJSON      = route{group: EndpointAudio, method: fasthttp.MethodPost}
	routeMessagesAux    = route{group: EndpointMessages, method: fasthttp.MethodPost}
)

// routeTable maps the exact paths of the body-carrying endpoints to their routes.
var routeTable = map[string]*route{
	"/v1/chat/completions":      &routeChat,
	"/v1/completions":           &routeCompletions,
	"/v1/embeddings":            &routeEmbeddings,
	"/v1/responses":             &routeResponses,
	"/v1/messages":              &routeMessages,
	"/v1/rerank":                &routeRerank,
	"/rerank":                   &routeRerank,
	"/v2/rerank":                &routeRerank,
	"/v1/score":                 &routeScore,
	"/score":                    &routeScore,
	"/v2/embed":                 &routeEmbedV2,
	"/tokenize":                 &routeTokenize,
	"/detokenize":               &routeTokenize,
	"/v1/audio/transcriptions":  &routeAudioForm,
	"/v1/audio/translations":    &routeAudioForm,
	"/v1/audio/speech":          &routeAudioJSON,
	"/v1/messages/count_tokens": &routeMessagesAux,
}

var pathResponsesSlash = []byte("/v1/responses/")

// lookupRoute returns the route of a request (by method only where one path has several), and for the
// stored-response routes the response id the path names; nil when the gateway serves no such endpoint.
func lookupRoute(method, path []byte) (r *route, id []byte) {
	if r := routeTable[string(path)]; r != nil { // the compiler does not allocate for a map index by string(b)
		return r, nil
	}
	rest, ok := bytes.CutPrefix(path, pathResponsesSlash)
	if !ok || len(rest) == 0 {
		return nil, nil
	}
	id, sub, _ := bytes.Cut(rest, []byte("/"))
	if len(id) == 0 {
		return nil, nil
	}
	switch string(sub) {
	case "":
		if string(method) == fasthttp.MethodDelete {
			return &routeResponseDelete, id
		}
		return &routeResponseGet, id
	case "cancel":
		return &routeResponseCancel, id
	case "input_items":
		return &routeResponseItems, id
	}
	return nil, nil
}

// isMultipart reports whether a Content-Type is multipart/form-data.
func isMultipart(ct []byte) bool {
	return len(ct) >= 19 && bytes.EqualFold(ct[:19], []byte("multipart/form-data"))
}

// notEnabled is the 404 for a model that does not serve a route's group.
func notEnabled(path []byte, model string, g EndpointSet) error {
	return &routeError{msg: "the endpoint " + string(path) + " is not enabled for the model " + strings.Clone(model) +
		" (models[].endpoints does not list " + g.name() + ")"}
}

// routeError is a 404 for an endpoint: unknown to the gateway, or not enabled for the model.
type routeError struct{ msg string }

func (e *routeError) Error() string { return e.msg }
