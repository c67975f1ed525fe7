package policy

import (
	"fmt"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/switchyard/switchyard/routing"
)

// Engine describes one kind of inference server: where its Prometheus metrics are and which metric carries each
// load signal the gateway uses. The policy's engines table starts from the built-in entries (routing's, listed in
// docs/engines.md); an entry of the file with a built-in's name overrides that entry field by field (a field
// the file leaves out keeps the built-in's value), and an entry with a new name adds an engine that backends may
// name.
type Engine struct {
	// MetricsPath is the path of the engine's Prometheus text exposition, appended to the backend's URL. "" or
	// "none" means the engine has nothing to scrape (a hosted API): routing then uses the gateway's own
	// accounting alone, and the RTT probe is a TCP connect. Default /metrics (or the built-in's).
	MetricsPath string `yaml:"metrics_path"`
	// MetricsPort scrapes the metrics on this port of the backend's host instead of the URL's port (Triton's
	// metrics server listens on 8002 by default). Default 0: the URL's port; 0..65535.
	MetricsPort int `yaml:"metrics_port"`
	// IdleProbes allows the gateway to send a backend that has been idle for 2 s a one-token completion, to
	// learn that it recovered from a slowdown, and, when its engine states no seats, a few short rounds of its
	// own streamed completions at its first scrapes to measure them (the seat probe, docs/design.md). Set it
	// to false for hosted APIs that bill per request. Default: true for an engine that is scraped, false for
	// one that is not (or the built-in's).
	IdleProbes *bool `yaml:"idle_probes"`
	// Priority says how the engine schedules by a request's "priority" field, so that the gateway sends each
	// request's class there: low_first (vLLM started with --scheduling-policy priority), high_first (SGLang
	// started with --enable-priority-scheduling) or none. The gateway then replaces a client's own priority.
	// Default none (or the built-in's, none): an engine not started so may refuse the field.
	Priority string `yaml:"priority"`
	// Continue says that the engine continues a final assistant message (vLLM's continue_final_message with
	// add_generation_prompt false), and a completion from a prompt ending in its text: a model's sheddable
	// streams on it may then yield their seats to critical requests (models[].preempt) and resume. Default:
	// the built-in's (true for vllm, false for the others); false for a new engine.
	Continue *bool `yaml:"continue"`
	// Metrics names, for each signal, the metric that carries it. A signal left out is one the engine does not
	// export (or the built-in's), and the gateway's own accounting stands in for it.
	Metrics EngineMetrics `yaml:"metrics"`
	// Info names a JSON document where the engine states its own limits (SGLang's /get_server_info, TGI's
	// /info), read when a backend is first scraped, after each restart and once a minute. Default: the
	// built-in's (none for a new engine).
	Info EngineInfo `yaml:"info"`
}

// EngineInfo is where an engine states its limits in JSON (routing.InfoSpec). Each field list is in order of
// preference: the first present as a positive number is used. A field is keys separated by dots, an array
// marked key[] whose elements' values add up (one per data-parallel rank):
// internal_states[].effective_max_running_requests_per_dp.
type EngineInfo struct {
	// Paths are the document's paths on the backend's URL, tried in order until one answers (/server_info,
	// /get_server_info). [] or none: the engine has no such document.
	Paths []string `yaml:"paths"`
	// MaxSeqs are the fields that may carry the most sequences the engine runs at once, its seats (SGLang's
	// effective_max_running_requests_per_dp, TGI's max_batch_size). A metric max_seqs wins over them.
	MaxSeqs []string `yaml:"max_seqs"`
	// MaxInflight are the fields that may carry the most requests the engine holds at once, running and
	// queued, past which it refuses new ones (TGI's max_concurrent_requests): the gateway never sends more.
	MaxInflight []string `yaml:"max_inflight"`
}

