package routing

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// seatEngine is a loopback engine of fixed seats in vLLM's dialect: a completion takes a seat or waits for one
// (counted in vllm:num_requests_waiting), streams a first token once seated, and holds the seat until its client
// leaves or it has streamed for hold.
type seatEngine struct {
	seats    chan struct{}
	running  atomic.Int64
	waiting  atomic.Int64
	requests atomic.Int64
	status   int           // answer every completion with this status instead (0: serve it)
	hold     time.Duration // how long a seated request streams before it ends (0: until its client leaves)
	extra    atomic.Int64  // requests of other clients the engine runs, counted in its running batch
	mu       sync.Mutex
	bodies   []string
	srv      *httptest.Server
}

func newSeatEngine(t *testing.T, seats int) *seatEngine {
	e := &seatEngine{seats: make(chan struct{}, seats)}
	e.srv = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *seatEngine) serve(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/metrics":
		fmt.Fprintf(w, "vllm:num_requests_running %d\nvllm:num_requests_waiting %d\n",
			e.running.Load()+e.extra.Load(), e.waiting.Load())
		return
	case "/v1/completions":
	default:
		http.NotFound(w, r)
		return
	}
	e.requests.Add(1)
	body, _ := io.ReadAll(r.Body)
	e.mu.Lock()
	e.bodies = append(e.bodies, string(body))
	e.mu.Unlock()
	if e.status != 0 {
		w.WriteHeader(e.status)
		return
	}
	e.waiting.Add(1)
	select {
	case e.seats <- struct{}{}:
		e.running.Add(1)
		e.waiting.Add(-1)
	case <-r.Context().Done():
		e.waiting.Add(-1)
		return
	}
	defer func() {
		e.running.Add(-1)
		<-e.seats
	}()
	w.Header().Set("Content-Type", "text/event-stream")
	_, _ = io.WriteString(w, "data: {\"choices\":[{\"text\":\"p\"}]}\n\n")
	w.(http.Flusher).Flush()
	var end <-chan time.Time
	if e.hold > 0 {
		end = time.After(e.hold)
	}
	select {
	case <-r.Context().Done():
	case <-end:
	}
}

