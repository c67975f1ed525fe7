package bench

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// Scenario is one YAML file in bench/scenarios: a fleet, a workload and the columns to compare, each column on a
// fresh fleet with the same seed and the same request sequence. Paths are relative to the scenario file.
//
//	name: failover
//	fleet: ../fleets/homogeneous.yaml
//	workload: ../workloads/chat-shared-prefix.yaml
//	rate: 20            # optional overrides of the workload
//	duration: 20s
//	warmup: 3s
//	seed: 7
//	slo: {ttft: 500ms, itl: 50ms}
//	columns:
//	  - {name: direct, strategy: direct}          # straight to the fleet's first backend
//	  - {strategy: round_robin}                   # name defaults to the strategy
//	  - name: adaptive-hedged
//	    strategy: adaptive
//	    gateway: {hedging: {enabled: true}}       # deep-merged into the generated config
//	    model: {slo: {ttft: 300ms}}               # deep-merged into its models[0]
//	events:
//	  - {at: 8s, backend: sim-b, control: {slowdown: 4}, label: sim-b 4x slower}
//	  - {at: 14s, backend: sim-b, control: {}, label: sim-b reset}
type Scenario struct {
	Name        string        `yaml:"name"`
	Description string        `yaml:"description"`
	Fleet       string        `yaml:"fleet"`
	Workload    string        `yaml:"workload"`
	Rate        float64       `yaml:"rate"`
	Duration    time.Duration `yaml:"duration"`
	Warmup      time.Duration `yaml:"warmup"`
	Seed        uint64        `yaml:"seed"`
	SLO         SLO           `yaml:"slo"`
	// Bursts, when present, replace the workload's bursts: a spike of the scenario's own (the matrix writes its
	// spikes here).
	Bursts []Burst `yaml:"bursts"`
	// Timeout bounds each request (send to last byte) when the command line sets no -timeout; default 2m. A
	// request over it counts as a timeout error, so an overloaded column ends instead of draining for minutes.
	Timeout time.Duration `yaml:"timeout"`
	// Region is the generated gateway's region; default the first backend's.
	Region  string   `yaml:"region"`
	Columns []Column `yaml:"columns"`
	Events  []Event  `yaml:"events"`
	// Companions are workloads sent at the same time as Workload, each to its own model (the workload file's
	// model, which the generated config routes to every backend): an interactive and a batch load sharing one
	// fleet. Each is reported as a run of its own, named COLUMN/NAME, the main workload's as COLUMN/WORKLOAD.
	// Scenario overrides (rate, duration, warmup, seed) apply to the main workload only, except the seed.
	Companions []Companion `yaml:"companions"`

	file string
}

// Companion is a workload run beside the scenario's main one.
type Companion struct {
	// Name labels its runs; default the workload's name.
	Name     string `yaml:"name"`
	Workload string `yaml:"workload"`
	// Model is deep-merged into its generated model entry, in every column (a column's also adds to it).
	Model map[string]any `yaml:"model"`
}

// Column is one side of a comparison.
type Column struct {
	Name string `yaml:"name"`
	// Strategy is a gateway routing strategy (round_robin, least_request, adaptive, ...), or "direct": no gateway,
	// load straight to the fleet's first backend, or "oracle": no gateway, the harness routes each request itself
	// to the backend whose simulator predicts the lowest TTFT for it (oracle.go).
	Strategy string         `yaml:"strategy"`
	Gateway  map[string]any `yaml:"gateway,omitempty"`
	Model    map[string]any `yaml:"model,omitempty"`
	// NoEvents runs the column without the scenario's events: the undisturbed baseline of a fault scenario,
	// measured in the same command (same workload, seed and fleet).
	NoEvents bool `yaml:"no_events,omitempty"`
	// Rate, when set, runs the column at its own arrival rate (requests/s) instead of the scenario's: a low-load
	// baseline (an unloaded tail latency) beside the overloaded columns, in the same command. The column then has
	// its own request sequence (same seed, fewer arrivals).
	Rate float64 `yaml:"rate,omitempty"`
	// NoBursts runs the column without the workload's (or scenario's) bursts: the same steady load without its
	// spike, for each class's unloaded latency in the same command.
	NoBursts bool `yaml:"no_bursts,omitempty"`
	// Also is deep-merged into the companions' model entries, by companion name: what the column changes for
	// them (e.g. {batch: {objective: cost}}).
	Also map[string]map[string]any `yaml:"also,omitempty"`
	// Replicas, 2 to MaxReplicas, runs the column through that many gateway replicas that share one
	// redis-server the bench starts for it (the policy's redis, as a deployment of several replicas does): turn
	// i of a multi-turn session goes to replica i mod Replicas, so that a conversation alternates between them,
	// every other request to replica index mod Replicas. Needs redis-server on PATH (Debian: redis-server).
	Replicas int `yaml:"replicas,omitempty"`
	// Workloads, in a matrix file only, runs the column in the cells of these workloads (by name) alone: a
	// column that measures what only some workloads have (the replicas' conversations) costs no time elsewhere.
	Workloads []string `yaml:"workloads,omitempty"`
}

