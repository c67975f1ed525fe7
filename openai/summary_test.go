package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		e    Endpoint
		body string
		want Summary // only the exported scalar fields and Model/Prompt are compared
	}{
		{"chat minimal", Chat, `{"model":"m","messages":[{"role":"user","content":"Hi"}]}`,
			Summary{Model: []byte("m"), N: 1, Prompts: 1, Prompt: []byte("user:Hi\n"), PromptTokens: 2}},
		{"chat all params", Chat, `{"model":"gpt","stream":true,"stream_options":{"include_usage":true},"max_tokens":7,"max_completion_tokens":9,"n":3,"temperature":0.25,"messages":[{"role":"user","content":"x"}]}`,
			Summary{Model: []byte("gpt"), Stream: true, IncludeUsage: true, MaxTokens: 9, N: 3, Temperature: 0.25, HasTemperature: true, Prompts: 1, Prompt: []byte("user:x\n"), PromptTokens: 2}},
		{"max_completion_tokens alone", Chat, `{"model":"m","max_completion_tokens":9,"messages":[{"role":"user","content":"x"}]}`,
			Summary{Model: []byte("m"), MaxTokens: 9, N: 1, Prompts: 1, Prompt: []byte("user:x\n"), PromptTokens: 2}},
		{"max_completion_tokens 4000 over max_tokens 1", Chat, `{"model":"m","max_completion_tokens":4000,"max_tokens":1,"messages":[{"role":"user","content":"x"}]}`,
			Summary{Model: []byte("m"), MaxTokens: 4000, N: 1, Prompts: 1, Prompt: []byte("user:x\n"), PromptTokens: 2}},
		{"the larger of the two, whichever it is", Chat, `{"model":"m","max_tokens":9,"max_completion_tokens":4,"messages":[{"role":"user","content":"x"}]}`,
			Summary{Model: []byte("m"), MaxTokens: 9, N: 1, Prompts: 1, Prompt: []byte("user:x\n"), PromptTokens: 2}},
		{"null max_tokens is absent", Chat, `{"model":"m","max_tokens":null,"max_completion_tokens":9,"messages":[{"role":"user","content":"x"}]}`,
			Summary{Model: []byte("m"), MaxTokens: 9, N: 1, Prompts: 1, Prompt: []byte("user:x\n"), PromptTokens: 2}},
		{"completions read max_completion_tokens too", Completions, `{"model":"m","prompt":"x","max_completion_tokens":4000,"max_tokens":1,"best_of":3,"n":2}`,
			Summary{Model: []byte("m"), MaxTokens: 4000, N: 2, BestOf: 3, Prompts: 1, Prompt: []byte("x"), PromptTokens: 1}},
		{"nulls are absent", Chat, `{"model":"m","stream":null,"stream_options":null,"max_tokens":null,"n":null,"temperature":null,"tools":null,"messages":[{"role":"user","content":null}]}`,
			Summary{Model: []byte("m"), N: 1, Prompts: 1, Prompt: []byte("user:\n"), PromptTokens: 2}},
		{"other duplicate keys: last wins", Chat, `{"model":"a","seed":1,"temperature":1,"temperature":0.5,"Temperature":2,"MESSAGES":[],"messages":[{"role":"user","content":"y"}],"messages":[{"role":"user","content":"x"}]}`,
			Summary{Model: []byte("a"), N: 1, Temperature: 0.5, HasTemperature: true, Prompts: 1, Prompt: []byte("user:x\n"), PromptTokens: 2}},
		{"a case variant inside another member is no field", Chat, `{"model":"a","metadata":{"MODEL":"b","model":"c"},"response_format":{"Stream":1},"messages":[{"role":"user","content":"x"}]}`,
			Summary{Model: []byte("a"), N: 1, Prompts: 1, Prompt: []byte("user:x\n"), PromptTokens: 2}},
		{"escaped model and keys", Chat, `{"m\u006fdel":"a\/b\u00e9","messages":[{"role":"user","content":"x"}]}`,
			Summary{Model: []byte("a/bé"), N: 1, Prompts: 1, Prompt: []byte("user:x\n"), PromptTokens: 2}},
		{"tools after messages go first", Chat, `{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[1]}`,
			Summary{Model: []byte("m"), N: 1, Prompts: 1, Prompt: []byte("tools:[1]\nuser:x\n"), PromptTokens: 5}},
		{"completions string", Completions, `{"model":"m","prompt":"abcdefgh"}`,
			Summary{Model: []byte("m"), N: 1, Prompts: 1, Prompt: []byte("abcdefgh"), PromptTokens: 2}},
		{"completions batch", Completions, `{"model":"m","prompt":["abc","defgh"]}`,
			Summary{Model: []byte("m"), N: 1, Prompts: 2, Prompt: []byte("abc"), PromptTokens: 1}},
		{"completions token IDs", Completions, `{"model":"m","prompt":[1, 2, 3]}`,
			Summary{Model: []byte("m"), N: 1, Prompts: 1, Prompt: []byte("[1, 2, 3]"), PromptTokens: 3}},
		{"completions token-ID batch", Completions, `{"model":"m","prompt":[[1,2],[3]]}`,
			Summary{Model: []byte("m"), N: 1, Prompts: 2, Prompt: []byte("[1,2]"), PromptTokens: 2}},
		{"embeddings", Embeddings, `{"model":"m","input":["a","b","c"]}`,
			Summary{Model: []byte("m"), N: 1, Prompts: 3, Prompt: []byte("a"), PromptTokens: 1}},
		{"responses string input", Responses, `{"model":"gpt","input":"Hi","max_output_tokens":9,"max_tokens":3,"n":4,"stream":true,"temperature":1}`,
			Summary{Model: []byte("gpt"), Stream: true, MaxTokens: 9, N: 1, Temperature: 1, HasTemperature: true, Prompts: 1, Prompt: []byte("user:Hi\n"), PromptTokens: 2}},
		{"responses prefix goes first", Responses, `{"input":[{"role":"user","content":"x"}],"model":"m","tools":[1],"instructions":"Be\nterse."}`,
			Summary{Model: []byte("m"), N: 1, Prompts: 1, Prompt: []byte("tools:[1]\ninstructions:Be\nterse.\nuser:x\n"), PromptTokens: 10}},
		{"responses items", Responses, `{"model":"m","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"u"}]},{"type":"function_call","call_id":"c","arguments":"{}"},{"content":[{"type":"output_text","text":"b"}],"role":"assistant"}]}`,
			Summary{Model: []byte("m"), N: 1, Prompts: 1, Prompt: []byte(`user:a{"type":"input_image","image_url":"u"}` + "\n" + `{"type":"function_call","call_id":"c","arguments":"{}"}` + "\nassistant:b\n"), PromptTokens: 29}},
		{"responses continuation", Responses, `{"model":"m","previous_response_id":"resp_\u0031","background":true,"stream_options":{"include_usage":true},"input":[]}`,
			Summary{Model: []byte("m"), N: 1, Prompts: 1, Prompt: []byte(""), PreviousResponseID: []byte("resp_1"), Background: true}},
		{"messages", Messages, `{"model":"claude","max_tokens":1024,"max_completion_tokens":5,"n":3,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Hello"}]}`,
			Summary{Model: []byte("claude"), Stream: true, MaxTokens: 1024, N: 1, Prompts: 1, Prompt: []byte("user:Hello\n"), PromptTokens: 3}},
		{"messages system and blocks", Messages, `{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"tool_result","tool_use_id":"t","content":"r"}]}],"system":[{"type":"text","text":"S1"},{"type":"text","text":"S2"}],"model":"c","max_tokens":0,"tools":[]}`,
			Summary{Model: []byte("c"), N: 1, Prompts: 1, Prompt: []byte("tools:[]\nsystem:S1S2\nuser:a" + `{"type":"tool_result","tool_use_id":"t","content":"r"}` + "\n"), PromptTokens: 21}},
	}
	var s Summary
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := s.Parse(tc.e, []byte(tc.body)); err != nil {
				t.Fatalf("Parse: %v", err)
			}
			got := s
			got.Endpoint, got.modelBuf, got.prevIDBuf = 0, nil, nil
			got.ModelSpan, got.StreamSpan, got.StreamOptionsSpan, got.IncludeUsageSpan = Span{}, Span{}, Span{}, Span{}
			if !equalSummary(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
			if s.Endpoint != tc.e {
				t.Errorf("Endpoint = %v", s.Endpoint)
			}
		})
	}
}

