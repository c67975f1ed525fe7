package proxy

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

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
}

// Admin serves the admin port: /metrics, /healthz, /readyz, /debug/backends, /debug/config and a small live
// status page at /. It is a net/http handler: the admin port carries little traffic, and the Prometheus
// handler is net/http native.
type Admin struct {
	s   *Server
	mux *http.ServeMux
}

//go:embed status.html
var statusPage []byte

// NewAdmin returns the admin handler for s, exporting the metrics gathered by g.
func NewAdmin(s *Server, g prometheus.Gatherer) *Admin {
	a := &Admin{s: s, mux: http.NewServeMux()}
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
		}
		out = append(out, st)
	}
	return out
}

func (a *Admin) backends(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, a.Backends())
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

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
