package proxy

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// seatGateway starts a simulated engine of seats that states none (10 ms a token) behind the real gateway,
// with admission on, nothing shed (the model's objective is a minute) and a Monitor scraping the engine every
// scrape, as `switchyard serve` runs one; it returns the gateway and its snapshot.
func seatGateway(t *testing.T, seats int, scrape time.Duration) (*gateway, *Snapshot) {
	t.Helper()
	snap := seatSnapshot(t, seats)
	monitored(t, snap, routing.MonitorOptions{ScrapeInterval: scrape, IdleProbeAfter: -1})
	return startGateway(t, snap, Options{}), snap
}

// seatSnapshot starts a simulated engine of seats that states none (10 ms a token) and returns a snapshot of it
// with admission on and nothing shed (the model's objective is a minute).
func seatSnapshot(t *testing.T, seats int) *Snapshot {
	t.Helper()
	be := startSim(t, "a", func(c *sim.Config) {
		c.MaxNumSeqs = seats
		c.ITL = 10 * time.Millisecond
		c.Overhead = time.Millisecond
	})
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 0, be.URL()))
	snap.Models["sim-model"].SLO = SLO{TTFT: time.Minute}
	return snap
}

// statedSeatGateway starts a simulated engine of seats (10 ms a token) behind the real gateway, with the seats
// stated in the policy (backends[].max_num_seqs), admission on and nothing shed (the model's objective is a
// minute).
func statedSeatGateway(t *testing.T, seats int) *gateway {
	t.Helper()
	snap := seatSnapshot(t, seats)
	editBackends(snap, func(c *routing.BackendConfig) { c.MaxNumSeqs = seats })
	return startGateway(t, snap, Options{})
}

// criticalHeader marks a request critical.
var criticalHeader = map[string]string{"X-Switchyard-Priority": "critical"}

// seatBody is a chat request for an answer of tokens.
func seatBody(tokens int) string {
	return fmt.Sprintf(`{"model":"sim-model","max_tokens":%d,"messages":[{"role":"user","content":"seat"}]}`, tokens)
}

// answerOrder records the order in which concurrent requests were answered, each of which must succeed.
type answerOrder struct {
	mu    sync.Mutex
	order []string
}

func (o *answerOrder) add(t *testing.T, what string, a answer) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.order = append(o.order, what)
	if a.code != 200 {
		t.Errorf("%s: %d %s", what, a.code, a.body)
	}
}

// TestCriticalFindsAFreeSeat checks the seam between the request path, the concurrency caps and the engine
// metrics under saturation: the cap learns the engine's batch size from its scrapes (running while requests
// wait), standard requests then stop short of the seats kept for critical ones, and a critical request arriving
// at a full backend starts at once instead of waiting inside the engine for a running sequence to finish. It runs
// the real gateway, with a Monitor as `switchyard serve` does, against a simulated engine of two seats.
//
// Before the batch size was learned, standard requests filled the cap's limit (about the batch plus two): the
// critical request was the engine's fourth, queued behind a standard one, and its answer came after a long
// standard request's.
func TestCriticalFindsAFreeSeat(t *testing.T) {
	t.Parallel()
	gw, _ := seatGateway(t, 2, 10*time.Millisecond)

	// Waves of six requests to the two seats: four wait in the engine, and the first tokens that come while
	// others still wait show the cap the batch size. A few critical requests in each wave make critical demand
	// known, so that a seat is kept for it.
	var c *admission.Cap
	waitFor(t, 20*time.Second, func() bool {
		var wg sync.WaitGroup
		for i := range 6 {
			wg.Go(func() {
				var h map[string]string
				if i%3 == 0 {
					h = criticalHeader
				}
				if a := post(t, gw.url, seatBody(15), h); a.code != 200 {
					t.Errorf("warm-up request: %d %s", a.code, a.body)
				}
			})
		}
		wg.Wait()
		c = gw.s.caps.Get("b0")
		return c.Seats() == 2
	})

	// Three long standard requests: one seat is kept free, so one runs and two wait in the gateway.
	const long = 150 // 1.5 s at 10 ms a token
	var answers answerOrder
	done := func(what string, a answer) { answers.add(t, what, a) }
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { done("standard", post(t, gw.url, seatBody(long), nil)) })
	}
	waitFor(t, 5*time.Second, func() bool { return c.Inflight() >= 1 })
	time.Sleep(100 * time.Millisecond) // let every standard request reach the gateway
	if n := c.Inflight(); n != 1 {
		t.Errorf("%d standard requests in flight on two seats with critical demand known, want 1 (a seat kept)", n)
	}
	done("critical", post(t, gw.url, seatBody(2), criticalHeader))
	wg.Wait()
	if order := answers.order; order[0] != "critical" {
		t.Errorf("answers came in the order %v; the critical request must not wait for a standard one to finish", order)
	}
}

