package openai

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

func TestParsePrevTurn(t *testing.T) {
	const (
		tools   = `"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`
		sys     = `{"role":"system","content":"Be terse."}`
		user    = `{"role":"user","content":"Weather in Paris?"}`
		user2   = `{"role":"user","content":[{"type":"text","text":"And Rome?"}]}`
		answer  = `{"role":"assistant","content":"18C"}`
		answer2 = `{"role":"assistant","content":"21C"}`
		calls   = `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]}`
		result  = `{"role":"tool","tool_call_id":"c1","content":"18C"}`
		aMsgs   = `"model":"claude","max_tokens":64,"messages":`
		rIn     = `"model":"m","input":`
		rUser   = `{"role":"user","content":"Weather in Paris?"}`
		rUser2  = `{"type":"message","role":"user","content":[{"type":"input_text","text":"And Rome?"}]}`
		rAnswer = `{"type":"message","role":"assistant","content":[{"type":"output_text","text":"18C","annotations":[]}]}`
		rReason = `{"type":"reasoning","id":"rs_1","summary":[]}`
		rCall   = `{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"}`
		rOutput = `{"type":"function_call_output","call_id":"c1","output":"18C"}`
	)
	chat := func(msgs ...string) string {
		return `{"model":"m","messages":[` + strings.Join(msgs, ",") + `]}`
	}
	tests := []struct {
		name string
		e    Endpoint
		body string
		prev string // the request that produced the last answer, whose prompt is Prompt[:PrevTurn]; "" for PrevTurn 0
	}{
		{"chat without assistant", Chat, chat(sys, user), ""},
		{"chat answered", Chat, chat(sys, user, answer, user2), chat(sys, user)},
		{"chat two answers: the last", Chat, chat(sys, user, answer, user2, answer2, user), chat(sys, user, answer, user2)},
		{"chat trailing answer", Chat, chat(user, answer), chat(user)},
		{"chat tool calls and results, tools after messages", Chat,
			`{"model":"m","messages":[` + user + `,` + calls + `,` + result + `,` + result + `],` + tools + `}`,
			`{"model":"m",` + tools + `,"messages":[` + user + `]}`},
		{"chat tools before messages", Chat, `{` + tools + `,"model":"m","messages":[` + user + `,` + answer + `,` + user2 + `]}`,
			`{"model":"m","messages":[` + user + `],` + tools + `}`},
		{"chat tools repeated after messages", Chat,
			`{"tools":[1],"model":"m","messages":[` + user + `,` + answer + `,` + user2 + `],` + tools + `}`,
			`{"model":"m","messages":[` + user + `],` + tools + `}`},
		{"chat role after content", Chat, chat(user, `{"content":"18C","role":"assistant"}`, user2), chat(user)},
		{"chat role repeated, assistant last", Chat, chat(user, `{"role":"user","content":"18C","role":"assistant"}`, user2), chat(user)},
		{"chat role repeated, assistant first", Chat, chat(user, `{"role":"assistant","content":"18C","role":"user"}`, user2), ""},
		{"chat escaped role", Chat, chat(user, `{"role":"assist\u0061nt","content":"18C"}`, user2), chat(user)},
		{"chat role assistantx", Chat, chat(user, `{"role":"assistantx","content":"18C"}`, user2), ""},
		{"chat role assistant:x", Chat, chat(user, `{"role":"assistant:x","content":"18C"}`, user2), ""},
		{"chat role Assistant", Chat, chat(user, `{"role":"Assistant","content":"18C"}`, user2), ""},
		{"chat answer first", Chat, chat(answer, user), ""},
		{"chat answer first, after tools", Chat, `{"model":"m",` + tools + `,"messages":[` + answer + `,` + user + `]}`, ""},
		{"chat messages repeated: the last counts", Chat,
			`{"model":"m","messages":[` + user + `,` + answer + `,` + user2 + `],"messages":[` + user2 + `]}`, ""},

		{"messages without assistant", Messages, `{` + aMsgs + `[` + user + `]}`, ""},
		{"messages answered, system and tools after", Messages,
			`{` + aMsgs + `[` + user + `,` + answer + `,` + user2 + `],"system":"Be terse.",` + tools + `}`,
			`{"system":"Be terse.",` + tools + `,` + aMsgs + `[` + user + `]}`},
		{"messages tool use and result", Messages,
			`{` + aMsgs + `[` + user + `,{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"tool_use","id":"t1","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"18C"}]}]}`,
			`{` + aMsgs + `[` + user + `]}`},
		{"messages two answers: the last", Messages, `{` + aMsgs + `[` + user + `,` + answer + `,` + user2 + `,` + answer2 + `,` + user + `]}`,
			`{` + aMsgs + `[` + user + `,` + answer + `,` + user2 + `]}`},
		{"messages role after content", Messages, `{` + aMsgs + `[` + user + `,{"content":"18C","role":"assistant"},` + user2 + `]}`,
			`{` + aMsgs + `[` + user + `]}`},
		{"messages escaped role", Messages, `{` + aMsgs + `[` + user + `,{"role":"\u0061ssistant","content":"18C"},` + user2 + `]}`,
			`{` + aMsgs + `[` + user + `]}`},
		{"messages role assistantx", Messages, `{` + aMsgs + `[` + user + `,{"role":"assistantx","content":"18C"},` + user2 + `]}`, ""},
		{"messages answer first, after system", Messages, `{"system":"Be terse.",` + aMsgs + `[` + answer + `,` + user + `]}`, ""},

		{"responses string input", Responses, `{` + rIn + `"Weather in Paris?"}`, ""},
		{"responses without output", Responses, `{` + rIn + `[` + rUser + `,` + rOutput + `,` + rUser2 + `]}`, ""},
		{"responses reasoning and call", Responses, `{` + rIn + `[` + rUser + `,` + rReason + `,` + rCall + `,` + rOutput + `]}`,
			`{` + rIn + `[` + rUser + `]}`},
		{"responses assistant message", Responses, `{` + rIn + `[` + rUser + `,` + rAnswer + `,` + rUser2 + `]}`,
			`{` + rIn + `[` + rUser + `]}`},
		{"responses assistant message without type, role after content", Responses,
			`{` + rIn + `[` + rUser + `,{"content":"18C","role":"assistant"},` + rUser2 + `]}`, `{` + rIn + `[` + rUser + `]}`},
		{"responses the last run", Responses,
			`{` + rIn + `[` + rUser + `,` + rAnswer + `,` + rUser2 + `,` + rReason + `,` + rAnswer + `,` + rUser + `]}`,
			`{` + rIn + `[` + rUser + `,` + rAnswer + `,` + rUser2 + `]}`},
		{"responses trailing run", Responses, `{` + rIn + `[` + rUser + `,` + rReason + `,` + rAnswer + `]}`,
			`{` + rIn + `[` + rUser + `]}`},
		{"responses instructions and tools after input", Responses,
			`{` + rIn + `[` + rUser + `,` + rCall + `,` + rOutput + `],"instructions":"Be terse.",` + tools + `}`,
			`{` + tools + `,"instructions":"Be terse.",` + rIn + `[` + rUser + `]}`},
		{"responses escaped type", Responses, `{` + rIn + `[` + rUser + `,{"type":"function_c\u0061ll","call_id":"c1","name":"f","arguments":"{}"},` + rOutput + `]}`,
			`{` + rIn + `[` + rUser + `]}`},
		{"responses type repeated: the last counts", Responses,
			`{` + rIn + `[` + rUser + `,{"type":"function_call","call_id":"c1","type":"item_reference","id":"x"},` + rUser2 + `]}`, ""},
		{"responses item reference", Responses, `{` + rIn + `[` + rUser + `,{"type":"item_reference","id":"fc_1"},` + rOutput + `]}`, ""},
		{"responses run first, after instructions", Responses, `{"instructions":"Be terse.",` + rIn + `[` + rReason + `,` + rAnswer + `,` + rUser + `]}`, ""},
		{"responses input repeated: the last counts", Responses,
			`{` + rIn + `[` + rUser + `,` + rAnswer + `,` + rUser2 + `],"input":"Hi"}`, ""},

		{"completions", Completions, `{"model":"m","prompt":"assistant:Hi\nuser:x"}`, ""},
		{"embeddings", Embeddings, `{"model":"m","input":["assistant:Hi","user:x"]}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var s Summary
			if err := s.Parse(tc.e, []byte(tc.body)); err != nil {
				t.Fatalf("Parse(%s): %v", tc.body, err)
			}
			var want []byte
			if tc.prev != "" {
				var prev Summary
				if err := prev.Parse(tc.e, []byte(tc.prev)); err != nil {
					t.Fatalf("Parse(%s): %v", tc.prev, err)
				}
				want = prev.Prompt
			}
			if s.PrevTurn != len(want) || !bytes.HasPrefix(s.Prompt, want) {
				t.Errorf("PrevTurn %d: Prompt[:PrevTurn] of\n%q\nwant %q", s.PrevTurn, s.Prompt[:min(max(s.PrevTurn, 0), len(s.Prompt))], want)
			}
		})
	}
}

func TestParsePrevTurnReuse(t *testing.T) {
	var s Summary
	if err := s.Parse(Chat, []byte(`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}`)); err != nil {
		t.Fatal(err)
	}
	if s.PrevTurn != len("user:a\n") {
		t.Fatalf("PrevTurn %d, want %d", s.PrevTurn, len("user:a\n"))
	}
	for _, tc := range []struct {
		e    Endpoint
		body string
	}{
		{Chat, `{"model":"m","messages":[{"role":"user","content":"a"}]}`},
		{Responses, `{"model":"m","input":"a"}`},
		{Completions, `{"model":"m","prompt":"a"}`},
	} {
		if err := s.Parse(tc.e, []byte(tc.body)); err != nil {
			t.Fatal(err)
		}
		if s.PrevTurn != 0 {
			t.Errorf("Parse(%s) after a body with an answer: PrevTurn %d, want 0", tc.body, s.PrevTurn)
		}
	}
}

// prevTurnReference is the oracle of Summary.PrevTurn, built on encoding/json: the reference prompt of body with
// its conversation cut before the last answer (see PrevTurn), or ok false when body has no answer with some of
// the conversation before it. It assumes the reference accepts body and has no quirk for it (referenceQuirk).
func prevTurnReference(e Endpoint, body []byte) (prev []byte, ok bool, err error) {
	if e != Chat && e < Responses {
		return nil, false, nil
	}
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, false, err
	}
	name := listName(e)
	if e == Chat {
		name = "messages"
	}
	var list []json.RawMessage
	if l := req[name]; isNull(l) || l[0] != '[' {
		return nil, false, nil // no list, or a Responses string input
	} else if err := json.Unmarshal(l, &list); err != nil {
		return nil, false, err
	}
	k, run := -1, false // the start of the last answer; whether a run of model output is open
	for i, it := range list {
		out := isOutputReference(e, it)
		if out && (!run || e != Responses) {
			k = i
		}
		run = out
	}
	if k <= 0 {
		return nil, false, nil
	}
	// The earlier request: the same members (tools, instructions or system) with the conversation before k.
	head := []byte{'{'}
	for key, v := range req {
		if key != name {
			q, _ := json.Marshal(key)
			head = append(append(append(append(head, q...), ':'), v...), ',')
		}
	}
	head = append(head, `"`+name+`":[`...)
	for i, it := range list[:k] {
		if i > 0 {
			head = append(head, ',')
		}
		head = append(head, it...)
	}
	head = append(head, "]}"...)
	prev, err = AppendPromptReference(nil, e, head)
	return prev, true, err
}

// isOutputReference reports whether the conversation item it is model output: a message whose role is
// "assistant", or a Responses item of an output type (isOutputItem).
func isOutputReference(e Endpoint, it json.RawMessage) bool {
	var role, typ string
	if e == Chat {
		var m struct{ Role string } // as the chat reference decodes it
		return json.Unmarshal(it, &m) == nil && m.Role == "assistant"
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(it, &m) != nil || m == nil {
		return false
	}
	if !isMessageItem(e, m["type"]) {
		return json.Unmarshal(m["type"], &typ) == nil && isOutputItem([]byte(typ))
	}
	return !isNull(m["role"]) && json.Unmarshal(m["role"], &role) == nil && role == "assistant"
}
