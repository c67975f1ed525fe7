package routing

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Monitor defaults (routing.md section 4.8).
const (
	// DefaultScrapeInterval is the mean time between two scrapes of one backend; each wait is drawn uniformly
	// from [2/3, 4/3] of it (100-200 ms), so scrapes of many backends do not synchronise.
	DefaultScrapeInterval = 150 * time.Millisecond
	// DefaultStaleAfter is the age past which engine metrics are ignored (about three scrapes).
	DefaultStaleAfter = 500 * time.Millisecond
	// DefaultProbeInterval is the mean time between two RTT probes of one backend (jittered likewise).
	DefaultProbeInterval = time.Second
	// DefaultRestartGap is how long scrapes may fail before the backend is presumed restarted (its KV cache
	// lost) once it answers again.
	DefaultRestartGap = 10 * time.Second
	// DefaultScrapeTimeout bounds one scrape or probe.
	DefaultScrapeTimeout = time.Second
	// DefaultIdleProbeAfter is the least time a backend may go without a first token before the Monitor sends it
	// a one-token completion to measure its TTFT (so a backend that routing avoids after a slowdown is seen to
	// recover); the probes repeat at that interval while it stays idle. A backend whose fair share of its models'
	// traffic is sparser waits longer (idleprobe.go).
	DefaultIdleProbeAfter = 2 * time.Second
	// idleProbeTimeout bounds one idle probe: a backend slower than this teaches the model by the timeout.
	idleProbeTimeout = 10 * time.Second
	// sweepInterval is how often the Monitor expires prefix-index entries.
	sweepInterval = time.Second
)

// MonitorOptions configure a Monitor. Zero fields take the defaults above.
type MonitorOptions struct {
	// ScrapeInterval is the mean time between scrapes of one backend.
	ScrapeInterval time.Duration
	// StaleAfter is the age past which a backend's engine metrics are ignored.
	StaleAfter time.Duration
	// ProbeInterval is the mean time between RTT probes of one backend.
	ProbeInterval time.Duration
	// RestartGap is how long scrapes may fail before the backend counts as restarted when it comes back.
	RestartGap time.Duration
	// Timeout bounds each scrape and probe.
	Timeout time.Duration
	// IdleProbeAfter is the least time a backend may go without a first token before it is sent a one-token
	// completion (only to engines whose spec allows it: never to hosted APIs, which bill per request; see
	// idleprobe.go for the rest of the rule). Negative disables idle probes.
	IdleProbeAfter time.Duration
	// Client does the scrapes and HTTP probes; nil means a keep-alive client of the Monitor's own.
	Client *http.Client
	// Clock stamps snapshots and measures staleness and gaps; nil means the system clock. (The waits between
	// scrapes always use real timers.)
	Clock Clock
	// OnScrape, when set, is called after every scrape attempt with its error (nil on success), from the
	// backend's scraping goroutine: for logs and tests. It must not block.
	OnScrape func(b *Backend, err error)
	// OnBack, when set, is called when a scrape succeeds after one or more failed ones (the engine answers
	// again: it was down, restarted or cut off) or finds another engine process than the last (see Monitor),
	// restarted saying which, from the backend's scraping goroutine once the scrape is published. The gateway
	// ends an outlier ejection for errors with it (admission.Outlier.Back). It must not block.
	OnBack func(b *Backend, restarted bool)
}

// Monitor keeps the registry's backends' engine metrics and RTT current: one goroutine per backend scrapes its
// engine's metrics (where and which names its EngineSpec says; engines with nothing to scrape, such as hosted
// APIs, are only probed) every ScrapeInterval and probes its RTT
// every ProbeInterval, and one more goroutine follows the registry across reloads (starting and stopping
// backend goroutines) and expires prefix-index entries every second.
//
// A scrape publishes an immutable EngineStats on the Backend. A failed scrape publishes the last snapshot marked
// Stale, so routing falls back to the gateway's own accounting. A restart — process_start_time_seconds changed,
// a counter went backwards, or scrapes failed for RestartGap — wipes the backend's prefix-index entries; new
// preemptions shrink the share of its KV capacity the index assumes by 5%. The engine's cache_config_info sizes
// its prefix-index capacity.
//
// Start and Stop may be called from any goroutine; Stop waits for every goroutine the Monitor started.
type Monitor struct {
	reg    *Registry
	opts   MonitorOptions
	client *http.Client
	ownsCl bool

	mu      sync.Mutex
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	running map[*Backend]context.CancelFunc
}

