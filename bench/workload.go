package bench

import (
	"fmt"
	"math"
	"os"
	"time"
)

// DefaultModel is the model a workload asks for when it names none: the simulator's default served model.
const DefaultModel = "sim-model"

// PriorityHeader is the request header that carries a request's priority class
// (docs/design.md, "External contracts").
const PriorityHeader = "x-switchyard-priority"

// Workload is one YAML file in bench/workloads: what requests to send and when. Every time on a workload's timeline
// (bursts, steps, scenario events, plot axes) is measured from the start of the load, warm-up included. Loaded with
// LoadWorkload, a Workload has its defaults filled in and is valid; it is read-only afterwards.
type Workload struct {
	// Name identifies the workload in reports; defaults to the file name without extension.
	Name        string `yaml:"name" json:"name"`
	Description string `yaml:"description" json:"description,omitempty"`
	// Model is sent as "model"; default DefaultModel.
	Model string `yaml:"model" json:"model"`
	// API is the request shape: "chat" (POST /v1/chat/completions, the default) or "completions".
	API string `yaml:"api" json:"api"`
	// Stream is the share of requests sent with "stream": true, in [0, 1]; default 1.
	Stream *float64 `yaml:"stream" json:"stream"`
	// IgnoreEOS adds vLLM's "ignore_eos": true so real engines generate exactly max_tokens (hosted APIs reject it).
	IgnoreEOS bool `yaml:"ignore_eos" json:"ignore_eos,omitempty"`
	// Seed drives every random choice; the same seed and workload give a byte-identical request sequence. Default 1.
	Seed uint64 `yaml:"seed" json:"seed"`
	// Warmup is sent before the measured window and excluded from the report; default 0.
	Warmup time.Duration `yaml:"warmup" json:"warmup_ns"`
	// Duration is the measured window after the warm-up; default 30s, or the sum of the steps.
	Duration time.Duration `yaml:"duration" json:"duration_ns"`
	Arrival  Arrival       `yaml:"arrival" json:"arrival"`
	// Bursts multiply the arrival rate inside windows of the timeline.
	Bursts []Burst `yaml:"bursts" json:"bursts,omitempty"`
	// SLO judges goodput; zero fields are not checked. The -slo-* flags override it.
	SLO SLO `yaml:"slo" json:"slo"`
	// Prompt is the length in tokens of each new user message (a shared prefix and session history come on top).
	Prompt Dist `yaml:"prompt" json:"prompt"`
	// Output is max_tokens per request.
	Output     Dist       `yaml:"output" json:"output"`
	Prefix     *Prefix    `yaml:"prefix" json:"prefix,omitempty"`
	Sessions   *Sessions  `yaml:"sessions" json:"sessions,omitempty"`
	LongDocs   *LongDocs  `yaml:"long_docs" json:"long_docs,omitempty"`
	Priorities []Priority `yaml:"priorities" json:"priorities,omitempty"`
}

// Arrival is the arrival process. Arrival times are drawn before the load starts, so a slow target cannot slow
// its own load.
type Arrival struct {
	// Process is "poisson" (exponential gaps, the default) or "fixed" (evenly spaced).
	Process string `yaml:"process" json:"process"`
	// Rate is the base rate in requests per second (all requests: single, session turns and long documents).
	Rate float64 `yaml:"rate" json:"rate"`
	// Steps, when present, replace Rate with a ladder: each step holds its rate for its duration, in order, from
	// time 0; the last rate holds to the end.
	Steps []Step `yaml:"steps" json:"steps,omitempty"`
}

// Step is one rung of a stepped load.
type Step struct {
	Rate     float64       `yaml:"rate" json:"rate"`
	Duration time.Duration `yaml:"duration" json:"duration_ns"`
}

// Burst multiplies the rate by Multiplier from At for Duration.
type Burst struct {
	At         time.Duration `yaml:"at" json:"at_ns"`
	Duration   time.Duration `yaml:"duration" json:"duration_ns"`
	Multiplier float64       `yaml:"multiplier" json:"multiplier"`
}

// SLO is a latency objective: a request meets it when its TTFT <= TTFT and its mean inter-token gap <= ITL.
type SLO struct {
	TTFT time.Duration `yaml:"ttft" json:"ttft_ns"`
	ITL  time.Duration `yaml:"itl" json:"itl_ns"`
}

// Prefix makes a share of requests start with one of Groups shared system prompts of Tokens tokens each (the
// shared-prefix workloads of SGLang's and inference-perf's benchmarks).
type Prefix struct {
	Groups int `yaml:"groups" json:"groups"`
	Tokens int `yaml:"tokens" json:"tokens"`
	// Share of single-turn requests and of sessions that carry a group prefix, in [0, 1]; default 1.
	Share *float64 `yaml:"share" json:"share"`
	// Skew picks the group: "uniform" (default), "zipf" (rank k has weight 1/k^ZipfS) or "hot" (group 0 gets
	// HotShare of the traffic, the rest share the remainder evenly).
	Skew     string  `yaml:"skew" json:"skew"`
	ZipfS    float64 `yaml:"zipf_s" json:"zipf_s,omitempty"`
	HotShare float64 `yaml:"hot_share" json:"hot_share,omitempty"`
}

