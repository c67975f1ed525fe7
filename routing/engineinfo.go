package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"time"
)

// InfoSpec says where an engine states its own limits in a JSON document of its own, outside its metrics: SGLang's
// GET /get_server_info (internal_states[].effective_max_running_requests_per_dp), TGI's GET /info (max_batch_size,
// max_concurrent_requests). docs/engines.md cites each engine's document. The Monitor reads it when a backend is
// first scraped, after each restart it detects, and every InfoInterval (InfoRetry after a failure), so that the
// concurrency cap knows the engine's seats from the first scrape instead of learning them from a queue. The zero
// value reads nothing.
type InfoSpec struct {
	// Paths are the document's paths, appended to the backend's URL, tried in order until one answers 200
	// (SGLang serves /server_info in newer releases, /get_server_info in older ones); the one that answered is
	// tried first afterwards.
	Paths []string
	// MaxSeqs lists the fields that may carry the most sequences the engine runs at once, its seats, in order of
	// preference: the first present as a positive number is used. A metric that carries them (SignalMaxSeqs)
	// wins over the document.
	MaxSeqs []JSONField
	// MaxInflight lists the fields that may carry the most requests the engine holds at once, running and
	// queued, past which it refuses new ones (TGI's max_concurrent_requests: 429 "Model is overloaded"). The
	// concurrency cap never lets more than that through (admission.Cap's ceiling).
	MaxInflight []JSONField
}

// Reads reports whether the spec names a document and a field to read from it.
func (s *InfoSpec) Reads() bool {
	return len(s.Paths) > 0 && (len(s.MaxSeqs) > 0 || len(s.MaxInflight) > 0)
}

// JSONField is a field of a JSON document: keys separated by dots, and a key followed by [] for an array whose
// elements' values add up (one element per data-parallel rank): max_batch_size,
// internal_states[].effective_max_running_requests_per_dp. Build one with ParseJSONField.
type JSONField struct {
	text  string
	steps []jsonStep
}

type jsonStep struct {
	key  string
	each bool // the key's value is an array: sum the rest of the path over its elements
}

// MaxJSONFieldSteps bounds the keys of one JSONField.
const MaxJSONFieldSteps = 8

// ParseJSONField parses a field path (see JSONField).
func ParseJSONField(s string) (JSONField, error) {
	if s == "" {
		return JSONField{}, errors.New("empty field path")
	}
	parts := strings.Split(s, ".")
	if len(parts) > MaxJSONFieldSteps {
		return JSONField{}, fmt.Errorf("field path %q has more than %d keys", s, MaxJSONFieldSteps)
	}
	f := JSONField{text: s}
	for _, p := range parts {
		st := jsonStep{key: p}
		if k, ok := strings.CutSuffix(p, "[]"); ok {
			st = jsonStep{key: k, each: true}
		}
		if st.key == "" || strings.ContainsAny(st.key, "[]") {
			return JSONField{}, fmt.Errorf("field path %q: %q is not a key (keys separated by '.', an array marked key[])", s, p)
		}
		f.steps = append(f.steps, st)
	}
	return f, nil
}

// mustField parses a built-in field path.
func mustField(s string) JSONField {
	f, err := ParseJSONField(s)
	if err != nil {
		panic("routing: " + err.Error())
	}
	return f
}

// String returns the path as written.
func (f JSONField) String() string { return f.text }

// value returns the field's number in doc, and whether it is there: every value it reaches is a finite JSON
// number (arrays summed; an empty array, a null, a string or an object is absent).
func (f JSONField) value(doc any) (float64, bool) { return walk(doc, f.steps) }

func walk(v any, steps []jsonStep) (float64, bool) {
	if len(steps) == 0 {
		n, ok := v.(json.Number)
		if !ok {
			return 0, false
		}
		x, err := n.Float64()
		if err != nil || math.IsInf(x, 0) || math.IsNaN(x) {
			return 0, false
		}
		return x, true
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return 0, false
	}
	next, ok := obj[steps[0].key]
	if !ok {
		return 0, false
	}
	if !steps[0].each {
		return walk(next, steps[1:])
	}
	arr, ok := next.([]any)
	if !ok || len(arr) == 0 {
		return 0, false
	}
	sum := 0.0
	for _, e := range arr {
		x, ok := walk(e, steps[1:])
		if !ok {
			return 0, false // a rank without the figure: the sum would understate the engine
		}
		sum += x
	}
	return sum, true
}

// firstPositive returns the first of fields present in doc as a positive number, at most maxEngineLimit.
func firstPositive(doc any, fields []JSONField) (int, bool) {
	for _, f := range fields {
		if x, ok := f.value(doc); ok && x >= 1 {
			return int(min(x, maxEngineLimit)), true
		}
	}
	return 0, false
}

// maxEngineLimit bounds a limit an engine states: more seats than this are no limit a gateway can reach.
const maxEngineLimit = 1 << 30

// MaxInfoBytes bounds an info document: SGLang's, which carries every server argument, is 10-30 KiB.
const MaxInfoBytes = 1 << 20

// The Monitor's schedule for an engine's info document. An engine's limits change only with a restart, which
// the scrapes detect (and which reads the document again at once): the refresh is for restarts they miss.
const (
	// InfoInterval is how long a document read stands before it is read again.
	InfoInterval = time.Minute
	// InfoRetry is how soon a failed read is tried again while the engine has no figure from it.
	InfoRetry = 5 * time.Second
)