// NewMonitor returns a Monitor of reg's backends. It does nothing until Start.
func NewMonitor(reg *Registry, opts MonitorOptions) *Monitor {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&opts.ScrapeInterval, DefaultScrapeInterval)
	def(&opts.StaleAfter, DefaultStaleAfter)
	def(&opts.ProbeInterval, DefaultProbeInterval)
	def(&opts.RestartGap, DefaultRestartGap)
	def(&opts.Timeout, DefaultScrapeTimeout)
	if opts.IdleProbeAfter == 0 {
		opts.IdleProbeAfter = DefaultIdleProbeAfter
	}
	if opts.Clock == nil {
		opts.Clock = SystemClock{}
	}
	m := &Monitor{reg: reg, opts: opts, client: opts.Client}
	if m.client == nil {
		m.client = newScrapeClient(opts.Timeout, nil)
		m.ownsCl = true
	}
	return m
}

// newScrapeClient returns a keep-alive client for scrapes and probes; ca, when not nil, replaces the system
// roots for https backends.
func newScrapeClient(timeout time.Duration, ca *CABundle) *http.Client {
	tr := &http.Transport{
		Proxy:               nil, // backends are reached directly, never through HTTP_PROXY
		DialContext:         (&net.Dialer{Timeout: timeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 2,
		IdleConnTimeout:     90 * time.Second,
	}
	if ca != nil {
		tr.TLSClientConfig = &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}
	}
	return &http.Client{Transport: tr}
}

// Start launches the Monitor's goroutines. Calling it again while running does nothing.
func (m *Monitor) Start() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cancel != nil {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	m.running = make(map[*Backend]context.CancelFunc)
	changes, unwatch := m.reg.watch()
	m.reconcileLocked(ctx)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer unwatch()
		sweep := time.NewTicker(sweepInterval)
		defer sweep.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-changes:
				m.mu.Lock()
				if ctx.Err() == nil {
					m.reconcileLocked(ctx)
				}
				m.mu.Unlock()
			case <-sweep.C:
				now := m.opts.Clock.Now()
				m.reg.Index().Sweep(now)
				m.sweepIdle(now)
			}
		}
	}()
}

// Stop stops every goroutine the Monitor started and waits for them. The Monitor may be started again.
func (m *Monitor) Stop() {
	m.mu.Lock()
	cancel := m.cancel
	m.cancel = nil
	m.running = nil
	m.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	m.wg.Wait()
	if m.ownsCl {
		m.client.CloseIdleConnections()
	}
}

// reconcileLocked starts a goroutine for each backend of the registry without one and stops those of backends
// it no longer holds. Callers hold m.mu.
func (m *Monitor) reconcileLocked(ctx context.Context) {
	want := make(map[*Backend]bool)
	for _, b := range m.reg.Backends() {
		want[b] = true
		if _, ok := m.running[b]; ok {
			continue
		}
		bctx, cancel := context.WithCancel(ctx)
		m.running[b] = cancel
		b.staleAfter.Store(int64(m.opts.StaleAfter))
		b.watched.Store(true) // before its goroutine runs: Measuring is true from here until its first scrape
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.run(bctx, b)
		}()
	}
	for b, cancel := range m.running {
		if !want[b] {
			cancel()
			delete(m.running, b)
		}
	}
}

// jitter returns d scaled by a uniform factor in [2/3, 4/3].
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (2.0/3 + rand.Float64()*2/3))
}

