package openai

import (
	"encoding/json"
	"reflect"
	"testing"
)

func TestAppendUpstreamBody(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	const input, claude = `"input":"x"`, `"max_tokens":5,"messages":[{"role":"user","content":"x"}]`
	tests := []struct {
		e           Endpoint // 0 means Chat
		name        string
		body        string
		model       string // "" means nil: keep the model
		streamUsage bool
		want        string
	}{
		{0, "model only", `{"model":"a",` + msgs + `}`, "b", false, `{"model":"b",` + msgs + `}`},
		{0, "model needs escaping", `{"model" : "a" ,` + msgs + `}`, "x\"y\n", false, `{"model" : "x\"y\n" ,` + msgs + `}`},
		{0, "nothing to do", `{"model":"a",` + msgs + `}`, "", false, `{"model":"a",` + msgs + `}`},
		{0, "stream false kept without streamUsage", `{"model":"a","stream":false,` + msgs + `}`, "", false, `{"model":"a","stream":false,` + msgs + `}`},
		{0, "inject both", `{"model":"a",` + msgs + `}`, "", true, `{"stream":true,"stream_options":{"include_usage":true},"model":"a",` + msgs + `}`},
		{0, "inject both, leading blanks", " \n{ \"model\":\"a\"," + msgs + `}`, "", true, " \n{\"stream\":true,\"stream_options\":{\"include_usage\":true}, \"model\":\"a\"," + msgs + `}`},
		{0, "stream false", `{"model":"a","stream":false,` + msgs + `}`, "", true, `{"model":"a","stream":true,"stream_options":{"include_usage":true},` + msgs + `}`},
		{0, "stream true, options null", `{"stream":true,"stream_options":null,"model":"a",` + msgs + `}`, "", true, `{"stream":true,"stream_options":{"include_usage":true},"model":"a",` + msgs + `}`},
		{0, "include_usage false", `{"model":"a","stream":true,"stream_options":{"include_usage":false,"continuous_usage_stats":true},` + msgs + `}`, "m2", true, `{"model":"m2","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true},` + msgs + `}`},
		{0, "options without include_usage", `{"model":"a","stream_options":{"continuous_usage_stats":true},"stream":true,` + msgs + `}`, "", true, `{"model":"a","stream_options":{"include_usage":true,"continuous_usage_stats":true},"stream":true,` + msgs + `}`},
		{0, "empty options", `{"model":"a","stream_options":{ },` + msgs + `}`, "", true, `{"stream":true,"model":"a","stream_options":{"include_usage":true },` + msgs + `}`},
		{0, "other repeated keys are copied", `{"model":"a","seed":1,"stream":false,"seed":2,` + msgs + `}`, "c", true, `{"model":"c","seed":1,"stream":true,"stream_options":{"include_usage":true},"seed":2,` + msgs + `}`},
		{Responses, "responses: stream inserted, no stream_options", `{"model":"a",` + input + `}`, "b", true, `{"stream":true,"model":"b",` + input + `}`},
		{Responses, "responses: stream false", `{"model":"a","stream":false,` + input + `}`, "", true, `{"model":"a","stream":true,` + input + `}`},
		{Responses, "responses: stream_options kept", `{"model":"a","stream":null,"stream_options":{"include_obfuscation":false},` + input + `}`, "", true, `{"model":"a","stream":true,"stream_options":{"include_obfuscation":false},` + input + `}`},
		{Responses, "responses: model only", `{"model":"a","stream":false,` + input + `}`, "b", false, `{"model":"b","stream":false,` + input + `}`},
		{Messages, "messages: stream inserted", `{"model":"claude",` + claude + `}`, "", true, `{"stream":true,"model":"claude",` + claude + `}`},
		{Messages, "messages: stream false, stream_options untouched", `{"model":"claude","stream":false,"stream_options":null,` + claude + `}`, "c2", true, `{"model":"c2","stream":true,"stream_options":null,` + claude + `}`},
	}
	var s Summary
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := Chat
			if tc.e != 0 {
				e = tc.e
			}
			if err := s.Parse(e, []byte(tc.body)); err != nil {
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
		f.Add(uint8(tc.e-1), []byte(tc.body), "new-model", true)
	}
	f.Add(uint8(Chat-1), []byte(`{"model":"a","stream_options":{"include_usage":false,"x":[1]},"stream":false,"messages":[{"role":"u","content":"x"}]}`), "", true)
	f.Add(uint8(Chat-1), []byte(`{"model":"m","x":-1e700,"messages":[{"role":"u","content":"x"}]}`), "b", true)
	f.Fuzz(func(t *testing.T, e uint8, body []byte, model string, streamUsage bool) {
		ep := Endpoint(e%uint8(lastEndpoint) + 1)
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
		if streamUsage && ep >= Responses {
			if after["stream"] != true {
				t.Fatalf("%q -> %q: stream %v", body, out, after["stream"])
			}
			before["stream"] = true
		} else if streamUsage {
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
