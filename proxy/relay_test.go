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

// writes records each write the relay makes to the client.
type writes [][]byte

func (w *writes) Write(b []byte) (int, error) {
	*w = append(*w, append([]byte(nil), b...))
	return len(b), nil
}

// TestEmitBatched: events already read when one is relayed go out in one write with it; the last of a burst
// is written at once, and the batch buffer is given back.
func TestEmitBatched(t *testing.T) {
	var got writes
	ex := &exchange{}
	ex.wd = &watchdog{w: &got}
	ex.replay = openai.NewEventReader(nil, maxEventBytes)
	ex.replay.ResetBytes([]byte("data: a\n\n: ping\n\ndata: c\n\n"))
	ex.replaying = true
	for i := 0; ; i++ {
		ev, err := ex.replay.Next()
		if err != nil {
			break
		}
		if err := ex.emitBatched(ev.Raw); err != nil {
			t.Fatal(err)
		}
		if last := i == 2; (len(got) > 0) != last {
			t.Fatalf("after event %d: %d writes, want one only after the last event of the burst", i, len(got))
		}
	}
	if len(got) != 1 || string(got[0]) != "data: a\n\n: ping\n\ndata: c\n\n" {
		t.Fatalf("writes %q, want the three events in one", got)
	}
	if ex.batch != nil {
		t.Fatal("the batch buffer is kept after the burst")
	}

	// emit (an error event, a panic's end) writes what is batched first, in the same write.
	got = nil
	ex.replay.ResetBytes([]byte("data: a\n\ndata: b\n\n"))
	ev, _ := ex.replay.Next()
	if err := ex.emitBatched(ev.Raw); err != nil || len(got) != 0 {
		t.Fatalf("the first of two events: %v, %d writes", err, len(got))
	}
	if err := ex.emit([]byte("data: [DONE]\n\n")); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || string(got[0]) != "data: a\n\ndata: [DONE]\n\n" {
		t.Fatalf("writes %q, want the batched event and [DONE] in one", got)
	}
	if ex.sent != int64(len("data: a\n\n: ping\n\ndata: c\n\n")+len("data: a\n\ndata: [DONE]\n\n")) {
		t.Fatalf("sent %d bytes, counted %d", len(got[0]), ex.sent)
	}
}

// TestEndBurst: an event that step drops without a write (the usage chunk the client did not ask for) can end
// a burst; the relay then writes the batch before it reads on.
func TestEndBurst(t *testing.T) {
	var got writes
	ex := &exchange{}
	ex.wd = &watchdog{w: &got}
	ex.replay = openai.NewEventReader(nil, maxEventBytes)
	ex.replay.ResetBytes([]byte("data: a\n\ndata: {\"usage\":{}}\n\n"))
	ex.replaying = true
	ev, _ := ex.replay.Next()
	if err := ex.emitBatched(ev.Raw); err != nil || len(got) != 0 {
		t.Fatalf("the first event of a burst: %v, %d writes", err, len(got))
	}
	if err := ex.endBurst(); err != nil || len(got) != 0 {
		t.Fatalf("endBurst with the next event ready: %v, %d writes", err, len(got))
	}
	_, _ = ex.replay.Next() // dropped: no write of its own
	if err := ex.endBurst(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || string(got[0]) != "data: a\n\n" || ex.batch != nil {
		t.Fatalf("writes %q (batch held: %v), want the first event written once the burst ended", got, ex.batch != nil)
	}
}