// run is one backend's scraping goroutine.
func (m *Monitor) run(ctx context.Context, b *Backend) {
	s := &scraper{m: m, b: b, br: bufio.NewReaderSize(nil, 16<<10)}
	defer s.closeCA()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var nextProbe time.Time
	var idle atomic.Bool // an idle probe is running
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if b.Config().Spec().Scrapes() {
			err := s.scrape(ctx)
			if ctx.Err() != nil {
				return
			}
			if m.opts.OnScrape != nil {
				m.opts.OnScrape(b, err)
			}
		}
		b.scrapedOnce.Store(true) // after the scrape: a seat probe it started is seen running (Measuring)
		if now := time.Now(); !now.Before(nextProbe) {
			s.probe(ctx)
			nextProbe = now.Add(jitter(m.opts.ProbeInterval))
		}
		if !idle.Load() && s.idleProbeDue() {
			// In its own goroutine: a slow backend must not hold up its scrapes.
			s.lastIdleP = b.clock.Now()
			idle.Store(true)
			cl := s.client(b.Config()) // chosen here: the scraper's state belongs to this goroutine
			m.wg.Add(1)
			go func() {
				defer m.wg.Done()
				defer idle.Store(false)
				s.idleProbe(ctx, cl)
			}()
		}
		if o := b.obs.Load(); o != nil {
			o.inflight.Set(float64(b.LocalInflight()))
		}
		timer.Reset(jitter(m.opts.ScrapeInterval))
	}
}

// scraper is one backend's scraping state, owned by its goroutine.
type scraper struct {
	m         *Monitor
	b         *Backend
	br        *bufio.Reader
	last      *EngineStats // last successful scrape
	lastOK    time.Time
	failing   bool      // the last scrape failed
	lastIdleP time.Time // last idle probe, on the backend's clock

	caClient *http.Client // for a backend with a CA bundle of its own (BackendConfig.CA), built for caSum
	caSum    [32]byte

	info      EngineInfo // what the engine's info document stated at its last good read (InfoSpec)
	infoAt    time.Time  // when the last read started, on the Monitor's clock (zero: due)
	infoFails int        // reads failed in a row
	infoPath  string     // the path that answered last
	infoGen   uint64     // bumped by a restart: a read started before it is dropped
	infoBusy  atomic.Bool
	infoDone  atomic.Pointer[infoRead] // a finished read, for the scraping goroutine to take

	seatOwn    atomic.Pointer[seatRequests] // a seat probe's running round (seatprobe.go), which scrapes leave out
	seatDone   atomic.Pointer[seatOutcome]  // how the last one ended, for the scraping goroutine to take
	seatsKnown bool                         // a probe of this engine process found what it can (or was refused)
	seatFails  int                          // probes that found nothing, in a row
	seatNext   time.Time                    // no probe before this, on the Monitor's clock
}

// client returns the HTTP client for the backend's current configuration: the Monitor's, or one that trusts
// the backend's own CA bundle (rebuilt when a reload changes the bundle). Only the scraping goroutine calls it.
func (s *scraper) client(cfg *BackendConfig) *http.Client {
	if cfg.CA == nil {
		return s.m.client
	}
	if s.caClient == nil || s.caSum != cfg.CA.Sum {
		s.closeCA()
		s.caClient, s.caSum = newScrapeClient(s.m.opts.Timeout, cfg.CA), cfg.CA.Sum
	}
	return s.caClient
}

func (s *scraper) closeCA() {
	if s.caClient != nil {
		s.caClient.CloseIdleConnections()
		s.caClient = nil
	}
}

// scrape fetches and parses the backend's /metrics once and publishes the result.
func (s *scraper) scrape(ctx context.Context) error {
	b := s.b
	begun, sent := b.requests.Load(), s.m.opts.Clock.Now()
	st, err := s.fetch(ctx)
	now := s.m.opts.Clock.Now()
	if err != nil {
		s.failing = ctx.Err() == nil // a scrape cut short by Stop says nothing about the engine
		if cur := b.engine.Load(); cur != nil && !cur.Stale {
			stale := *cur
			stale.Stale = true
			b.engine.Store(&stale)
		}
		return err
	}
	st.At = now
	st.begun, st.ended, st.sent = begun, b.ended.Load(), sent
	s.discount(st)
	restarted := s.restarted(st, now)
	s.refreshInfo(ctx, now, restarted)
	s.applyInfo(st)
	if restarted {
		if o := b.prefixOwner(); o != nil {
			o.Clear()
		}
		s.seatsKnown, s.seatFails, s.seatNext = false, 0, time.Time{} // another process: its seats may differ
	} else if p := s.last; p != nil && p.Has&st.Has&HasPreemptions != 0 && st.Preemptions > p.Preemptions {
		// Preemptions mean the KV cache ran out: the engine is evicting cached prefixes faster than the index
		// assumes. Shrink the share of its capacity the index may count on (routing.md 4.4, eviction-pressure
		// aging); cached_tokens feedback grows it back.
		b.alpha.store(max(b.alpha.load()*0.95, minAlpha))
		b.applyCapacity()
	}
	if st.Has&HasCacheConfig != 0 && st.BlockSize > 0 {
		blocks := int64(st.NumGPUBlocks) * int64(st.BlockSize) / blockTokens
		if b.kvBlocks.Swap(blocks) != blocks {
			b.applyCapacity()
		}
	}
	s.last, s.lastOK = st, now
	if s.seatProbeDue(now) {
		s.startSeatProbe(ctx) // before the scrape is published: whoever sees it sees the probe running
	}
	b.engine.Store(st)
	b.notePeers(st)
	if o := b.obs.Load(); o != nil {
		o.queueDepth.Set(st.Waiting)
	}
	if (s.failing || restarted) && s.m.opts.OnBack != nil {
		s.m.opts.OnBack(b, restarted)
	}
	s.failing = false
	return nil
}