// TestReserveHoldsUnderConcurrentPicks checks that the seats kept for critical requests hold when standard
// requests arrive at the same moment: each pick counts the fleet's free seats before its claim, so requests
// picked together all counted the same free seats, and the caps bound each backend, not the fleet's reserve.
// Through the real gateway, to an engine of two seats that the policy states, with critical demand known (one
// seat kept): of standard requests sent at once, one runs at a time. Without the count after the claim
// (exchange.take), two ran at once in some tries, and in CI a critical request arriving next waited for a
// standard one to finish (TestCriticalFindsAFreeSeat).
func TestReserveHoldsUnderConcurrentPicks(t *testing.T) {
	t.Parallel()
	gw := statedSeatGateway(t, 2)
	if a := post(t, gw.url, seatBody(2), criticalHeader); a.code != 200 { // critical demand, known for a minute
		t.Fatalf("critical request: %d %s", a.code, a.body)
	}
	c := gw.s.caps.Get("b0")
	for try := range 5 {
		var peak atomic.Int64
		stop := make(chan struct{})
		var watch sync.WaitGroup
		watch.Go(func() {
			for {
				peak.Store(max(peak.Load(), int64(c.Inflight())))
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
				}
			}
		})
		start := make(chan struct{})
		var wg sync.WaitGroup
		for range 6 {
			wg.Go(func() {
				<-start
				if a := post(t, gw.url, seatBody(10), nil); a.code != 200 {
					t.Errorf("standard request: %d %s", a.code, a.body)
				}
			})
		}
		close(start)
		wg.Wait()
		close(stop)
		watch.Wait()
		if p := peak.Load(); p != 1 {
			t.Fatalf("try %d: %d standard requests in flight at once on two seats with one kept, want 1", try, p)
		}
	}
}

// TestCriticalPassesTheProbeOnASoleEngine checks, through the real gateway and a simulated engine that states no
// seats (as vLLM), that on the only backend of its model a critical request is not held in the gateway's queue
// behind standard requests while the engine has seats free and nothing waiting: it may go past the batch the
// engine has proved so far, up to the cap's limit (admission.Cap.LimitFor). Held to that batch, it waited until
// every standard request queued before it had been sent, the batch growing a seat a scrape while standard
// requests took each new seat.
func TestCriticalPassesTheProbeOnASoleEngine(t *testing.T) {
	t.Parallel()
	gw, snap := seatGateway(t, 64, 100*time.Millisecond)
	if a := post(t, gw.url, seatBody(2), criticalHeader); a.code != 200 { // critical demand, known for a minute
		t.Fatalf("critical request: %d %s", a.code, a.body)
	}
	c := gw.s.caps.Get("b0")
	waitFor(t, 5*time.Second, func() bool { return c.Batch() > 0 }) // the engine's scrapes are read

	// Forty standard requests of 3 s at once: the fleet's reserve and the probe let them into the engine a seat
	// or so a scrape, until they hold every seat the engine has proved and the probe past them.
	q := gw.s.queueFor("sim-model", snap)
	var wg sync.WaitGroup
	for range 40 {
		wg.Go(func() {
			if a := post(t, gw.url, seatBody(300), nil); a.code != 200 {
				t.Errorf("standard request: %d %s", a.code, a.body)
			}
		})
	}
	waitFor(t, 5*time.Second, func() bool { return q.Len() >= 10 && c.Inflight() >= c.Batch() })
	if st := NewAdmin(gw.s, gw.reg).Backends()[0].Seats; st.Critical < st.Working {
		t.Errorf("/debug/backends seats %+v: critical requests may fill less than the working seats", st)
	}
	a := post(t, gw.url, seatBody(2), criticalHeader)
	held := q.Len()
	if a.code != 200 {
		t.Errorf("critical request: %d %s", a.code, a.body)
	}
	if held == 0 {
		t.Errorf("the critical request was answered only once every standard request queued before it had been "+
			"sent (%d in flight on 64 seats): it waited behind them", c.Inflight())
	}
	wg.Wait()
}