func equalSummary(a, b Summary) bool {
	return string(a.Model) == string(b.Model) && string(a.Prompt) == string(b.Prompt) && a.Stream == b.Stream &&
		string(a.PreviousResponseID) == string(b.PreviousResponseID) && a.Background == b.Background &&
		a.IncludeUsage == b.IncludeUsage && a.MaxTokens == b.MaxTokens && a.N == b.N && a.Temperature == b.Temperature &&
		a.HasTemperature == b.HasTemperature && a.PromptTokens == b.PromptTokens && a.Prompts == b.Prompts &&
		a.BestOf == b.BestOf
}

func TestParseSpans(t *testing.T) {
	body := `{"model": "m" ,"stream":false,"stream_options":{"x":1,"include_usage":false},"messages":[{"role":"user","content":"x"}]}`
	var s Summary
	if err := s.Parse(Chat, []byte(body)); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		sp   Span
		want string
	}{
		"model":          {s.ModelSpan, `"m"`},
		"stream":         {s.StreamSpan, `false`},
		"stream_options": {s.StreamOptionsSpan, `{"x":1,"include_usage":false}`},
		"include_usage":  {s.IncludeUsageSpan, `false`},
	} {
		if got := body[tc.sp.Start:tc.sp.End]; got != tc.want {
			t.Errorf("%s span holds %q, want %q", name, got, tc.want)
		}
	}
	if err := s.Parse(Chat, []byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`)); err != nil {
		t.Fatal(err)
	}
	if s.StreamSpan.Start >= 0 || s.StreamOptionsSpan.Start >= 0 || s.IncludeUsageSpan.Start >= 0 {
		t.Errorf("absent values have spans: %+v", s)
	}
}

func TestParseErrors(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	tests := []struct {
		name      string
		e         Endpoint
		body      string
		param     string
		malformed bool // Code "invalid_json"
	}{
		{"empty body", Chat, ``, "", true},
		{"blank body", Chat, " \n", "", true},
		{"truncated", Chat, `{"model":"m",` + msgs[:20], "", true},
		{"trailing garbage", Chat, `{"model":"m",` + msgs + `}x`, "", true},
		{"two values", Chat, `{"model":"m",` + msgs + `} {}`, "", true},
		{"bad literal", Chat, `{"model":"m","stream":tru,` + msgs + `}`, "", true},
		{"leading zero", Chat, `{"model":"m","n":01,` + msgs + `}`, "", true},
		{"bad escape", Chat, `{"model":"m\x",` + msgs + `}`, "", true},
		{"control char in string", Chat, "{\"model\":\"m\n\"," + msgs + "}", "", true},
		{"invalid UTF-8", Chat, "{\"model\":\"m\xff\"," + msgs + "}", "", true},
		{"invalid UTF-8 in a skipped value", Chat, "{\"model\":\"m\",\"user\":\"\xc3\"," + msgs + "}", "", true},
		{"unpaired surrogate", Chat, `{"model":"m","user":"\ud800",` + msgs + `}`, "", true},
		{"lone low surrogate", Chat, `{"model":"m","user":"\udc00",` + msgs + `}`, "", true},
		{"too deep", Chat, `{"model":"m",` + msgs + `,"x":` + strings.Repeat("[", 64) + strings.Repeat("]", 64) + `}`, "", true},
		{"syntax error wins over a bad param", Chat, `{"model":5,` + msgs + `,}`, "", true},
		{"array body", Chat, `[1]`, "", false},
		{"string body", Chat, `"x"`, "", false},
		{"null body", Chat, `null`, "", false},
		{"missing model", Chat, `{` + msgs + `}`, "model", false},
		{"null model", Chat, `{"model":null,` + msgs + `}`, "model", false},
		{"empty model", Chat, `{"model":"",` + msgs + `}`, "model", false},
		{"number model", Chat, `{"model":5,` + msgs + `}`, "model", false},
		{"string stream", Chat, `{"model":"m","stream":"true",` + msgs + `}`, "stream", false},
		{"number stream", Chat, `{"model":"m","stream":1,` + msgs + `}`, "stream", false},
		{"string stream_options", Chat, `{"model":"m","stream_options":"x",` + msgs + `}`, "stream_options", false},
		{"string include_usage", Chat, `{"model":"m","stream_options":{"include_usage":"yes"},` + msgs + `}`, "stream_options.include_usage", false},
		{"negative max_tokens", Chat, `{"model":"m","max_tokens":-1,` + msgs + `}`, "max_tokens", false},
		{"fractional max_tokens", Chat, `{"model":"m","max_tokens":1.5,` + msgs + `}`, "max_tokens", false},
		{"huge max_tokens", Chat, `{"model":"m","max_tokens":99999999999999999999999,` + msgs + `}`, "max_tokens", false},
		{"string max_completion_tokens", Chat, `{"model":"m","max_completion_tokens":"5",` + msgs + `}`, "max_completion_tokens", false},
		{"zero n", Chat, `{"model":"m","n":0,` + msgs + `}`, "n", false},
		{"huge n", Chat, `{"model":"m","n":1000,` + msgs + `}`, "n", false},
		{"string temperature", Chat, `{"model":"m","temperature":"hot",` + msgs + `}`, "temperature", false},
		{"missing messages", Chat, `{"model":"m"}`, "messages", false},
		{"null messages", Chat, `{"model":"m","messages":null}`, "messages", false},
		{"empty messages", Chat, `{"model":"m","messages":[]}`, "messages", false},
		{"object messages", Chat, `{"model":"m","messages":{"role":"user"}}`, "messages", false},
		{"string message", Chat, `{"model":"m","messages":["hi"]}`, "messages[0]", false},
		{"null message", Chat, `{"model":"m","messages":[{"role":"user","content":"x"},null]}`, "messages[1]", false},
		{"missing role", Chat, `{"model":"m","messages":[{"content":"x"}]}`, "messages[0].role", false},
		{"number role", Chat, `{"model":"m","messages":[{"role":1,"content":"x"}]}`, "messages[0].role", false},
		{"number content", Chat, `{"model":"m","messages":[{"role":"user","content":1}]}`, "messages[0].content", false},
		{"object content", Chat, `{"model":"m","messages":[{"role":"user","content":{}}]}`, "messages[0].content", false},
		{"string part", Chat, `{"model":"m","messages":[{"role":"user","content":["x"]}]}`, "messages[0].content[0]", false},
		{"object tool_calls", Chat, `{"model":"m","messages":[{"role":"assistant","tool_calls":{}}]}`, "messages[0].tool_calls", false},
		{"object tools", Chat, `{"model":"m","tools":{},` + msgs + `}`, "tools", false},
		{"missing prompt", Completions, `{"model":"m"}`, "prompt", false},
		{"object prompt", Completions, `{"model":"m","prompt":{}}`, "prompt", false},
		{"empty prompt list", Completions, `{"model":"m","prompt":[]}`, "prompt", false},
		{"mixed prompt list", Completions, `{"model":"m","prompt":["a",1]}`, "prompt", false},
		{"negative token ID", Completions, `{"model":"m","prompt":[1,-2]}`, "prompt[1]", false},
		{"bad token-ID list", Completions, `{"model":"m","prompt":[[1],[2.5]]}`, "prompt[1]", false},
		{"null in prompt list", Completions, `{"model":"m","prompt":[null]}`, "prompt[0]", false},
		{"missing input", Embeddings, `{"model":"m","prompt":"x"}`, "input", false},
		{"number input", Embeddings, `{"model":"m","input":5}`, "input", false},
		{"messages is not the completions prompt", Completions, `{"model":"m",` + msgs + `}`, "prompt", false},
		{"responses missing model", Responses, `{"input":"x"}`, "model", false},
		{"responses missing input", Responses, `{"model":"m","previous_response_id":"resp_1"}`, "input", false},
		{"responses null input", Responses, `{"model":"m","input":null}`, "input", false},
		{"responses number input", Responses, `{"model":"m","input":5}`, "input", false},
		{"responses last input counts", Responses, `{"model":"m","input":"x","input":5}`, "input", false},
		{"responses string item", Responses, `{"model":"m","input":["x"]}`, "input[0]", false},
		{"responses item without role", Responses, `{"model":"m","input":[{"content":"x"}]}`, "input[0].role", false},
		{"responses null role", Responses, `{"model":"m","input":[{"role":null,"content":"x"}]}`, "input[0].role", false},
		{"responses object content", Responses, `{"model":"m","input":[{"role":"user","content":"x"},{"role":"user","content":{}}]}`, "input[1].content", false},
		{"responses string part", Responses, `{"model":"m","input":[{"role":"user","content":["x"]}]}`, "input[0].content[0]", false},
		{"responses array instructions", Responses, `{"model":"m","input":"x","instructions":[]}`, "instructions", false},
		{"responses object tools", Responses, `{"model":"m","input":"x","tools":{}}`, "tools", false},
		{"responses max_output_tokens", Responses, `{"model":"m","input":"x","max_output_tokens":-1}`, "max_output_tokens", false},
		{"responses previous_response_id", Responses, `{"model":"m","input":"x","previous_response_id":1}`, "previous_response_id", false},
		{"responses background", Responses, `{"model":"m","input":"x","background":"yes"}`, "background", false},
		{"responses stream_options", Responses, `{"model":"m","input":"x","stream_options":true}`, "stream_options", false},
		{"responses invalid JSON", Responses, `{"model":"m","input":[{"role":"user","content":"x"}`, "", true},
		{"messages missing max_tokens", Messages, `{"model":"c",` + msgs + `}`, "max_tokens", false},
		{"messages null max_tokens", Messages, `{"model":"c","max_tokens":null,` + msgs + `}`, "max_tokens", false},
		{"messages max_completion_tokens is not max_tokens", Messages, `{"model":"c","max_completion_tokens":5,` + msgs + `}`, "max_tokens", false},
		{"messages bad max_tokens", Messages, `{"model":"c","max_tokens":1.5,` + msgs + `}`, "max_tokens", false},
		{"messages missing messages", Messages, `{"model":"c","max_tokens":5}`, "messages", false},
		{"messages empty messages", Messages, `{"model":"c","max_tokens":5,"messages":[]}`, "messages", false},
		{"messages string messages", Messages, `{"model":"c","max_tokens":5,"messages":"hi"}`, "messages", false},
		{"messages missing role", Messages, `{"model":"c","max_tokens":5,"messages":[{"content":"x"}]}`, "messages[0].role", false},
		{"messages number content", Messages, `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":1}]}`, "messages[0].content", false},
		{"messages string block", Messages, `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":"a"},"b"]}]}`, "messages[0].content[1]", false},
		{"messages number system", Messages, `{"model":"c","max_tokens":5,"system":1,` + msgs + `}`, "system", false},
		{"messages string system block", Messages, `{"model":"c","max_tokens":5,"system":["s"],` + msgs + `}`, "system[0]", false},
	}
	var s Summary
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Parse(tc.e, []byte(tc.body))
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("Parse(%s) = %v, want a *RequestError", tc.body, err)
			}
			if re.Param != tc.param {
				t.Errorf("Param = %q, want %q (%v)", re.Param, tc.param, err)
			}
			if malformed := re.Code == "invalid_json"; malformed != tc.malformed {
				t.Errorf("Code = %q, want malformed=%v (%v)", re.Code, tc.malformed, err)
			}
			if re.Message == "" {
				t.Error("empty Message")
			}
		})
	}
}

