package routing

import (
	"errors"
	"testing"
)

func targets(names ...string) []Target {
	ts := make([]Target, len(names))
	for i, n := range names {
		ts[i] = Target{Backend: NewBackend(&BackendConfig{Name: n, URL: "http://" + n}), Model: "m"}
	}
	return ts
}

func TestRoundRobinCyclesOverHealthy(t *testing.T) {
	ts := targets("a", "b", "c")
	ts[1].Backend.SetHealthy(false)
	var rr RoundRobin
	var got []string
	for range 4 {
		p, err := rr.Pick(&Request{}, ts)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, p.Backend.Name())
	}
	want := []string{"a", "c", "a", "c"}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("picks = %v, want %v", got, want)
		}
	}
}

func TestStrategiesWithNoHealthyBackend(t *testing.T) {
	for _, tc := range []struct {
		name string
		s    Strategy
	}{
		{"round_robin", &RoundRobin{}},
		{"least_request", LeastRequest{}},
		{"random", Random{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := targets("a", "b")
			for _, x := range ts {
				x.Backend.SetHealthy(false)
			}
			if _, err := tc.s.Pick(&Request{}, ts); !errors.Is(err, ErrNoBackend) {
				t.Fatalf("err = %v, want ErrNoBackend", err)
			}
			if _, err := tc.s.Pick(&Request{}, nil); !errors.Is(err, ErrNoBackend) {
				t.Fatalf("no targets: err = %v, want ErrNoBackend", err)
			}
		})
	}
}

func TestLeastRequestPicksFewestInflightPerWeight(t *testing.T) {
	ts := targets("a", "b", "c")
	a := ts[0].Backend.Begin(10)
	ts[0].Backend.Begin(10)
	ts[1].Backend.Begin(10)
	ts[2].Backend.Config().Weight = 4 // 2 in flight / weight 4 beats 1 in flight / weight 1
	ts[2].Backend.Begin(10)
	ts[2].Backend.Begin(10)
	for range 20 {
		p, _ := LeastRequest{}.Pick(&Request{}, ts)
		if p.Backend.Name() != "c" {
			t.Fatalf("picked %s, want c", p.Backend.Name())
		}
	}
	a.End(false)
	if got := ts[0].Backend.Inflight(); got != 1 {
		t.Fatalf("inflight after End = %d, want 1", got)
	}
}

func TestLeastRequestSpreadsTies(t *testing.T) {
	ts := targets("a", "b", "c")
	seen := map[string]int{}
	for range 300 {
		p, _ := LeastRequest{}.Pick(&Request{}, ts)
		seen[p.Backend.Name()]++
	}
	for _, n := range []string{"a", "b", "c"} {
		if seen[n] < 50 {
			t.Fatalf("tie-break is not spreading: %v", seen)
		}
	}
}

func TestRandomFollowsWeights(t *testing.T) {
	ts := targets("a", "b")
	ts[1].Backend.Config().Weight = 3
	seen := map[string]int{}
	for range 4000 {
		p, _ := Random{}.Pick(&Request{}, ts)
		seen[p.Backend.Name()]++
	}
	if share := float64(seen["b"]) / 4000; share < 0.70 || share > 0.80 {
		t.Fatalf("weight-3 backend got share %.2f, want about 0.75", share)
	}
}

func TestAttemptAccounting(t *testing.T) {
	b := NewBackend(&BackendConfig{Name: "a"})
	a := b.Begin(100)
	if r, tok := b.Prefilling(); r != 1 || tok != 100 {
		t.Fatalf("prefilling = %d/%d, want 1/100", r, tok)
	}
	a.FirstToken()
	a.FirstToken() // idempotent
	if r, tok := b.Prefilling(); r != 0 || tok != 0 || b.Decoding() != 1 {
		t.Fatalf("after first token: prefilling %d/%d decoding %d", r, tok, b.Decoding())
	}
	a.End(true)
	a.End(true) // idempotent
	if b.Inflight() != 0 || b.Decoding() != 0 || b.Failures() != 1 {
		t.Fatalf("after end: inflight %d decoding %d failures %d", b.Inflight(), b.Decoding(), b.Failures())
	}
	c := b.Begin(50)
	c.End(false) // ended before the first token
	if r, tok := b.Prefilling(); r != 0 || tok != 0 {
		t.Fatalf("after early end: prefilling %d/%d", r, tok)
	}
}

func TestRegistryKeepsBackendsAcrossSync(t *testing.T) {
	r := NewRegistry()
	first := r.Sync([]*BackendConfig{{Name: "a", URL: "http://a"}, {Name: "b", URL: "http://b"}})
	first[0].Begin(1)
	second := r.Sync([]*BackendConfig{{Name: "a", URL: "http://a", Weight: 2}, {Name: "b", URL: "http://b2"}})
	if second[0] != first[0] {
		t.Fatal("same name and URL must keep the same *Backend")
	}
	if second[0].Config().Weight != 2 || second[0].Inflight() != 1 {
		t.Fatalf("kept backend: weight %v inflight %d", second[0].Config().Weight, second[0].Inflight())
	}
	if second[1] == first[1] {
		t.Fatal("a changed URL must give a new *Backend")
	}
}
