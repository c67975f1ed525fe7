package proxy

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
)

// decisionFixture is a finished exchange as record sees it: model m routed to the first of m's targets, which
// were all candidates.
func decisionFixture(tb testing.TB, backends int) (*Server, *exchange, *attempt) {
	tb.Helper()
	urls := make([]string, backends)
	for i := range urls {
		urls[i] = fmt.Sprintf("http://127.0.0.1:%d", 1+i)
	}
	snap := snapshotOf(&routing.RoundRobin{}, 2, urls...)
	s := &Server{}
	m := snap.Models["sim-model"]
	ex := &exchange{s: s, routed: routed{model: m, asked: m, class: admission.Critical}}
	ex.cands = append(ex.cands, m.Targets...)
	a := &attempt{target: m.Targets[0]}
	return s, ex, a
}

func TestDecisionRing(t *testing.T) {
	t.Parallel()
	s, ex, a := decisionFixture(t, 10)
	arrival := time.Unix(1_700_000_000, 0)
	for i := range decisionRingSize + 5 {
		ex.arrival = arrival.Add(time.Duration(i) * time.Millisecond)
		a.started = ex.arrival.Add(5 * time.Millisecond)
		ex.firstAt = ex.arrival.Add(40 * time.Millisecond)
		ex.lastTokenAt, ex.tokens = ex.firstAt.Add(90*time.Millisecond), 10
		ex.attempts = 1
		ex.note.dispatched(ex, a)
		code := 200
		if i == decisionRingSize+4 {
			ex.note.failed(fmt.Errorf("admit: %w", shedError{admission.ErrSLO, time.Second}))
			code = 503
		}
		s.rings.record(ex, code, a.target.Backend.Name(), ex.firstAt)
		if ex.note != (decisionNote{}) {
			t.Fatal("record must clear the exchange's note")
		}
	}
	got := s.rings.dec.recent(1000)
	if len(got) != decisionRingSize {
		t.Fatalf("%d decisions, want the last %d", len(got), decisionRingSize)
	}
	newest, oldest := got[0], got[len(got)-1]
	if !newest.Time.Equal(arrival.Add((decisionRingSize+4)*time.Millisecond)) || !oldest.Time.Equal(arrival.Add(5*time.Millisecond)) {
		t.Errorf("newest %v oldest %v", newest.Time, oldest.Time)
	}
	if newest.Shed != admission.ReasonSLO || newest.Status != 503 || got[1].Shed != "" {
		t.Errorf("shed reasons: newest %q (%d), next %q", newest.Shed, newest.Status, got[1].Shed)
	}
	e := got[1]
	if e.Model != "sim-model" || e.Class != "critical" || e.Backend != "b0" || e.Strategy != "test" || e.Attempts != 1 ||
		e.CandidatesTotal != 10 || len(e.Candidates) != maxCandidates || e.Candidates[0].Backend != "b0" || e.Candidates[7].Backend != "b7" {
		t.Errorf("entry %+v", e)
	}
	if float64(e.TTFTMs) != 40 || float64(e.ObservedTTFTMs) != 35 {
		t.Errorf("TTFT %v from arrival, %v from dispatch; want 40 and 35", e.TTFTMs, e.ObservedTTFTMs)
	}
	if got := s.rings.dec.recent(3); len(got) != 3 || got[0].Time != newest.Time {
		t.Errorf("limit 3: %d", len(got))
	}
	// The charts saw them too: the fleet and b0, with TTFT 40 ms and ITL 10 ms.
	pts := s.rings.ts.snapshot(arrival.Unix()+1, 1, 1)
	if len(pts.Series) != 2 || pts.Series[1].Name != "b0" || pts.Series[0].RequestsPerS[0] != decisionRingSize+5 ||
		pts.Series[0].ShedPerS[0] != 1 || pts.Series[1].ShedPerS[0] != 1 {
		t.Errorf("series %+v", pts.Series)
	}
}

// TestDecisionFailedOnlySheds: only admission's refusals with a shed reason are sheds (those
// switchyard_shed_total counts, rate limits included).
func TestDecisionFailedOnlySheds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{shedError{admission.ErrOverloaded, time.Second}, admission.ReasonSaturated},
		{admission.ErrQueueTimeout, admission.ReasonQueueTimeout},
		{admission.ErrRateLimitRequests, admission.ReasonRateLimitRequests},
		{admission.ErrInvalidKey, ""},
		{routing.ErrNoBackend, ""},
		{errors.New("x"), ""},
	} {
		var n decisionNote
		n.failed(tc.err)
		if n.shed != tc.want {
			t.Errorf("%v: shed %q, want %q", tc.err, n.shed, tc.want)
		}
	}
}

// TestDecisionHooksDoNotAllocate pins the status page's cost on the request path: noting a dispatch and
// recording a finished request allocate nothing (STYLE.md, habit 9).
func TestDecisionHooksDoNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	s, ex, a := decisionFixture(t, 8)
	now := time.Now()
	ex.arrival, a.started, ex.firstAt = now, now, now.Add(time.Millisecond)
	var shed error = shedError{admission.ErrSLO, time.Second} // Server.fail has it as an error already
	if n := testing.AllocsPerRun(1000, func() {
		ex.note.dispatched(ex, a)
		ex.note.failed(shed)
		s.rings.record(ex, 200, "b0", now)
	}); n != 0 {
		t.Errorf("%v allocations per request", n)
	}
}

// BenchmarkStatusHooks measures the status page's hooks per request: prepare's note (8 candidates, each
// with a TTFT prediction) and record's update of the rings.
func BenchmarkStatusHooks(b *testing.B) {
	s, ex, a := decisionFixture(b, 8)
	now := time.Now()
	ex.arrival, a.started, ex.firstAt, ex.lastTokenAt, ex.tokens = now, now, now.Add(30*time.Millisecond), now.Add(time.Second), 20
	b.Run("dispatched", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ex.note.dispatched(ex, a)
		}
	})
	b.Run("record", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s.rings.record(ex, 200, "b0", now)
		}
	})
	b.Run("record-parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			_, ex, _ := decisionFixture(b, 8)
			ex.s = s
			ex.arrival, ex.firstAt, ex.lastTokenAt, ex.tokens = now, now.Add(30*time.Millisecond), now.Add(time.Second), 20
			for pb.Next() {
				s.rings.record(ex, 200, "b0", now)
			}
		})
	})
}
