package openai

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestAppendUpstreamBody(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	tests := []struct {
		name        string
		body        string
		model       string // "" means nil: keep the model
		streamUsage bool
		want        string
	}{
		{"model only", `{"model":"a",` + msgs + `}`, "b", false, `{"model":"b",` + msgs + `}`},
		{"model needs escaping", `{"model" : "a" ,` + msgs + `}`, "x\"y\n", false, `{"model" : "x\"y\n" ,` + msgs + `}`},
		{"nothing to do", `{"model":"a",` + msgs + `}`, "", false, `{"model":"a",` + msgs + `}`},
		{"stream false kept without streamUsage", `{"model":"a","stream":false,` + msgs + `}`, "", false, `{"model":"a","stream":false,` + msgs + `}`},
		{"inject both", `{"model":"a",` + msgs + `}`, "", true, `{"stream":true,"stream_options":{"include_usage":true},"model":"a",` + msgs + `}`},
		{"inject both, leading blanks", " \n{ \"model\":\"a\"," + msgs + `}`, "", true, " \n{\"stream\":true,\"stream_options\":{\"include_usage\":true}, \"model\":\"a\"," + msgs + `}`},
		{"stream false", `{"model":"a","stream":false,` + msgs + `}`, "", true, `{"model":"a","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`},
		{"stream true, options null", `{"stream":true,"stream_options":null,"model":"a",` + msgs + `}`, "", true, `{"stream":true,"stream_options":{"include_usage":true},"model":"a",` + msgs + `}`},
		{"include_usage false", `{"model":"a","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true},` + msgs + `}`, "m2", true, `{"model":"m2","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},` + msgs + `}`},
		{"options without include_usage", `{"model":"a","stream_options":{"continuous_usage_stats":true},"stream":true,` + msgs + `}`, "", true, `{"model":"a","stream_options":{"include_usage":true,"continuous_usage_stats":true},"stream":true,` + msgs + `}`},
		{"empty options", `{"model":"a","stream_options":{ },` + msgs + `}`, "", true, `{"stream":true,"model":"a","stream_options":{"include_usage":true },` + msgs + `}`},
		{"repeated keys: the last is rewritten", `{"model":"a","model":"b","stream":false,"stream":false,` + msgs + `}`, "c", true, `{"model":"a","model":"c","stream":false,"stream":true,"stream_options":{"include_usage":true},` + msgs + `}`},
	}
	var s Summary
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.Parse(Chat, []byte(tc.body)); err != nil {
				t.Fatal(err)
			}
			var model []byte
			if tc.model != "" {
				model = []byte(tc.model)
			}
			got := AppendUpstreamBody([]byte("pre"), []byte(tc.body), &s, model, tc.streamUsage)
			if string(got) != "pre"+tc.want {
				t.Errorf("got  %s\nwant pre%s", got, tc.want)
			}
		})
	}
}

func TestAppendUpstreamBodyAllocs(t *testing.T) {
	body := chatBody(8 << 10)
	var s Summary
	if err := s.Parse(Chat, body); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, 0, 2*len(body))
	if n := testing.AllocsPerRun(20, func() { AppendUpstreamBody(dst, body, &s, []byte("other"), true) }); n != 0 {
		t.Errorf("%v allocs, want 0", n)
	}
}

func FuzzAppendUpstreamBody(f *testing.F) {
	for _, tc := range promptSeeds {
		f.Add(uint8(tc.e), []byte(tc.body), "new-model", true)
	}
	f.Add(uint8(Chat), []byte(`{"model":"a","stream_options":{"include_usage":false,"x":[1]},"stream":false,"messages":[{"role":"u","content":"x"}]}`), "", true)
	f.Add(uint8(Chat), []byte(`{"model":"m","x":-1e700,"messages":[{"role":"u","content":"x"}]}`), "b", true)
	f.Fuzz(func(t *testing.T, e uint8, body []byte, model string, streamUsage bool) {
		ep := Endpoint(e%3 + 1)
		var s Summary
		if s.Parse(ep, body) != nil {
			return
		}
		var newModel []byte
		if model != "" {
			newModel = []byte(model)
		}
		out := AppendUpstreamBody(nil, body, &s, newModel, streamUsage)
		var before, after map[string]any
		if err := decodeJSON(body, &before); err != nil {
			t.Fatal(err)
		}
		if err := decodeJSON(out, &after); err != nil {
			t.Fatalf("%q -> %q: %v", body, out, err)
		}
		if newModel != nil {
			// encoding/json replaces invalid UTF-8 as AppendQuoted does.
			var want string
			json.Unmarshal(AppendQuoted(nil, newModel), &want)
			if after["model"] != want {
				t.Fatalf("%q -> %q: model %q", body, out, after["model"])
			}
			before["model"] = want
		}
		if streamUsage {
			if after["stream"] != true {
				t.Fatalf("%q -> %q: stream %v", body, out, after["stream"])
			}
			opts, ok := after["stream_options"].(map[string]any)
			if !ok || opts["include_usage"] != true {
				t.Fatalf("%q -> %q: stream_options %v", body, out, after["stream_options"])
			}
			want, _ := before["stream_options"].(map[string]any)
			if want == nil {
				want = map[string]any{}
			}
			want["include_usage"] = true
			if !reflect.DeepEqual(opts, want) {
				t.Fatalf("%q -> %q: stream_options %v, want %v", body, out, opts, want)
			}
			before["stream"], before["stream_options"] = after["stream"], after["stream_options"]
		}
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("%q -> %q: other members changed", body, out)
		}
	})
}
