package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/switchyard/switchyard/openai"
)

// wordSet returns the hashes of text's distinct words (see eachWord).
func wordSet(text string) map[uint64]struct{} {
	set := make(map[uint64]struct{})
	eachWord(text, func(h uint64) { set[h] = struct{}{} })
	return set
}

// relevance is the simulator's cross-encoder score of a (query, document) pair: the share of the query's
// distinct words that the document contains, in [0, 1] (case-insensitive; 0 for a query without words), so a
// document holding every query word scores 1.
func relevance(query map[uint64]struct{}, doc string) float64 {
	if len(query) == 0 {
		return 0
	}
	d := wordSet(doc)
	hit := 0
	for w := range query {
		if _, ok := d[w]; ok {
			hit++
		}
	}
	return float64(hit) / float64(len(query))
}

// pairItem is the prefill of one (query, document) pair: the query, a newline, the document, so the documents of
// one query share its prefix in the cache.
func pairItem(query, doc string) poolItem {
	text := make([]byte, 0, len(query)+1+len(doc))
	text = append(append(append(text, query...), '\n'), doc...)
	return poolItem{text: text, tokens: max(openai.EstimateTokens(len(text)), 1)}
}

// rerankDocument is a rerank document: a string, or an object with "text" (Cohere's and Jina's form).
type rerankDocument struct{ text string }

func (d *rerankDocument) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '{' {
		var o struct {
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(b, &o); err != nil {
			return fmt.Errorf("rerank: document: %w", err)
		}
		if o.Text == nil {
			return fmt.Errorf("rerank: document: an object needs a text")
		}
		d.text = *o.Text
		return nil
	}
	return json.Unmarshal(b, &d.text)
}

// serveRerank answers POST /rerank, /v1/rerank and /v2/rerank (the Jina/Cohere shape vLLM serves): query,
// documents (strings or {"text":..} objects), top_n (default all). Each (query, document) pair is prefilled
// through the engine (see pool and pairItem); scores are relevance's, results sorted by score then index.
//
//	{"id":"rerank-..","model":..,"usage":{"total_tokens":N},"results":[{"index":i,"document":{"text":..},
//	"relevance_score":s}]}
func (b *Backend) serveRerank(w http.ResponseWriter, r *http.Request) {
	body, ok := b.readPost(w, r, writeError)
	if !ok {
		return
	}
	var req struct {
		Model     string            `json:"model"`
		Query     *string           `json:"query"`
		Documents *[]rerankDocument `json:"documents"`
		TopN      *int              `json:"top_n"`
	}
	if err := decodeJSON(body, &req); err != nil {
		answerError(w, writeError, err)
		return
	}
	switch {
	case req.Query == nil:
		writeError(w, http.StatusBadRequest, "Field required: query")
		return
	case req.Documents == nil:
		writeError(w, http.StatusBadRequest, "Field required: documents")
		return
	case len(*req.Documents) > maxPoolItems:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("documents: at most %d, got %d", maxPoolItems, len(*req.Documents)))
		return
	case req.TopN != nil && *req.TopN < 0:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("top_n must not be negative, got %d", *req.TopN))
		return
	}
	docs := *req.Documents
	if !b.admit(w, req.Model, writeError) {
		return
	}
	items := make([]poolItem, len(docs))
	tokens := 0
	for i, d := range docs {
		items[i] = pairItem(*req.Query, d.text)
		tokens += items[i].tokens
	}
	if !b.pool(w, r, items, writeError) {
		return
	}
	type result struct {
		Index    int `json:"index"`
		Document struct {
			Text string `json:"text"`
		} `json:"document"`
		RelevanceScore float64 `json:"relevance_score"`
	}
	q := wordSet(*req.Query)
	results := make([]result, len(docs))
	for i, d := range docs {
		results[i].Index = i
		results[i].Document.Text = d.text
		results[i].RelevanceScore = relevance(q, d.text)
	}
	slices.SortStableFunc(results, func(a, b result) int {
		switch {
		case a.RelevanceScore > b.RelevanceScore:
			return -1
		case a.RelevanceScore < b.RelevanceScore:
			return 1
		}
		return 0
	})
	if n := req.TopN; n != nil && *n > 0 && *n < len(results) {
		results = results[:*n]
	}
	out, _ := json.Marshal(struct {
		ID    string `json:"id"`
		Model string `json:"model"`
		Usage struct {
			TotalTokens int `json:"total_tokens"`
		} `json:"usage"`
		Results []result `json:"results"`
	}{ID: "rerank-" + b.requestID(r), Model: b.cfg.Model, Usage: struct {
		TotalTokens int `json:"total_tokens"`
	}{tokens}, Results: results})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(out, '\n'))
}

