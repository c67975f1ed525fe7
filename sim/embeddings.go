package sim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/switchyard/switchyard/openai"
)

// maxPoolItems bounds the inputs of one embeddings request, the documents of one rerank and the pairs of one
// score request (OpenAI's embeddings limit).
const maxPoolItems = 2048

// poolItem is one prefill-only input: the bytes the prefix cache sees and its token count.
type poolItem struct {
	text   []byte
	tokens int
}

// pool runs every item through the engine as a prefill-only sequence (no token generated), concurrently as one
// batch would, and waits for all of them. Each costs its uncached prompt tokens / PrefillTPS inside the engine's
// steps, shares them with running decodes, and is counted in vllm:prompt_tokens_total and
// vllm:request_success_total{finished_reason="stop"}. It reports whether every item finished; otherwise the
// request was answered (an item past the context, down) or the client left.
func (b *Backend) pool(w http.ResponseWriter, r *http.Request, items []poolItem, fail errWriter) bool {
	maxCtx := b.cfg.maxContextTokens()
	for _, it := range items {
		if it.tokens > maxCtx {
			fail(w, http.StatusBadRequest, fmt.Sprintf("This model's maximum context length is %d tokens. "+
				"However, you requested %d tokens in the input. Please reduce the length of the input.",
				maxCtx, it.tokens))
			return false
		}
	}
	seqs := make([]*seq, 0, len(items))
	abortAll := func() {
		for _, s := range seqs {
			b.eng.abort(s)
		}
	}
	faults := b.eng.getFaults()
	for _, it := range items {
		s := newSeq(it.tokens, 1, b.blockHashes(it.text))
		s.pooling = true
		s.stalled = faults.StallRate > 0 && b.failDraw(faults.StallRate)
		if err := b.eng.submit(s); err != nil {
			abortAll()
			writeSubmitError(w, err, fail)
			return false
		}
		seqs = append(seqs, s)
	}
	done := r.Context().Done()
	for i, s := range seqs {
		switch b.waitSeq(done, s) {
		case waitKilled:
			panic(http.ErrAbortHandler)
		case waitLeft:
			for _, rest := range seqs[i+1:] {
				b.eng.abort(rest)
			}
			return false
		}
	}
	return true
}

// embedding is the simulator's stand-in for a sentence embedding: a feature-hashed bag of words. Each word
// (a run of ASCII letters and digits, lowercased, or of non-ASCII bytes) adds ±1 at 8 coordinates of the
// Config.EmbeddingDim-long vector chosen by hashing the word with the seed; the first dim coordinates are kept
// (as a Matryoshka model truncates) and L2-normalised. Texts sharing words therefore have a positive cosine,
// the same words give the same vector on every backend with the same Seed, and a text without words gets a
// unit vector at a coordinate chosen by its bytes. It costs 8 hashes a word, whatever the dimension.
func embedding(dst []float32, seed uint64, text []byte, full, dim int) []float32 {
	start := len(dst)
	for range dim {
		dst = append(dst, 0)
	}
	v := dst[start:]
	eachWord(text, func(h uint64) {
		h ^= seed
		for k := range uint64(8) {
			z := mix64(h + k*0xbf58476d1ce4e5b9)
			if c := int(z % uint64(full)); c < dim {
				v[c] += float32(1 - 2*int(z>>63))
			}
		}
	})
	var sum float64
	for _, x := range v {
		sum += float64(x) * float64(x)
	}
	if sum == 0 {
		v[mix64(xxhash.Sum64(text)^seed)%uint64(dim)] = 1
		return dst
	}
	inv := float32(1 / math.Sqrt(sum))
	for i := range v {
		v[i] *= inv
	}
	return dst
}

// eachWord calls fn with the hash of each word of text: a run of ASCII letters and digits, lowercased, or of
// non-ASCII bytes; a word longer than 64 bytes is hashed from its first 64 bytes and its length. It does not
// allocate.
func eachWord[T ~string | ~[]byte](text T, fn func(h uint64)) {
	var buf [64]byte
	word := buf[:0]
	n := 0
	flush := func() {
		if n == 0 {
			return
		}
		h := xxhash.Sum64(word)
		if n > len(buf) {
			h ^= mix64(uint64(n))
		}
		fn(h)
		word, n = buf[:0], 0
	}
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c >= 0x80:
		default:
			flush()
			continue
		}
		n++
		if len(word) < len(buf) {
			word = append(word, c)
		}
	}
	flush()
}