// TestParseAmbiguousFields: a member the gateway acts on that is repeated, or spelled in another case (as
// encoding/json's case-insensitive matching would still read it), is refused whatever its position and value.
func TestParseAmbiguousFields(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	tests := []struct {
		name string
		e    Endpoint
		body string
		msg  string // the message, exactly
	}{
		{"model case variant", Chat, `{"model":"pub-a","MODEL":"other",` + msgs + `}`, `duplicate or case-variant key "MODEL" for "model"`},
		{"model case variant first", Chat, `{"Model":"other","model":"pub-a",` + msgs + `}`, `duplicate or case-variant key "Model" for "model"`},
		{"model case variant alone", Chat, `{"mOdEl":"other",` + msgs + `}`, `duplicate or case-variant key "mOdEl" for "model"`},
		{"duplicate model", Chat, `{"model":"other","model":"pub-a",` + msgs + `}`, `duplicate or case-variant key "model" for "model"`},
		{"duplicate model, escaped", Chat, `{"model":"pub-a","m\u006fdel":"other",` + msgs + `}`, `duplicate or case-variant key "model" for "model"`},
		{"case variant, escaped", Chat, `{"model":"pub-a","\u004dODEL":"other",` + msgs + `}`, `duplicate or case-variant key "MODEL" for "model"`},
		{"null duplicate", Chat, `{"model":"pub-a","model":null,` + msgs + `}`, `duplicate or case-variant key "model" for "model"`},
		{"stray Stream", Chat, `{"model":"m","Stream":true,` + msgs + `}`, `duplicate or case-variant key "Stream" for "stream"`},
		{"long s", Chat, `{"model":"m","ſtream":true,` + msgs + `}`, `duplicate or case-variant key "ſtream" for "stream"`},
		{"long s, escaped", Chat, `{"model":"m","\u017ftream":true,` + msgs + `}`, `duplicate or case-variant key "ſtream" for "stream"`},
		{"Kelvin sign in another key", Chat, `{"model":"m","max_\u212aens":1,"max_tokens":1,` + msgs + `}`, ""},
		{"Kelvin sign in max_tokens", Chat, `{"model":"m","max_to` + "\u212a" + `ens":4000,"max_tokens":1,` + msgs + `}`, "duplicate or case-variant key \"max_to\u212aens\" for \"max_tokens\""},
		{"duplicate max_tokens", Chat, `{"model":"m","max_tokens":1,"max_tokens":4000,` + msgs + `}`, `duplicate or case-variant key "max_tokens" for "max_tokens"`},
		{"MAX_COMPLETION_TOKENS", Chat, `{"model":"m","max_tokens":1,"MAX_COMPLETION_TOKENS":4000,` + msgs + `}`, `duplicate or case-variant key "MAX_COMPLETION_TOKENS" for "max_completion_tokens"`},
		{"N", Chat, `{"model":"m","n":1,"N":128,` + msgs + `}`, `duplicate or case-variant key "N" for "n"`},
		{"stream_options twice", Chat, `{"model":"m","stream":true,"stream_options":{},"stream_options":{"include_usage":true},` + msgs + `}`, `duplicate or case-variant key "stream_options" for "stream_options"`},
		{"include_usage twice", Chat, `{"model":"m","stream":true,"stream_options":{"include_usage":false,"include_usage":true},` + msgs + `}`, `duplicate or case-variant key "include_usage" for "include_usage"`},
		{"Include_Usage", Chat, `{"model":"m","stream":true,"stream_options":{"include_usage":true,"Include_Usage":false},` + msgs + `}`, `duplicate or case-variant key "Include_Usage" for "include_usage"`},
		{"USER", Chat, `{"model":"m","user":"a","USER":"b",` + msgs + `}`, `duplicate or case-variant key "USER" for "user"`},
		{"Priority", Chat, `{"model":"m","Priority":-100,` + msgs + `}`, `duplicate or case-variant key "Priority" for "priority"`},
		{"best_of twice", Completions, `{"model":"m","prompt":"x","best_of":1,"best_of":20}`, `duplicate or case-variant key "best_of" for "best_of"`},
		{"Max_Output_Tokens", Responses, `{"model":"m","input":"x","max_output_tokens":1,"Max_Output_Tokens":4000}`, `duplicate or case-variant key "Max_Output_Tokens" for "max_output_tokens"`},
		{"previous_response_id twice", Responses, `{"model":"m","input":"x","previous_response_id":"a","previous_response_id":"b"}`, `duplicate or case-variant key "previous_response_id" for "previous_response_id"`},
		{"BACKGROUND", Responses, `{"model":"m","input":"x","BACKGROUND":true}`, `duplicate or case-variant key "BACKGROUND" for "background"`},
		{"messages endpoint too", Messages, `{"model":"c","max_tokens":5,"Model":"d",` + msgs + `}`, `duplicate or case-variant key "Model" for "model"`},
		{"a field of another endpoint too", Messages, `{"model":"c","max_tokens":5,"n":1,"n":2,` + msgs + `}`, `duplicate or case-variant key "n" for "n"`},
	}
	var s Summary
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := s.Parse(tc.e, []byte(tc.body))
			if tc.msg == "" {
				if err != nil {
					t.Fatalf("Parse(%s): %v", tc.body, err)
				}
				return
			}
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("Parse(%s) = %v, want a *RequestError", tc.body, err)
			}
			param := strings.Trim(tc.msg[strings.LastIndex(tc.msg, " for ")+5:], `"`)
			if param == "include_usage" {
				param = "stream_options.include_usage"
			}
			if re.Param != param || re.Message != tc.msg || re.Code != "" {
				t.Errorf("got param %q message %q code %q, want %q %q", re.Param, re.Message, re.Code, param, tc.msg)
			}
		})
	}
	// A syntax error anywhere still takes precedence.
	err := s.Parse(Chat, []byte(`{"model":"a","MODEL":"b",`+msgs+`,}`))
	if re, ok := err.(*RequestError); !ok || re.Code != "invalid_json" {
		t.Errorf("ambiguous and malformed: %v, want invalid_json", err)
	}
}

