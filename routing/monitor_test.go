package routing

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/cache"
)

// fakeEngine is a loopback HTTP server that serves whatever exposition the test sets, or fails.
type fakeEngine struct {
	mu     sync.Mutex
	text   string
	status int
	delay  time.Duration // added before answering /health
	srv    *httptest.Server
}

func newFakeEngine(t *testing.T) *fakeEngine {
	e := &fakeEngine{status: http.StatusOK}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		e.mu.Lock()
		text, status, delay := e.text, e.status, e.delay
		e.mu.Unlock()
		switch r.URL.Path {
		case "/metrics":
			w.WriteHeader(status)
			_, _ = w.Write([]byte(text))
		case "/health":
			if delay > 0 {
				select {
				case <-time.After(delay):
				case <-r.Context().Done():
				}
			}
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEngine) set(text string, status int) {
	e.mu.Lock()
	e.text, e.status = text, status
	e.mu.Unlock()
}

// scraperFor returns a scraper of one backend of a fresh registry, on a virtual clock.
func scraperFor(t *testing.T, url, engine string) (*scraper, *Backend, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	b := reg.Sync([]*BackendConfig{{Name: "e", URL: url, Engine: engine}})[0]
	m := NewMonitor(reg, MonitorOptions{Clock: clk, Timeout: 5 * time.Second})
	t.Cleanup(m.client.CloseIdleConnections)
	return &scraper{m: m, b: b, br: bufio.NewReader(nil)}, b, clk
}

func TestScrapePublishesSnapshots(t *testing.T) {
	for _, tc := range []struct {
		name, engine, text string
		waiting, running   float64
		kv                 float64
	}{
		{"vllm v1 names", EngineVLLM, vllmText(2, 7, 0.5, 4096, 1e9, false), 2, 7, 0.5},
		{"vllm v0 names", EngineVLLM, vllmText(1, 3, 0.25, 4096, 1e9, true), 1, 3, 0.25},
		{"sglang", EngineSGLang, "sglang:num_queue_reqs 4\nsglang:num_running_reqs 11\nsglang:token_usage 0.9\n",
			4, 11, 0.9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEngine(t)
			e.set(tc.text, http.StatusOK)
			s, b, clk := scraperFor(t, e.srv.URL, tc.engine)
			if err := s.scrape(context.Background()); err != nil {
				t.Fatal(err)
			}
			st := b.Engine()
			if !st.Fresh(clk.Now(), DefaultStaleAfter) {
				t.Fatal("fresh scrape is not fresh")
			}
			if st.Waiting != tc.waiting || st.Running != tc.running || st.KVUsage != tc.kv {
				t.Fatalf("got waiting %v running %v kv %v", st.Waiting, st.Running, st.KVUsage)
			}
			if b.Status().Stale {
				t.Fatal("status says stale")
			}
			clk.Advance(DefaultStaleAfter + time.Millisecond)
			if !b.Status().Stale {
				t.Fatal("an old snapshot is not stale")
			}
		})
	}
}

func TestScrapeFailureMarksStale(t *testing.T) {
	e := newFakeEngine(t)
	e.set(vllmText(9, 1, 0.1, 100, 1e9, false), http.StatusOK)
	s, b, clk := scraperFor(t, e.srv.URL, EngineVLLM)
	if err := s.scrape(context.Background()); err != nil {
		t.Fatal(err)
	}
	if l := b.loadAt(clk.Now()); !l.fresh || l.waiting != 9 {
		t.Fatalf("load before failure: %+v", l)
	}
	e.set("oops", http.StatusInternalServerError)
	if err := s.scrape(context.Background()); err == nil {
		t.Fatal("a 500 scrape succeeded")
	}
	if st := b.Engine(); !st.Stale || st.Waiting != 9 {
		t.Fatalf("after failure: %+v", st)
	}
	if l := b.loadAt(clk.Now()); l.fresh || l.waiting != 0 {
		t.Fatalf("stale metrics still count: %+v", l)
	}
	if !b.Status().Stale {
		t.Fatal("status not stale")
	}
	e.set(vllmText(1, 1, 0.1, 100, 1e9, false), http.StatusOK)
	if err := s.scrape(context.Background()); err != nil || b.Engine().Stale {
		t.Fatalf("recovery: err %v stale %v", err, b.Engine().Stale)
	}
}