// mix64 is splitmix64's finalizer.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// appendVector appends v as a JSON array of numbers, or (b64) as a JSON string of its little-endian float32s
// in standard base64, as OpenAI's encoding_format "base64".
func appendVector(dst []byte, v []float32, b64 bool) []byte {
	if b64 {
		raw := make([]byte, 4*len(v))
		for i, x := range v {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(x))
		}
		dst = append(dst, '"')
		dst = base64.StdEncoding.AppendEncode(dst, raw)
		return append(dst, '"')
	}
	dst = append(dst, '[')
	for i, x := range v {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendFloat(dst, float64(x), 'g', -1, 32)
	}
	return append(dst, ']')
}

// embeddingInputs parses an embeddings "input": a string, a list of strings, a list of token ids or a list of
// such lists. A string's text is its bytes and its tokens openai.EstimateTokens of them (at least 1); a list of
// token ids is one input whose text is its raw JSON (the bytes the gateway's canonical prompt takes for it) and
// whose tokens are the ids.
func embeddingInputs(input json.RawMessage) ([]poolItem, error) {
	input = bytes.TrimSpace(input)
	if len(input) == 0 || bytes.Equal(input, []byte("null")) {
		return nil, errorf(http.StatusBadRequest, "Field required: input")
	}
	text := func(s string) poolItem {
		return poolItem{text: []byte(s), tokens: max(openai.EstimateTokens(len(s)), 1)}
	}
	ids := func(raw json.RawMessage, at string) (poolItem, error) {
		var v []int64
		if err := json.Unmarshal(raw, &v); err != nil {
			return poolItem{}, errorf(http.StatusBadRequest, "%s: want a string or a list of token ids", at)
		}
		if len(v) == 0 {
			return poolItem{}, errorf(http.StatusBadRequest, "%s: must not be empty", at)
		}
		return poolItem{text: bytes.TrimSpace(raw), tokens: len(v)}, nil
	}
	switch input[0] {
	case '"':
		var s string
		if err := json.Unmarshal(input, &s); err != nil {
			return nil, errorf(http.StatusBadRequest, "input: %v", err)
		}
		return []poolItem{text(s)}, nil
	case '[':
	default:
		return nil, errorf(http.StatusBadRequest, "input: want a string or a list")
	}
	var list []json.RawMessage
	if err := json.Unmarshal(input, &list); err != nil {
		return nil, errorf(http.StatusBadRequest, "input: %v", err)
	}
	if len(list) == 0 {
		return nil, errorf(http.StatusBadRequest, "input must not be empty")
	}
	if len(list) > maxPoolItems {
		return nil, errorf(http.StatusBadRequest, "input: at most %d items, got %d", maxPoolItems, len(list))
	}
	if first := bytes.TrimSpace(list[0]); len(first) > 0 && first[0] != '"' && first[0] != '[' {
		it, err := ids(input, "input")
		return []poolItem{it}, err
	}
	items := make([]poolItem, 0, len(list))
	for i, raw := range list {
		raw = bytes.TrimSpace(raw)
		at := param("input", i)
		switch {
		case len(raw) > 0 && raw[0] == '"':
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, errorf(http.StatusBadRequest, "%s: %v", at, err)
			}
			items = append(items, text(s))
		default:
			it, err := ids(raw, at)
			if err != nil {
				return nil, err
			}
			items = append(items, it)
		}
	}
	return items, nil
}

func param(name string, i int) string { return name + "[" + strconv.Itoa(i) + "]" }

