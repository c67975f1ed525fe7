package openai

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
)

// itemsBody returns a Responses or Messages request of about size bytes: tools and instructions (or system)
// after the conversation, so that Parse must move the prefix in front of it, and turns of typed content parts.
func itemsBody(e Endpoint, size int) []byte {
	var b bytes.Buffer
	list, part, prefix := `"input":[`, "input_text", `"instructions":"You are a helpful assistant.\nAnswer briefly."`
	if e == Messages {
		list, part, prefix = `"max_tokens":512,"messages":[`, "text", `"system":[{"type":"text","text":"You are a helpful assistant.\nAnswer briefly."}]`
	}
	b.WriteString(`{"model":"llama-3.1-8b-instruct","stream":true,"temperature":0.7,` + list)
	turn := strings.Repeat(`Here is some text about the \"gateway\", with a newline\nand an accent: café. `, 4)
	for i := 0; b.Len() < size-300; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"` + role + `","content":[{"type":"` + part + `","text":"` + turn + `"}]}`)
	}
	b.WriteString(`],"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}}],` + prefix + `}`)
	return b.Bytes()
}

func TestParseItemsLarge(t *testing.T) {
	for _, e := range []Endpoint{Responses, Messages} {
		for _, size := range []int{8 << 10, 1 << 20} {
			body := itemsBody(e, size)
			var s Summary
			if err := s.Parse(e, body); err != nil {
				t.Fatal(err)
			}
			want, err := AppendPromptReference(nil, e, body)
			if err != nil || !bytes.Equal(s.Prompt, want) {
				t.Fatalf("%v %d bytes: prompt differs from the reference (%v)", e, size, err)
			}
			if !bytes.HasPrefix(s.Prompt, []byte("tools:")) {
				t.Errorf("%v: prompt starts %.20q", e, s.Prompt)
			}
			if prev, ok, err := prevTurnReference(e, body); err != nil || !ok || s.PrevTurn != len(prev) || !bytes.HasPrefix(s.Prompt, prev) {
				t.Errorf("%v %d bytes: PrevTurn %d, reference %d bytes (%v, %v)", e, size, s.PrevTurn, len(prev), ok, err)
			}
			if n := testing.AllocsPerRun(10, func() { s.Parse(e, body) }); n != 0 {
				t.Errorf("Parse(%v) of %d bytes with a reused Summary: %v allocs, want 0", e, len(body), n)
			}
		}
	}
}

func BenchmarkParseItems(b *testing.B) {
	for _, e := range []Endpoint{Responses, Messages} {
		body := itemsBody(e, 8<<10)
		b.Run(strings.TrimPrefix(e.String(), "/v1/")+"-"+strconv.Itoa(len(body)>>10)+"KB", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			var s Summary
			for b.Loop() {
				if err := s.Parse(e, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
