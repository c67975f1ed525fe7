package proxy

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
)

// BackendStatus is one backend as /debug/backends shows it: routing's view (its engine and the load signals
// that engine exports, lacks or left out of its last scrape; live counts, scraped engine metrics, predictions,
// prefix-index share) plus what the request path knows (URL, circuit breaker, outlier detector, concurrency
// cap).
type BackendStatus struct {
	routing.BackendStatus
	URL              string `json:"url"`
	Breaker          string `json:"breaker"`
	Outlier          string `json:"outlier"`
	ConcurrencyLimit int    `json:"concurrency_limit"`
	// EngineSeats is the engine's batch size as the concurrency cap learned it (admission.Cap.Seats; 0: not
	// known): requests are not sent to wait inside the engine beyond it.
	EngineSeats int `json:"engine_seats"`
	// Seats is the cap's best figure of the engine's seats, where it came from and how sure it is
	// (admission.Cap.SeatsSource).
	Seats SeatsStatus `json:"seats"`
}

// SeatsStatus is a backend's seat figure in /debug/backends.
type SeatsStatus struct {
	// Figure is the seats (0: none yet).
	Figure int `json:"figure"`
	// From is engine (it states them: its metrics or its info document), policy (backends[].max_num_seqs),
	// queue (its running count while it kept requests waiting), probe (the largest batch it ever ran) or
	// unknown.
	From string `json:"from"`
	// Via says, for seats from the engine, where it stated them: metrics, or its info document's path
	// (/get_server_info, /info); seat_probe for a figure the Monitor's seat probe measured (queue) or found a
	// lower bound of (probe) before any load showed it (routing/seatprobe.go).
	Via string `json:"via,omitempty"`
	// Sure is stated (engine, policy), measured (queue), at_least (probe) or none.
	Sure string `json:"sure"`
	// Working is the seats the cap works with now while the model has critical demand (admission.Cap.Batch):
	// the figure when stated or measured, provisional seats past a probe's figure, 0 when the cap reads no batch
	// from its engine.
	Working int `json:"working"`
	// Hint says, for a figure that is not stated, how to state it.
	Hint string `json:"hint,omitempty"`
	// Ceiling is the most requests the engine says it holds at once before it refuses new ones (TGI's
	// max_concurrent_requests, from its /info), which the cap's limit never exceeds; 0: none stated.
	Ceiling int `json:"ceiling,omitempty"`
	// Critical is the most requests the cap lets in flight now for a critical one to be sent
	// (admission.Cap.LimitFor): Working on a backend that shares its model, more on the only backend of its
	// models while the engine's seats are not known and it shows nothing waiting.
	Critical int `json:"critical"`
}

// seatsHint is SeatsStatus.Hint for an adaptive cap whose engine's seats are not stated.
const seatsHint = "the engine does not state its batch limit: set backends[].max_num_seqs in the policy to its " +
	"--max-num-seqs (TGI: start it with --max-batch-size, which its /info states) so that its seats are known " +
	"from the first request; until then they are measured from its running batch and queue"

// Admin serves the admin port: /metrics, /healthz, /readyz, /debug/backends, /debug/config, the status
// page's data (/debug/timeseries, /debug/decisions, /debug/policy) and the live status page at / (status.html,
// one embedded file with no external assets). It is a net/http handler: the admin port carries little
// traffic, and the Prometheus handler is net/http native.
type Admin struct {
	s   *Server
	g   prometheus.Gatherer
	mux *http.ServeMux
	now func() time.Time // time.Now unless a test sets it
}

//go:embed status.html
var statusPage []byte

// NewAdmin returns the admin handler for s, exporting the metrics gathered by g.
func NewAdmin(s *Server, g prometheus.Gatherer) *Admin {
	a := &Admin{s: s, g: g, mux: http.NewServeMux(), now: time.Now}
	a.mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	a.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	a.mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, why := s.Ready()
		if !ok {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = w.Write([]byte(why + "\n"))
	})
	a.mux.HandleFunc("GET /debug/backends", a.backends)
	a.mux.HandleFunc("GET /debug/config", a.config)
	a.mux.HandleFunc("GET /debug/models", a.models)
	a.mux.HandleFunc("GET /debug/timeseries", a.timeseries)
	a.mux.HandleFunc("GET /debug/decisions", a.decisions)
	a.mux.HandleFunc("GET /debug/policy", a.policy)
	a.mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(statusPage)
	})
	return a
}