// TestSeatProbeBeforeAnyLoad: a fresh gateway in front of engines that state no seats (vLLM's dialect) knows
// them before the first request, measured by the Monitor's seat probe through real HTTP to the simulators, and
// leaves nothing of the probe running or waiting there. The engines are two replicas of one deployment so that
// their peer group does not stand in for a measure. Without the probe (idle_probes off) the gateway knows
// nothing until load shows it, the control that says where the figure came from.
func TestSeatProbeBeforeAnyLoad(t *testing.T) {
	t.Parallel()
	for _, probe := range []bool{true, false} {
		t.Run(fmt.Sprintf("probe=%v", probe), func(t *testing.T) {
			t.Parallel()
			var urls []string
			var sims []*sim.Backend
			for i, seats := range []int{24, 6} {
				be := startSim(t, fmt.Sprintf("s%d", i), func(c *sim.Config) {
					c.MaxNumSeqs = seats
					c.ITL = 10 * time.Millisecond
					c.Overhead = time.Millisecond
				})
				urls, sims = append(urls, be.URL()), append(sims, be)
			}
			snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 0, urls...))
			opts := routing.MonitorOptions{ScrapeInterval: 50 * time.Millisecond}
			if !probe {
				opts.IdleProbeAfter = -1
			}
			monitored(t, snap, opts)
			gw := startGateway(t, snap, Options{})
			want := []SeatsStatus{{Figure: 24, From: "queue", Sure: "measured", Via: "seat_probe", Working: 24,
				Hint: seatsHint, Critical: 24}, {Figure: 6, From: "queue", Sure: "measured", Via: "seat_probe",
				Working: 6, Hint: seatsHint, Critical: 6}}
			var got []SeatsStatus
			seen := func() bool {
				got = got[:0]
				for _, st := range NewAdmin(gw.s, gw.reg).Backends() {
					got = append(got, st.Seats)
				}
				return got[0] == want[0] && got[1] == want[1]
			}
			if !probe {
				time.Sleep(time.Second) // twenty scrapes
				if a := post(t, gw.url, seatBody(3), nil); a.code != 200 {
					t.Fatalf("first request: %d %s", a.code, a.body)
				}
				time.Sleep(200 * time.Millisecond)
				if seen() || got[0].Sure == "measured" || got[1].Sure == "measured" || got[0].Via != "" || got[1].Via != "" {
					t.Fatalf("without the seat probe, before any load: seats %+v", got)
				}
				return
			}
			// The Monitor probes every engine at its first scrapes; the caps are made at the first request.
			for i, b := range snap.Backends {
				waitFor(t, 10*time.Second, func() bool {
					p := b.Status().SeatProbe
					return p != nil && p.Exact && p.Seats == want[i].Figure
				})
				// Nothing of the probe is left on the engine: cancelled, not left to run its tokens.
				waitFor(t, 5*time.Second, func() bool {
					code, text := get(t, sims[i].URL()+"/metrics")
					return code == 200 && strings.Contains(text, "vllm:num_requests_running{model_name=\"sim-model\"} 0") &&
						strings.Contains(text, "vllm:num_requests_waiting{model_name=\"sim-model\"} 0")
				})
				if p := b.Status().SeatProbe; p.Requests > 2*want[i].Figure+8 {
					t.Errorf("backend %d: %d probe requests for %d seats", i, p.Requests, want[i].Figure)
				}
			}
			if a := post(t, gw.url, seatBody(3), nil); a.code != 200 {
				t.Fatalf("first request: %d %s", a.code, a.body)
			}
			// The caps take the probe's figure at their next scrape. Once in a full run of the suite they had not
			// within 5 s (2026-12-07); a timeout says what they showed.
			for deadline := time.Now().Add(5 * time.Second); !seen(); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the caps did not take the probe's figures within 5s: seats %+v, want %+v", got, want)
				}
			}
		})
	}
}