// EngineMetrics maps the load signals to metrics. Each field is a Metric: a metric name, a mapping
// {name, labels, value_label, scale}, or a list of those in order of preference (the first present in a scrape
// is used: a new name before the old one it replaces). Samples of one metric add up (data-parallel ranks,
// models), except kv_usage, kv_block_size and start_time, whose largest sample counts.
type EngineMetrics struct {
	// Running is a gauge of the requests in the engine's running batch (vllm:num_requests_running).
	Running Metric `yaml:"running"`
	// Waiting is a gauge of the requests queued in the engine (vllm:num_requests_waiting).
	Waiting Metric `yaml:"waiting"`
	// KVUsage is a gauge of the share of the KV cache in use: a fraction 0-1 by default, or a percentage with
	// scale: percent.
	KVUsage Metric `yaml:"kv_usage"`
	// KVBlocks is the engine's number of KV blocks, as a gauge or in a label of an info metric (value_label:
	// vllm:cache_config_info's num_gpu_blocks); it sizes the backend's share of the prefix index.
	KVBlocks Metric `yaml:"kv_blocks"`
	// KVBlockSize is the number of tokens per KV block, as a gauge or a label. Without it a block is 1 token (a
	// capacity given in tokens, such as sglang:max_total_num_tokens).
	KVBlockSize Metric `yaml:"kv_block_size"`
	// PrefixHits is a counter of prompt tokens found in the engine's prefix cache.
	PrefixHits Metric `yaml:"prefix_hits"`
	// PrefixQueries is a counter of prompt tokens looked up in the engine's prefix cache.
	PrefixQueries Metric `yaml:"prefix_queries"`
	// Preemptions is a counter of preempted (or retracted) requests: new preemptions shrink the share of the KV
	// cache the prefix index assumes the engine keeps.
	Preemptions Metric `yaml:"preemptions"`
	// StartTime is the engine process's start time in Unix seconds (process_start_time_seconds): a change
	// means a restart, which empties the backend's share of the prefix index.
	StartTime Metric `yaml:"start_time"`
	// MaxSeqs is a gauge (or a label) of the most sequences the engine runs at once, its batch limit (Triton's
	// nv_trt_llm_request_metrics{request_type="max"}): the concurrency cap's seats from the first scrape.
	MaxSeqs Metric `yaml:"max_seqs"`
}

// Metric is the series that may carry one signal, in order of preference; empty when the engine does not export
// the signal. A file writes it as a name, a mapping (a Series) or a list of names and mappings; "" or [] says
// the engine does not export it (removing a built-in's series).
type Metric struct {
	Series []Series `yaml:"-"`
}

// Series selects the samples of one metric.
type Series struct {
	// Name is the metric's name as exposed, counters with their _total suffix. Required; a Prometheus metric
	// name ([a-zA-Z_:][a-zA-Z0-9_:]*).
	Name string `yaml:"name"`
	// Labels keeps only the samples whose labels have these values (request_type: waiting). Default: every
	// sample.
	Labels map[string]string `yaml:"labels"`
	// ValueLabel reads the value from this label instead of the sample's value (an info metric). Default: the
	// sample's value.
	ValueLabel string `yaml:"value_label"`
	// Scale is fraction (a share 0-1) or percent (0-100, divided by 100). Only for kv_usage. Default fraction.
	Scale string `yaml:"scale"`

	path string // where the file set it, for errors
}

// signalFields pairs each routing.Signal with its EngineMetrics field and name.
var signalFields = func() [routing.NumSignals]int {
	var idx [routing.NumSignals]int
	t := reflect.TypeFor[EngineMetrics]()
	for s := range routing.NumSignals {
		i := fieldIndex(t, s.String())
		if i < 0 {
			panic("policy: EngineMetrics has no field for signal " + s.String())
		}
		idx[s] = i
	}
	return idx
}()

func (m *EngineMetrics) metric(s routing.Signal) *Metric {
	return reflect.ValueOf(m).Elem().Field(signalFields[s]).Addr().Interface().(*Metric)
}

