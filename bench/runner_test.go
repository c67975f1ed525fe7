package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRunOpenLoop holds every response for at least 3 seconds, and until every request of the run has arrived.
// At 25 requests/s for 2 seconds, a closed-loop generator (or one whose sends queue behind slow answers) could
// never deliver all 49 requests while no response has come back: the run would stall until the server's 20s
// deadline. The open-loop runner must put each request on the wire at its scheduled time: checked on the server
// side, where each arrival is recorded against the plan.
func TestRunOpenLoop(t *testing.T) {
	const n = 49 // 40ms apart, from 40ms to 1960ms
	var (
		mu       sync.Mutex
		arrivals = map[string]time.Time{}
		all      = make(chan struct{})
		early    atomic.Int32 // responses released before every request had arrived
	)
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals[r.Header.Get("X-Test-Seq")] = time.Now()
		if len(arrivals) == n {
			close(all)
		}
		mu.Unlock()
		hold := time.NewTimer(3 * time.Second)
		defer hold.Stop()
		select {
		case <-hold.C:
		case <-r.Context().Done():
			return
		}
		select {
		case <-all:
		case <-time.After(20 * time.Second):
			early.Add(1)
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer ts.Close()

	w := testWorkload(t, `
arrival: {process: fixed, rate: 25}
duration: 2s
prompt: {dist: fixed, value: 8}
output: {dist: fixed, value: 1}
`)
	plan, err := NewPlan(w)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Items) != n {
		t.Fatalf("plan has %d items, want %d", len(plan.Items), n)
	}
	// Tag each request so the server can tell which scheduled item it is.
	for i := range plan.Items {
		plan.Items[i].Body = fmt.Appendf(nil, `{"seq":%d}`, i)
	}
	ts.Config.Handler = tagHandler(ts.Config.Handler)
	res, err := Run(context.Background(), RunConfig{Name: "stall", BaseURL: ts.URL, Plan: plan, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if e := early.Load(); e > 0 {
		t.Fatalf("%d responses had to be released before every request had arrived: the sends waited for answers", e)
	}
	mu.Lock()
	defer mu.Unlock()
	var lateness []time.Duration
	for i, it := range plan.Items {
		at, ok := arrivals[fmt.Sprint(i)]
		if !ok {
			t.Fatalf("request %d never arrived", i)
		}
		lateness = append(lateness, at.Sub(res.Start.Add(it.At)))
		if s := res.Samples[i]; s.Err != "" {
			t.Errorf("request %d: %s %s", i, s.Err, s.ErrMsg)
		}
	}
	slices.Sort(lateness)
	// On schedule: generous bounds for a shared 2-core machine under -race, where a process can be descheduled
	// for a few hundred milliseconds, and still well below the 3s hold that a closed loop would add.
	if p50, worst := lateness[len(lateness)/2], lateness[len(lateness)-1]; p50 > 250*time.Millisecond || worst > 2500*time.Millisecond {
		t.Errorf("sends were late against the schedule: p50 %v, max %v", p50, worst)
	}
	// Every response took >= 3s, and it must show: latency counts from the scheduled time.
	for i, s := range res.Samples {
		if s.E2E < 3*time.Second {
			t.Errorf("request %d: e2e %v, but the server held it 3s", i, s.E2E)
		}
	}
	// The report's own lateness figure must agree with what the server saw.
	r := Summary(res, ts.URL, SLO{})
	if r.SendLate.N != n || time.Duration(r.SendLate.Max*float64(time.Millisecond)) > lateness[len(lateness)-1] {
		t.Errorf("reported send lateness %+v, the server saw at most %v", r.SendLate, lateness[len(lateness)-1])
	}
}

// tagHandler copies the "seq" of a {"seq":N} body into the X-Test-Seq header for the wrapped handler.
func tagHandler(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n int
		if _, err := fmt.Fscanf(r.Body, `{"seq":%d}`, &n); err == nil {
			r.Header.Set("X-Test-Seq", fmt.Sprint(n))
		}
		h.ServeHTTP(w, r)
	})
}

// TestLateSendCounts checks the coordinated-omission rule itself: a request sent late is measured from its
// scheduled time, and its lateness is recorded.
func TestLateSendCounts(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer ts.Close()
	c := NewClient(ts.URL, 5*time.Second, nil)
	defer c.Close()
	scheduled := time.Now().Add(-200 * time.Millisecond) // the scheduler fell 200ms behind
	s := c.Do(context.Background(), testItem(true), scheduled, scheduled)
	if s.Err != "" || s.Late < 200*time.Millisecond || s.TTFT < s.Late || s.E2E < s.TTFT {
		t.Fatalf("late %v ttft %v e2e %v err %q", s.Late, s.TTFT, s.E2E, s.Err)
	}
}

func TestRunSessionsWaitForAnswers(t *testing.T) {
	var mu sync.Mutex
	var order []string
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		order = append(order, "start")
		mu.Unlock()
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		order = append(order, "end")
		mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer ts.Close()
	w := testWorkload(t, `
arrival: {process: fixed, rate: 20}
duration: 200ms
prompt: {dist: fixed, value: 4}
output: {dist: fixed, value: 2}
sessions: {share: 1, users: 1, turns: {dist: fixed, value: 10}}
`)
	plan, err := NewPlan(w)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Items) != 3 {
		t.Fatalf("%d items, want 3", len(plan.Items))
	}
	res, err := Run(context.Background(), RunConfig{BaseURL: ts.URL, Plan: plan})
	if err != nil {
		t.Fatal(err)
	}
	// One user: every turn waits for the previous answer, so requests never overlap.
	want := []string{"start", "end", "start", "end", "start", "end"}
	if !slices.Equal(order, want) {
		t.Fatalf("server saw %v, want %v", order, want)
	}
	for i, s := range res.Samples[1:] {
		if s.SessionWait < 150*time.Millisecond {
			t.Errorf("turn %d waited %v for its previous answer; the server held it 300ms", i+1, s.SessionWait)
		}
	}
}

func TestRunActionsAndCancel(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// With the body read, the server watches the connection and cancels r's context when the client leaves.
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done()
	}))
	defer ts.Close()
	w := testWorkload(t, "arrival: {process: fixed, rate: 10}\nduration: 5s\nprompt: {dist: fixed, value: 1}\noutput: {dist: fixed, value: 1}\n")
	plan, err := NewPlan(w)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	fired := make(chan struct{})
	start := time.Now()
	res, err := Run(ctx, RunConfig{BaseURL: ts.URL, Plan: plan, Actions: []Action{
		{At: 300 * time.Millisecond, Label: "stop", Do: func(context.Context) error { close(fired); cancel(); return nil }},
	}})
	if err == nil {
		t.Fatal("Run returned no error after its context was cancelled")
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("Run took %v to stop after cancel", took)
	}
	if len(res.Events) != 1 || res.Events[0].Label != "stop" || res.Events[0].At < 300*time.Millisecond {
		t.Errorf("events %+v", res.Events)
	}
	canceled := 0
	for _, s := range res.Samples {
		if s.Err == ErrCanceled {
			canceled++
		}
	}
	if canceled != len(plan.Items) {
		t.Errorf("%d of %d requests marked canceled", canceled, len(plan.Items))
	}
}