// MaxReplicas bounds Column.Replicas: each replica is a gateway process on the bench's machine.
const MaxReplicas = 8

// gateway reports whether the column runs through a gateway (every strategy but direct and oracle).
func (c *Column) gateway() bool { return c.Strategy != "direct" && c.Strategy != "oracle" }

// Event is a timed fault: at At on the load's timeline, POST Control as JSON to the named backend's /sim/control.
type Event struct {
	At      time.Duration  `yaml:"at"`
	Backend string         `yaml:"backend"`
	Control map[string]any `yaml:"control"`
	Label   string         `yaml:"label"`
}

// LoadScenario reads and validates a scenario file (errors as FileErrors).
func LoadScenario(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bench: scenario: %w", err)
	}
	var s Scenario
	doc, err := decodeStrict(path, data, &s)
	if err != nil {
		return nil, err
	}
	s.file = path
	if s.Name == "" {
		s.Name = baseName(path)
	}
	var errs fieldErrors
	if s.Fleet == "" {
		errs.add("fleet", "missing fleet file")
	}
	if s.Workload == "" {
		errs.add("workload", "missing workload file")
	}
	if s.Rate < 0 || s.Duration < 0 || s.Warmup < 0 || s.Timeout < 0 {
		errs.add("rate", "rate, duration, warmup and timeout must be >= 0")
	}
	if len(s.Columns) == 0 {
		errs.add("columns", "at least one column is needed")
	}
	seen := map[string]bool{}
	for i := range s.Columns {
		c := &s.Columns[i]
		if c.Strategy == "" {
			errs.add(fmt.Sprintf("columns[%d].strategy", i), "missing strategy (direct or a gateway strategy)")
		}
		if c.Name == "" {
			c.Name = c.Strategy
		}
		if seen[c.Name] {
			errs.add(fmt.Sprintf("columns[%d].name", i), "duplicate column name %q", c.Name)
		}
		seen[c.Name] = true
		if !c.gateway() && (c.Gateway != nil || c.Model != nil) {
			errs.add(fmt.Sprintf("columns[%d]", i), "a %s column has no gateway to configure", c.Strategy)
		}
		if len(c.Workloads) > 0 {
			errs.add(fmt.Sprintf("columns[%d].workloads", i), "workloads chooses a matrix's cells; a scenario runs every column")
		}
		switch {
		case c.Replicas == 0:
		case !c.gateway():
			errs.add(fmt.Sprintf("columns[%d].replicas", i), "a %s column has no gateway to replicate", c.Strategy)
		case c.Replicas < 2 || c.Replicas > MaxReplicas:
			errs.add(fmt.Sprintf("columns[%d].replicas", i), "replicas must be 2 to %d (or absent: one gateway), got %d",
				MaxReplicas, c.Replicas)
		}
	}
	for i, b := range s.Bursts {
		if b.At < 0 || b.Duration <= 0 || b.Multiplier <= 0 {
			errs.add(fmt.Sprintf("bursts[%d]", i), "a burst needs at >= 0, duration > 0 and multiplier > 0")
		}
	}
	for i := range s.Companions {
		c := &s.Companions[i]
		if c.Workload == "" {
			errs.add(fmt.Sprintf("companions[%d].workload", i), "missing workload file")
		}
		if c.Name == "" {
			c.Name = baseName(c.Workload)
		}
	}
	for i, e := range s.Events {
		if e.At < 0 || e.Backend == "" {
			errs.add(fmt.Sprintf("events[%d]", i), "an event needs at >= 0 and a backend")
		}
		if e.Label == "" {
			body, _ := json.Marshal(e.Control)
			s.Events[i].Label = e.Backend + " " + string(body)
		}
	}
	if err := errs.resolve(path, doc); err != nil {
		return nil, err
	}
	return &s, nil
}

// Path resolves a path named in the scenario file (relative to the file's directory).
func (s *Scenario) Path(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(s.file), p)
}

// Overrides returns the workload overrides the scenario sets.
func (s *Scenario) Overrides() Overrides {
	return Overrides{Rate: s.Rate, Duration: s.Duration, Warmup: s.Warmup, Seed: s.Seed, SLO: s.SLO, Bursts: s.Bursts}
}