// TestNotReadyWhileMeasuring: a starting gateway answers /readyz "measuring engines" while the Monitor's first
// measure of an engine runs (here a seat probe whose requests the engine holds without a first token, so its
// round runs to its 3 s bound), and is ready once it ends: traffic a load balancer sends after that does not
// share the engine with the probe's requests.
func TestNotReadyWhileMeasuring(t *testing.T) {
	t.Parallel()
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			_, _ = io.WriteString(w, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
		case "/v1/completions":
			_, _ = io.Copy(io.Discard, r.Body) // read: the server then sees the client leave
			<-r.Context().Done()               // admitted, but never a first token
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(engine.Close) // after the Monitor stops (cleanups run last first): its requests end with it
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 0, engine.URL))
	monitored(t, snap, routing.MonitorOptions{ScrapeInterval: 50 * time.Millisecond})
	gw := startGateway(t, snap, Options{})
	if ok, why := gw.s.Ready(); ok || why != "measuring engines" {
		t.Fatalf("Ready() = %v %q while the seat probe runs, want false, measuring engines", ok, why)
	}
	waitFor(t, 10*time.Second, func() bool { ok, _ := gw.s.Ready(); return ok })
	if p := snap.Backends[0].Status().SeatProbe; p == nil || p.Error == "" || snap.Backends[0].Measuring() {
		t.Fatalf("after the probe: %+v, measuring %v", p, snap.Backends[0].Measuring())
	}
}