// decodeNode reads a Metric: a name, a mapping, or a list of them.
func (m *Metric) decodeNode(d *decoder, n *yaml.Node, path string) {
	m.Series = nil
	one := func(e *yaml.Node, p string, inList bool) {
		switch e.Kind {
		case yaml.ScalarNode:
			if s, ok := d.str(e, p); ok && s != "" {
				m.Series = append(m.Series, Series{Name: s, path: p})
			}
		case yaml.MappingNode:
			var s Series
			d.structure(e, reflect.ValueOf(&s).Elem(), p, "engines.*.metrics.*", 1)
			s.path = p
			m.Series = append(m.Series, s)
		default:
			if inList {
				d.add(e.Line, p, "expected a metric name or a mapping {name, labels, value_label, scale}, got "+kindName(e))
				return
			}
			d.add(e.Line, p, "expected a metric name, a mapping {name, labels, value_label, scale} or a list of them, got "+kindName(e))
		}
	}
	if n.Kind != yaml.SequenceNode {
		one(n, path, false)
		return
	}
	if !d.count(n, path, len(n.Content)) {
		return
	}
	for i, e := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		if e = resolve(e); e == nil {
			d.add(0, p, "broken alias")
			continue
		}
		d.record(p, "engines.*.metrics.*[]", e.Line, e, reflect.ValueOf(""))
		one(e, p, true)
	}
}

// Engine validation.
var (
	metricNameRE = regexp.MustCompile(`^[a-zA-Z_:][a-zA-Z0-9_:]*$`)
	labelNameRE  = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)
)

// Scales of a kv_usage series.
const (
	scaleFraction = "fraction"
	scalePercent  = "percent"
)

// priorityOrders maps engines.*.priority to routing's orders ("" is none).
var priorityOrders = map[string]routing.PriorityOrder{"": routing.PriorityNone, "none": routing.PriorityNone,
	"low_first": routing.PriorityLowFirst, "high_first": routing.PriorityHighFirst}

// defaultEngines fills each engine of the file from the built-in of the same name (field by field), or with the
// defaults of a new engine; and names the canonical engine of backends that use the old "openai" name.
func (r *report) defaultEngines(c *Config) {
	for _, name := range slices.Sorted(maps.Keys(c.Engines)) {
		e, p := c.Engines[name], "engines."+name
		base, builtin := routing.BuiltinEngine(name), true
		if base == nil {
			base, builtin = routing.NewEngineSpec(routing.EngineSpec{MetricsPath: routing.DefaultMetricsPath}), false
		}
		if !r.set(p + ".metrics_path") {
			e.MetricsPath = base.MetricsPath
		} else if e.MetricsPath == "none" {
			e.MetricsPath = ""
		}
		if !r.set(p + ".metrics_port") {
			e.MetricsPort = base.MetricsPort
		}
		if !r.set(p + ".priority") {
			e.Priority = base.Priority.String()
		}
		if !r.set(p + ".info.paths") {
			e.Info.Paths = slices.Clone(base.Info.Paths)
		}
		if !r.set(p + ".info.max_seqs") {
			e.Info.MaxSeqs = jsonFieldNames(base.Info.MaxSeqs)
		}
		if !r.set(p + ".info.max_inflight") {
			e.Info.MaxInflight = jsonFieldNames(base.Info.MaxInflight)
		}
		if e.Continue == nil {
			cont := base.Continue && builtin
			e.Continue = &cont
		}
		if e.IdleProbes == nil {
			idle := base.IdleProbes
			if !builtin {
				idle = e.MetricsPath != ""
			}
			e.IdleProbes = &idle
		}
		for s := range routing.NumSignals {
			if !r.set(p + ".metrics." + s.String()) {
				e.Metrics.metric(s).Series = fromRouting(base.Signals[s])
			}
		}
		c.Engines[name] = e
	}
	for i := range c.Backends {
		if b := &c.Backends[i]; b.Engine == routing.EngineOpenAI {
			if _, own := c.Engines[routing.EngineOpenAI]; !own {
				b.Engine = routing.EngineOpenAIHosted
			}
		}
	}
}