// TestFoldOrbits checks foldField's premise against the whole of Unicode: the only non-ASCII runes that
// bytes.EqualFold (encoding/json's matching) equates with an ASCII letter are U+212A (k) and U+017F (s). EqualFold
// compares non-ASCII runes by their unicode.SimpleFold orbits, so a rune whose orbit holds no ASCII rune equals no
// ASCII letter.
func TestFoldOrbits(t *testing.T) {
	for r := rune(utf8.RuneSelf); r <= unicode.MaxRune; r++ {
		for o := unicode.SimpleFold(r); o != r; o = unicode.SimpleFold(o) {
			if o >= utf8.RuneSelf {
				continue
			}
			if !(r == 0x212a && o|0x20 == 'k' || r == 0x17f && o|0x20 == 's') {
				t.Errorf("%U folds to %c, and foldField does not know it", r, o)
			}
		}
	}
	for _, tc := range []struct{ r, c string }{{"\u212a", "k"}, {"\u212a", "K"}, {"\u017f", "s"}, {"\u017f", "S"}} {
		if !bytes.EqualFold([]byte(tc.r), []byte(tc.c)) {
			t.Errorf("EqualFold(%q, %q) is false", tc.r, tc.c)
		}
	}
}

// TestFoldField compares foldField with bytes.EqualFold on every field name in many spellings.
func TestFoldField(t *testing.T) {
	for f := fieldModel; f < numFields; f++ {
		name := fieldNames[f]
		variants := []string{name, strings.ToUpper(name), strings.ReplaceAll(name, "k", "\u212a"), strings.ReplaceAll(name, "s", "\u017f"),
			strings.ReplaceAll(strings.ReplaceAll(name, "s", "\u017f"), "k", "\u212a"), name + "x", name[1:], "x" + name[1:], strings.ToUpper(name[:1]) + name[1:]}
		for _, v := range variants {
			got, exact := foldField([]byte(v))
			want := bytes.EqualFold([]byte(v), []byte(name))
			if (got == f) != want || exact != (v == name && want) {
				t.Errorf("foldField(%q) = %v %v, EqualFold with %q %v", v, got, exact, name, want)
			}
		}
	}
	for _, k := range []string{"", "messages", "temperature", "tools", "top_p", "seed", "stop", "x", "modem", "mode\u212a"} {
		if f, _ := foldField([]byte(k)); f != fieldNone {
			t.Errorf("foldField(%q) = %v", k, f)
		}
	}
}

