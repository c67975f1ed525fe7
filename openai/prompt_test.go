package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
)

// decodeJSON decodes data as json.Unmarshal does, except that numbers stay json.Number: a number outside
// float64's range (1e700) is valid JSON, which our scanners accept, but json.Unmarshal refuses it as a float64.
func decodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the top-level value")
	}
	return nil
}

// promptSeeds are bodies for every shape of the canonical prompt; they seed the fuzzers and the table tests.
var promptSeeds = []struct {
	e    Endpoint
	body string
}{
	{Chat, `{"model":"m","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi"}]}`},
	{Chat, `{"messages":[{"content":"text first","role":"user"}],"model":"m"}`},
	{Chat, `{"model":"m","messages":[{"role":"user","content":"a\nb\u00e9\ud83d\ude00\"\\\/"}]}`},
	{Chat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"data:x"}}]}]}`},
	{Chat, `{"model":"m","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"}]}`},
	{Chat, `{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}],"messages":[{"role":"user","content":"x"}]}`},
	{Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}`},
	{Chat, ` {"model" : "m" , "messages" : [ { "role" : "user" , "content" : [ "raw" , 1 , null , { "text" : null } ] } ] } `},
	{Chat, `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":7,"n":2,"temperature":0.5,"messages":[{"role":"user","content":"x"}]}`},
	{Chat, `{"m\u006fdel":"a\u0062c","messages":[{"r\u006fle":"user","content":"x"}]}`},
	{Chat, `{"model":"m","messages":[{"role":"user","content":"x","role":"system"}]}`},
	{Chat, `{"model":"m","messages":[{"role":"user","content":"x","tool_calls":[],"content":"y"}]}`},
	{Chat, `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"q"},{"content":"a","role":"assistant"},{"role":"user","content":"q2"}],"tools":[{"type":"function"}]}`},
	{Completions, `{"model":"m","prompt":"Once upon a time"}`},
	{Completions, `{"model":"m","prompt":["first","second"]}`},
	{Completions, `{"model":"m","prompt":[1,2,3]}`},
	{Completions, `{"model":"m","prompt":[[1,2],[3]]}`},
	{Embeddings, `{"model":"m","input":"embed me"}`},
	{Embeddings, `{"model":"m","input":["a","b"]}`},
	{Embeddings, `{"model":"m","input":[5, 6]}`},
	{Responses, `{"model":"m","input":"Tell me a joke"}`},
	{Responses, `{"model":"m","instructions":"Be terse.","input":"Hi","max_output_tokens":64,"stream":true}`},
	{Responses, `{"input":[{"role":"user","content":"Hi"}],"tools":[{"type":"function","name":"f","parameters":{}}],"model":"m","instructions":"x"}`},
	{Responses, `{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"look"},{"type":"input_image","image_url":"data:x"}]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"a cat","annotations":[]},{"type":"refusal","refusal":"no"}]}]}`},
	{Responses, `{"model":"m","input":[{"role":"user","content":"w?"},{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c1","output":"18C"},{"type":"reasoning","id":"rs_1","summary":[]}]}`},
	{Responses, `{"model":"m","previous_response_id":"resp_1","background":true,"input":[{"content":"late role","role":"user","type":"message"}]}`},
	{Responses, `{"model":"m","stream_options":{"include_obfuscation":false},"input":[{"role":"u","content":"a","role":"v","content":"b"}]}`},
	{Messages, `{"model":"claude","max_tokens":1024,"messages":[{"role":"user","content":"Hello"}]}`},
	{Messages, `{"model":"claude","max_tokens":16,"system":"You are terse.","messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Yo"}],"stream":true}`},
	{Messages, `{"model":"claude","max_tokens":16,"system":[{"type":"text","text":"A","cache_control":{"type":"ephemeral"}},{"type":"text","text":"B"}],"messages":[{"role":"user","content":[{"type":"text","text":"look"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBO"}}]}]}`},
	{Messages, `{"messages":[{"role":"user","content":"w?"},{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"tool_use","id":"t1","name":"f","input":{"city":"Paris"}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"18C"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}],"model":"claude","max_tokens":5}`},
}

