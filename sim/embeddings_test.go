package sim

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"net/http"
	"strings"
	"testing"
)

func cosine(a, b []float32) float64 {
	var dot float64
	for i := range a {
		dot += float64(a[i]) * float64(b[i])
	}
	return dot
}

func norm(v []float32) float64 { return math.Sqrt(cosine(v, v)) }

func TestEmbeddingVectors(t *testing.T) {
	a := embedding(nil, 1, []byte("The cat sat on the mat"), 384, 384)
	tests := []struct {
		name   string
		text   string
		dim    int
		seed   uint64
		relate func(cos float64) bool
	}{
		{"same text", "The cat sat on the mat", 384, 1, func(c float64) bool { return c > 0.9999 }},
		{"same words, other case and punctuation", "the CAT, sat on the mat!", 384, 1, func(c float64) bool { return c > 0.9999 }},
		{"shared words", "a cat on a mat", 384, 1, func(c float64) bool { return c > 0.3 && c < 0.99 }},
		{"no shared words", "quantum chromodynamics", 384, 1, func(c float64) bool { return math.Abs(c) < 0.3 }},
		{"another seed", "The cat sat on the mat", 384, 2, func(c float64) bool { return c < 0.5 }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v := embedding(nil, tc.seed, []byte(tc.text), 384, tc.dim)
			if math.Abs(norm(v)-1) > 1e-5 {
				t.Errorf("norm %v, want 1", norm(v))
			}
			if c := cosine(a, v); !tc.relate(c) {
				t.Errorf("cosine %v", c)
			}
		})
	}
	for _, text := range []string{"", "!!!", "x"} {
		for _, dim := range []int{1, 7, 384} {
			if v := embedding(nil, 1, []byte(text), 384, dim); len(v) != dim || math.Abs(norm(v)-1) > 1e-5 {
				t.Errorf("%q at %d: len %d norm %v", text, dim, len(v), norm(v))
			}
		}
	}
	if allocs := testing.AllocsPerRun(10, func() {
		a = embedding(a[:0], 1, []byte("some words to embed, and a few more"), 384, 384)
	}); allocs != 0 {
		t.Errorf("%v allocations per embedding, want 0", allocs)
	}
}

