// Package openai is the OpenAI wire format as Switchyard needs it: a request summary extracted without a full
// unmarshal (model, stream flag, max_tokens, canonical prompt bytes for hashing and token estimates), an SSE reader
// and writer, chunk inspection (content, usage, errors), re-assembly of a streamed answer into a non-streaming body,
// and OpenAI-shaped error bodies. It imports nothing internal.
package openai