func TestAppendPromptMatchesReference(t *testing.T) {
	for _, tc := range promptSeeds {
		want, err := AppendPromptReference([]byte("pre"), tc.e, []byte(tc.body))
		if err != nil {
			t.Fatalf("reference rejects seed %s: %v", tc.body, err)
		}
		got, err := AppendPrompt([]byte("pre"), tc.e, []byte(tc.body))
		if err != nil {
			t.Errorf("AppendPrompt(%s): %v", tc.body, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("AppendPrompt(%s)\n got %q\nwant %q", tc.body, got, want)
		}
	}
}

// TestAppendPromptLenient covers what the reference accepts although a request would be refused: AppendPrompt
// must build the same bytes for it (the simulator calls AppendPrompt on whatever it is sent).
func TestAppendPromptLenient(t *testing.T) {
	for _, tc := range []struct {
		e    Endpoint
		body string
	}{
		{Chat, `null`},
		{Chat, `{}`},
		{Chat, `{"messages":null,"tools":null}`},
		{Chat, `{"messages":[null,{"role":"u","content":[{"text":null},{"text":5},"s",{"type":"x"},null,{"text":"a","text":"b"}]}]}`},
		{Chat, "{\"messages\":[{\"role\":\"u\xff\",\"content\":\"a\xc3\\n\xe2\x82\"}]}"},
		{Chat, "{\"messages\":[{\"role\":\"u\",\"content\":\"\xed\xa0\x80 \xef\xbf\xbd\"}]}"},
		{Chat, `{"messages":[{"role":"u","content":"\ud800x\udc00\ud83d\ude00\ud800\u0041\uDBFF\uDFFF"}]}`},
		{Chat, `{"messages":[{"role":"a","role":null,"content":"x"}]}`},
		{Chat, `{"messages":[{"content":"x","tool_calls":5,"content":null}]}`},
		{Chat, `{"tools":{"a":1},"messages":[{"role":"u"}],"tools":"t"}`},
		{Chat, `{"messages":[{"role":"u","content":"x"}],"tools":[1],"tools":null}`},
		{Chat, `{"tools":[1],"messages":[{"role":"u","content":"x"}],"tools":[2]}`},
		{Completions, `null`},
		{Completions, `{"prompt":null}`},
		{Completions, `{"prompt":[]}`},
		{Completions, `{"prompt":[null]}`},
		{Completions, `{"prompt":[{}, "x"]}`},
		{Completions, `{"prompt":[1.5e3, -2]}`},
		{Completions, `{"prompt":[[], "x"]}`},
		{Completions, `{"prompt":["a\u00e9", 1]}`},
		{Completions, `{"prompt":"a","prompt":"b"}`},
		{Embeddings, `{"input":"x","prompt":"y"}`},
		{Responses, `null`},
		{Responses, `{}`},
		{Responses, `{"input":null,"instructions":null,"tools":null}`},
		{Responses, `{"input":[1,"s",null,[],{"type":5},{"type":null,"role":null},{"type":"message"},{}]}`},
		{Responses, `{"input":[{"role":"u","content":[1,{"text":"no type"},{"type":"text","text":5},{"type":"text","text":null},{"type":"input_text","text":"a","text":"b"},{"type":"x","type":"output_text","text":"c"}]}]}`},
		{Responses, `{"input":[{"role":5,"type":"function_call"},{"content":5,"type":"item_reference"},{"type":"custom","role":"u","content":"x"}]}`},
		{Responses, `{"input":[{"content":"c","role":"r"},{"role":"r","content":"a","content":"b"}]}`},
		{Responses, `{"input":[{"content":5,"content":"x","role":"u"},{"role":5,"role":"u"}]}`},
		{Responses, `{"input":5,"input":"x","instructions":5,"instructions":"y"}`},
		{Responses, `{"tools":[1],"input":"x","tools":[2],"instructions":"i","input":[{"role":"u"}]}`},
		{Responses, "{\"input\":[{\"role\":\"u\xff\",\"content\":\"a\xc3\\n\"}],\"instructions\":\"\\ud800\"}"},
		{Responses, `{"input":[{"type":"m\u0065ssage","role":"u","content":[{"typ\u0065":"input_t\u0065xt","t\u0065xt":"esc"}]}]}`},
		{Messages, `null`},
		{Messages, `{"messages":null,"system":null}`},
		{Messages, `{"messages":[null,1,{"role":null},{"type":"x","role":"u","content":"c"}]}`},
		{Messages, `{"system":[{"type":"text","text":"a"},"raw",{"type":"image"}],"messages":[{"role":"u","content":[{"type":"input_text","text":"raw"}]}]}`},
		{Messages, `{"system":5,"system":"s","messages":[]}`},
	} {
		want, err := AppendPromptReference([]byte("pre"), tc.e, []byte(tc.body))
		if err != nil {
			t.Fatalf("reference rejects %s: %v", tc.body, err)
		}
		got, err := AppendPrompt([]byte("pre"), tc.e, []byte(tc.body))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("AppendPrompt(%v, %s) = %q, %v; want %q", tc.e, tc.body, got, err, want)
		}
	}
	for _, tc := range []struct {
		e    Endpoint
		body string
	}{
		{Chat, `[]`}, {Chat, `{"messages":{}}`}, {Chat, `{"messages":["x"]}`}, {Chat, `{"messages":[{"role":1}]}`},
		{Chat, `{"messages":[{"content":{}}]}`}, {Completions, `{"prompt":{}}`}, {Completions, `{"prompt":1}`},
		{Embeddings, `{"input":true}`}, {Chat, `{"messages":[]`}, {Endpoint(9), `{}`},
		{Responses, `{"input":{}}`}, {Responses, `{"input":[{"role":1}]}`}, {Responses, `{"input":[{"content":{}}]}`},
		{Responses, `{"instructions":[]}`}, {Responses, `{"input":"x","input":5}`}, {Messages, `{"messages":"x"}`},
		{Messages, `{"system":{}}`}, {Messages, `{"messages":[{"content":1}]}`}, {Messages, `{"messages":[{"content":1,"content":2}]}`},
		{Messages, `{"system":[],"system":true}`},
	} {
		if _, err := AppendPrompt(nil, tc.e, []byte(tc.body)); err == nil {
			t.Errorf("AppendPrompt(%v, %s) accepted", tc.e, tc.body)
		}
	}
}