// restarted reports whether st comes from a different engine process than the last good scrape.
func (s *scraper) restarted(st *EngineStats, now time.Time) bool {
	p := s.last
	if p == nil {
		return false
	}
	both := func(f EngineFields) bool { return p.Has&f != 0 && st.Has&f != 0 }
	switch {
	case now.Sub(s.lastOK) > s.m.opts.RestartGap:
		return true
	case both(HasStartTime) && math.Abs(st.StartTime-p.StartTime) > 0.5:
		return true
	case both(HasPreemptions) && st.Preemptions < p.Preemptions:
		return true
	case both(HasPrefixCounters) && st.PrefixQueries < p.PrefixQueries:
		return true
	}
	return false
}

func (s *scraper) fetch(ctx context.Context) (*EngineStats, error) { return s.fetchWith(ctx, s.br) }

// fetchWith scrapes the engine's metrics once, reading through br (a seat probe's own, or the scraper's).
func (s *scraper) fetchWith(ctx context.Context, br *bufio.Reader) (*EngineStats, error) {
	ctx, cancel := context.WithTimeout(ctx, s.m.opts.Timeout)
	defer cancel()
	cfg := s.b.Config()
	spec := cfg.Spec()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, metricsURL(cfg.URL, spec), nil)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", s.b.Name(), err)
	}
	setUpstreamHeaders(req.Header, cfg)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := s.client(cfg).Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", s.b.Name(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, fmt.Errorf("scrape %s: status %d", s.b.Name(), resp.StatusCode)
	}
	st := &EngineStats{}
	err = spec.ParseMetrics(resp.Body, br, st)
	br.Reset(nil) // do not keep the body reachable
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", s.b.Name(), err)
	}
	return st, nil
}

// metricsURL returns where the engine's metrics are: base (the backend's URL) with the spec's path, and its
// port when it has one of its own.
func metricsURL(base string, spec *EngineSpec) string {
	if spec.MetricsPort == 0 {
		return base + spec.MetricsPath
	}
	u, err := url.Parse(base)
	if err != nil {
		return base + spec.MetricsPath // the request fails and says why
	}
	u.Host = net.JoinHostPort(u.Hostname(), strconv.Itoa(spec.MetricsPort))
	return u.String() + spec.MetricsPath
}

// probe measures one round trip to the backend: a GET /health on a kept-alive connection for engines that are
// scraped (any HTTP answer is a round trip), a TCP connect for those that are not (hosted APIs). A failed probe is not a measurement.
func (s *scraper) probe(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, s.m.opts.Timeout)
	defer cancel()
	cfg := s.b.Config()
	start := time.Now()
	if !cfg.Spec().Scrapes() {
		u, err := url.Parse(cfg.URL)
		if err != nil {
			return
		}
		host := u.Host
		if u.Port() == "" {
			host = net.JoinHostPort(u.Hostname(), map[bool]string{true: "443", false: "80"}[u.Scheme == "https"])
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", host)
		if err != nil {
			return
		}
		s.b.observeProbe(time.Since(start))
		c.Close()
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.URL+"/health", nil)
	if err != nil {
		return
	}
	setUpstreamHeaders(req.Header, cfg)
	resp, err := s.client(cfg).Do(req)
	if err != nil {
		return
	}
	d := time.Since(start)
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	s.b.observeProbe(d)
}
