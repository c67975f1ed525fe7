package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"
)

// Faults is a backend's injected fault state at run time. POST /sim/control replaces it whole: the fields a
// request leaves out take their baseline (Slowdown 1, FailRate the Config's FailRate, Stall 0, Down false), so
// {} restores the baseline.
type Faults struct {
	// Slowdown multiplies every step's time, prefill and decode alike; 1 is normal, must be > 0.
	Slowdown float64
	// FailRate is the share of completion requests answered 500 before any token, in [0, 1].
	FailRate float64
	// Stall holds each new request's first token this much longer (it is added to the overhead when the request
	// arrives, so requests already queued are not affected). Not negative.
	Stall time.Duration
	// StallRate, when > 0, stalls only that share of new requests (drawn per request), in [0, 1]: a backend
	// with a heavy TTFT tail rather than a stalled one. 0 stalls every request.
	StallRate float64
	// Down refuses every request but /sim/control with 503; going down drops the running streams at once,
	// without [DONE], as a crash would.
	Down bool
}

// faultsJSON is the wire form of Faults (GET /sim/control answers it, with started_at).
type faultsJSON struct {
	Slowdown  float64 `json:"slowdown"`
	FailRate  float64 `json:"fail_rate"`
	Stall     string  `json:"stall"`
	StallRate float64 `json:"stall_rate,omitempty"`
	Down      bool    `json:"down"`
	StartedAt string  `json:"started_at,omitempty"`
}

// controlRequest is POST /sim/control's body; nil fields take their baseline.
type controlRequest struct {
	Slowdown  *float64 `json:"slowdown"`
	FailRate  *float64 `json:"fail_rate"`
	Stall     *string  `json:"stall"`
	StallRate *float64 `json:"stall_rate"`
	Down      *bool    `json:"down"`
	// Restart is an action: it restarts the engine (see Backend.Restart) before the new state applies.
	Restart bool `json:"restart"`
	// EvictCache is an action: it drops every cached prefix block that no sequence holds (see
	// Backend.EvictCache), as other tenants' traffic on a shared engine would.
	EvictCache bool `json:"evict_cache"`
}

func (f Faults) validate() error {
	switch {
	case !(f.Slowdown > 0) || math.IsInf(f.Slowdown, 0):
		return fmt.Errorf("slowdown: %v must be > 0", f.Slowdown)
	case !(f.FailRate >= 0 && f.FailRate <= 1):
		return fmt.Errorf("fail_rate: %v is outside [0, 1]", f.FailRate)
	case f.Stall < 0:
		return fmt.Errorf("stall: %v must not be negative", f.Stall)
	case !(f.StallRate >= 0 && f.StallRate <= 1):
		return fmt.Errorf("stall_rate: %v is outside [0, 1]", f.StallRate)
	}
	return nil
}

// parseControl decodes a POST /sim/control body strictly (unknown fields and trailing data are errors) into the
// new fault state, starting from base.
func parseControl(body []byte, base Faults) (Faults, controlRequest, error) {
	var req controlRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return Faults{}, controlRequest{}, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return Faults{}, controlRequest{}, errors.New("unexpected data after the JSON object")
	}
	f := base
	if req.Slowdown != nil {
		f.Slowdown = *req.Slowdown
	}
	if req.FailRate != nil {
		f.FailRate = *req.FailRate
	}
	if req.Stall != nil {
		d, err := time.ParseDuration(*req.Stall)
		if err != nil {
			return Faults{}, controlRequest{}, fmt.Errorf("stall: %q is not a duration (like 5s)", *req.Stall)
		}
		f.Stall = d
	}
	if req.StallRate != nil {
		f.StallRate = *req.StallRate
	}
	if req.Down != nil {
		f.Down = *req.Down
	}
	if err := f.validate(); err != nil {
		return Faults{}, controlRequest{}, err
	}
	return f, req, nil
}

// baseFaults is the state {} restores.
func (b *Backend) baseFaults() Faults { return Faults{Slowdown: 1, FailRate: b.cfg.FailRate} }

// Faults returns the current fault state.
func (b *Backend) Faults() Faults { return b.eng.getFaults() }

// SetFaults replaces the fault state (as POST /sim/control without restart). It fails, changing nothing, if a
// value is out of range.
func (b *Backend) SetFaults(f Faults) error {
	if err := f.validate(); err != nil {
		return fmt.Errorf("sim: control: %w", err)
	}
	b.eng.setFaults(f)
	return nil
}

// EvictCache drops every cached prefix block that no running sequence holds, as the traffic of other clients of
// a shared engine would: the next request for an evicted prefix prefills it again. Unlike Restart, nothing else
// changes (no request is dropped, the metrics and process_start_time_seconds go on), so a gateway has no sign of
// it but the cached_tokens of later answers.
func (b *Backend) EvictCache() { b.eng.evictCache() }

// Restart restarts the simulated engine as a process restart would: every request in flight is dropped (its
// connection closes without [DONE]), the KV cache is wiped, every metric starts again from zero and
// process_start_time_seconds becomes now. The fault state is left as it is.
func (b *Backend) Restart() { b.eng.restart() }

// serveControl answers GET and POST /sim/control. It is never delayed by RTT nor refused while down: it is the
// test harness's handle, not part of the simulated server.
func (b *Backend) serveControl(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
	case http.MethodPost:
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<16))
		if err != nil {
			writeError(w, http.StatusBadRequest, "sim: control: "+err.Error())
			return
		}
		f, act, err := parseControl(body, b.baseFaults())
		if err != nil {
			writeError(w, http.StatusBadRequest, "sim: control: "+err.Error())
			return
		}
		if act.Restart {
			b.eng.restart()
		}
		if act.EvictCache {
			b.eng.evictCache()
		}
		b.eng.setFaults(f)
	default:
		w.Header().Set("Allow", "GET, POST")
		writeError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	f := b.eng.getFaults()
	out, _ := json.Marshal(faultsJSON{
		Slowdown: f.Slowdown, FailRate: f.FailRate, Stall: f.Stall.String(), StallRate: f.StallRate, Down: f.Down,
		StartedAt: b.eng.startTime().UTC().Format(time.RFC3339Nano),
	})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(out, '\n'))
}