// referenceQuirk reports whether the reference's answer for body depends on encoding/json behaviour the fast
// scanner deliberately does not copy: case-insensitive key matching ("Messages", "ROLE", "meſſages"), and the
// merging of a repeated "messages" array into the elements decoded from an earlier one.
//
// The Responses and Messages references decode into maps, which match keys exactly and take the last of repeated
// keys: they have no quirk.
func referenceQuirk(e Endpoint, body []byte) bool {
	if e >= Responses {
		return false
	}
	names := []string{"messages", "tools", "role", "content", "tool_calls", "text", "prompt", "input"}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber() // a number float64 cannot hold (1e700) is valid JSON, which the reference skips, not an error
	type frame struct {
		obj     bool
		wantKey bool
	}
	var stack []frame
	topMessages := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false
		}
		if err != nil {
			return false // the reference rejects it too
		}
		isKey := len(stack) > 0 && stack[len(stack)-1].obj && stack[len(stack)-1].wantKey
		if k, ok := tok.(string); ok && isKey {
			for _, n := range names {
				if k != n && strings.EqualFold(k, n) {
					return true
				}
			}
			if len(stack) == 1 && k == "messages" {
				topMessages++
				if topMessages > 1 {
					return true
				}
			}
			stack[len(stack)-1].wantKey = false
			continue
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{obj: true, wantKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the enclosing object wants a key next.
		if len(stack) > 0 && stack[len(stack)-1].obj {
			stack[len(stack)-1].wantKey = true
		}
	}
}

func FuzzAppendPrompt(f *testing.F) {
	for _, tc := range promptSeeds {
		f.Add(uint8(tc.e-1), []byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, e uint8, body []byte) {
		ep := Endpoint(e%uint8(lastEndpoint) + 1)
		got, gotErr := AppendPrompt([]byte("pre"), ep, body)
		want, wantErr := AppendPromptReference([]byte("pre"), ep, body)
		if wantErr != nil || referenceQuirk(ep, body) {
			return
		}
		if gotErr != nil {
			t.Fatalf("%v: reference accepts %q, fast path says %v", ep, body, gotErr)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%v: %q\n got %q\nwant %q", ep, body, got, want)
		}
	})
}
