package routing

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestJSONFieldPaths(t *testing.T) {
	for _, bad := range []string{"", ".", "a..b", "a[]]", "[]", "a[0]", "a.b.c.d.e.f.g.h.i"} {
		if _, err := ParseJSONField(bad); err == nil {
			t.Errorf("ParseJSONField(%q) accepted", bad)
		}
	}
	doc := func(s string) any {
		t.Helper()
		d := json.NewDecoder(strings.NewReader(s))
		d.UseNumber()
		var v any
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		path, doc string
		want      float64
		ok        bool
	}{
		{"a", `{"a":12}`, 12, true},
		{"a.b", `{"a":{"b":3.5}}`, 3.5, true},
		{"r[].n", `{"r":[{"n":48},{"n":48},{"n":32}]}`, 128, true},
		{"r[].n", `{"r":[{"n":48},{"m":48}]}`, 0, false}, // a rank without it: the sum would understate
		{"r[].n", `{"r":[]}`, 0, false},
		{"r[].n", `{"r":{"n":1}}`, 0, false},
		{"a", `{"a":null}`, 0, false},
		{"a", `{"a":"128"}`, 0, false},
		{"a", `{"a":true}`, 0, false},
		{"a", `{"a":{"b":1}}`, 0, false},
		{"a", `{"a":1e400}`, 0, false}, // not a finite float64
		{"a", `[1,2]`, 0, false},
		{"a.b", `{"a":7}`, 0, false},
	} {
		f, err := ParseJSONField(tc.path)
		if err != nil {
			t.Fatal(err)
		}
		if got, ok := f.value(doc(tc.doc)); got != tc.want || ok != tc.ok {
			t.Errorf("%s in %s = %v, %v; want %v, %v", tc.path, tc.doc, got, ok, tc.want, tc.ok)
		}
	}
	// firstPositive skips absent, zero and negative figures, and bounds what it returns.
	fs := []JSONField{mustField("x"), mustField("y"), mustField("z")}
	if n, ok := firstPositive(doc(`{"x":0,"y":-4,"z":64}`), fs); n != 64 || !ok {
		t.Errorf("firstPositive = %d, %v", n, ok)
	}
	if n, _ := firstPositive(doc(`{"x":1e300}`), fs); n != maxEngineLimit {
		t.Errorf("firstPositive of 1e300 = %d", n)
	}
	if _, ok := firstPositive(doc(`{"x":0.5}`), fs); ok {
		t.Error("half a seat is a seat")
	}
}

// infoEngine serves /metrics and info documents whose bodies and statuses a test changes, and counts reads.
type infoEngine struct {
	mu      sync.Mutex
	docs    map[string]string // path -> body (200)
	status  map[string]int    // path -> status other than 200
	reads   map[string]int
	metrics string
	srv     *httptest.Server
}