func jsonFieldNames(fs []routing.JSONField) []string {
	var out []string
	for _, f := range fs {
		out = append(out, f.String())
	}
	return out
}

func fromRouting(ss []routing.Series) []Series {
	var out []Series
	for _, s := range ss {
		ps := Series{Name: s.Name, Labels: maps.Clone(s.Labels), ValueLabel: s.ValueLabel}
		if s.Percent {
			ps.Scale = scalePercent
		}
		out = append(out, ps)
	}
	return out
}

// validateEngines checks the file's engines and returns every engine name a backend may use.
func (r *report) validateEngines(c *Config) map[string]bool {
	known := map[string]bool{}
	for _, n := range routing.BuiltinEngineNames() {
		known[n] = true
	}
	known[routing.EngineOpenAI] = true
	for _, name := range slices.Sorted(maps.Keys(c.Engines)) {
		e, p := c.Engines[name], "engines."+name
		if !nameRE.MatchString(name) {
			r.errorf(p, fmt.Sprintf("invalid engine name %q: use letters, digits, '.', '_', '-' and ':' (at most 64)", name))
			continue
		}
		known[name] = true
		if mp := e.MetricsPath; mp != "" && (!strings.HasPrefix(mp, "/") || strings.ContainsAny(mp, "?# \t")) {
			r.errorf(p+".metrics_path", fmt.Sprintf("must be a path such as /metrics (no query), or none; got %q", mp))
		}
		if e.MetricsPort < 0 || e.MetricsPort > 65535 {
			r.errorf(p+".metrics_port", "must be between 0 (the URL's port) and 65535")
		}
		if _, ok := priorityOrders[e.Priority]; !ok {
			r.errorf(p+".priority", fmt.Sprintf("unknown priority order %q (one of: none, low_first, high_first)", e.Priority))
		}
		r.engineInfo(p+".info", e.Info)
		for s := range routing.NumSignals {
			sp := p + ".metrics." + s.String()
			if !r.set(sp) {
				continue // the built-in's, valid by construction
			}
			for _, se := range e.Metrics.metric(s).Series {
				r.series(se, s)
			}
			if len(e.Metrics.metric(s).Series) > 100 {
				r.errorf(sp, "at most 100 series")
			}
		}
	}
	return known
}

// maxInfoEntries bounds each list of engines.*.info.
const maxInfoEntries = 8

// engineInfo checks an engine's info document (what the file set of it; the built-in's is valid by construction).
func (r *report) engineInfo(p string, in EngineInfo) {
	if r.set(p + ".paths") {
		if len(in.Paths) > maxInfoEntries {
			r.errorf(p+".paths", fmt.Sprintf("at most %d paths", maxInfoEntries))
		}
		for i, path := range in.Paths {
			if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, "?# \t") || len(path) > 256 {
				r.errorf(fmt.Sprintf("%s.paths[%d]", p, i), fmt.Sprintf("must be a path such as /info (no query, at most 256 bytes); got %q", path))
			}
		}
	}
	for _, f := range []struct {
		name string
		list []string
	}{{"max_seqs", in.MaxSeqs}, {"max_inflight", in.MaxInflight}} {
		fp := p + "." + f.name
		if !r.set(fp) {
			continue
		}
		if len(f.list) > maxInfoEntries {
			r.errorf(fp, fmt.Sprintf("at most %d fields", maxInfoEntries))
		}
		for i, s := range f.list {
			if _, err := routing.ParseJSONField(s); err != nil {
				r.errorf(fmt.Sprintf("%s[%d]", fp, i), err.Error())
			}
		}
	}
	if (len(in.MaxSeqs) > 0 || len(in.MaxInflight) > 0) && len(in.Paths) == 0 && (r.set(p+".max_seqs") || r.set(p+".max_inflight")) {
		r.errorf(p+".paths", "required with max_seqs or max_inflight: where the engine serves the document")
	}
}