// ServeHTTP implements http.Handler.
func (a *Admin) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// Backends returns the status of every backend of the current policy.
func (a *Admin) Backends() []BackendStatus {
	snap := a.s.src.Snapshot()
	if snap == nil {
		return []BackendStatus{}
	}
	out := make([]BackendStatus, 0, len(snap.Backends))
	for _, b := range snap.Backends {
		st := BackendStatus{BackendStatus: b.Status(), URL: b.Config().URL, Breaker: a.s.brk.state(b).String(), Outlier: "serving"}
		if o := a.s.outliers.Get(st.Name); o != nil {
			st.Outlier = o.State().String()
		}
		if c := a.s.caps.Get(st.Name); c != nil {
			st.ConcurrencyLimit, st.EngineSeats = c.Limit(), c.Seats()
			n, from := c.SeatsSource()
			st.Seats = SeatsStatus{Figure: n, From: from.String(), Sure: from.Sure(), Working: c.Batch(),
				Ceiling: c.Ceiling(), Critical: c.LimitFor(admission.Critical, true)}
			if c.Adaptive() && from.Sure() != "stated" {
				st.Seats.Hint = seatsHint
			}
			if e := b.Engine(); from == admission.SeatsEngine && e != nil {
				st.Seats.Via = e.MaxSeqsFrom
			}
			if p, exact, at := b.ProbedSeats(); !at.IsZero() && p == n &&
				(from == admission.SeatsQueue && exact || from == admission.SeatsFloor && !exact) {
				st.Seats.Via = "seat_probe"
			}
		} else {
			st.Seats = SeatsStatus{From: admission.SeatsUnknown.String(), Sure: admission.SeatsUnknown.Sure()}
		}
		out = append(out, st)
	}
	return out
}

func (a *Admin) backends(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, a.Backends())
}

// ModelStatus is one model's admission state as /debug/models shows it.
type ModelStatus struct {
	// Name is the model's name in the policy.
	Name string `json:"name"`
	// Queued is how many of its requests wait in the gateway's queue.
	Queued int `json:"queued"`
	// Reserve is its fleet's seats and those kept free for critical requests (admission.SeatReserve).
	Reserve admission.ReserveStatus `json:"reserve"`
	// Yields is where its yielding seats stand (models[].preempt); absent without preempt.
	Yields *YieldStatus `json:"yields,omitempty"`
}

// YieldStatus is a model's yielding seats (docs/design.md, "Yielding seats") as /debug/models shows them.
type YieldStatus struct {
	// Streams is how many streams hold a seat they would give a critical request.
	Streams int `json:"streams"`
	// Asked is how many yields were asked whose seats are not free yet.
	Asked int `json:"asked"`
	// CriticalWaiting is how many critical requests wait in the queue for a seat.
	CriticalWaiting int `json:"critical_waiting"`
}

// Models returns the admission state of every model of the current policy, in the policy's order.
func (a *Admin) Models() []ModelStatus {
	snap := a.s.src.Snapshot()
	if snap == nil {
		return []ModelStatus{}
	}
	res := a.s.follow(snap) // the records a request would find
	out := make([]ModelStatus, 0, len(res.snap.ModelNames))
	for _, name := range res.snap.ModelNames {
		rec := res.models[res.snap.Models[name]]
		if rec == nil {
			continue
		}
		free, seats, _ := rec.fleetSeats()
		st := ModelStatus{Name: name, Queued: rec.queue.Len(), Reserve: rec.reserve.Status(free, seats)}
		if y := rec.yield; y != nil {
			st.Yields = y.status()
		}
		out = append(out, st)
	}
	return out
}

func (a *Admin) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, a.Models())
}

