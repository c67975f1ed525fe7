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
		{"last wins", `{"model":"a","model":"b"}`, "b", false, "", ""},
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

// FuzzParseGeneric: no panic; an accepted body is valid JSON, and the model read equals encoding/json's.
func FuzzParseGeneric(f *testing.F) {
	for _, s := range []string{`{"model":"m"}`, `{"model":"a","model":"b","stream":true}`, `{"x":[{"model":1}],"model":"\u00e9"}`, `[]`, `{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var g Generic
		if err := g.ParseGeneric(body); err != nil {
			return
		}
		var ref struct {
			Model *string `json:"model"`
		}
		if err := json.Unmarshal(body, &ref); err != nil {
			t.Fatalf("accepted %q, which encoding/json rejects: %v", body, err)
		}
		want := ""
		if ref.Model != nil {
			want = *ref.Model
		}
		// encoding/json matches keys case-insensitively; compare only where the body has no case variant.
		if string(g.Model) != want && !hasCaseVariant(body) {
			t.Fatalf("model %q, encoding/json reads %q in %q", g.Model, want, body)
		}
	})
}

func hasCaseVariant(body []byte) bool {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return true
	}
	for k := range m {
		if k != "model" && len(k) == 5 && (k[0]|0x20) == 'm' {
			return true
		}
	}
	return false
}