// TestScrapeReportsTheEngineBack: OnBack is told once when a scrape succeeds after failed ones, and once when a
// scrape finds another engine process, and never for a scrape that merely follows a good one.
func TestScrapeReportsTheEngineBack(t *testing.T) {
	e := newFakeEngine(t)
	s, _, _ := scraperFor(t, e.srv.URL, EngineVLLM)
	var got []string
	s.m.opts.OnBack = func(b *Backend, restarted bool) {
		got = append(got, fmt.Sprintf("%s restarted=%v", b.Name(), restarted))
	}
	for i, step := range []struct {
		status int
		start  float64
		want   string
	}{
		{http.StatusOK, 1e9, ""}, // the first scrape: nothing to come back from
		{http.StatusOK, 1e9, ""},
		{http.StatusServiceUnavailable, 1e9, ""},
		{http.StatusServiceUnavailable, 1e9, ""},
		{http.StatusOK, 1e9, "e restarted=false"}, // reachable again, the same process
		{http.StatusOK, 1e9, ""},
		{http.StatusOK, 2e9, "e restarted=true"}, // another process, no failed scrape in between
		{http.StatusOK, 2e9, ""},
	} {
		got = got[:0]
		e.set(vllmText(0, 1, 0.1, 100, step.start, false), step.status)
		err := s.scrape(context.Background())
		if (err == nil) != (step.status == http.StatusOK) {
			t.Fatalf("step %d: scrape error %v with status %d", i, err, step.status)
		}
		want := []string{}
		if step.want != "" {
			want = append(want, step.want)
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("step %d (status %d, start %g): OnBack calls %q, want %q", i, step.status, step.start, got, want)
		}
	}
}