// scoreTexts is a score request's text_1 or text_2: a string or a list of strings.
type scoreTexts []string

func (t *scoreTexts) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("score: %w", err)
		}
		*t = scoreTexts{s}
		return nil
	}
	return json.Unmarshal(b, (*[]string)(t))
}

// serveScore answers POST /score and /v1/score (vLLM's): text_1 and text_2, each a string or a list. One
// text_1 is scored against every text_2; two lists of the same length are scored pairwise. Each pair is
// prefilled through the engine and scored by relevance (text_1 as the query).
//
//	{"id":"score-..","object":"list","created":..,"model":..,"data":[{"index":0,"object":"score","score":s}],
//	"usage":{"prompt_tokens":N,"total_tokens":N,"completion_tokens":0,"prompt_tokens_details":null}}
func (b *Backend) serveScore(w http.ResponseWriter, r *http.Request) {
	body, ok := b.readPost(w, r, writeError)
	if !ok {
		return
	}
	var req struct {
		Model string     `json:"model"`
		Text1 scoreTexts `json:"text_1"`
		Text2 scoreTexts `json:"text_2"`
	}
	if err := decodeJSON(body, &req); err != nil {
		answerError(w, writeError, err)
		return
	}
	t1, t2 := req.Text1, req.Text2
	switch {
	case len(t1) == 0:
		writeError(w, http.StatusBadRequest, "Field required: text_1 (a string or a non-empty list)")
		return
	case len(t2) == 0:
		writeError(w, http.StatusBadRequest, "Field required: text_2 (a string or a non-empty list)")
		return
	case len(t1) > 1 && len(t1) != len(t2):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("text_1 has %d items and text_2 %d: "+
			"a list of text_1 is scored pairwise and needs as many text_2", len(t1), len(t2)))
		return
	case len(t2) > maxPoolItems:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("text_2: at most %d items, got %d", maxPoolItems, len(t2)))
		return
	}
	if !b.admit(w, req.Model, writeError) {
		return
	}
	first := func(i int) string {
		if len(t1) == 1 {
			return t1[0]
		}
		return t1[i]
	}
	items := make([]poolItem, len(t2))
	tokens := 0
	for i, doc := range t2 {
		items[i] = pairItem(first(i), doc)
		tokens += items[i].tokens
	}
	if !b.pool(w, r, items, writeError) {
		return
	}
	out := append(make([]byte, 0, 256+64*len(t2)), `{"id":"score-`...)
	out = append(out, b.requestID(r)...)
	out = append(out, `","object":"list","created":`...)
	out = strconv.AppendInt(out, time.Now().Unix(), 10)
	out = append(out, `,"model":`...)
	out = append(out, jsonString(b.cfg.Model)...)
	out = append(out, `,"data":[`...)
	for i, doc := range t2 {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"index":`...)
		out = strconv.AppendInt(out, int64(i), 10)
		out = append(out, `,"object":"score","score":`...)
		out = strconv.AppendFloat(out, relevance(wordSet(first(i)), doc), 'g', -1, 64)
		out = append(out, '}')
	}
	out = append(out, `],"usage":{"prompt_tokens":`...)
	out = strconv.AppendInt(out, int64(tokens), 10)
	out = append(out, `,"total_tokens":`...)
	out = strconv.AppendInt(out, int64(tokens), 10)
	out = append(out, ",\"completion_tokens\":0,\"prompt_tokens_details\":null}}\n"...)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}