func TestSequences(t *testing.T) {
	for _, tc := range []struct {
		e    Endpoint
		body string
		want int
	}{
		{Chat, `{"model":"m","n":3,"messages":[{"role":"user","content":"x"}]}`, 3},
		{Completions, `{"model":"m","prompt":["a","b"],"n":2}`, 4},
		{Completions, `{"model":"m","prompt":["a","b","c"],"n":2,"best_of":5}`, 15},
		{Completions, `{"model":"m","prompt":"a","best_of":null}`, 1},
		{Embeddings, `{"model":"m","input":["a","b"]}`, 1},
		{Responses, `{"model":"m","input":"x","n":4}`, 1},
		{Messages, `{"model":"m","max_tokens":3,"n":4,"messages":[{"role":"user","content":"x"}]}`, 1},
	} {
		var s Summary
		if err := s.Parse(tc.e, []byte(tc.body)); err != nil {
			t.Fatal(err)
		}
		if got := s.Sequences(); got != tc.want {
			t.Errorf("%s: Sequences() = %d, want %d", tc.body, got, tc.want)
		}
	}
	if got := (&Summary{N: 1, Prompts: 1}).Sequences(); got != 1 {
		t.Errorf("pass-through summary: Sequences() = %d", got)
	}
}

// TestParseDeepNesting checks that a pathologically nested body is refused quickly, without exhausting the stack.
func TestParseDeepNesting(t *testing.T) {
	for _, open := range []string{"[", `{"a":`} {
		body := []byte(`{"model":"m","messages":` + strings.Repeat(open, 100_000))
		start := time.Now()
		var s Summary
		err := s.Parse(Chat, body)
		var re *RequestError
		if !errors.As(err, &re) || re.Code != "invalid_json" || !strings.Contains(re.Message, "nesting") {
			t.Errorf("Parse(%q...) = %v, want a nesting error", body[:40], err)
		}
		if d := time.Since(start); d > 10*time.Millisecond {
			t.Errorf("rejecting took %v", d)
		}
		// AppendPrompt accepts encoding/json's depth (10,000) and refuses more.
		if _, err := AppendPrompt(nil, Chat, body); err == nil {
			t.Error("AppendPrompt accepted 100,000 levels")
		}
	}
	deep := []byte(`{"tools":` + strings.Repeat("[", 9000) + strings.Repeat("]", 9000) + `,"messages":[]}`)
	got, err := AppendPrompt(nil, Chat, deep)
	want, werr := AppendPromptReference(nil, Chat, deep)
	if err != nil || werr != nil || !bytes.Equal(got, want) {
		t.Errorf("9,000 levels: AppendPrompt err %v, reference err %v, equal %v", err, werr, bytes.Equal(got, want))
	}
}

