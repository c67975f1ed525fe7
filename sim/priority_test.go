package sim

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"
)

// submitPriority runs the engine until at, then submits a request of the given priority.
func (h *harness) submitPriority(at time.Duration, promptTokens, maxTokens, priority int) *seq {
	h.t.Helper()
	h.runUntil(at)
	s := newSeq(promptTokens, maxTokens, nil)
	s.priority = priority
	if err := h.e.submit(s); err != nil {
		h.t.Fatal(err)
	}
	h.seqs = append(h.seqs, s)
	return s
}

// TestPriorityWaitingCriticalGoesFirst: with both seats taken and standard requests waiting, a critical request
// (a lower priority value) that arrives last runs at the first free seat under the priority policy, and last
// under fcfs.
func TestPriorityWaitingCriticalGoesFirst(t *testing.T) {
	for _, tc := range []struct {
		policy    string
		wantFirst bool
	}{{PolicyPriority, true}, {PolicyFCFS, false}} {
		t.Run(tc.policy, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.MaxNumSeqs, cfg.SchedulingPolicy, cfg.Overhead = 2, tc.policy, 0
			h := newHarness(t, cfg)
			h.submitPriority(0, 16, 10, 0) // the two seats, freed after 10 tokens
			h.submitPriority(0, 16, 50, 0)
			var standard []*seq
			for range 3 {
				standard = append(standard, h.submitPriority(time.Millisecond, 16, 5, 0))
			}
			crit := h.submitPriority(2*time.Millisecond, 16, 5, -1)
			h.runIdle()
			first := true
			for _, s := range standard {
				if h.ttft(s)+s.arrival.Sub(t0) < h.ttft(crit)+crit.arrival.Sub(t0) {
					first = false
				}
			}
			if first != tc.wantFirst {
				t.Errorf("critical first token at %v, standard ones at %v %v %v: first = %v, want %v",
					h.times[crit][0], h.times[standard[0]][0], h.times[standard[1]][0], h.times[standard[2]][0],
					first, tc.wantFirst)
			}
		})
	}
}

// TestPriorityVictimAndQueueOrder: the priority policy preempts the running sequence with the highest priority
// value, the latest arrival on a tie, and queues waiting ones by (priority, arrival), preempted ones included;
// fcfs preempts the newest and puts it back at the front.
func TestPriorityVictimAndQueueOrder(t *testing.T) {
	mk := func(priority int, order uint64) *seq {
		s := newSeq(16, 4, nil)
		s.priority, s.order = priority, order
		return s
	}
	for _, tc := range []struct {
		policy      string
		wantVictim  int
		wantWaiting []uint64 // orders, head first, after the victim is preempted
	}{
		{PolicyPriority, 1, []uint64{5, 6, 2, 7}}, // (-1,5) (0,6) (2,2) (3,7)
		{PolicyFCFS, 2, []uint64{3, 6, 5, 7}},     // the victim at the front, the rest in arrival order
	} {
		t.Run(tc.policy, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.SchedulingPolicy = tc.policy
			e := newEngine(cfg, &vclock{t: t0})
			e.running = []*seq{mk(0, 1), mk(2, 2), mk(-1, 3)}
			for _, w := range []*seq{mk(0, 6), mk(-1, 5), mk(3, 7)} {
				e.enqueue(w, false)
			}
			v := e.victim()
			if v != tc.wantVictim {
				t.Fatalf("victim running[%d], want running[%d]", v, tc.wantVictim)
			}
			e.preempt(v)
			var got []uint64
			for _, w := range e.waiting {
				got = append(got, w.order)
			}
			if len(got) != len(tc.wantWaiting) {
				t.Fatalf("waiting %v, want %v", got, tc.wantWaiting)
			}
			for i := range got {
				if got[i] != tc.wantWaiting[i] {
					t.Fatalf("waiting %v, want %v", got, tc.wantWaiting)
				}
			}
		})
	}
}

// TestPriorityRefusedUnderFCFS: as vLLM, a request with a priority needs the priority policy.
func TestPriorityRefusedUnderFCFS(t *testing.T) {
	for _, tc := range []struct {
		policy string
		want   int
	}{{PolicyFCFS, http.StatusBadRequest}, {PolicyPriority, http.StatusOK}} {
		t.Run(tc.policy, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.SchedulingPolicy, cfg.ITL = tc.policy, time.Millisecond
			b, err := Start(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			resp, err := http.Post(b.URL()+"/v1/chat/completions", "application/json", bytes.NewBufferString(
				`{"model":"sim-model","max_tokens":2,"priority":-1,"messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.want)
			}
		})
	}
}

// TestPriorityPreemptsTheLowest: when the KV cache runs out, the priority policy preempts the running sequence
// with the highest priority value even if it is the older one (already scheduled in the step: its tokens go
// back to the budget), so the urgent one finishes first; fcfs preempts the newest.
func TestPriorityPreemptsTheLowest(t *testing.T) {
	for _, tc := range []struct {
		policy        string
		wantUrgentWin bool
	}{{PolicyPriority, true}, {PolicyFCFS, false}} {
		t.Run(tc.policy, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.SchedulingPolicy, cfg.KVBlocks, cfg.Overhead = tc.policy, 8, 0
			h := newHarness(t, cfg)
			low := h.submitPriority(0, 16, 100, 1)
			urgent := h.submitPriority(time.Millisecond, 16, 100, 0)
			h.runIdle()
			if metricValue(t, h.e.m.preemptions) == 0 {
				t.Fatal("no preemption: the KV cache was not short")
			}
			lowEnd, urgentEnd := h.times[low][len(h.times[low])-1], h.times[urgent][len(h.times[urgent])-1]
			if got := urgentEnd < lowEnd; got != tc.wantUrgentWin {
				t.Errorf("urgent finished at %v, low at %v: urgent first = %v, want %v", urgentEnd, lowEnd, got,
					tc.wantUrgentWin)
			}
		})
	}
}
