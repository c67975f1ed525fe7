package openai

import (
	"strconv"
	"testing"
)

// Benchmarks of the request path. Run with
//
//	go test -run '^$' -bench . -benchmem ./openai/

func BenchmarkParse(b *testing.B) {
	for _, size := range []int{8 << 10, 1 << 20} {
		body := chatBody(size)
		b.Run(strconv.Itoa(size>>10)+"KB", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			var s Summary
			for b.Loop() {
				if err := s.Parse(Chat, body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkParseManyKeys parses a small chat body with the many top-level sampling parameters vLLM clients send:
// the cost of matching each key against the members Parse reads.
func BenchmarkParseManyKeys(b *testing.B) {
	body := manyKeysBody()
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	var s Summary
	for b.Loop() {
		if err := s.Parse(Chat, body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendPromptReference is the encoding/json baseline for BenchmarkParse.
func BenchmarkAppendPromptReference(b *testing.B) {
	for _, size := range []int{8 << 10, 1 << 20} {
		body := chatBody(size)
		b.Run(strconv.Itoa(size>>10)+"KB", func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			var dst []byte
			for b.Loop() {
				dst, _ = AppendPromptReference(dst[:0], Chat, body)
			}
		})
	}
}

func BenchmarkAppendUpstreamBody(b *testing.B) {
	body := chatBody(8 << 10)
	var s Summary
	if err := s.Parse(Chat, body); err != nil {
		b.Fatal(err)
	}
	dst := make([]byte, 0, 2*len(body))
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		dst = AppendUpstreamBody(dst[:0], body, &s, []byte("llama-3.1-8b-instruct-awq"), true)
	}
}

var benchChunk = []byte(`{"id":"chatcmpl-7f3a","object":"chat.completion.chunk","created":1718000000,"model":"llama-3.1-8b-instruct",` +
	`"choices":[{"index":0,"delta":{"content":" token"},"logprobs":null,"finish_reason":null}]}`)

func BenchmarkEventReaderNext(b *testing.B) {
	stream := []byte("data: " + string(benchChunk) + "\n\n")
	er := NewEventReader(&cycleReader{data: stream}, 0)
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for b.Loop() {
		if _, err := er.Next(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkInspectChunk(b *testing.B) {
	var ci ChunkInfo
	b.ReportAllocs()
	b.SetBytes(int64(len(benchChunk)))
	for b.Loop() {
		if err := InspectChunk(benchChunk, &ci); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAssemblerAdd(b *testing.B) {
	var a Assembler
	a.Reset(Chat)
	b.ReportAllocs()
	b.SetBytes(int64(len(benchChunk)))
	n := 0
	for b.Loop() {
		if n++; n%1000 == 0 {
			a.Reset(Chat) // a 1,000-token answer, then the next stream
		}
		if err := a.Add(benchChunk); err != nil {
			b.Fatal(err)
		}
	}
}