func (a *Admin) config(w http.ResponseWriter, _ *http.Request) {
	snap := a.s.src.Snapshot()
	if snap == nil {
		http.Error(w, "no policy loaded", http.StatusServiceUnavailable)
		return
	}
	type model struct {
		Name     string   `json:"name"`
		Strategy string   `json:"strategy"`
		Backends []string `json:"backends"`
	}
	out := struct {
		Hash   string    `json:"hash"`
		Loaded time.Time `json:"loaded"`
		Region string    `json:"region"`
		Models []model   `json:"models"`
	}{Hash: snap.Hash, Loaded: snap.Loaded, Region: snap.Region, Models: []model{}}
	for _, name := range snap.ModelNames {
		m := snap.Models[name]
		mm := model{Name: m.Name, Strategy: m.StrategyName}
		for _, t := range m.Targets {
			mm.Backends = append(mm.Backends, t.Backend.Name())
		}
		out.Models = append(out.Models, mm)
	}
	writeJSON(w, out)
}

// timeseries serves the charts' data: ?window=SECONDS (default and at most 299) in points of ?step=SECONDS
// (default 1), ending with the last whole second.
func (a *Admin) timeseries(w http.ResponseWriter, r *http.Request) {
	window := intParam(r, "window", tsBuckets-1)
	step := intParam(r, "step", 1)
	writeJSON(w, a.s.rings.ts.snapshot(a.now().Unix(), window, step))
}

// decisions serves the last ?limit= (default and at most decisionRingSize) requests' routing decisions,
// newest first.
func (a *Admin) decisions(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, a.s.rings.dec.recent(intParam(r, "limit", decisionRingSize)))
}

func intParam(r *http.Request, name string, def int) int {
	if v, err := strconv.Atoi(r.URL.Query().Get(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// ReloadReporter is what a Source may also tell of its reloads (policy.Watcher does): why the last one
// failed, nil when it succeeded.
type ReloadReporter interface {
	LastError() error
}

// PathReporter is what a Source may also tell of where its policy comes from: the file it reads.
type PathReporter interface {
	Path() string
}

// PolicyStatus is GET /debug/policy: the policy in force and how its last reload went.
type PolicyStatus struct {
	// Hash identifies the policy text in force (as /debug/config); Loaded is when it was compiled.
	Hash   string    `json:"hash"`
	Loaded time.Time `json:"loaded"`
	// File is the policy file, "" when the Source does not say (PathReporter).
	File string `json:"file"`
	// Reloadable says the Source reports its reloads (ReloadReporter); a fixed policy does not.
	Reloadable bool `json:"reloadable"`
	// LastReloadOK is false when the last reload failed: Error says why, and the policy of Hash stays in force.
	LastReloadOK bool   `json:"last_reload_ok"`
	Error        string `json:"error,omitempty"`
	// ReloadSuccess and ReloadSuccessTime are switchyard_config_reload_success and
	// switchyard_config_reload_success_timestamp_seconds as /metrics has them; null when not exported.
	ReloadSuccess     *float64   `json:"reload_success_metric"`
	ReloadSuccessTime *time.Time `json:"reload_success_time"`
}

// policy serves PolicyStatus.
func (a *Admin) policy(w http.ResponseWriter, _ *http.Request) {
	snap := a.s.src.Snapshot()
	if snap == nil {
		http.Error(w, "no policy loaded", http.StatusServiceUnavailable)
		return
	}
	st := PolicyStatus{Hash: snap.Hash, Loaded: snap.Loaded, LastReloadOK: true}
	if p, ok := a.s.src.(PathReporter); ok {
		st.File = p.Path()
	}
	if rr, ok := a.s.src.(ReloadReporter); ok {
		st.Reloadable = true
		if err := rr.LastError(); err != nil {
			st.LastReloadOK, st.Error = false, err.Error()
		}
	}
	if a.g != nil {
		if mfs, err := a.g.Gather(); err == nil {
			for _, mf := range mfs {
				if len(mf.GetMetric()) == 0 || mf.GetMetric()[0].GetGauge() == nil {
					continue
				}
				v := mf.GetMetric()[0].GetGauge().GetValue()
				switch mf.GetName() {
				case "switchyard_config_reload_success":
					st.ReloadSuccess = &v
				case "switchyard_config_reload_success_timestamp_seconds":
					if v > 0 {
						t := time.Unix(0, int64(v*1e9)).UTC()
						st.ReloadSuccessTime = &t
					}
				}
			}
		}
	}
	writeJSON(w, st)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