// chatBody returns a chat request of about size bytes: a system prompt and turns of user/assistant text with the
// escapes real clients send (newlines, quotes, non-ASCII).
func chatBody(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"llama-3.1-8b-instruct","stream":true,"max_tokens":512,"temperature":0.7,"messages":[`)
	b.WriteString(`{"role":"system","content":"You are a helpful assistant.\nAnswer briefly and cite sources."}`)
	turn := strings.Repeat(`Here is some text about the \"gateway\", with a newline\nand an accent: café. `, 4)
	for i := 0; b.Len() < size-200; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		b.WriteString(`,{"role":"` + role + `","content":"` + turn + `"}`)
	}
	b.WriteString(`],"stream_options":{"include_usage":true}}`)
	return b.Bytes()
}

// manyKeysBody is a chat request with forty top-level members, most of them vLLM's extra sampling parameters,
// some with the lengths of members Parse reads (so that they are folded and compared).
func manyKeysBody() []byte {
	return []byte(`{"model":"llama-3.1-8b-instruct","messages":[{"role":"user","content":"Hi"}],"stream":true,` +
		`"stream_options":{"include_usage":true,"continuous_usage_stats":false},"max_completion_tokens":256,"n":1,` +
		`"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":7,"stop":["\n\n"],"stop_token_ids":[2],` +
		`"presence_penalty":0,"frequency_penalty":0,"repetition_penalty":1.1,"length_penalty":1,"logprobs":false,` +
		`"top_logprobs":0,"logit_bias":{},"user":"u-1","priority":0,"ignore_eos":false,"min_tokens":0,` +
		`"skip_special_tokens":true,"spaces_between_special_tokens":true,"include_stop_str_in_output":false,` +
		`"echo":false,"add_generation_prompt":true,"continue_final_message":false,"add_special_tokens":false,` +
		`"tool_choice":"none","parallel_tool_calls":false,"response_format":{"type":"text"},"request_id":"r-1",` +
		`"cache_salt":"s","truncate_prompt_tokens":null,"prompt_logprobs":null,"allowed_token_ids":null,` +
		`"bad_words":[],"chat_template_kwargs":{"enable_thinking":false},"metadata":{"tenant":"t"}}`)
}

func TestParseAllocs(t *testing.T) {
	for _, size := range []int{8 << 10, 1 << 20} {
		body := chatBody(size)
		var s Summary
		if err := s.Parse(Chat, body); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(20, func() { s.Parse(Chat, body) }); n != 0 {
			t.Errorf("Parse of %d bytes with a reused Summary: %v allocs, want 0", len(body), n)
		}
	}
	for _, tc := range []struct {
		e    Endpoint
		body string
	}{
		{Chat, `{"m\u006fdel":"esc\u0061ped","messages":[{"content":"x","role":"user"}],"tools":[],"temperature":0.5}`},
		{Completions, `{"model":"m","prompt":["a\nb","c"],"max_tokens":5,"n":2}`},
		{Completions, `{"model":"m","prompt":[[1,2],[3]]}`},
		{Embeddings, `{"model":"m","input":[1,2,3]}`},
		{Responses, `{"model":"m","input":[{"content":[{"type":"input_text","text":"a\nb"}],"role":"user"},{"type":"function_call","arguments":"{}"}],"instructions":"i\n","tools":[{}],"previous_response_id":"r\u0031"}`},
		{Messages, `{"model":"m","max_tokens":5,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image"}]}],"tools":[]}`},
		{Chat, string(manyKeysBody())},
	} {
		body := []byte(tc.body)
		var s Summary
		if err := s.Parse(tc.e, body); err != nil {
			t.Fatal(err)
		}
		if n := testing.AllocsPerRun(20, func() { s.Parse(tc.e, body) }); n != 0 {
			t.Errorf("Parse(%s): %v allocs, want 0", body, n)
		}
	}
}

func TestAppendPromptAllocs(t *testing.T) {
	body := chatBody(64 << 10)
	dst, err := AppendPrompt(nil, Chat, body)
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(20, func() { AppendPrompt(dst[:0], Chat, body) }); n != 0 {
		t.Errorf("AppendPrompt into a buffer with room: %v allocs, want 0", n)
	}
}

