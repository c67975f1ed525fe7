package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestBest(t *testing.T) {
	p := func(ttft float64, cached int) *Prediction { return &Prediction{TTFTMillis: ttft, CachedTokens: cached} }
	for _, tc := range []struct {
		name  string
		preds []*Prediction
		want  int
	}{
		{"none", nil, -1},
		{"all failed", []*Prediction{nil, nil}, -1},
		{"lowest ttft", []*Prediction{p(30, 0), p(10, 0), p(20, 500)}, 1},
		{"tie goes to the most cached", []*Prediction{p(10, 16), p(10, 512), p(10, 64)}, 1},
		{"full tie goes to the first", []*Prediction{p(10, 16), p(10, 16)}, 0},
		{"a failed backend is skipped", []*Prediction{nil, p(50, 0), p(40, 0)}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Best(tc.preds); got != tc.want {
				t.Errorf("Best = %d, want %d", got, tc.want)
			}
		})
	}
}

// standIn is a loopback stand-in for a simulator: /sim/predict answers the prediction it is given (or a status),
// recording the bodies; the completion endpoints answer a one-chunk stream naming the backend.
type standIn struct {
	name   string
	pred   Prediction
	status atomic.Int32 // of /sim/predict; 0 = 200
	mu     sync.Mutex
	bodies [][]byte
	served int
	srv    *httptest.Server
}

func newStandIn(t *testing.T, name string, ttft float64, cached, status int) *standIn {
	s := &standIn{name: name, pred: Prediction{Backend: name, TTFTMillis: ttft, CachedTokens: cached}}
	s.status.Store(int32(status))
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/sim/predict":
			s.mu.Lock()
			s.bodies = append(s.bodies, body)
			s.mu.Unlock()
			if st := int(s.status.Load()); st != 0 {
				http.Error(w, `{"error":"down"}`, st)
				return
			}
			_ = json.NewEncoder(w).Encode(s.pred)
		case "/v1/chat/completions":
			s.mu.Lock()
			s.served++
			s.mu.Unlock()
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("X-Sim-Backend", s.name)
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func TestOraclePick(t *testing.T) {
	slow := newStandIn(t, "slow", 80, 0, 0)
	down := newStandIn(t, "down", 1, 4096, http.StatusServiceUnavailable)
	fast := newStandIn(t, "fast", 20, 0, 0)
	cached := newStandIn(t, "cached", 20, 512, 0)
	backends := []FleetBackend{{Name: "slow", URL: slow.srv.URL}, {Name: "down", URL: down.srv.URL},
		{Name: "fast", URL: fast.srv.URL}, {Name: "cached", URL: cached.srv.URL}}
	o := NewOracle(backends, time.Second)
	it := &Item{Body: []byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`)}
	got, err := o.Pick(context.Background(), it)
	if err != nil {
		t.Fatal(err)
	}
	if got != cached.srv.URL {
		t.Errorf("picked %s, want the cached backend %s (lowest TTFT, tie on cached tokens; down skipped)", got, cached.srv.URL)
	}
	for _, s := range []*standIn{slow, down, fast, cached} {
		s.mu.Lock()
		if len(s.bodies) != 1 || !bytes.Equal(s.bodies[0], it.Body) {
			t.Errorf("%s got predict bodies %q, want the request's body once", s.name, s.bodies)
		}
		s.mu.Unlock()
	}
	// Every backend failing is an error, not a guess.
	o = NewOracle([]FleetBackend{{Name: "down", URL: down.srv.URL}}, time.Second)
	if _, err := o.Pick(context.Background(), it); !errors.Is(err, ErrNoPrediction) {
		t.Errorf("all down: err %v, want ErrNoPrediction", err)
	}
}

// Run with the oracle as its Picker sends every request to the picked backend and records the pick apart
// from the latencies; a failed pick is an error sample that was never sent.
func TestRunWithPicker(t *testing.T) {
	a := newStandIn(t, "a", 50, 0, 0)
	b := newStandIn(t, "b", 10, 0, 0)
	w := testWorkload(t, "arrival: {process: fixed, rate: 50}\nduration: 200ms\nprompt: {dist: fixed, value: 8}\noutput: {dist: fixed, value: 1}\n")
	plan, err := NewPlan(w)
	if err != nil {
		t.Fatal(err)
	}
	o := NewOracle([]FleetBackend{{Name: "a", URL: a.srv.URL}, {Name: "b", URL: b.srv.URL}}, time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := Run(ctx, RunConfig{Name: "oracle", BaseURL: "oracle", Plan: plan, Picker: o, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r := Summary(res, "oracle", SLO{})
	a.mu.Lock()
	aServed := a.served
	a.mu.Unlock()
	if r.OK != len(plan.Items) || r.Backends["b"] != len(plan.Items) || aServed != 0 {
		t.Fatalf("ok %d of %d, backends %v, a served %d: want all on b", r.OK, len(plan.Items), r.Backends, aServed)
	}
	if r.Pick == nil || r.Pick.N != len(plan.Items) {
		t.Errorf("pick quantiles %+v, want one per request", r.Pick)
	}
	for _, s := range res.Samples {
		if s.Pick <= 0 {
			t.Errorf("sample %d: no pick time", s.Index)
		}
	}
	b.status.Store(http.StatusServiceUnavailable)
	a.status.Store(http.StatusServiceUnavailable)
	res, err = Run(ctx, RunConfig{Name: "oracle", BaseURL: "oracle", Plan: plan, Picker: o, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r = Summary(res, "oracle", SLO{})
	if r.Errors[ErrPick] != len(plan.Items) || r.Sent != 0 {
		t.Errorf("every pick failing: errors %v, sent %d; want all %s and none sent", r.Errors, r.Sent, ErrPick)
	}
}