func newInfoEngine(t *testing.T, metrics string) *infoEngine {
	e := &infoEngine{docs: map[string]string{}, status: map[string]int{}, reads: map[string]int{}}
	e.metrics = metrics
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		if r.URL.Path == "/metrics" {
			m := e.metrics
			e.mu.Unlock()
			_, _ = w.Write([]byte(m))
			return
		}
		e.reads[r.URL.Path]++
		body, ok := e.docs[r.URL.Path]
		st := e.status[r.URL.Path]
		e.mu.Unlock()
		switch {
		case st != 0:
			w.WriteHeader(st)
		case ok:
			_, _ = w.Write([]byte(body))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *infoEngine) set(path, body string, status int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.docs[path], e.status[path] = body, status
}

func (e *infoEngine) read(path string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reads[path]
}

const sglangMetrics = "sglang:num_running_reqs 3\nsglang:num_queue_reqs 0\nprocess_start_time_seconds 100\n"

func sglangInfo(perRank ...int) string {
	var states []string
	for _, n := range perRank {
		states = append(states, `{"effective_max_running_requests_per_dp":`+itoa(n)+`}`)
	}
	return `{"max_running_requests":null,"internal_states":[` + strings.Join(states, ",") + `]}`
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// settled scrapes, waits for the read of the info document the scrape may have started (it runs beside the
// scrapes), and scrapes again at the same instant, which takes the read's result.
func settled(t *testing.T, s *scraper) {
	t.Helper()
	if err := s.scrape(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for s.infoBusy.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the info document's read did not finish")
		}
		time.Sleep(time.Millisecond)
	}
	if err := s.scrape(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestEngineInfoSchedule(t *testing.T) {
	e := newInfoEngine(t, sglangMetrics)
	e.set("/server_info", sglangInfo(64), 0) // a newer SGLang: /get_server_info is gone
	s, b, clk := scraperFor(t, e.srv.URL, EngineSGLang)
	// to scrapes once a second until the virtual clock is at second sec (the first call scrapes at 0).
	now := -1
	to := func(sec int) {
		t.Helper()
		for ; now < sec; now++ {
			if now >= 0 {
				clk.Advance(time.Second)
			}
			settled(t, s)
		}
		now = sec
	}
	seats := func() int { n, _, _, _ := b.EngineBatch(); return n }
	interval, retry := int(InfoInterval/time.Second), int(InfoRetry/time.Second)
	to(0)
	if seats() != 64 || b.Engine().MaxSeqsFrom != "/server_info" {
		t.Fatalf("first scrape: seats %d from %q, want 64 from /server_info", seats(), b.Engine().MaxSeqsFrom)
	}
	if e.read("/get_server_info") != 1 || e.read("/server_info") != 1 {
		t.Fatalf("reads %v", e.reads)
	}
	// Within InfoInterval the document is not read again, and every scrape carries its figure.
	to(interval - 1)
	if seats() != 64 || e.read("/server_info") != 1 {
		t.Fatalf("seats %d after %d reads", seats(), e.read("/server_info"))
	}
	// At InfoInterval it is read again, at the path that answered (not the 404 first).
	e.set("/server_info", sglangInfo(40, 40), 0)
	to(interval)
	if seats() != 80 || e.read("/get_server_info") != 1 || e.read("/server_info") != 2 {
		t.Fatalf("seats %d, reads %v", seats(), e.reads)
	}
	// A failed read keeps the figure, and is retried after InfoRetry, not InfoInterval; a second failure in a
	// row doubles the wait.
	e.set("/server_info", "", http.StatusInternalServerError)
	to(2 * interval)
	if seats() != 80 || e.read("/server_info") != 3 || b.Status().Info.Error == "" {
		t.Fatalf("seats %d after a failed read (%d reads), status %+v", seats(), e.read("/server_info"), b.Status().Info)
	}
	to(2*interval + retry - 1)
	if n := e.read("/server_info"); n != 3 {
		t.Fatalf("%d reads before InfoRetry", n)
	}
	to(2*interval + retry)
	if n := e.read("/server_info"); n != 4 {
		t.Fatalf("%d reads: a failed read is retried after InfoRetry", n)
	}
	to(2*interval + 3*retry - 1)
	if n := e.read("/server_info"); n != 4 {
		t.Fatalf("%d reads within twice InfoRetry of a second failure", n)
	}
	// A restart (a new start time) may change the seats: the figure goes until the document is read again,
	// which it is at once.
	e.set("/server_info", "", http.StatusServiceUnavailable)
	e.mu.Lock()
	e.metrics = strings.Replace(sglangMetrics, "100", "200", 1)
	e.mu.Unlock()
	to(now + 1)
	if seats() != 0 || e.read("/server_info") != 5 {
		t.Fatalf("seats %d kept across a restart whose document failed (%d reads)", seats(), e.read("/server_info"))
	}
	e.set("/server_info", sglangInfo(16), 0)
	to(now + retry)
	if seats() != 16 {
		t.Fatalf("seats %d after the restarted engine's document, want 16", seats())
	}
}

func TestEngineInfoAbsent(t *testing.T) {
	// An engine of the kind that has no info document at either path (an older build, a proxy in front): no
	// figure, the scrapes go on, and it is asked again only after InfoInterval.
	e := newInfoEngine(t, sglangMetrics)
	s, b, clk := scraperFor(t, e.srv.URL, EngineSGLang)
	for i := range 20 {
		if i > 0 {
			clk.Advance(InfoRetry)
		}
		settled(t, s)
	}
	if n, _, _, _ := b.EngineBatch(); n != 0 || b.Engine().Has&HasMaxSeqs != 0 {
		t.Fatalf("seats %d from no document", n)
	}
	if n := e.read("/get_server_info"); n != 19*int(InfoRetry)/int(InfoInterval)+1 {
		t.Fatalf("%d reads of a missing document over %v", n, 20*InfoRetry)
	}
	if st := b.Status(); st.Info == nil || st.Info.Error == "" || st.Stale {
		t.Fatalf("status %+v stale %v", st.Info, st.Stale)
	}
}

func TestEngineInfoHostile(t *testing.T) {
	// Whatever the document holds, a scrape neither fails nor states seats that the document does not.
	huge := `{"max_batch_size":8,"pad":"` + strings.Repeat("x", MaxInfoBytes) + `"}`
	deep := strings.Repeat(`{"a":`, 20000) + "1" + strings.Repeat("}", 20000)
	for name, body := range map[string]string{
		"over the bound": huge,
		"not json":       "<html>oops</html>",
		"truncated":      `{"max_batch_size":8,"max_concurrent`,
		"too deep":       deep,
		"array":          `[{"max_batch_size":8}]`,
		"negative":       `{"max_batch_size":-8,"max_concurrent_requests":-1}`,
		"strings":        `{"max_batch_size":"8","max_concurrent_requests":"128"}`,
		"null":           `null`,
	} {
		t.Run(name, func(t *testing.T) {
			e := newInfoEngine(t, "tgi_batch_current_size 1\ntgi_queue_size 0\n")
			e.set("/info", body, 0)
			s, b, _ := scraperFor(t, e.srv.URL, EngineTGI)
			settled(t, s)
			if n, _, _, _ := b.EngineBatch(); n != 0 || b.EngineCeiling() != 0 {
				t.Fatalf("seats %d ceiling %d from %q...", n, b.EngineCeiling(), body[:min(len(body), 40)])
			}
			if e := b.Engine(); e.Running != 1 || e.Stale {
				t.Fatalf("the scrape suffered: %+v", e)
			}
		})
	}
}

// TestEngineInfoHangs: a document that does not answer holds up neither the scrapes (their figures stay fresh)
// nor the Monitor's goroutine; it fails at the scrape timeout and is retried later.
func TestEngineInfoHangs(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			_, _ = w.Write([]byte("tgi_batch_current_size 2\ntgi_queue_size 0\n"))
			return
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close) // after release: it waits for the handler
	t.Cleanup(func() { close(release) })
	s, b, _ := scraperFor(t, srv.URL, EngineTGI)
	start := time.Now()
	for range 5 {
		if err := s.scrape(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d >= s.m.opts.Timeout {
		t.Fatalf("5 scrapes took %v behind a hanging /info (timeout %v)", d, s.m.opts.Timeout)
	}
	if !s.infoBusy.Load() || b.Engine().Running != 2 {
		t.Fatalf("busy %v, engine %+v", s.infoBusy.Load(), b.Engine())
	}
}

func TestEngineInfoCeiling(t *testing.T) {
	// TGI started without --max-batch-size: no seats, but the router's limit is a ceiling.
	e := newInfoEngine(t, "tgi_batch_current_size 1\ntgi_queue_size 0\n")
	e.set("/info", `{"model_id":"m","max_concurrent_requests":24,"max_batch_size":null,"max_batch_total_tokens":9000}`, 0)
	s, b, _ := scraperFor(t, e.srv.URL, EngineTGI)
	settled(t, s)
	if n, _, _, _ := b.EngineBatch(); n != 0 || b.EngineCeiling() != 24 {
		t.Fatalf("seats %d ceiling %d, want 0 and 24", n, b.EngineCeiling())
	}
	if st := b.Status(); st.Info == nil || st.Info.MaxInflight != 24 || st.Info.Path != "/info" {
		t.Fatalf("status %+v", st.Info)
	}
}
