package openai

import (
	"encoding/json"
	"testing"
)

func TestParseGeneric(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		model      string
		stream     bool
		errParam   string
		errCode    string
	}{
		{"plain", `{"model":"m","query":"q","documents":["a"]}`, "m", false, "", ""},
		{"spaces and stream", ` { "stream" : true , "model" : "m\u0031" } `, "m1", true, "", ""},
		{"duplicate model", `{"model":"a","model":"b"}`, "", false, "model", ""},
		{"case-variant model", `{"model":"pub-a","MODEL":"other"}`, "", false, "model", ""},
		{"escaped case variant", `{"\u004dodel":"other","model":"pub-a"}`, "", false, "model", ""},
		{"stray Stream", `{"model":"m","Stream":true}`, "", false, "stream", ""},
		{"long-s stream", `{"model":"m","\u017ftream":true}`, "", false, "stream", ""},
		{"duplicate stream", `{"model":"m","stream":false,"stream":true}`, "", false, "stream", ""},
		{"bad JSON after an ambiguous key", `{"model":"m","MODEL":"x",}`, "", false, "", "invalid_json"},
		{"other members may repeat", `{"model":"m","query":"a","query":"b","N":3,"n":1,"n":2,"User":"u"}`, "m", false, "", ""},
		{"null model", `{"model":null}`, "", false, "", ""},
		{"absent", `{"tokens":[1,2]}`, "", false, "", ""},
		{"not a string", `{"model":3}`, "", false, "model", ""},
		{"empty", `{"model":""}`, "", false, "model", ""},
		{"nested model untouched", `{"input":{"model":"x"},"model":"m"}`, "m", false, "", ""},
		{"bad json", `{"model":"m",}`, "", false, "", "invalid_json"},
		{"trailing garbage", `{"model":"m"} x`, "", false, "", "invalid_json"},
		{"not an object", `["model"]`, "", false, "", ""},
		{"invalid utf8", "{\"model\":\"\xff\"}", "", false, "", "invalid_json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var g Generic
			err := g.ParseGeneric([]byte(tc.body))
			if tc.errParam != "" || tc.errCode != "" || tc.name == "not an object" {
				re, ok := err.(*RequestError)
				if !ok || re.Param != tc.errParam || re.Code != tc.errCode {
					t.Fatalf("err = %#v, want param %q code %q", err, tc.errParam, tc.errCode)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if string(g.Model) != tc.model || g.Stream != tc.stream {
				t.Errorf("model %q stream %v, want %q %v", g.Model, g.Stream, tc.model, tc.stream)
			}
		})
	}
}

func TestAppendReplaced(t *testing.T) {
	var g Generic
	body := []byte(`{"query":"model","model" : "pub","documents":["a"]}`)
	if err := g.ParseGeneric(body); err != nil {
		t.Fatal(err)
	}
	out := AppendReplaced(nil, body, g.ModelSpan, `up"stream`)
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatal(err)
	}
	if v["model"] != `up"stream` || v["query"] != "model" {
		t.Errorf("got %s", out)
	}
}

func TestParseGenericAllocs(t *testing.T) {
	body := []byte(`{"model":"rerank\u002dv2","query":"q","documents":["a","b"],"top_n":2,"return_documents":false,"stream":false}`)
	var g Generic
	if err := g.ParseGeneric(body); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(20, func() { g.ParseGeneric(body) }); n != 0 {
		t.Errorf("ParseGeneric with a reused Generic: %v allocs, want 0", n)
	}
}

// FuzzParseGeneric: no panic; an accepted body is valid JSON, and the model and stream flag read equal both
// encoding/json's reading (case-insensitive, the last match wins) and an exact-match decoder's (a map, as
// Python's json), which agree with each other.
func FuzzParseGeneric(f *testing.F) {
	for _, s := range []string{`{"model":"m"}`, `{"model":"a","model":"b","stream":true}`, `{"x":[{"model":1}],"model":"\u00e9"}`,
		`{"model":"pub-a","MODEL":"other"}`, `{"Stream":true,"model":"m"}`, `{"mod\u0065l":"m","stream":true}`, `[]`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var g Generic
		if err := g.ParseGeneric(body); err != nil {
			return
		}
		var ref struct {
			Model  *string `json:"model"`
			Stream json.RawMessage
		}
		if err := json.Unmarshal(body, &ref); err != nil {
			t.Fatalf("accepted %q, which encoding/json rejects: %v", body, err)
		}
		var dict map[string]json.RawMessage
		if err := json.Unmarshal(body, &dict); err != nil {
			t.Fatal(err)
		}
		goModel, pyModel := "", ""
		if ref.Model != nil {
			goModel = *ref.Model
		}
		if v, ok := dict["model"]; ok {
			json.Unmarshal(v, &pyModel)
		}
		if string(g.Model) != goModel || string(g.Model) != pyModel {
			t.Fatalf("%q: the gateway reads model %q, encoding/json %q, an exact decoder %q", body, g.Model, goModel, pyModel)
		}
		if g.Stream != (string(ref.Stream) == "true") || g.Stream != (string(dict["stream"]) == "true") {
			t.Fatalf("%q: the gateway reads stream %v, encoding/json %s, an exact decoder %s", body, g.Stream, ref.Stream, dict["stream"])
		}
	})
}