// serveEmbeddings answers POST /v1/embeddings (OpenAI's shape, as vLLM serves it): input (see
// embeddingInputs), encoding_format "float" (default) or "base64", dimensions (1 to Config.EmbeddingDim). The
// cost is a prefill of every input through the engine (see pool), so embeddings share the batch with chat.
//
//	{"id":"embd-..","object":"list","created":..,"model":..,"data":[{"index":0,"object":"embedding",
//	"embedding":[..]}],"usage":{"prompt_tokens":N,"total_tokens":N,"completion_tokens":0,
//	"prompt_tokens_details":null}}
func (b *Backend) serveEmbeddings(w http.ResponseWriter, r *http.Request) {
	body, ok := b.readPost(w, r, writeError)
	if !ok {
		return
	}
	var req struct {
		Model          string          `json:"model"`
		Input          json.RawMessage `json:"input"`
		EncodingFormat *string         `json:"encoding_format"`
		Dimensions     *int            `json:"dimensions"`
	}
	if err := decodeJSON(body, &req); err != nil {
		answerError(w, writeError, err)
		return
	}
	items, err := embeddingInputs(req.Input)
	if err != nil {
		answerError(w, writeError, err)
		return
	}
	b64 := false
	if f := req.EncodingFormat; f != nil {
		switch *f {
		case "float":
		case "base64":
			b64 = true
		default:
			writeError(w, http.StatusBadRequest, fmt.Sprintf(`encoding_format: want "float" or "base64", got %q`, *f))
			return
		}
	}
	dim := b.cfg.EmbeddingDim
	if d := req.Dimensions; d != nil {
		if *d < 1 || *d > dim {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("dimensions: %d is outside [1, %d]", *d, dim))
			return
		}
		dim = *d
	}
	if !b.admit(w, req.Model, writeError) {
		return
	}
	if !b.pool(w, r, items, writeError) {
		return
	}
	out := make([]byte, 0, 256+len(items)*dim*12)
	out = append(out, `{"id":"embd-`...)
	out = append(out, b.requestID(r)...)
	out = append(out, `","object":"list","created":`...)
	out = strconv.AppendInt(out, time.Now().Unix(), 10)
	out = append(out, `,"model":`...)
	out = append(out, jsonString(b.cfg.Model)...)
	out = append(out, `,"data":[`...)
	vec := make([]float32, 0, dim)
	tokens := 0
	for i, it := range items {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"index":`...)
		out = strconv.AppendInt(out, int64(i), 10)
		out = append(out, `,"object":"embedding","embedding":`...)
		vec = embedding(vec[:0], b.cfg.Seed, it.text, b.cfg.EmbeddingDim, dim)
		out = appendVector(out, vec, b64)
		out = append(out, '}')
		tokens += it.tokens
	}
	out = append(out, `],"usage":{"prompt_tokens":`...)
	out = strconv.AppendInt(out, int64(tokens), 10)
	out = append(out, `,"total_tokens":`...)
	out = strconv.AppendInt(out, int64(tokens), 10)
	out = append(out, ",\"completion_tokens\":0,\"prompt_tokens_details\":null}}\n"...)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// serveCohereEmbed answers POST /v2/embed (Cohere's v2 shape, as vLLM serves it): texts (required),
// input_type (accepted, any value), embedding_types (default ["float"]; "float" is the only one served). Its
// cost is that of /v1/embeddings.
//
//	{"id":..,"embeddings":{"float":[[..]]},"texts":[..],"meta":{"api_version":{"version":"2"},
//	"billed_units":{"input_tokens":N}},"response_type":"embeddings_by_type"}
func (b *Backend) serveCohereEmbed(w http.ResponseWriter, r *http.Request) {
	body, ok := b.readPost(w, r, writeError)
	if !ok {
		return
	}
	var req struct {
		Model          string    `json:"model"`
		Texts          *[]string `json:"texts"`
		InputType      string    `json:"input_type"`
		EmbeddingTypes []string  `json:"embedding_types"`
	}
	if err := decodeJSON(body, &req); err != nil {
		answerError(w, writeError, err)
		return
	}
	switch {
	case req.Texts == nil:
		writeError(w, http.StatusBadRequest, "Field required: texts")
		return
	case len(*req.Texts) == 0:
		writeError(w, http.StatusBadRequest, "texts must not be empty")
		return
	case len(*req.Texts) > maxPoolItems:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("texts: at most %d items, got %d", maxPoolItems, len(*req.Texts)))
		return
	}
	for _, t := range req.EmbeddingTypes {
		if t != "float" {
			writeError(w, http.StatusBadRequest,
				fmt.Sprintf(`embedding_types: %q is not served by the simulator (only "float")`, t))
			return
		}
	}
	if !b.admit(w, req.Model, writeError) {
		return
	}
	items := make([]poolItem, len(*req.Texts))
	tokens := 0
	for i, t := range *req.Texts {
		items[i] = poolItem{text: []byte(t), tokens: max(openai.EstimateTokens(len(t)), 1)}
		tokens += items[i].tokens
	}
	if !b.pool(w, r, items, writeError) {
		return
	}
	dim := b.cfg.EmbeddingDim
	out := make([]byte, 0, 256+len(items)*dim*12)
	out = append(out, `{"id":`...)
	out = append(out, jsonString(b.requestID(r))...)
	out = append(out, `,"embeddings":{"float":[`...)
	vec := make([]float32, 0, dim)
	for i, it := range items {
		if i > 0 {
			out = append(out, ',')
		}
		vec = embedding(vec[:0], b.cfg.Seed, it.text, dim, dim)
		out = appendVector(out, vec, false)
	}
	out = append(out, `]},"texts":`...)
	texts, _ := json.Marshal(*req.Texts)
	out = append(out, texts...)
	out = append(out, `,"meta":{"api_version":{"version":"2"},"billed_units":{"input_tokens":`...)
	out = strconv.AppendInt(out, int64(tokens), 10)
	out = append(out, "}},\"response_type\":\"embeddings_by_type\"}\n"...)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}