// Sessions turns a share of arrivals into multi-turn chats. Users sessions are open at once; each arrival picked
// for a session goes to the next user in turn and becomes that session's next turn, whose prompt repeats every
// previous turn (user message and the assistant answer) before the new user message. A turn is sent at its own
// arrival time, but never before the previous turn's answer has arrived; that wait is reported as session_wait and
// latencies of such a turn count from its actual send. When a session has had its Turns, a fresh one replaces it.
type Sessions struct {
	Share float64 `yaml:"share" json:"share"`
	Users int     `yaml:"users" json:"users"`
	Turns Dist    `yaml:"turns" json:"turns"`
}

// LongDocs makes a share of arrivals long-document requests: a unique document of Tokens tokens plus a question
// drawn from the workload's Prompt distribution.
type LongDocs struct {
	Share  float64 `yaml:"share" json:"share"`
	Tokens Dist    `yaml:"tokens" json:"tokens"`
}

// Priority is one value of the priority header with its relative weight.
type Priority struct {
	Value  string  `yaml:"value" json:"value"`
	Weight float64 `yaml:"weight" json:"weight"`
}

// Overrides are command-line replacements for workload fields; zero values leave the workload's value.
type Overrides struct {
	Model    string
	Rate     float64
	Duration time.Duration
	Warmup   time.Duration
	Seed     uint64
	SLO      SLO
	// Bursts, when not nil, replaces the workload's bursts (a scenario's spike); NoBursts drops them all (the
	// same load without its spike: an unloaded baseline).
	Bursts   []Burst
	NoBursts bool
}

// LoadWorkload reads, strictly decodes, defaults and validates a workload file. Errors are FileErrors
// ("FILE:LINE: message") or wrap the read error.
func LoadWorkload(path string) (*Workload, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bench: workload: %w", err)
	}
	return ParseWorkload(path, data)
}

// ParseWorkload is LoadWorkload on bytes; file names the source in errors.
func ParseWorkload(file string, data []byte) (*Workload, error) {
	var w Workload
	doc, err := decodeStrict(file, data, &w)
	if err != nil {
		return nil, err
	}
	w.setDefaults(baseName(file))
	var errs fieldErrors
	w.validate(&errs)
	if err := errs.resolve(file, doc); err != nil {
		return nil, err
	}
	return &w, nil
}

func (w *Workload) setDefaults(name string) {
	if w.Name == "" {
		w.Name = name
	}
	if w.Model == "" {
		w.Model = DefaultModel
	}
	if w.API == "" {
		w.API = "chat"
	}
	if w.Stream == nil {
		one := 1.0
		w.Stream = &one
	}
	if w.Seed == 0 {
		w.Seed = 1
	}
	if w.Arrival.Process == "" {
		w.Arrival.Process = "poisson"
	}
	if w.Duration == 0 {
		for _, s := range w.Arrival.Steps {
			w.Duration += s.Duration
		}
		w.Duration -= min(w.Warmup, w.Duration)
		if w.Duration == 0 {
			w.Duration = 30 * time.Second
		}
	}
	if p := w.Prefix; p != nil {
		if p.Share == nil {
			one := 1.0
			p.Share = &one
		}
		if p.Skew == "" {
			p.Skew = "uniform"
		}
		if p.Skew == "zipf" && p.ZipfS == 0 {
			p.ZipfS = 1.1
		}
	}
}

