package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// TestBurstFillsALargeEngine is issue 15's first case, scaled down to a few seconds: a fresh gateway in front of
// one engine with 4,096 seats, sent a burst of streams that outlast the burst (so that no completion frees a
// slot and no first token comes in time to teach the cap anything), must admit them all. The engine exports
// what vLLM does (running, waiting, its KV cache), not its batch limit: the cap grows from the scrapes of its
// running batch. One request in ten is critical, so that the fleet's seat reserve is in force while the seats
// are found: a reserve sized over the seats the engine had proved (the probe's floor) refused 75 of 106
// requests at half the capacity of a 64-seat engine, the engine running 5. The same engine speaking SGLang's
// dialect states its seats in /get_server_info, which the gateway reads beside its first scrapes: the cap starts
// from what the engine says about itself.
func TestBurstFillsALargeEngine(t *testing.T) {
	if testing.Short() {
		t.Skip("a 4 s burst of 400 streams")
	}
	t.Parallel()
	for _, tc := range []struct {
		dialect  string
		critical bool
	}{{sim.DialectVLLM, false}, {sim.DialectVLLM, true}, {sim.DialectSGLang, true}} {
		t.Run(fmt.Sprintf("%s/critical=%v", tc.dialect, tc.critical), func(t *testing.T) {
			t.Parallel()
			burstFillsALargeEngine(t, tc.dialect, tc.critical)
		})
	}
}

// withEngine names every backend of snap an engine of that name (backends[].engine).
func withEngine(snap *Snapshot, engine string) *Snapshot {
	return editBackends(snap, func(c *routing.BackendConfig) { c.Engine = engine })
}

func burstFillsALargeEngine(t *testing.T, dialect string, critical bool) {
	be := startSim(t, "big", func(c *sim.Config) {
		c.MaxNumSeqs = 4096
		c.KVBlocks = 1 << 16
		c.ITL = 20 * time.Millisecond
		c.Dialect = dialect
	})
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 0, be.URL()))
	if dialect == sim.DialectSGLang {
		snap = withEngine(snap, routing.EngineSGLang)
	}
	snap.Queue = QueueSettings{Size: 1024, Timeout: 10 * time.Second} // the policy's defaults
	monitored(t, snap, routing.MonitorOptions{})
	gw := startGateway(t, snap, Options{})

	const rate, burst, tokens = 200, 2 * time.Second, 60 // 60 tokens at 20-60 ms a step outlast the burst
	n := int(rate * burst.Seconds())
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	codes := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / rate)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := fmt.Sprintf(`{"model":"sim-model","max_tokens":%d,"stream":true,"messages":[{"role":"user",`+
				`"content":"burst %d"}]}`, tokens, i)
			req, err := http.NewRequest(http.MethodPost, gw.url+"/v1/chat/completions", bytes.NewBufferString(body))
			if err != nil {
				errs[i] = err
				return
			}
			req.Header.Set("Content-Type", "application/json")
			if critical && i%10 == 0 {
				req.Header.Set("X-Switchyard-Priority", "critical")
			}
			resp, err := client.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			codes[i] = resp.StatusCode
			if resp.StatusCode != http.StatusOK {
				_, _ = io.Copy(io.Discard, resp.Body)
				return
			}
			sc := bufio.NewScanner(resp.Body)
			done := false
			for sc.Scan() {
				done = done || sc.Text() == "data: [DONE]"
			}
			if !done {
				errs[i] = fmt.Errorf("stream %d ended without [DONE]: %v", i, sc.Err())
			}
		}()
	}
	peak := 0
	for time.Since(start) < burst+time.Second {
		peak = max(peak, int(snap.Backends[0].Inflight()))
		time.Sleep(50 * time.Millisecond)
	}
	wg.Wait()
	ok, byCode := 0, map[int]int{}
	for i, c := range codes {
		byCode[c]++
		if c == http.StatusOK && errs[i] == nil {
			ok++
		} else if errs[i] != nil && ok < 3 {
			t.Log(errs[i])
		}
	}
	st := NewAdmin(gw.s, gw.reg).Backends()[0]
	t.Logf("%d of %d answered 200 (statuses %v); peak in flight %d; limit %d, seats %+v", ok, n, byCode, peak,
		st.ConcurrencyLimit, st.Seats)
	if ok*100 < n*99 {
		t.Errorf("%d of %d streams answered 200, want at least 99%%: the engine had 4,096 seats", ok, n)
	}
	if dialect == sim.DialectSGLang {
		want := SeatsStatus{Figure: 4096, From: "engine", Sure: "stated", Via: "/get_server_info", Working: 4096}
		if got := withoutCritical(st.Seats); got != want || st.Seats.Critical < 1 || st.Seats.Critical > 4096 {
			t.Errorf("/debug/backends seats = %+v, want %+v, critical 1-4096: SGLang states its seats", st.Seats, want)
		}
		return
	}
	// The probe sees the engine's running batch at each scrape, the test its own in-flight count every 50 ms:
	// on a loaded machine the peak the scrapes caught trails the test's by a step or two, so the figure must
	// reach three quarters of the test's peak (and far above the cap's start), not the peak itself.
	if want := peak * 3 / 4; st.Seats.From != "probe" || st.Seats.Sure != "at_least" || st.Seats.Figure < want ||
		st.Seats.Hint == "" {
		t.Errorf("/debug/backends seats = %+v, want at least %d (3/4 of the peak in flight) from the probe, and "+
			"a hint to state them", st.Seats, want)
	}
	if critical && st.Seats.Working < st.Seats.Figure {
		t.Errorf("/debug/backends seats = %+v: the cap works with no more than the probe's figure", st.Seats)
	}
}