// settled waits until the engine runs and queues nothing of the probe's: every request it sent has gone.
func (e *seatEngine) settled(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for e.running.Load() != 0 || e.waiting.Load() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the probe's requests are still there: %d running, %d waiting", e.running.Load(), e.waiting.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// seatScraper returns a scraper of one vLLM backend at url that has scraped once, on a virtual clock.
func seatScraper(t *testing.T, url string) (*scraper, *Backend, *fakeClock) {
	t.Helper()
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	b := reg.Sync([]*BackendConfig{{Name: "e", URL: url, Engine: EngineVLLM, Models: []string{"up-model"}}})[0]
	m := NewMonitor(reg, MonitorOptions{Clock: clk, Timeout: 5 * time.Second})
	t.Cleanup(m.client.CloseIdleConnections)
	s := &scraper{m: m, b: b, br: bufio.NewReader(nil)}
	scrapeOnly(t, s)
	return s, b, clk
}

// scrapeOnly scrapes once without letting the scrape start a seat probe of its own: the tests run theirs.
func scrapeOnly(t *testing.T, s *scraper) {
	t.Helper()
	known := s.seatsKnown
	s.seatsKnown = true
	defer func() { s.seatsKnown = known }()
	if err := s.scrape(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestSeatProbeMeasuresTheSeats(t *testing.T) {
	for _, tc := range []struct {
		seats, extra int
		rounds       int
	}{
		{seats: 12, rounds: 2},            // 8 ran, then 16 against 12
		{seats: 8, rounds: 2},             // 8 ran (nothing waits), then 16 against 8
		{seats: 5, rounds: 1},             // the first round already queues
		{seats: 40, extra: 10, rounds: 3}, // 10 of other clients run: 18, 26, then 42 against 40
	} {
		t.Run(fmt.Sprintf("%d seats, %d busy", tc.seats, tc.extra), func(t *testing.T) {
			e := newSeatEngine(t, tc.seats)
			e.extra.Store(int64(tc.extra))
			for range tc.extra {
				e.seats <- struct{}{} // other clients' requests hold these
			}
			s, b, clk := seatScraper(t, e.srv.URL)
			if !s.seatProbeDue(clk.Now()) {
				t.Fatal("an engine that states no seats is not due a seat probe")
			}
			out := s.seatProbe(context.Background(), s.client(b.Config()))
			e.settled(t)
			got, exact, at := b.ProbedSeats()
			if !out.done || !exact || got != tc.seats || at.IsZero() {
				t.Fatalf("probe found %d seats (exact %v, at %v, done %v), want %d; %+v", got, exact, at, out.done,
					tc.seats, b.Status().SeatProbe)
			}
			if p := b.Status().SeatProbe; p == nil || p.Rounds != tc.rounds || p.Error != "" {
				t.Fatalf("status %+v, want %d rounds and no error", p, tc.rounds)
			}
			e.mu.Lock()
			body := e.bodies[0]
			e.mu.Unlock()
			for _, want := range []string{`"model":"up-model"`, `"ignore_eos":true`, `"stream":true`} {
				if !strings.Contains(body, want) {
					t.Fatalf("probe body %s lacks %s", body, want)
				}
			}
			// The next due check takes the outcome: this engine process is measured.
			if s.seatProbeDue(clk.Now()) {
				t.Fatal("a measured engine is due another seat probe")
			}
		})
	}
}

func TestSeatProbeStopsAtTheBurstBound(t *testing.T) {
	e := newSeatEngine(t, maxSeatBurst+200)
	s, b, _ := seatScraper(t, e.srv.URL)
	out := s.seatProbe(context.Background(), s.client(b.Config()))
	e.settled(t)
	got, exact, _ := b.ProbedSeats()
	if !out.done || exact || got != maxSeatBurst {
		t.Fatalf("probe of %d seats found %d (exact %v, done %v), want the lower bound %d", maxSeatBurst+200, got, exact,
			out.done, maxSeatBurst)
	}
	if p := b.Status().SeatProbe; p.Requests != 2*maxSeatBurst-seatBurstFirst {
		t.Fatalf("%d requests sent, want the doubling's %d", p.Requests, 2*maxSeatBurst-seatBurstFirst)
	}
}

func TestSeatProbeRequestsThatEndEarly(t *testing.T) {
	// An engine that ends the probe's streams at once (an EOS it did not ignore, or no batching at all): what
	// ran is a lower bound, and the probe stops, for this engine process, after its first round.
	e := newSeatEngine(t, 20)
	e.hold = time.Millisecond
	s, b, _ := seatScraper(t, e.srv.URL)
	out := s.seatProbe(context.Background(), s.client(b.Config()))
	e.settled(t)
	if got, exact, _ := b.ProbedSeats(); exact || got > 20 {
		t.Fatalf("streams that ended at once gave %d seats, exact %v: more than the engine has, or exact", got, exact)
	}
	if p := b.Status().SeatProbe; !out.done || p.Rounds != 1 || e.requests.Load() != seatBurstFirst || p.Error == "" {
		t.Fatalf("outcome %+v, probe %+v, %d requests: want one round of %d and an error", out, p, e.requests.Load(),
			seatBurstFirst)
	}
}

func TestSeatProbeRefusedOrFailing(t *testing.T) {
	// An engine that refuses the probe's fields is not asked again in this process.
	e := newSeatEngine(t, 8)
	e.status = http.StatusBadRequest
	s, b, clk := seatScraper(t, e.srv.URL)
	out := s.seatProbe(context.Background(), s.client(b.Config()))
	p := b.Status().SeatProbe
	if !out.done || out.failed || p == nil || !strings.Contains(p.Error, "400") || p.Seats != 0 {
		t.Fatalf("a refused probe: outcome %+v, status %+v", out, p)
	}
	if n, _, at := b.ProbedSeats(); n != 0 || !at.IsZero() {
		t.Fatalf("a refused probe published %d seats", n)
	}
	s.seatDone.Store(&out)
	if s.seatProbeDue(clk.Now()) {
		t.Fatal("an engine that refused the probe is due another")
	}

	// An engine that answers 503 is asked again after seatProbeRetry, doubling.
	e2 := newSeatEngine(t, 8)
	e2.status = http.StatusServiceUnavailable
	s2, b2, clk2 := seatScraper(t, e2.srv.URL)
	out = s2.seatProbe(context.Background(), s2.client(b2.Config()))
	if out.done || !out.failed {
		t.Fatalf("a failed probe: outcome %+v", out)
	}
	s2.seatDone.Store(&out)
	if s2.seatProbeDue(clk2.Now()) {
		t.Fatal("due again at once after a failure")
	}
	clk2.Advance(seatProbeRetry)
	if !s2.seatProbeDue(clk2.Now()) {
		t.Fatal("not due again after the retry wait")
	}
	s2.seatDone.Store(&out)
	s2.seatProbeDue(clk2.Now())
	clk2.Advance(seatProbeRetry)
	if s2.seatProbeDue(clk2.Now()) {
		t.Fatal("the second failure's wait did not double")
	}
}

func TestSeatProbeDue(t *testing.T) {
	e := newSeatEngine(t, 8)
	s, b, clk := seatScraper(t, e.srv.URL)
	if !s.seatProbeDue(clk.Now()) {
		t.Fatal("not due")
	}
	// The policy states the seats.
	cfg := *b.Config()
	cfg.MaxNumSeqs = 8
	b.cfg.Store(&cfg)
	if s.seatProbeDue(clk.Now()) {
		t.Fatal("due although the policy states the seats")
	}
	cfg.MaxNumSeqs = 0
	b.cfg.Store(&cfg)
	// The engine queues: its own traffic shows the seats.
	e.waiting.Store(3)
	scrapeOnly(t, s)
	e.waiting.Store(0)
	if s.seatProbeDue(clk.Now()) {
		t.Fatal("due while the engine keeps requests waiting")
	}
	scrapeOnly(t, s)
	if !s.seatProbeDue(clk.Now()) {
		t.Fatal("not due once the queue is gone")
	}
	// The policy forbids the gateway's own completions.
	spec := *cfg.Spec()
	spec.IdleProbes = false
	noIdle := cfg
	noIdle.EngineSpec = &spec
	b.cfg.Store(&noIdle)
	if s.seatProbeDue(clk.Now()) {
		t.Fatal("due although idle_probes is off")
	}
}

// TestScrapeStartsTheSeatProbe: the scrape that finds a probe due starts it before publishing itself, so that
// whoever sees the scrape sees the probe running (bench.WaitMeasured relies on it), and the probe's figure is
// published when it ends.
func TestScrapeStartsTheSeatProbe(t *testing.T) {
	e := newSeatEngine(t, 12)
	clk := newFakeClock()
	reg := NewRegistry(WithClock(clk))
	b := reg.Sync([]*BackendConfig{{Name: "e", URL: e.srv.URL, Engine: EngineVLLM, Models: []string{"up-model"}}})[0]
	m := NewMonitor(reg, MonitorOptions{Clock: clk, Timeout: 5 * time.Second})
	t.Cleanup(m.client.CloseIdleConnections)
	s := &scraper{m: m, b: b, br: bufio.NewReader(nil)}
	if err := s.scrape(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := b.Status(); st.ScrapedAt.IsZero() || !st.SeatProbing {
		t.Fatalf("after the first scrape: scraped at %v, seat probing %v", st.ScrapedAt, st.SeatProbing)
	}
	m.wg.Wait()
	if st := b.Status(); st.SeatProbing || st.SeatProbe == nil || st.SeatProbe.Seats != 12 || !st.SeatProbe.Exact {
		t.Fatalf("after the probe: seat probing %v, %+v", st.SeatProbing, st.SeatProbe)
	}
	e.settled(t)
	if err := s.scrape(context.Background()); err != nil {
		t.Fatal(err)
	}
	if b.Status().SeatProbing {
		t.Fatal("a measured engine is probed again")
	}
	// Routing's seats: the probe's exact figure over a meter's lower bound (a static cap measures nothing), a
	// meter's exact figure over the probe's (the cap's later measure).
	for _, tc := range []struct {
		m     meter
		seats float64
		exact bool
	}{{meter{5, false}, 12, true}, {meter{9, true}, 9, true}} {
		b.SetSeatMeter(tc.m)
		if n, exact := b.seatsOf(b.Engine(), b.Config()); n != tc.seats || exact != tc.exact {
			t.Errorf("meter %+v: seats %v, exact %v; want %v, %v", tc.m, n, exact, tc.seats, tc.exact)
		}
	}
}