func TestServeEmbeddings(t *testing.T) {
	b := startBackend(t, func(c *Config) { fastConfig(c); c.EmbeddingDim = 64; c.KVBlocks = 64 })
	type resp struct {
		Object string `json:"object"`
		Model  string `json:"model"`
		Data   []struct {
			Object    string    `json:"object"`
			Index     int       `json:"index"`
			Embedding []float32 `json:"embedding"`
		} `json:"data"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}
	tests := []struct {
		name, body string
		status     int
		n, dim     int // inputs, vector length
		tokens     int
	}{
		{"string", `{"model":"sim-model","input":"hello world"}`, 200, 1, 64, 3},
		{"strings", `{"input":["hello world","abcdefgh","x"]}`, 200, 3, 64, 3 + 2 + 1},
		{"token ids", `{"input":[1,2,3,4,5]}`, 200, 1, 64, 5},
		{"lists of token ids", `{"input":[[1,2],[3,4,5]]}`, 200, 2, 64, 5},
		{"dimensions", `{"input":"hello","dimensions":8,"encoding_format":"float"}`, 200, 1, 8, 2},
		{"missing input", `{"model":"sim-model"}`, 400, 0, 0, 0},
		{"empty list", `{"input":[]}`, 400, 0, 0, 0},
		{"wrong type", `{"input":5}`, 400, 0, 0, 0},
		{"mixed list", `{"input":["a",[1],{}]}`, 400, 0, 0, 0},
		{"too many dimensions", `{"input":"a","dimensions":65}`, 400, 0, 0, 0},
		{"bad encoding_format", `{"input":"a","encoding_format":"int8"}`, 400, 0, 0, 0},
		{"past the context", `{"input":"` + strings.Repeat("a", 4*64*16+4) + `"}`, 400, 0, 0, 0},
		{"bad JSON", `{"input":`, 400, 0, 0, 0},
		{"unknown model", `{"model":"gpt-9","input":"a"}`, 404, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := call(t, b, http.MethodPost, "/v1/embeddings", tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %.300s", status, tc.status, body)
			}
			if status != 200 {
				var e apiError
				decode(t, body, &e)
				if e.Error.Code != status || e.Error.Message == "" {
					t.Errorf("error body %s", body)
				}
				return
			}
			var r resp
			decode(t, body, &r)
			if r.Object != "list" || r.Model != "sim-model" || len(r.Data) != tc.n ||
				r.Usage.PromptTokens != tc.tokens || r.Usage.TotalTokens != tc.tokens {
				t.Fatalf("got %.300s", body)
			}
			for i, d := range r.Data {
				if d.Object != "embedding" || d.Index != i || len(d.Embedding) != tc.dim ||
					math.Abs(norm(d.Embedding)-1) > 1e-5 {
					t.Errorf("data[%d] = %+v", i, d)
				}
			}
		})
	}
	t.Run("base64 is the float vector's little-endian bytes", func(t *testing.T) {
		_, fl := call(t, b, http.MethodPost, "/v1/embeddings", `{"input":"same text"}`)
		_, b64 := call(t, b, http.MethodPost, "/v1/embeddings", `{"input":"same text","encoding_format":"base64"}`)
		var f resp
		decode(t, fl, &f)
		var e struct {
			Data []struct {
				Embedding string `json:"embedding"`
			} `json:"data"`
		}
		decode(t, b64, &e)
		raw, err := base64.StdEncoding.DecodeString(e.Data[0].Embedding)
		if err != nil || len(raw) != 4*64 {
			t.Fatalf("%d bytes, %v", len(raw), err)
		}
		for i, x := range f.Data[0].Embedding {
			if got := math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:])); got != x {
				t.Fatalf("[%d] = %v, want %v", i, got, x)
			}
		}
	})
	t.Run("wrong method", func(t *testing.T) {
		if status, _ := call(t, b, http.MethodGet, "/v1/embeddings", ""); status != 405 {
			t.Errorf("status %d", status)
		}
	})
	t.Run("counted as prefill", func(t *testing.T) {
		stop := scrape(t, b, `vllm:request_success_total{finished_reason="stop",model_name="sim-model"}`)
		if stop < 7 { // the 200s above: 1+3+1+2+1 inputs, plus the base64 pair
			t.Errorf("request_success_total{stop} = %v", stop)
		}
		if gen := scrape(t, b, "vllm:generation_tokens_total"); gen != 0 {
			t.Errorf("generation_tokens_total = %v, want 0 (embeddings generate nothing)", gen)
		}
	})
}

func TestServeCohereEmbed(t *testing.T) {
	b := startBackend(t, func(c *Config) { fastConfig(c); c.EmbeddingDim = 16 })
	tests := []struct {
		name, body string
		status, n  int
	}{
		{"texts", `{"model":"sim-model","texts":["hello","world wide"],"input_type":"search_document","embedding_types":["float"]}`, 200, 2},
		{"default type", `{"texts":["hello"]}`, 200, 1},
		{"no texts", `{"input_type":"search_query"}`, 400, 0},
		{"empty texts", `{"texts":[]}`, 400, 0},
		{"int8", `{"texts":["a"],"embedding_types":["int8"]}`, 400, 0},
		{"unknown model", `{"model":"x","texts":["a"]}`, 404, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := call(t, b, http.MethodPost, "/v2/embed", tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			if status != 200 {
				return
			}
			var r struct {
				ID         string `json:"id"`
				Embeddings struct {
					Float [][]float32 `json:"float"`
				} `json:"embeddings"`
				Texts []string `json:"texts"`
				Meta  struct {
					BilledUnits struct {
						InputTokens int `json:"input_tokens"`
					} `json:"billed_units"`
				} `json:"meta"`
			}
			decode(t, body, &r)
			if r.ID == "" || len(r.Embeddings.Float) != tc.n || len(r.Texts) != tc.n || r.Meta.BilledUnits.InputTokens < tc.n {
				t.Fatalf("got %s", body)
			}
			for _, v := range r.Embeddings.Float {
				if len(v) != 16 {
					t.Errorf("vector of %d", len(v))
				}
			}
		})
	}
	// The same text gets the same vector from both embedding APIs.
	_, v1 := call(t, b, http.MethodPost, "/v1/embeddings", `{"input":"hello"}`)
	_, v2 := call(t, b, http.MethodPost, "/v2/embed", `{"texts":["hello"]}`)
	vec1 := v1[strings.Index(v1, `"embedding":`)+len(`"embedding":`):]
	vec2 := v2[strings.Index(v2, `"float":[`)+len(`"float":[`):]
	if vec1[:strings.IndexByte(vec1, ']')] != vec2[:strings.IndexByte(vec2, ']')] {
		t.Errorf("vectors differ:\n%s\n%s", v1, v2)
	}
}

func TestServeRerankAndScore(t *testing.T) {
	b := startBackend(t, fastConfig)
	docs := `["the capital of France is Paris","bananas are yellow","Paris is a city"]`
	t.Run("rerank paths", func(t *testing.T) {
		for _, path := range []string{"/rerank", "/v1/rerank", "/v2/rerank"} {
			status, body := call(t, b, http.MethodPost, path,
				`{"model":"sim-model","query":"What is the capital of France?","documents":`+docs+`,"top_n":2}`)
			if status != 200 {
				t.Fatalf("%s: %d %s", path, status, body)
			}
			var r struct {
				ID    string `json:"id"`
				Model string `json:"model"`
				Usage struct {
					TotalTokens int `json:"total_tokens"`
				} `json:"usage"`
				Results []struct {
					Index    int                   `json:"index"`
					Document struct{ Text string } `json:"document"`
					Score    float64               `json:"relevance_score"`
				} `json:"results"`
			}
			decode(t, body, &r)
			if len(r.Results) != 2 || r.Results[0].Index != 0 || r.Results[1].Index != 2 ||
				r.Results[0].Score <= r.Results[1].Score || r.Results[0].Document.Text != "the capital of France is Paris" ||
				r.Usage.TotalTokens == 0 || r.Model != "sim-model" || !strings.HasPrefix(r.ID, "rerank-") {
				t.Errorf("%s: %s", path, body)
			}
		}
	})
	tests := []struct {
		name, path, body string
		status           int
		scores           []float64
	}{
		{"rerank objects", "/v1/rerank", `{"query":"a b","documents":[{"text":"a"},{"text":"b a"}]}`, 200, []float64{1, 0.5}},
		{"rerank no query", "/v1/rerank", `{"documents":["a"]}`, 400, nil},
		{"rerank no documents", "/v1/rerank", `{"query":"a"}`, 400, nil},
		{"rerank bad document", "/v1/rerank", `{"query":"a","documents":[{"title":"x"}]}`, 400, nil},
		{"rerank unknown model", "/v1/rerank", `{"model":"x","query":"a","documents":["a"]}`, 404, nil},
		{"score one to many", "/v1/score", `{"text_1":"a b","text_2":["a","b a","c"]}`, 200, []float64{0.5, 1, 0}},
		{"score pairwise", "/score", `{"text_1":["a","c"],"text_2":["a","b"]}`, 200, []float64{1, 0}},
		{"score strings", "/v1/score", `{"model":"sim-model","text_1":"x y","text_2":"y"}`, 200, []float64{0.5}},
		{"score length mismatch", "/v1/score", `{"text_1":["a","b"],"text_2":["a"]}`, 400, nil},
		{"score missing text_2", "/v1/score", `{"text_1":"a"}`, 400, nil},
		{"score bad JSON", "/v1/score", `{"text_1":`, 400, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := call(t, b, http.MethodPost, tc.path, tc.body)
			if status != tc.status {
				t.Fatalf("status %d, want %d: %s", status, tc.status, body)
			}
			if status != 200 {
				var e apiError
				decode(t, body, &e)
				if e.Error.Code != status {
					t.Errorf("error body %s", body)
				}
				return
			}
			var got []float64
			if strings.Contains(tc.path, "rerank") {
				var r struct {
					Results []struct {
						Score float64 `json:"relevance_score"`
					} `json:"results"`
				}
				decode(t, body, &r)
				for _, x := range r.Results {
					got = append(got, x.Score)
				}
			} else {
				var r struct {
					Object string `json:"object"`
					Data   []struct {
						Index  int     `json:"index"`
						Object string  `json:"object"`
						Score  float64 `json:"score"`
					} `json:"data"`
					Usage struct {
						PromptTokens int `json:"prompt_tokens"`
					} `json:"usage"`
				}
				decode(t, body, &r)
				for i, x := range r.Data {
					if x.Index != i || x.Object != "score" {
						t.Errorf("data[%d] = %+v", i, x)
					}
					got = append(got, x.Score)
				}
				if r.Object != "list" || r.Usage.PromptTokens == 0 {
					t.Errorf("got %s", body)
				}
			}
			if len(got) != len(tc.scores) {
				t.Fatalf("scores %v, want %v", got, tc.scores)
			}
			for i := range got {
				if got[i] != tc.scores[i] {
					t.Errorf("scores %v, want %v", got, tc.scores)
				}
			}
		})
	}
	for _, path := range []string{"/v1/rerank", "/v1/score", "/v2/embed"} {
		if status, _ := call(t, b, http.MethodPut, path, "{}"); status != 405 {
			t.Errorf("PUT %s: %d, want 405", path, status)
		}
	}
}
