// Package openai is the OpenAI wire format as Switchyard needs it: a request summary extracted without a full
// unmarshal (model, stream flag, max_tokens, canonical prompt bytes for hashing and token estimates), an SSE reader
// and writer, chunk inspection (content, usage, errors), re-assembly of a streamed answer into a non-streaming body,
// and OpenAI-shaped error bodies. It imports nothing internal.
//
// Everything here sits on the request path, so it follows fasthttp's conventions: AppendX functions append to
// dst and return the extended slice (they allocate only to grow it); parsers scan their input once, validate all of
// it, and do not allocate on valid input; reusable objects (Summary, EventReader, Assembler) keep their buffers
// across uses. Returned byte slices alias the input or the object's own buffers exactly where the doc comment says
// so, and are valid only as long as it says. Nothing in the package is safe for concurrent use unless stated; the
// package-level functions are safe to call concurrently.
package openai