func FuzzParse(f *testing.F) {
	for _, tc := range promptSeeds {
		f.Add(uint8(tc.e-1), []byte(tc.body))
	}
	f.Add(uint8(Chat-1), []byte(`{"model":"m","stream":"true","messages":[]}`))
	f.Add(uint8(Chat-1), []byte(`{"model":"m","x":1e700,"messages":[{"role":"u","content":"x"}]}`))
	f.Add(uint8(Responses-1), []byte(`{"model":"m","max_output_tokens":3,"max_tokens":4,"previous_response_id":"r","background":true,"input":"x"}`))
	f.Add(uint8(Messages-1), []byte(`{"model":"m","max_tokens":3,"max_completion_tokens":4,"n":2,"messages":[{"role":"u","content":"x"}]}`))
	f.Fuzz(func(t *testing.T, e uint8, body []byte) {
		ep := Endpoint(e%uint8(lastEndpoint) + 1)
		var s Summary
		err := s.Parse(ep, body)
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			if re.Code == "" && !json.Valid(body) {
				t.Fatalf("%q: invalid JSON reported as a bad parameter: %v", body, err)
			}
			return
		}
		if !json.Valid(body) {
			t.Fatalf("%q: accepted invalid JSON", body)
		}
		// The prompt is the fast AppendPrompt's, which the reference checks.
		p, perr := AppendPrompt(nil, ep, body)
		if perr != nil || !bytes.Equal(p, s.Prompt) {
			t.Fatalf("%q: Prompt %q, AppendPrompt %q (%v)", body, s.Prompt, p, perr)
		}
		if ref, rerr := AppendPromptReference(nil, ep, body); rerr == nil && !referenceQuirk(ep, body) {
			if !bytes.Equal(ref, s.Prompt) {
				t.Fatalf("%q: Prompt %q, reference %q", body, s.Prompt, ref)
			}
			prev, ok, err := prevTurnReference(ep, body)
			if err != nil {
				t.Fatalf("%q: the previous turn's reference: %v", body, err)
			}
			if !ok && s.PrevTurn != 0 || ok && (s.PrevTurn != len(prev) || !bytes.HasPrefix(s.Prompt, prev)) {
				t.Fatalf("%q: PrevTurn %d of %q, reference %q (%v)", body, s.PrevTurn, s.Prompt, prev, ok)
			}
		}
		// The scalar parameters agree with encoding/json's reading of the body.
		var m map[string]any
		if err := decodeJSON(body, &m); err != nil {
			t.Fatalf("%q: %v", body, err)
		}
		if m["model"] != string(s.Model) {
			t.Fatalf("%q: Model %q, encoding/json %q", body, s.Model, m["model"])
		}
		if st, _ := m["stream"].(bool); st != s.Stream {
			t.Fatalf("%q: Stream %v", body, s.Stream)
		}
		so, _ := m["stream_options"].(map[string]any)
		if iu, _ := so["include_usage"].(bool); (iu && ep < Responses) != s.IncludeUsage {
			t.Fatalf("%q: IncludeUsage %v", body, s.IncludeUsage)
		}
		if n, ok := m["n"].(json.Number); ok && ep < Responses {
			if v, _ := n.Int64(); int(v) != s.N {
				t.Fatalf("%q: N %v", body, s.N)
			}
		} else if ep >= Responses && s.N != 1 {
			t.Fatalf("%q: N %v", body, s.N)
		}
		var mt json.Number
		switch ep {
		case Responses:
			mt, _ = m["max_output_tokens"].(json.Number)
		case Messages:
			var ok bool
			if mt, ok = m["max_tokens"].(json.Number); !ok {
				t.Fatalf("%q: accepted without max_tokens", body)
			}
		default:
			mt, _ = m["max_tokens"].(json.Number)
			if mct, _ := m["max_completion_tokens"].(json.Number); len(mct) > len(mt) || len(mct) == len(mt) && mct > mt {
				mt = mct // the larger (both are integers without leading zeros)
			}
		}
		if v, _ := mt.Int64(); int(v) != s.MaxTokens {
			t.Fatalf("%q: MaxTokens %v, want %v", body, s.MaxTokens, mt)
		}
		temp, ok := m["temperature"].(json.Number)
		if tv, _ := temp.Float64(); ok != s.HasTemperature || tv != s.Temperature {
			t.Fatalf("%q: Temperature %v %v", body, s.Temperature, s.HasTemperature)
		}
		if id, _ := m["previous_response_id"].(string); ep == Responses && id != string(s.PreviousResponseID) || ep != Responses && s.PreviousResponseID != nil {
			t.Fatalf("%q: PreviousResponseID %q", body, s.PreviousResponseID)
		}
		if bg, _ := m["background"].(bool); bg && ep == Responses != s.Background {
			t.Fatalf("%q: Background %v", body, s.Background)
		}
		for _, sp := range []Span{s.ModelSpan, s.StreamSpan, s.StreamOptionsSpan, s.IncludeUsageSpan} {
			if sp.Start >= 0 && !json.Valid(body[sp.Start:sp.End]) {
				t.Fatalf("%q: span %v is not a JSON value", body, sp)
			}
		}
	})
}

func TestRequestErrorString(t *testing.T) {
	if got := (&RequestError{Param: "model", Message: "m"}).Error(); got != "model: m" {
		t.Errorf("got %q", got)
	}
	if got := (&RequestError{Message: "m"}).Error(); got != "m" {
		t.Errorf("got %q", got)
	}
	var s Summary
	if err := s.Parse(Endpoint(0), []byte(`{}`)); err == nil {
		t.Error("Parse accepted an unknown endpoint")
	}
	if Chat.String() != "/v1/chat/completions" || Endpoint(7).String() != "Endpoint(7)" {
		t.Errorf("String: %v %v", Chat, Endpoint(7))
	}
}