func TestScrapeUnreachableMarksStale(t *testing.T) {
	e := newFakeEngine(t)
	e.set(vllmText(1, 1, 0.1, 100, 1e9, false), http.StatusOK)
	s, b, _ := scraperFor(t, e.srv.URL, EngineVLLM)
	if err := s.scrape(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.srv.Close()
	if err := s.scrape(context.Background()); err == nil {
		t.Fatal("scrape of a closed server succeeded")
	}
	if !b.Engine().Stale {
		t.Fatal("not stale")
	}
}

func TestRestartWipesPrefixEntries(t *testing.T) {
	hs := cache.AppendHashes(nil, 1, make([]byte, 640), 0)
	for _, tc := range []struct {
		name    string
		restart func(e *fakeEngine, clk *fakeClock)
		wiped   bool
	}{
		{"start time changed", func(e *fakeEngine, _ *fakeClock) {
			e.set(vllmText(0, 0, 0, 4096, 2e9, false), http.StatusOK)
		}, true},
		{"counters went back", func(e *fakeEngine, _ *fakeClock) {
			e.set("vllm:num_preemptions_total 0\nprocess_start_time_seconds 1e9\n", http.StatusOK)
		}, true},
		{"long scrape gap", func(e *fakeEngine, clk *fakeClock) { clk.Advance(DefaultRestartGap + time.Second) }, true},
		{"same process", func(e *fakeEngine, clk *fakeClock) { clk.Advance(time.Second) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newFakeEngine(t)
			e.set(vllmText(0, 0, 0, 4096, 1e9, false), http.StatusOK)
			s, b, clk := scraperFor(t, e.srv.URL, EngineVLLM)
			if err := s.scrape(context.Background()); err != nil {
				t.Fatal(err)
			}
			b.prefixOwner().Confirm(hs, clk.Now())
			tc.restart(e, clk)
			if err := s.scrape(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := b.prefixOwner().Len(); (got == 0) != tc.wiped {
				t.Fatalf("prefix blocks after scrape = %d, wiped want %v", got, tc.wiped)
			}
		})
	}
}

func TestScrapeSizesPrefixCapacityFromEngine(t *testing.T) {
	e := newFakeEngine(t)
	e.set(vllmText(0, 0, 0, 2000, 1e9, false), http.StatusOK)
	s, b, _ := scraperFor(t, e.srv.URL, EngineVLLM)
	if c := b.prefixOwner().Capacity(); c != int(cache.DefaultCapacity*initialAlpha) {
		t.Fatalf("capacity before scrape = %d", c)
	}
	if err := s.scrape(context.Background()); err != nil {
		t.Fatal(err)
	}
	// 2,000 blocks of 16 tokens are 2,000 64-byte index blocks, of which 80% are assumed held.
	if c := b.prefixOwner().Capacity(); c != 1600 {
		t.Fatalf("capacity = %d, want 1600", c)
	}
}

func TestProbeMeasuresRTT(t *testing.T) {
	e := newFakeEngine(t)
	e.delay = 30 * time.Millisecond
	s, b, _ := scraperFor(t, e.srv.URL, EngineVLLM)
	s.probe(context.Background())
	if rtt := b.RTT(); rtt < 30*time.Millisecond || rtt > time.Second {
		t.Fatalf("RTT = %v, want about 30ms", rtt)
	}
	o, ob, _ := scraperFor(t, e.srv.URL, EngineOpenAI) // hosted: a TCP connect
	o.probe(context.Background())
	if rtt := ob.RTT(); rtt <= 0 || rtt > time.Second {
		t.Fatalf("TCP probe RTT = %v", rtt)
	}
}

// TestMonitorFollowsRegistry runs the real Monitor against two loopback engines: it scrapes both, stops
// scraping a backend the registry forgot, starts on one it added, and Stop leaves nothing running.
func TestMonitorFollowsRegistry(t *testing.T) {
	e1, e2 := newFakeEngine(t), newFakeEngine(t)
	e1.set(vllmText(1, 0, 0, 100, 1e9, false), http.StatusOK)
	e2.set(vllmText(2, 0, 0, 100, 1e9, false), http.StatusOK)
	reg := NewRegistry()
	reg.Sync([]*BackendConfig{{Name: "one", URL: e1.srv.URL, Engine: EngineVLLM}})
	scraped := make(chan string, 256)
	m := NewMonitor(reg, MonitorOptions{ScrapeInterval: 5 * time.Millisecond, OnScrape: func(b *Backend, err error) {
		if err == nil {
			select {
			case scraped <- b.Name():
			default:
			}
		}
	}})
	m.Start()
	defer m.Stop()
	waitFor := func(name string) {
		t.Helper()
		deadline := time.After(10 * time.Second)
		for {
			select {
			case n := <-scraped:
				if n == name {
					return
				}
			case <-deadline:
				t.Fatalf("backend %s never scraped", name)
			}
		}
	}
	waitFor("one")
	reg.Sync([]*BackendConfig{{Name: "two", URL: e2.srv.URL, Engine: EngineVLLM}})
	waitFor("two")
	// After the reconcile, "one" is no longer scraped: drain, then see only "two" for a while.
	m.mu.Lock()
	n := len(m.running)
	m.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d scraping goroutines, want 1", n)
	}
	m.Stop()
	m.Stop() // idempotent
	for len(scraped) > 0 {
		<-scraped
	}
	m.mu.Lock()
	running := m.running
	m.mu.Unlock()
	if running != nil {
		t.Fatal("Stop left goroutines registered")
	}
}

func TestIdleProbeTeachesTheModel(t *testing.T) {
	var mu sync.Mutex
	delay := 250 * time.Millisecond
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/completions" || r.Method != http.MethodPost {
			http.NotFound(w, r)
			return
		}
		var body [256]byte
		n, _ := r.Body.Read(body[:])
		mu.Lock()
		d := delay
		seen = append(seen, string(body[:n]))
		mu.Unlock()
		select {
		case <-time.After(d):
		case <-r.Context().Done():
		}
		_, _ = w.Write([]byte(`{"choices":[{"text":"p"}]}`))
	}))
	defer srv.Close()
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	b := reg.Sync([]*BackendConfig{{Name: "e", URL: srv.URL, Engine: EngineVLLM, Models: []string{"up-model"}}})[0]
	m := NewMonitor(reg, MonitorOptions{Clock: clk})
	defer m.client.CloseIdleConnections()
	s := &scraper{m: m, b: b}
	if !s.idleProbeDue() {
		t.Fatal("a backend never observed is not due a probe")
	}
	before, _ := b.PredictTTFT(1, 0)
	for range 3 {
		s.lastIdleP = clk.Now()
		s.idleProbe(context.Background(), s.client(b.Config()))
		clk.Advance(DefaultIdleProbeAfter)
	}
	after, _ := b.PredictTTFT(1, 0)
	if after < 2*before || b.Status().TTFTSamples != 3 {
		t.Fatalf("three 250 ms probes moved the one-token prediction from %v to %v (%d samples)", before, after,
			b.Status().TTFTSamples)
	}
	mu.Lock()
	if len(seen) != 3 || !strings.Contains(seen[0], `"model":"up-model"`) || !strings.Contains(seen[0], `"max_tokens":1`) {
		t.Fatalf("probe bodies %q", seen)
	}
	mu.Unlock()
	if st := b.Status(); b.idle.firsts.Load() != 0 || st.IdleProbes != 3 {
		t.Fatalf("after three probes: %d first tokens of traffic, %d probes", b.idle.firsts.Load(), st.IdleProbes)
	}
	// Traffic makes probes unnecessary.
	a := b.Begin(10)
	a.FirstToken()
	a.End(false)
	if s.idleProbeDue() {
		t.Fatal("probe due right after a first token")
	}
	if b.idle.firsts.Load() != 1 {
		t.Fatalf("a request's first token: %d first tokens of traffic", b.idle.firsts.Load())
	}
	// Hosted APIs are never probed with completions.
	hosted := NewRegistry(WithClock(clk)).Sync([]*BackendConfig{{Name: "h", URL: srv.URL, Engine: EngineOpenAI,
		Models: []string{"gpt"}}})[0]
	if (&scraper{m: m, b: hosted}).idleProbeDue() {
		t.Fatal("a hosted backend is due a completion probe")
	}
}

func TestPreemptionsShrinkPrefixCapacity(t *testing.T) {
	e := newFakeEngine(t)
	e.set("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\nvllm:num_preemptions_total 3\n", http.StatusOK)
	s, b, _ := scraperFor(t, e.srv.URL, EngineVLLM)
	for range 2 { // the second scrape sees no new preemption
		if err := s.scrape(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if c := b.prefixOwner().Capacity(); c != 800 {
		t.Fatalf("capacity %d, want 800", c)
	}
	e.set("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1000\"} 1\nvllm:num_preemptions_total 9\n", http.StatusOK)
	if err := s.scrape(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c := b.prefixOwner().Capacity(); c != 760 {
		t.Fatalf("capacity after preemptions %d, want 760", c)
	}
}