// EngineInfo is what an engine's info document states: its seats (MaxSeqs) and the most requests it holds at once
// (MaxInflight), 0 where it states nothing, and the path it came from.
type EngineInfo struct {
	MaxSeqs, MaxInflight int
	Path                 string
}

// InfoStatus is the last read of a backend's info document, as /debug/backends shows it.
type InfoStatus struct {
	// Path is the document's path that answered ("" when none did).
	Path string `json:"path,omitempty"`
	// MaxSeqs and MaxInflight are the figures it stated (0: none).
	MaxSeqs     int `json:"max_seqs"`
	MaxInflight int `json:"max_inflight"`
	// Error is why the last read failed ("" when it did not).
	Error string `json:"error,omitempty"`
	// At is when it was read, on the Monitor's clock.
	At time.Time `json:"at"`
}

// errNoInfoPath: every path answered 404 or 405.
var errNoInfoPath = errors.New("no info document at any of its paths")

// fetchInfo reads the engine's info document from the first of its paths that answers 200.
func (s *scraper) fetchInfo(ctx context.Context) (EngineInfo, error) {
	cfg := s.b.Config()
	spec := cfg.Spec()
	paths := spec.Info.Paths
	if s.infoPath != "" {
		paths = append([]string{s.infoPath}, paths...)
	}
	tried := map[string]bool{}
	for _, p := range paths {
		if tried[p] {
			continue
		}
		tried[p] = true
		doc, status, err := s.getInfo(ctx, cfg, p)
		if err != nil {
			return EngineInfo{}, err
		}
		if status == http.StatusNotFound || status == http.StatusMethodNotAllowed {
			continue
		}
		if status != http.StatusOK {
			return EngineInfo{}, fmt.Errorf("engine info %s%s: status %d", s.b.Name(), p, status)
		}
		s.infoPath = p
		in := EngineInfo{Path: p}
		in.MaxSeqs, _ = firstPositive(doc, spec.Info.MaxSeqs)
		in.MaxInflight, _ = firstPositive(doc, spec.Info.MaxInflight)
		return in, nil
	}
	return EngineInfo{}, fmt.Errorf("engine info %s: %w", s.b.Name(), errNoInfoPath)
}

// getInfo fetches one path and decodes its JSON body (numbers kept as json.Number); a status other than 200 is
// returned with a nil document.
func (s *scraper) getInfo(ctx context.Context, cfg *BackendConfig, path string) (any, int, error) {
	ctx, cancel := context.WithTimeout(ctx, s.m.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.URL+path, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("engine info %s: %w", s.b.Name(), err)
	}
	setUpstreamHeaders(req.Header, cfg)
	req.Header.Set("Accept", "application/json")
	resp, err := s.client(cfg).Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("engine info %s: %w", s.b.Name(), err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return nil, resp.StatusCode, nil
	}
	lr := &io.LimitedReader{R: resp.Body, N: MaxInfoBytes + 1}
	dec := json.NewDecoder(lr)
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		if lr.N <= 0 {
			return nil, 0, fmt.Errorf("engine info %s%s: larger than %d bytes", s.b.Name(), path, MaxInfoBytes)
		}
		return nil, 0, fmt.Errorf("engine info %s%s: %w", s.b.Name(), path, err)
	}
	return doc, http.StatusOK, nil
}

// refreshInfo reads the engine's info document when it is due (never read, a restart, InfoInterval since the
// last read, InfoRetry since a failed one) and keeps what it states in s.info. A failed read keeps the last
// figures, except after a restart, which may have changed them.
func (s *scraper) refreshInfo(ctx context.Context, now time.Time, restarted bool) {
	spec := s.b.Config().Spec()
	if !spec.Info.Reads() {
		s.info, s.infoAt = EngineInfo{}, time.Time{}
		s.b.info.Store(nil)
		return
	}
	if restarted {
		s.info, s.infoAt = EngineInfo{}, time.Time{}
	}
	wait := InfoInterval
	if s.infoErr {
		wait = InfoRetry
	}
	if !s.infoAt.IsZero() && now.Sub(s.infoAt) < wait {
		return
	}
	s.infoAt = now
	in, err := s.fetchInfo(ctx)
	s.infoErr = err != nil
	if err != nil && errors.Is(err, errNoInfoPath) {
		s.info, s.infoErr = EngineInfo{}, false // the engine has no such document: read again at InfoInterval
	} else if err == nil {
		s.info = in
	}
	st := &InfoStatus{Path: s.info.Path, MaxSeqs: s.info.MaxSeqs, MaxInflight: s.info.MaxInflight, At: now}
	if err != nil {
		st.Error = err.Error()
	}
	s.b.info.Store(st)
}

// applyInfo writes what the info document states into a scrape: its seats where the metrics carry none.
func (s *scraper) applyInfo(st *EngineStats) {
	in := s.info
	if in.MaxSeqs > 0 && st.Has&HasMaxSeqs == 0 {
		st.MaxSeqs, st.Has = float64(in.MaxSeqs), st.Has|HasMaxSeqs
		st.MaxSeqsFrom = in.Path
	} else if st.Has&HasMaxSeqs != 0 {
		st.MaxSeqsFrom = "metrics"
	}
	if in.MaxInflight > 0 {
		st.MaxInflight, st.Has = float64(in.MaxInflight), st.Has|HasMaxInflight
		st.MaxInflightFrom = in.Path
	}
}
