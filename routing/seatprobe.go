package routing

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The seat probe measures the seats of an engine that states none (vLLM exports its running batch and its queue,
// not its --max-num-seqs) before any load shows them: docs/design.md, "Seats, measured before load". Without it
// the gateway learned them from the first queue its own traffic caused, in the middle of the first spike, and
// held critical requests to the largest batch it had seen until then (critical p99 TTFT 3-5x unloaded in the
// protect matrix's cells that leave the seats to discovery).
//
// A probe runs in rounds. Each round sends the engine k streamed completions of its own (a one-word prompt,
// seatProbeTokens tokens, ignore_eos) and scrapes the engine's metrics until one of two things is seen:
//   - every request of the round has its first token and nothing waits: the engine runs at least what it runs
//     now, a lower bound; the next round sends twice as many;
//   - requests wait while the engine's running count and the round's first tokens stand still over two scrapes
//     a step apart (the spacing is at least the time the round's first first token took): the engine runs all
//     it can and queues the rest, so its running count is its seats.
//
// The round's requests are then cancelled (the engine aborts a request whose client leaves). The first round
// sends seatBurstFirst requests; a round of maxSeatBurst that all ran leaves a lower bound, and the cap's own
// slow start (admission.Cap.ObserveBatch) finds the rest under load.
//
// What it costs: one round holds at most maxSeatBurst of the engine's seats for a few scrapes (tens of
// milliseconds on a fast engine, seatRoundTimeout at most); a request of real traffic that arrives while a
// round keeps some of its own waiting may wait behind them until the round ends. The probe runs once per engine
// process (again after a restart), only while the engine's last scrape showed nothing waiting, and only on
// engines the policy lets the gateway send its own completions to (engines.*.idle_probes: never hosted APIs,
// which bill per request).

const (
	// seatBurstFirst is the first round's requests: the smallest --max-num-seqs in use is about 8, and a round
	// that all ran costs nothing but the requests' one step of prefill.
	seatBurstFirst = 8
	// maxSeatBurst bounds a round's requests, and so the load a probe adds to an engine that other gateways
	// serve, the connections it opens, and the seats one round holds: a probe sends at most 248 requests in 5
	// rounds, and measures an engine of up to 128 seats less what it runs (every engine of the protect matrix,
	// 8-64 seats, idle or at half load). Past it the probe leaves a lower bound of 128, and the cap's slow start
	// (one doubling per scrape under real load, admission.Cap.ObserveBatch) finds the rest: an engine that large
	// takes a spike longer to fill than a few scrapes. Rounds of 512 and 1,024 on 256-seat simulators behind two
	// gateways starting together kept the machine busy for seconds (scrapes timed out).
	maxSeatBurst = 128
	// seatProbeTokens is each probe request's max_tokens: enough to hold its seat through a round on an engine
	// of 2 ms per token (512 ms, against rounds of tens to hundreds of milliseconds), little enough that a round
	// whose cancellation is lost ends by itself within seconds.
	seatProbeTokens = 256
	// seatRoundTimeout bounds one round: an engine that shows neither outcome in that time is left for later.
	seatRoundTimeout = 3 * time.Second
	// seatScrapeEvery is the least time between two scrapes of a round.
	seatScrapeEvery = 20 * time.Millisecond
	// seatProbeRetry is the wait after a failed probe before the next, doubling with each failure in a row up to
	// maxSeatProbeRetry.
	seatProbeRetry    = 30 * time.Second
	maxSeatProbeRetry = 10 * time.Minute
)

// SeatProbe is what the Monitor's seat probe found of a backend's engine (/debug/backends "seat_probe").
type SeatProbe struct {
	// Seats is the engine's batch limit when Exact, else the most it ran with none of the probe's requests
	// waiting (a lower bound); 0 when the probe failed.
	Seats int  `json:"seats"`
	Exact bool `json:"exact"`
	// Rounds and Requests count the probe's rounds and the completions it sent in all.
	Rounds   int `json:"rounds"`
	Requests int `json:"requests"`
	// At is when the probe ended, on the Monitor's clock.
	At time.Time `json:"at"`
	// Error says why the probe found no figure, or why a round after the last figure failed ("" when none did).
	Error string `json:"error,omitempty"`
}

// ProbedSeats returns what b's last seat probe found: the seats, whether they are the engine's limit or a lower
// bound, and when the probe ended (zero when none did, or it found nothing). admission.Cap takes them as its own
// measure. Lock-free.
func (b *Backend) ProbedSeats() (seats int, exact bool, at time.Time) {
	p := b.seatProbe.Load()
	if p == nil || p.Seats <= 0 {
		return 0, false, time.Time{}
	}
	return p.Seats, p.Exact, p.At
}

// seatOutcome is how a probe ended, for the scraping goroutine to schedule the next.
type seatOutcome struct {
	done   bool // a figure the probe cannot better (exact, or a lower bound at maxSeatBurst), or a refusal
	failed bool // a round failed before either: retry after seatProbeRetry, doubling
}

// seatProbeDue reports whether b's engine should be probed for its seats now: the engine states none (its
// metrics, info document or the policy), nothing the gateway measured or its peers agree on is exact, its
// metrics carry its batch and queue and the last scrape showed nothing waiting, the policy allows the gateway's
// own completions there, and no probe ran for this engine process (or the last failed long enough ago).
func (s *scraper) seatProbeDue(now time.Time) bool {
	if r := s.seatDone.Swap(nil); r != nil {
		switch {
		case r.done:
			s.seatsKnown = true
		case r.failed:
			s.seatFails++
			s.seatNext = now.Add(min(seatProbeRetry<<min(s.seatFails-1, 16), maxSeatProbeRetry))
		}
	}
	b := s.b
	cfg := b.Config()
	spec := cfg.Spec()
	st := s.last
	switch {
	case s.seatsKnown, s.b.seatProbing.Load(), now.Before(s.seatNext), st == nil:
		return false
	case s.m.opts.IdleProbeAfter < 0 || !spec.IdleProbes || len(cfg.Models) == 0 || !b.Healthy():
		return false
	case st.Has&(HasRunning|HasWaiting) != HasRunning|HasWaiting || st.Waiting > 0:
		return false
	case spec.Info.Reads() && (s.infoBusy.Load() || b.info.Load() == nil):
		return false // what the engine states comes first
	}
	if _, exact := b.seatsOf(st, cfg); exact {
		return false
	}
	return true
}

// startSeatProbe runs a seat probe in its own goroutine (a round may take seconds; scrapes go on meanwhile).
// Only the scraping goroutine calls it, after seatProbeDue.
func (s *scraper) startSeatProbe(ctx context.Context) {
	cl := s.client(s.b.Config())
	s.b.seatProbing.Store(true)
	s.b.probeGen.Add(1)
	s.m.wg.Add(1)
	go func() {
		defer s.m.wg.Done()
		out := s.seatProbe(ctx, cl)
		s.seatDone.Store(&out)
		s.b.probeGen.Add(1)
		s.b.seatProbing.Store(false) // after the outcome: the next due check finds it
	}()
}

// seatProbe runs the rounds and publishes what they found on the backend.
func (s *scraper) seatProbe(ctx context.Context, cl *http.Client) seatOutcome {
	b := s.b
	br := bufio.NewReaderSize(nil, 16<<10)
	res := &SeatProbe{}
	out := seatOutcome{}
	k := seatBurstFirst
	for {
		res.Rounds++
		res.Requests += k
		seats, exact, err := s.seatRound(ctx, cl, br, k)
		if ctx.Err() != nil {
			return seatOutcome{failed: true}
		}
		res.Seats = max(res.Seats, seats)
		if err != nil {
			res.Error = err.Error()
			var ref *seatRefused
			// The engine refuses the probe, or does not hold its requests: asking again changes nothing.
			out.done = errors.As(err, &ref) || errors.Is(err, errSeatStreamsEnd)
			out.failed = !out.done // later, from the first round again: a lower bound found so far stands
			break
		}
		res.Exact = exact
		if exact || k >= maxSeatBurst {
			out.done = true
			break
		}
		k = min(2*k, maxSeatBurst)
	}
	if res.Seats > 0 || res.Error != "" {
		res.At = s.m.opts.Clock.Now()
		b.seatProbe.Store(res)
	}
	return out
}

// errSeatStreamsEnd: a probe request's stream ended before its round did. The engine stops at an end of sequence
// although asked to ignore it, or answers at once (not an engine that batches): more rounds would measure the
// same.
var errSeatStreamsEnd = errors.New("seat probe: the engine ended a probe request's stream before the round ended")

// seatRefused is a probe request the engine answered with a client error: it does not take the probe's
// fields (ignore_eos) or its model name, and will not take them next time.
type seatRefused struct{ status int }

func (e *seatRefused) Error() string {
	return fmt.Sprintf("seat probe: the engine refused a probe request with status %d", e.status)
}

// discount takes a running seat probe's own requests out of a scrape that routing and the caps read: they are
// the gateway's, not load, and they end with their round; counted in, a round that fills an engine shows it
// full, with the round's own requests waiting. The round's own scrapes see the engine as it is. Other gateways'
// scrapes do count the probe, as the load it is for them.
func (s *scraper) discount(st *EngineStats) {
	r := s.seatOwn.Load()
	if r == nil {
		return
	}
	started := r.started.Load()
	running := started - r.ended.Load()
	waiting := r.sent - started - r.failed.Load() // a request still on its way counts here too: the clamp takes it
	if st.Has&HasRunning != 0 {
		st.Running = max(st.Running-float64(max(running, 0)), 0)
	}
	if st.Has&HasWaiting != 0 {
		st.Waiting = max(st.Waiting-float64(max(waiting, 0)), 0)
	}
}

// refuses reports whether an answer's status says the engine will not take the probe's requests at all (a
// client error other than a timeout or too many requests).
func refuses(status int) bool {
	return status >= 400 && status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests
}

// seatRound sends k probe requests and scrapes until the engine shows its seats or a lower bound (see the top
// of this file); it cancels the requests before it returns.
func (s *scraper) seatRound(ctx context.Context, cl *http.Client, br *bufio.Reader, k int) (seats int, exact bool, err error) {
	cfg := s.b.Config()
	ctx, cancel := context.WithTimeout(ctx, seatRoundTimeout)
	var wg sync.WaitGroup
	r := &seatRequests{sent: int64(k)}
	defer func() {
		cancel()
		wg.Wait()
		s.seatOwn.Store(nil)
	}()
	// A scrape first: the round adds to what runs now, and an engine that queues is measured by its
	// own traffic (admission.Cap.ObserveBatch), not by more requests.
	st, err := s.fetchWith(ctx, br)
	if err != nil {
		return 0, false, err
	}
	if st.Waiting > 0 {
		return 0, false, errors.New("seat probe: the engine keeps requests waiting")
	}
	s.seatOwn.Store(r) // from here the scrapes routing and the caps read leave the round's requests out
	body := `{"model":` + strconv.Quote(cfg.Models[0]) + `,"prompt":"ping","max_tokens":` +
		strconv.Itoa(seatProbeTokens) + `,"ignore_eos":true,"stream":true}`
	sent := time.Now()
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.hold(ctx, cl, cfg, body)
		}()
	}
	spacing := seatScrapeEvery
	prevRun, prevWait, prevGot := -1.0, -1.0, int64(-1)
	most := 0.0
	timer := time.NewTimer(spacing)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			if most > 0 {
				return int(most), false, nil // what ran is a lower bound still
			}
			return 0, false, fmt.Errorf("seat probe: no outcome within %v", seatRoundTimeout)
		case <-timer.C:
		}
		if st := int(r.status.Load()); refuses(st) {
			return 0, false, &seatRefused{status: st}
		}
		if r.failed.Load() > 0 {
			return int(most), false, fmt.Errorf("seat probe: %s", r.why())
		}
		// The first tokens counted before the scrape: a request counted started is in the scrape's running count
		// (counted after it, the scrape may predate it).
		got := r.started.Load()
		st, err := s.fetchWith(ctx, br)
		if err != nil {
			if ctx.Err() != nil && most > 0 {
				return int(most), false, nil
			}
			return int(most), false, err
		}
		if got > 0 {
			// Two scrapes at least a step apart: the round's first first token took one step at least.
			spacing = max(spacing, time.Duration(r.first.Load()-sent.UnixNano()))
		}
		most = max(most, st.Running)
		switch {
		case r.ended.Load() > 0:
			// A probe request's stream ended before the round did: its seat freed, and what waited took it. What
			// ran stands as a lower bound.
			return int(most), false, errSeatStreamsEnd
		case got == int64(k) && st.Waiting == 0:
			return int(st.Running), false, nil
		case got > 0 && st.Waiting > 0 && prevWait > 0 && st.Running == prevRun && got == prevGot:
			return int(st.Running), true, nil
		}
		prevRun, prevWait, prevGot = st.Running, st.Waiting, got
		timer.Reset(spacing)
	}
}

