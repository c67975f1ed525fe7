package routing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"
)

// InfoSpec says where an engine states its own limits in a JSON document of its own, outside its metrics: SGLang's
// GET /get_server_info (internal_states[].effective_max_running_requests_per_dp), TGI's GET /info (max_batch_size,
// max_concurrent_requests). docs/engines.md cites each engine's document. The Monitor reads it, beside the
// scrapes, when a backend is first scraped, after each restart it detects, and every InfoInterval (InfoRetry
// after a failure, doubling), so that the concurrency cap knows the engine's seats from its first scrapes instead
// of learning them from a queue. The zero value reads nothing.
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
	// InfoRetry is how soon a failed read is tried again; each further failure in a row doubles it, up to
	// InfoInterval.
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

// infoRead is one read of an engine's info document, made by a goroutine of its own (a document that hangs must
// not hold up the scrapes: their figures go stale in 500 ms) and handed to the scraping goroutine.
type infoRead struct {
	gen uint64 // the scraper's infoGen when the read started
	in  EngineInfo
	err error
	at  time.Time
}

// fetchInfo reads the engine's info document from the first of paths that answers 200, with cl.
func fetchInfo(ctx context.Context, cl *http.Client, cfg *BackendConfig, timeout time.Duration, paths []string) (EngineInfo, error) {
	spec := cfg.Spec()
	for _, p := range paths {
		doc, status, err := getInfo(ctx, cl, cfg, timeout, p)
		if err != nil {
			return EngineInfo{}, err
		}
		if status == http.StatusNotFound || status == http.StatusMethodNotAllowed {
			continue
		}
		if status != http.StatusOK {
			return EngineInfo{}, fmt.Errorf("engine info %s%s: status %d", cfg.Name, p, status)
		}
		in := EngineInfo{Path: p}
		in.MaxSeqs, _ = firstPositive(doc, spec.Info.MaxSeqs)
		in.MaxInflight, _ = firstPositive(doc, spec.Info.MaxInflight)
		return in, nil
	}
	return EngineInfo{}, fmt.Errorf("engine info %s: %w", cfg.Name, errNoInfoPath)
}

// getInfo fetches one path and decodes its JSON body (numbers kept as json.Number); a status other than 200 is
// returned with a nil document.
func getInfo(ctx context.Context, cl *http.Client, cfg *BackendConfig, timeout time.Duration, path string) (any, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.URL+path, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("engine info %s: %w", cfg.Name, err)
	}
	setUpstreamHeaders(req.Header, cfg)
	req.Header.Set("Accept", "application/json")
	resp, err := cl.Do(req)
	if err != nil {
		return nil, 0, fmt.Errorf("engine info %s: %w", cfg.Name, err)
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
			return nil, 0, fmt.Errorf("engine info %s%s: larger than %d bytes", cfg.Name, path, MaxInfoBytes)
		}
		return nil, 0, fmt.Errorf("engine info %s%s: %w", cfg.Name, path, err)
	}
	return doc, http.StatusOK, nil
}

// refreshInfo takes the result of the last read of the engine's info document, if one finished, and starts the
// next when it is due: never read, a restart, InfoInterval since the last read, InfoRetry after a failed one
// (doubling with each failure in a row, up to InfoInterval). What the document states is kept in s.info until
// a read states otherwise; a failed read keeps it, except after a restart, which may have changed it (a read
// started before the restart is dropped). Called by the scraping goroutine after each successful scrape.
func (s *scraper) refreshInfo(ctx context.Context, now time.Time, restarted bool) {
	cfg := s.b.Config()
	spec := cfg.Spec()
	if !spec.Info.Reads() {
		s.info, s.infoAt, s.infoFails = EngineInfo{}, time.Time{}, 0
		s.b.info.Store(nil)
		return
	}
	if restarted {
		s.info, s.infoAt, s.infoFails = EngineInfo{}, time.Time{}, 0
		s.infoGen++
	}
	if r := s.infoDone.Swap(nil); r != nil && r.gen == s.infoGen {
		s.settleInfo(r)
	}
	wait := InfoInterval
	if s.infoFails > 0 {
		wait = min(InfoRetry<<min(s.infoFails-1, 16), InfoInterval)
	}
	if s.infoBusy.Load() || !s.infoAt.IsZero() && now.Sub(s.infoAt) < wait {
		return
	}
	s.infoAt = now
	paths := spec.Info.Paths
	if s.infoPath != "" {
		paths = append([]string{s.infoPath}, slices.DeleteFunc(slices.Clone(paths), func(p string) bool { return p == s.infoPath })...)
	}
	cl, gen, timeout := s.client(cfg), s.infoGen, s.m.opts.Timeout // chosen here: the scraper's state is this goroutine's
	s.infoBusy.Store(true)
	s.m.wg.Add(1)
	go func() {
		defer s.m.wg.Done()
		in, err := fetchInfo(ctx, cl, cfg, timeout, paths)
		s.infoDone.Store(&infoRead{gen: gen, in: in, err: err, at: now})
		s.infoBusy.Store(false) // after the result: a read started next finds it
	}()
}

// settleInfo keeps what one finished read found, and publishes it for /debug/backends.
func (s *scraper) settleInfo(r *infoRead) {
	switch {
	case r.err == nil:
		s.info, s.infoFails, s.infoPath = r.in, 0, r.in.Path
	case errors.Is(r.err, errNoInfoPath):
		s.info, s.infoFails = EngineInfo{}, 0 // the engine has no such document: read again at InfoInterval
	default:
		s.infoFails++
	}
	st := &InfoStatus{Path: s.info.Path, MaxSeqs: s.info.MaxSeqs, MaxInflight: s.info.MaxInflight, At: r.at}
	if r.err != nil {
		st.Error = r.err.Error()
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