// series checks one series of signal s.
func (r *report) series(se Series, s routing.Signal) {
	p := se.path
	at := func(f string) string {
		if r.set(p + "." + f) {
			return p + "." + f
		}
		return p
	}
	switch {
	case se.Name == "":
		r.errorf(p+".name", "required: the metric's name")
	case !metricNameRE.MatchString(se.Name):
		r.errorf(at("name"), fmt.Sprintf("invalid metric name %q: use letters, digits, '_' and ':', not starting with a digit", se.Name))
	}
	for _, k := range slices.Sorted(maps.Keys(se.Labels)) {
		if !labelNameRE.MatchString(k) || strings.HasPrefix(k, "__") {
			r.errorf(p+".labels."+k, fmt.Sprintf("invalid label name %q: use letters, digits and '_'", k))
		}
	}
	if se.ValueLabel != "" && !labelNameRE.MatchString(se.ValueLabel) {
		r.errorf(p+".value_label", fmt.Sprintf("invalid label name %q: use letters, digits and '_'", se.ValueLabel))
	}
	switch se.Scale {
	case "", scaleFraction:
	case scalePercent:
		if s != routing.SignalKVUsage {
			r.errorf(p+".scale", fmt.Sprintf("only kv_usage has a scale; %s is a count", s))
		}
	default:
		r.errorf(p+".scale", fmt.Sprintf("unknown scale %q (one of: fraction, percent)", se.Scale))
	}
}

// engineName checks a backend's engine against the known names.
func (r *report) engineName(path, name string, known map[string]bool) {
	if known[name] {
		return
	}
	names := slices.Sorted(maps.Keys(known))
	msg := fmt.Sprintf("unknown engine %q (known: %s)", name, strings.Join(names, ", "))
	if s := suggest(name, names); s != "" {
		msg = fmt.Sprintf("unknown engine %q (did you mean %q? known: %s)", name, s, strings.Join(names, ", "))
	}
	r.errorf(path, msg)
}

// engineSpecs compiles the engines a backend may name: the built-ins, with the file's entries over them.
func (c *Config) engineSpecs() map[string]*routing.EngineSpec {
	specs := make(map[string]*routing.EngineSpec)
	for _, n := range routing.BuiltinEngineNames() {
		specs[n] = routing.BuiltinEngine(n)
	}
	for name, e := range c.Engines {
		rs := routing.EngineSpec{Name: name, MetricsPath: e.MetricsPath, MetricsPort: e.MetricsPort,
			IdleProbes: e.IdleProbes != nil && *e.IdleProbes, Priority: priorityOrders[e.Priority],
			Continue: e.Continue != nil && *e.Continue}
		for s := range routing.NumSignals {
			for _, se := range e.Metrics.metric(s).Series {
				rs.Signals[s] = append(rs.Signals[s], routing.Series{Name: se.Name, Labels: se.Labels,
					ValueLabel: se.ValueLabel, Percent: se.Scale == scalePercent})
			}
		}
		rs.Info.Paths = slices.Clone(e.Info.Paths)
		for _, f := range e.Info.MaxSeqs {
			if jf, err := routing.ParseJSONField(f); err == nil {
				rs.Info.MaxSeqs = append(rs.Info.MaxSeqs, jf)
			}
		}
		for _, f := range e.Info.MaxInflight {
			if jf, err := routing.ParseJSONField(f); err == nil {
				rs.Info.MaxInflight = append(rs.Info.MaxInflight, jf)
			}
		}
		specs[name] = routing.NewEngineSpec(rs)
	}
	return specs
}