// TestEngineCeiling: TGI refuses requests past its --max-concurrent-requests with 429 and states the figure in
// /info. A gateway that reads it never sends more, even where the policy states more seats: a burst of streams
// five times that is queued at the gateway and answered whole, none refused by the engine. The same burst through
// a gateway that reads the engine as vLLM (no /info) sends what the stated seats allow, and the engine refuses
// the excess: the ceiling is what holds.
func TestEngineCeiling(t *testing.T) {
	if testing.Short() {
		t.Skip("two bursts of 60 streams")
	}
	t.Parallel()
	const ceiling = 12
	for _, engine := range []string{routing.EngineTGI, routing.EngineVLLM} {
		t.Run(engine, func(t *testing.T) {
			t.Parallel()
			be := startSim(t, "tgi", func(c *sim.Config) {
				c.Dialect = sim.DialectTGI
				c.StatesSeats = false // TGI's default: no --max-batch-size, its batch bounded by tokens
				c.MaxConcurrentRequests = ceiling
				c.MaxNumSeqs = 64
				c.ITL = 10 * time.Millisecond
			})
			// The policy states 64 seats (the engine's batch as its tokens bound it): without the ceiling the gateway
			// sends the whole burst, and the engine refuses what is past 12, however the adaptive cap would have grown.
			snap := editBackends(withAdmission(snapshotOf(&routing.RoundRobin{}, 0, be.URL())), func(c *routing.BackendConfig) {
				c.Engine, c.MaxNumSeqs = engine, 64
			})
			snap.Queue = QueueSettings{Size: 1024, Timeout: 20 * time.Second}
			monitored(t, snap, routing.MonitorOptions{})
			gw := startGateway(t, snap, Options{})
			if engine == routing.EngineTGI {
				// The document is read beside the scrapes: a scrape or two after the start the ceiling is known.
				waitFor(t, 5*time.Second, func() bool { return snap.Backends[0].EngineCeiling() == ceiling })
			}
			const n, tokens = 60, 40
			client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: n}}
			codes := make([]int, n)
			var wg sync.WaitGroup
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					body := fmt.Sprintf(`{"model":"sim-model","max_tokens":%d,"stream":true,"messages":[{"role":"user",`+
						`"content":"ceiling %d"}]}`, tokens, i)
					resp, err := client.Post(gw.url+"/v1/chat/completions", "application/json", bytes.NewBufferString(body))
					if err != nil {
						return
					}
					defer resp.Body.Close()
					_, _ = io.Copy(io.Discard, resp.Body)
					codes[i] = resp.StatusCode
				}()
				time.Sleep(5 * time.Millisecond)
			}
			peak, done := 0, make(chan struct{})
			go func() { wg.Wait(); close(done) }()
		watch:
			for {
				select {
				case <-done:
					break watch
				case <-time.After(20 * time.Millisecond):
					peak = max(peak, int(snap.Backends[0].Inflight()))
				}
			}
			ok := 0
			for _, c := range codes {
				if c == http.StatusOK {
					ok++
				}
			}
			refused := simCounter(t, be.URL()+"/metrics", `tgi_request_failure{err="overloaded"}`)
			st := NewAdmin(gw.s, gw.reg).Backends()[0]
			t.Logf("%s: %d of %d answered 200; the engine refused %v; peak in flight %d; limit %d, seats %+v", engine,
				ok, n, refused, peak, st.ConcurrencyLimit, st.Seats)
			if engine == routing.EngineVLLM {
				if refused == 0 {
					t.Errorf("the engine refused nothing without the ceiling (peak %d): the test cannot fail", peak)
				}
				return
			}
			if ok != n || refused != 0 || peak > ceiling || st.Seats.Ceiling != ceiling || st.ConcurrencyLimit > ceiling {
				t.Errorf("%d of %d answered 200, the engine refused %v, peak in flight %d, limit %d, seats %+v; want "+
					"all, none, at most %d", ok, n, refused, peak, st.ConcurrencyLimit, st.Seats, ceiling)
			}
			if st.Info == nil || st.Info.Path != "/info" || st.Info.MaxInflight != ceiling || st.Info.MaxSeqs != 0 {
				t.Errorf("engine_info = %+v", st.Info)
			}
		})
	}
}