// goFields is how a Go engine decodes the fields of a request the gateway acts on: encoding/json into a struct,
// which matches member names case-insensitively (bytes.EqualFold) and keeps the last match.
type goFields struct {
	Model               json.RawMessage `json:"model"`
	Stream              json.RawMessage `json:"stream"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	MaxOutputTokens     json.RawMessage `json:"max_output_tokens"`
	N                   json.RawMessage `json:"n"`
	BestOf              json.RawMessage `json:"best_of"`
	User                json.RawMessage `json:"user"`
	Priority            json.RawMessage `json:"priority"`
	PreviousResponseID  json.RawMessage `json:"previous_response_id"`
	Background          json.RawMessage `json:"background"`
}

// readings returns the raw values of the fields of body as a Go engine reads them (goFields) and as a Python
// engine does (json.loads: a dict, keys matched exactly, the last one kept; a Go map decodes alike), keyed by
// field name, "stream_options.include_usage" for the nested one. Absent fields are missing.
func readings(t *testing.T, body []byte) (goRead, pyRead map[string]string) {
	t.Helper()
	var g goFields
	if err := json.Unmarshal(body, &g); err != nil {
		t.Fatalf("%q: encoding/json: %v", body, err)
	}
	var nested struct {
		IncludeUsage json.RawMessage `json:"include_usage"`
	}
	if len(g.StreamOptions) > 0 && g.StreamOptions[0] == '{' {
		if err := json.Unmarshal(g.StreamOptions, &nested); err != nil {
			t.Fatal(err)
		}
	}
	goRead = map[string]string{}
	for name, v := range map[string]json.RawMessage{"model": g.Model, "stream": g.Stream, "stream_options": g.StreamOptions,
		"max_tokens": g.MaxTokens, "max_completion_tokens": g.MaxCompletionTokens, "max_output_tokens": g.MaxOutputTokens,
		"n": g.N, "best_of": g.BestOf, "user": g.User, "priority": g.Priority, "previous_response_id": g.PreviousResponseID,
		"background": g.Background, "stream_options.include_usage": nested.IncludeUsage} {
		if v != nil {
			goRead[name] = string(v)
		}
	}
	var dict map[string]json.RawMessage
	if err := json.Unmarshal(body, &dict); err != nil {
		t.Fatal(err)
	}
	pyRead = map[string]string{}
	for f := fieldModel; f < fieldIncludeUsage; f++ {
		if v, ok := dict[fieldNames[f]]; ok {
			pyRead[fieldNames[f]] = string(v)
		}
	}
	if so := dict["stream_options"]; len(so) > 0 && so[0] == '{' {
		var inner map[string]json.RawMessage
		if err := json.Unmarshal(so, &inner); err != nil {
			t.Fatal(err)
		}
		if v, ok := inner["include_usage"]; ok {
			pyRead["stream_options.include_usage"] = string(v)
		}
	}
	return goRead, pyRead
}

// FuzzParseAgreesWithDecoders is the differential test of the field rule (docs/security.md): for every body
// Parse accepts, a Go engine and a Python engine read the same value of every field the gateway acts on, the
// gateway reads that value too, and the body AppendUpstreamBody sends on still reads alike in both, with the
// routed model and the stream flag the gateway set.
func FuzzParseAgreesWithDecoders(f *testing.F) {
	for _, tc := range promptSeeds {
		f.Add(uint8(tc.e-1), []byte(tc.body))
	}
	const msgs = `"messages":[{"role":"user","content":"x"}]`
	for _, b := range []string{
		`{"model":"pub-a","MODEL":"other",` + msgs + `}`,
		`{"model":"pub-a","model":"other",` + msgs + `}`,
		`{"model":"m","Stream":true,` + msgs + `}`,
		`{"model":"m","max_completion_tokens":4000,"max_tokens":1,"n":2,` + msgs + `}`,
		`{"m\u006fdel":"m","\u017ftream":false,"max_to\u212aens":3,` + msgs + `}`,
		`{"model":"m","stream":true,"stream_options":{"include_usage":false,"Include_usage":true},` + msgs + `}`,
		`{"model":"m","max_\u212aens":1,"mode":"x","models":"y","stream_option":{},` + msgs + `}`,
	} {
		f.Add(uint8(Chat-1), []byte(b))
	}
	f.Add(uint8(Completions-1), []byte(`{"model":"m","prompt":["a","b"],"best_of":3,"n":2,"max_tokens":5,"BEST_OF":1}`))
	f.Add(uint8(Responses-1), []byte(`{"model":"m","input":"x","max_output_tokens":9,"background":true,"previous_response_id":"r","Previous_Response_Id":"s"}`))
	f.Add(uint8(Messages-1), []byte(`{"model":"c","max_tokens":5,"Max_Tokens":99,`+msgs+`}`))
	f.Fuzz(func(t *testing.T, e uint8, body []byte) {
		ep := Endpoint(e%uint8(lastEndpoint) + 1)
		var s Summary
		if s.Parse(ep, body) != nil {
			return
		}
		goRead, pyRead := readings(t, body)
		if !reflect.DeepEqual(goRead, pyRead) {
			t.Fatalf("%q: accepted, but Go reads %v and Python %v", body, goRead, pyRead)
		}
		num := func(name string, absent int) int {
			v, ok := goRead[name]
			if !ok || v == "null" {
				return absent
			}
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("%q: %s is %s", body, name, v)
			}
			return n
		}
		var model string
		if err := json.Unmarshal([]byte(goRead["model"]), &model); err != nil || model != string(s.Model) {
			t.Fatalf("%q: the gateway reads model %q, the engines %s", body, s.Model, goRead["model"])
		}
		if (goRead["stream"] == "true") != s.Stream {
			t.Fatalf("%q: the gateway reads stream %v, the engines %s", body, s.Stream, goRead["stream"])
		}
		var maxTokens, n, bestOf int
		switch ep {
		case Responses:
			maxTokens, n = num("max_output_tokens", 0), 1
		case Messages:
			maxTokens, n = num("max_tokens", 0), 1
		default:
			maxTokens, n = max(num("max_tokens", 0), num("max_completion_tokens", 0)), num("n", 1)
		}
		if ep == Completions {
			bestOf = num("best_of", 0)
		}
		if maxTokens != s.MaxTokens || n != s.N || bestOf != s.BestOf {
			t.Fatalf("%q: the gateway reads max tokens %d, n %d, best_of %d; the engines %d %d %d", body,
				s.MaxTokens, s.N, s.BestOf, maxTokens, n, bestOf)
		}
		if iu := goRead["stream_options.include_usage"] == "true" && ep < Responses; iu != s.IncludeUsage {
			t.Fatalf("%q: the gateway reads include_usage %v", body, s.IncludeUsage)
		}
		if ep == Responses {
			var id string
			if v, ok := goRead["previous_response_id"]; ok && v != "null" {
				json.Unmarshal([]byte(v), &id)
			}
			if id != string(s.PreviousResponseID) || (goRead["background"] == "true") != s.Background {
				t.Fatalf("%q: the gateway reads previous_response_id %q background %v", body, s.PreviousResponseID, s.Background)
			}
		}

		// What goes upstream is what was checked, with the gateway's edits, and as unambiguous.
		out := AppendUpstreamBody(nil, body, &s, []byte("routed-model"), true)
		goOut, pyOut := readings(t, out)
		if !reflect.DeepEqual(goOut, pyOut) {
			t.Fatalf("%q -> %q: Go reads %v and Python %v", body, out, goOut, pyOut)
		}
		if goOut["model"] != `"routed-model"` || goOut["stream"] != "true" {
			t.Fatalf("%q -> %q: model %s stream %s upstream", body, out, goOut["model"], goOut["stream"])
		}
		if ep < Responses && goOut["stream_options.include_usage"] != "true" {
			t.Fatalf("%q -> %q: include_usage %s upstream", body, out, goOut["stream_options.include_usage"])
		}
		for name, v := range goRead {
			if name != "model" && name != "stream" && !strings.HasPrefix(name, "stream_options") && goOut[name] != v {
				t.Fatalf("%q -> %q: %s went from %s to %s", body, out, name, v, goOut[name])
			}
		}
	})
}