// TestRetryKeepsTheCriticalSeat checks, through the real gateway, a simulated engine of two seats stated in the
// policy and a backend that answers every request 429, that a standard request retried off the failing backend
// meets the rules a new standard request meets: it does not take the seat kept for critical requests, it waits in
// the gateway's queue for a seat its class may take, and a critical request arriving meanwhile starts at once.
//
// Before, a retry went past the caps (Claim.Force) without being counted: the engine ran both seats for standard
// requests and the cap counted one, so the critical request was sent as the engine's third and waited inside it
// for a standard one to finish (the protect matrix's one-down cell: critical p99 6-8x unloaded).
func TestRetryKeepsTheCriticalSeat(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) {
		c.MaxNumSeqs = 2
		c.ITL = 10 * time.Millisecond
		c.Overhead = time.Millisecond
	})
	var failed sync.Map // the prompts the failing backend answered
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if i := strings.Index(string(b), "long "); i >= 0 {
			failed.Store(string(b[i:i+6]), true)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests) // retried, and never counted by the breaker, which stays closed
		_, _ = io.WriteString(w, `{"error":{"message":"busy","type":"rate_limit_error"}}`)
	}))
	t.Cleanup(bad.Close)
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 1, be.URL(), bad.URL))
	snap.Models["sim-model"].SLO = SLO{TTFT: time.Minute}
	editBackends(snap, func(c *routing.BackendConfig) {
		if c.Name == "b0" {
			c.MaxNumSeqs = 2
		}
	})
	gw := startGateway(t, snap, Options{})

	// Critical demand, so that a seat is kept for it (the reserve: at least one of the two).
	for range 2 {
		if a := post(t, gw.url, seatBody(2), criticalHeader); a.code != 200 {
			t.Fatalf("critical warm-up: %d %s", a.code, a.body)
		}
	}
	c := gw.s.caps.Get("b0")
	const long = 150 // 1.5 s at 10 ms a token
	body := func(i int) string {
		return fmt.Sprintf(`{"model":"sim-model","max_tokens":%d,"messages":[{"role":"user","content":"long %d"}]}`, long, i)
	}
	var answers answerOrder
	done := func(what string, a answer) { answers.add(t, what, a) }
	var wg sync.WaitGroup
	wg.Go(func() { done("first standard", post(t, gw.url, body(1), nil)) })
	waitFor(t, 5*time.Second, func() bool { return c.Inflight() == 1 })

	// The engine's last free seat is the critical one: the second standard request goes to the failing backend,
	// and its retry must wait in the gateway.
	wg.Go(func() { done("retried standard", post(t, gw.url, body(2), nil)) })
	waitFor(t, 5*time.Second, func() bool { _, ok := failed.Load("long 2"); return ok })
	time.Sleep(100 * time.Millisecond) // the retry's decision
	if n := c.Inflight(); n != 1 {
		t.Errorf("%d requests in flight on the engine after the retry, want 1: the retry took the seat kept for critical requests", n)
	}
	if n := simGauge(t, be.URL(), "vllm:num_requests_running") + simGauge(t, be.URL(), "vllm:num_requests_waiting"); n != 1 {
		t.Errorf("the engine holds %v requests, want 1", n)
	}
	done("critical", post(t, gw.url, seatBody(2), criticalHeader))
	wg.Wait()
	if order := answers.order; len(order) != 3 || order[0] != "critical" || order[2] != "retried standard" {
		t.Errorf("answers came in the order %v, want the critical request first and the retried standard request, which waited for a seat, last", order)
	}
}

// TestFreshGatewayAdmitsSheddable checks, through the real gateway and a simulated engine of 16 seats stated in
// the policy, that a gateway whose first request is critical does not keep half of an idle engine for critical
// requests until its first completion: sheddable requests sent right after it start at once on the free seats.
// Before, the seat reserve counted no completions while none had ended, took its cap (half the seats) and let
// sheddable requests only past twice that, the whole engine: in the protect matrix a fresh gateway refused every
// sheddable request of its first 2 s with 45 of 64 seats free.
func TestFreshGatewayAdmitsSheddable(t *testing.T) {
	t.Parallel()
	gw := statedSeatGateway(t, 16)
	inflight := func() int {
		if c := gw.s.caps.Get("b0"); c != nil {
			return c.Inflight()
		}
		return 0
	}

	const long = 300 // 3 s at 10 ms a token: nothing ends while the test looks
	sheddable := map[string]string{"X-Switchyard-Priority": "sheddable"}
	var wg sync.WaitGroup
	wg.Go(func() {
		if a := post(t, gw.url, seatBody(long), criticalHeader); a.code != 200 {
			t.Errorf("critical: %d %s", a.code, a.body)
		}
	})
	waitFor(t, 5*time.Second, func() bool { return inflight() == 1 })
	start := time.Now()
	for range 6 {
		wg.Go(func() {
			if a := post(t, gw.url, seatBody(long), sheddable); a.code != 200 {
				t.Errorf("sheddable: %d %s", a.code, a.body)
			}
		})
	}
	waitFor(t, 5*time.Second, func() bool { return inflight() == 7 })
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the sheddable requests took %v to reach an engine with 15 of 16 seats free, want them sent at once", d)
	}
	wg.Wait()
}