// simCounter returns the value of the sample named series (its name and labels, as exposed) at url, 0 if absent.
func simCounter(t *testing.T, url, series string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	return 0
}

// TestSeatsFromPolicy: backends[].max_num_seqs sets the cap's seats before any request, and /debug/backends
// says they are the policy's.
func TestSeatsFromPolicy(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 0, be.URL()))
	editBackends(snap, func(c *routing.BackendConfig) { c.MaxNumSeqs = 512 })
	gw := startGateway(t, snap, Options{})
	// Before any request (the snapshot's records built as the first request would build them), the cap starts
	// at the stated seats. After traffic the adaptive cap may back off below them on a slow first token, so its
	// limit is checked here only.
	gw.s.follow(snap)
	st := NewAdmin(gw.s, gw.reg).Backends()[0]
	want := SeatsStatus{Figure: 512, From: "policy", Sure: "stated", Working: 512, Critical: 512}
	if st.Seats != want || st.EngineSeats != 512 || st.ConcurrencyLimit < 512 {
		t.Errorf("before any request: seats %+v, engine_seats %d, limit %d; want %+v, 512, >= 512", st.Seats,
			st.EngineSeats, st.ConcurrencyLimit, want)
	}
	if a := post(t, gw.url, small, nil); a.code != http.StatusOK {
		t.Fatalf("status %d: %s", a.code, a.body)
	}
	want.Critical = 0 // the cap may back off below the seats after a slow first token
	if st := NewAdmin(gw.s, gw.reg).Backends()[0]; withoutCritical(st.Seats) != want || st.EngineSeats != 512 {
		t.Errorf("after a request: seats %+v, engine_seats %d; want %+v, 512", st.Seats, st.EngineSeats, want)
	}
}

// withoutCritical returns s with its Critical figure, which follows the cap's limit, zeroed.
func withoutCritical(s SeatsStatus) SeatsStatus {
	s.Critical = 0
	return s
}
