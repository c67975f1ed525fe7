package proxy

import (
	"strconv"
	"testing"

	"github.com/switchyard/switchyard/openai"
)

// TestCodeLabel: the status label is the code's decimal form, and a valid status costs no allocation.
func TestCodeLabel(t *testing.T) {
	for _, code := range []int{0, 99, 200, 429, 499, 502, 599, 600, 1000, -1} {
		if got, want := codeLabel(code), strconv.Itoa(code); got != want {
			t.Errorf("codeLabel(%d) = %q, want %q", code, got, want)
		}
	}
	var sink string
	if n := testing.AllocsPerRun(100, func() { sink = codeLabel(503) }); n != 0 {
		t.Fatalf("codeLabel(503) allocates %.0f times", n)
	}
	_ = sink
}

// TestStreamAssemblyBound: a streamed answer assembled for the response cache is bounded by the largest entry
// the cache keeps, so an open stream holds no more of its answer than could be kept.
func TestStreamAssemblyBound(t *testing.T) {
	for _, tc := range []struct {
		name            string
		maxResp, maxEnt int
		want            int
	}{
		{"entry bound below the answer bound", 64 << 20, 1 << 20, 1 << 20},
		{"answer bound below the entry bound", 1 << 20, 4 << 20, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ex := &exchange{s: &Server{opts: Options{MaxResponseBytes: tc.maxResp}}}
			ex.asked = &Model{Cache: &ResponseCache{MaxEntryBytes: tc.maxEnt}}
			ex.rc.store, ex.sum.Stream = true, true
			ex.replay = openai.NewEventReader(nil, maxEventBytes)
			ex.cur = &attempt{}
			ex.startReplay()
			if ex.asm.Limit != tc.want {
				t.Fatalf("assembler limit %d, want %d", ex.asm.Limit, tc.want)
			}
		})
	}
}
