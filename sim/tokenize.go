package sim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/switchyard/switchyard/openai"
)

// The simulator's tokenizer cuts text into openai.BytesPerToken-byte chunks, so its token count is
// openai.EstimateTokens of the text, the count every other endpoint uses. A token id is its chunk's bytes, so
// detokenizing needs no vocabulary:
//
//   - a full 4-byte chunk b0 b1 b2 b3 is the id b0 | b1<<8 | b2<<16 | b3<<24 (0 to 2^32-1);
//   - a last chunk of k = 1 to 3 bytes is 1<<32 | k<<24 | (its bytes, little-endian).
//
// Ids are therefore below 2^33, larger than a real vocabulary's but exact in a float64 and any JSON parser.
const (
	partialToken = 1 << 32
	maxTokenID   = partialToken | 3<<24 | (1<<24 - 1)
)

// appendTokenIDs appends the token ids of text.
func appendTokenIDs(dst []int64, text []byte) []int64 {
	for len(text) >= openai.BytesPerToken {
		dst = append(dst, int64(text[0])|int64(text[1])<<8|int64(text[2])<<16|int64(text[3])<<24)
		text = text[openai.BytesPerToken:]
	}
	if k := len(text); k > 0 {
		id := int64(partialToken) | int64(k)<<24
		for i, c := range text {
			id |= int64(c) << (8 * i)
		}
		dst = append(dst, id)
	}
	return dst
}

// appendDetokenized appends the bytes of the token ids (any order of full and partial chunks); an id no text
// gives is an error naming its index.
func appendDetokenized(dst []byte, ids []int64) ([]byte, error) {
	for i, id := range ids {
		n := 4
		if id >= partialToken {
			n = int(id>>24) & 0xff
			if id > maxTokenID || n < 1 || n > 3 || id&(1<<24-1) >= 1<<(8*n) {
				return dst, errorf(http.StatusBadRequest, "tokens[%d]: %d is not a token id of this model", i, id)
			}
		} else if id < 0 {
			return dst, errorf(http.StatusBadRequest, "tokens[%d]: %d is not a token id of this model", i, id)
		}
		for k := range n {
			dst = append(dst, byte(id>>(8*k)))
		}
	}
	return dst, nil
}

// serveTokenize answers POST /tokenize: {"model", "prompt": string} or {"model", "messages": [...]} (whose text
// is the canonical chat prompt, so count is the prompt_tokens a chat request with those messages reports,
// except that an empty text counts 0 here and 1 there); add_special_tokens and add_generation_prompt are
// accepted and change nothing (the simulator has no special tokens). The answer is vLLM's:
// {"count":N,"max_model_len":L,"tokens":[...],"token_strs":null}.
func (b *Backend) serveTokenize(w http.ResponseWriter, r *http.Request) {
	body, ok := b.readPost(w, r, writeError)
	if !ok {
		return
	}
	var req struct {
		Model    string          `json:"model"`
		Prompt   *string         `json:"prompt"`
		Messages json.RawMessage `json:"messages"`
	}
	if err := decodeJSON(body, &req); err != nil {
		answerError(w, writeError, err)
		return
	}
	var text []byte
	hasMessages := len(req.Messages) > 0 && !bytes.Equal(req.Messages, []byte("null"))
	switch {
	case req.Prompt != nil && hasMessages:
		writeError(w, http.StatusBadRequest, "Set either prompt or messages, not both.")
		return
	case req.Prompt != nil:
		text = []byte(*req.Prompt)
	case hasMessages:
		var err error
		if text, err = openai.AppendPrompt(nil, openai.Chat, body); err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
	default:
		writeError(w, http.StatusBadRequest, "Field required: prompt or messages")
		return
	}
	if !b.checkModel(w, req.Model, writeError) {
		return
	}
	ids := appendTokenIDs(make([]int64, 0, openai.EstimateTokens(len(text))), text)
	out := append(make([]byte, 0, 64+len(ids)*11), `{"count":`...)
	out = strconv.AppendInt(out, int64(len(ids)), 10)
	out = append(out, `,"max_model_len":`...)
	out = strconv.AppendInt(out, int64(b.cfg.maxContextTokens()), 10)
	out = append(out, `,"tokens":[`...)
	for i, id := range ids {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendInt(out, id, 10)
	}
	out = append(out, "],\"token_strs\":null}\n"...)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// serveDetokenize answers POST /detokenize: {"model", "tokens": [ids]} -> {"prompt": text}, the inverse of
// /tokenize. Bytes that are not UTF-8 (a text cut inside a character) come back as U+FFFD.
func (b *Backend) serveDetokenize(w http.ResponseWriter, r *http.Request) {
	body, ok := b.readPost(w, r, writeError)
	if !ok {
		return
	}
	var req struct {
		Model  string   `json:"model"`
		Tokens *[]int64 `json:"tokens"`
	}
	if err := decodeJSON(body, &req); err != nil {
		answerError(w, writeError, err)
		return
	}
	if req.Tokens == nil {
		writeError(w, http.StatusBadRequest, "Field required: tokens")
		return
	}
	text, err := appendDetokenized(nil, *req.Tokens)
	if err != nil {
		answerError(w, writeError, err)
		return
	}
	if !b.checkModel(w, req.Model, writeError) {
		return
	}
	out, _ := json.Marshal(struct {
		Prompt string `json:"prompt"`
	}{string(text)})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(out, '\n'))
}