// seatRequests counts a round's probe requests.
type seatRequests struct {
	sent    int64        // requests the round sends
	started atomic.Int64 // with a first token
	ended   atomic.Int64 // streams the engine ended before the round did
	failed  atomic.Int64 // refused, broken or unreachable before the round ended
	status  atomic.Int64 // the first non-200 status
	first   atomic.Int64 // UnixNano of the round's first first token
	errMu   sync.Mutex
	err     error
}

func (r *seatRequests) why() string {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	if r.err == nil {
		return "a probe request failed"
	}
	return r.err.Error()
}

func (r *seatRequests) fail(err error) {
	r.errMu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.errMu.Unlock()
	r.failed.Add(1)
}

// hold sends one probe request and holds its seat until ctx ends: its first bytes are its first token.
func (r *seatRequests) hold(ctx context.Context, cl *http.Client, cfg *BackendConfig, body string) {
	req, err := completionRequest(ctx, cfg, body)
	if err != nil {
		r.fail(err)
		return
	}
	resp, err := cl.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			r.fail(err)
		}
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.status.CompareAndSwap(0, int64(resp.StatusCode))
		r.fail(fmt.Errorf("probe request: status %d", resp.StatusCode))
		return
	}
	var buf [512]byte
	for {
		n, err := resp.Body.Read(buf[:])
		if n > 0 {
			break
		}
		if err != nil {
			if ctx.Err() == nil {
				r.fail(fmt.Errorf("probe request: the stream ended before its first token: %w", err))
			}
			return
		}
	}
	now := time.Now().UnixNano()
	r.first.CompareAndSwap(0, now)
	r.started.Add(1)
	if _, err := io.Copy(io.Discard, resp.Body); err == nil && ctx.Err() == nil {
		r.ended.Add(1)
	}
}

// completionRequest returns a POST of body to the backend's completions endpoint, with its upstream headers.
func completionRequest(ctx context.Context, cfg *BackendConfig, body string) (*http.Request, error) {
	u := cfg.URL + string(cfg.Path.AppendPath(nil, []byte("/v1/completions"), cfg.Models[0]))
	if cfg.Query != "" {
		u += "?" + cfg.Query
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, strings.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("probe request: %w", err)
	}
	setUpstreamHeaders(req.Header, cfg)
	req.Header.Set("Content-Type", "application/json")
	return req, nil
}