func (w *Workload) validate(errs *fieldErrors) {
	if w.API != "chat" && w.API != "completions" {
		errs.add("api", "unknown api %q (chat or completions)", w.API)
	}
	if s := *w.Stream; s < 0 || s > 1 {
		errs.add("stream", "share must be in [0, 1], got %v", s)
	}
	if w.Warmup < 0 || w.Duration < 0 {
		errs.add("duration", "warmup and duration must be >= 0")
	}
	switch w.Arrival.Process {
	case "poisson", "fixed":
	default:
		errs.add("arrival.process", "unknown process %q (poisson or fixed)", w.Arrival.Process)
	}
	if len(w.Arrival.Steps) == 0 && (w.Arrival.Rate <= 0 || math.IsInf(w.Arrival.Rate, 0)) {
		errs.add("arrival.rate", "rate must be > 0 requests/s (or give steps), got %v", w.Arrival.Rate)
	}
	if len(w.Arrival.Steps) > 0 && w.Arrival.Rate != 0 {
		errs.add("arrival.rate", "give either rate or steps, not both")
	}
	for i, s := range w.Arrival.Steps {
		if s.Rate < 0 || s.Duration <= 0 {
			errs.add(fmt.Sprintf("arrival.steps[%d]", i), "a step needs rate >= 0 and duration > 0")
		}
	}
	for i, b := range w.Bursts {
		if b.At < 0 || b.Duration <= 0 || b.Multiplier <= 0 {
			errs.add(fmt.Sprintf("bursts[%d]", i), "a burst needs at >= 0, duration > 0 and multiplier > 0")
		}
	}
	if w.SLO.TTFT < 0 || w.SLO.ITL < 0 {
		errs.add("slo", "SLO durations must be >= 0")
	}
	w.Prompt.validate("prompt", errs)
	w.Output.validate("output", errs)
	share := 0.0
	if p := w.Prefix; p != nil {
		if p.Groups < 1 {
			errs.add("prefix.groups", "must be >= 1, got %d", p.Groups)
		}
		if p.Tokens < 1 {
			errs.add("prefix.tokens", "must be >= 1, got %d", p.Tokens)
		}
		if *p.Share < 0 || *p.Share > 1 {
			errs.add("prefix.share", "must be in [0, 1], got %v", *p.Share)
		}
		switch p.Skew {
		case "uniform":
		case "zipf":
			if p.ZipfS <= 0 {
				errs.add("prefix.zipf_s", "must be > 0, got %v", p.ZipfS)
			}
		case "hot":
			if p.HotShare <= 0 || p.HotShare > 1 {
				errs.add("prefix.hot_share", "must be in (0, 1], got %v", p.HotShare)
			}
		default:
			errs.add("prefix.skew", "unknown skew %q (uniform, zipf or hot)", p.Skew)
		}
	}
	if s := w.Sessions; s != nil {
		share += s.Share
		if s.Share <= 0 || s.Share > 1 {
			errs.add("sessions.share", "must be in (0, 1], got %v", s.Share)
		}
		if s.Users < 1 {
			errs.add("sessions.users", "must be >= 1, got %d", s.Users)
		}
		s.Turns.validate("sessions.turns", errs)
	}
	if l := w.LongDocs; l != nil {
		share += l.Share
		if l.Share <= 0 || l.Share > 1 {
			errs.add("long_docs.share", "must be in (0, 1], got %v", l.Share)
		}
		l.Tokens.validate("long_docs.tokens", errs)
	}
	if share > 1+1e-9 {
		errs.add("sessions.share", "sessions.share + long_docs.share must be <= 1, got %v", share)
	}
	total := 0.0
	for i, p := range w.Priorities {
		if p.Value == "" || p.Weight < 0 {
			errs.add(fmt.Sprintf("priorities[%d]", i), "a priority needs a value and a weight >= 0")
		}
		total += p.Weight
	}
	if len(w.Priorities) > 0 && total <= 0 {
		errs.add("priorities", "weights must add up to more than 0")
	}
}

// Apply returns a copy of w with the non-zero overrides applied, re-validated.
func (w *Workload) Apply(o Overrides) (*Workload, error) {
	c := *w
	if o.Model != "" {
		c.Model = o.Model
	}
	if o.Rate > 0 {
		if len(c.Arrival.Steps) > 0 {
			// Scale the ladder so its first step runs at the new rate; the shape is kept.
			f := o.Rate / c.Arrival.Steps[0].Rate
			steps := make([]Step, len(c.Arrival.Steps))
			for i, s := range c.Arrival.Steps {
				steps[i] = Step{Rate: s.Rate * f, Duration: s.Duration}
			}
			c.Arrival.Steps = steps
		} else {
			c.Arrival.Rate = o.Rate
		}
	}
	if o.Duration > 0 {
		c.Duration = o.Duration
	}
	if o.Warmup > 0 {
		c.Warmup = o.Warmup
	}
	if o.Seed != 0 {
		c.Seed = o.Seed
	}
	if o.SLO.TTFT > 0 {
		c.SLO.TTFT = o.SLO.TTFT
	}
	if o.SLO.ITL > 0 {
		c.SLO.ITL = o.SLO.ITL
	}
	if o.Bursts != nil {
		c.Bursts = o.Bursts
	}
	if o.NoBursts {
		c.Bursts = nil
	}
	var errs fieldErrors
	c.validate(&errs)
	if len(errs) > 0 {
		return nil, fmt.Errorf("bench: workload %s: %s", c.Name, errs[0].msg)
	}
	return &c, nil
}

// Span is the whole timeline: warm-up plus the measured window.
func (w *Workload) Span() time.Duration { return w.Warmup + w.Duration }

// rateAt is the arrival rate (requests/s) at time t on the timeline, and the next time it may change.
func (w *Workload) rateAt(t time.Duration) (rate float64, next time.Duration) {
	next = time.Duration(math.MaxInt64)
	rate = w.Arrival.Rate
	if len(w.Arrival.Steps) > 0 {
		var end time.Duration
		for i, s := range w.Arrival.Steps {
			rate = s.Rate
			end += s.Duration
			if t < end {
				next = end
				break
			}
			if i == len(w.Arrival.Steps)-1 {
				break
			}
		}
	}
	for _, b := range w.Bursts {
		switch {
		case t < b.At:
			next = min(next, b.At)
		case t < b.At+b.Duration:
			rate *= b.Multiplier
			next = min(next, b.At+b.Duration)
		}
	}
	return rate, next
}
