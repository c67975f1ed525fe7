package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/switchyard/switchyard/sim"
)

// Matrix is one YAML file in bench/matrix: axes whose cross product (less the excluded combinations) are the
// cells, the columns every cell compares, and the check set that judges each cell. Each cell runs as a
// generated compare scenario (Compare, on a fleet made from the cell's fleet file and size), Runs times; see
// bench/scenarios/README.md, "Matrices". Paths are relative to the matrix file.
//
//	name: protect
//	checks: {kind: protect}
//	runs: 3
//	warmup: 5s
//	fleets: [{file: ../fleets/small-batch.yaml}]
//	sizes: [{n: 1}, {n: 4}]
//	seats: [8, 64]                              # optional: max_num_seqs on every backend
//	seats_from: [policy, discover]              # optional: does the gateway's policy state them
//	workloads: [{file: ../workloads/overload-mix.yaml}]
//	loads: [{name: 3x-10s, load: 0.5, spike: 3, for: 10s}]
//	events: [{name: steady}, {name: one-down, backend: 0, at_spike: 0.5, control: {down: true}}]
//	exclude: [{event: one-down, size: "!4"}]     # "!" negates; every named axis must match
//	columns: [{name: shedding, strategy: adaptive}, ...]
type Matrix struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	Checks      Checks `yaml:"checks"`
	// Runs is how many times each cell runs (same seed: the spread is the system's, not the workload's, unless
	// VarySeed); default 3, the -runs flag overrides it.
	Runs int `yaml:"runs"`
	// VarySeed runs a cell's run r (from 0) on its seed plus r (RunScenario): the runs are then as many
	// schedules of its arrivals, classes, prompts and lengths, not one schedule repeated. The protect matrix
	// sets it: on its one seed, every critical wait of its 8x8-seat cells came at the same cluster of critical
	// arrivals, run after run, and seeds 2, 3 and 4 failed the critical p99 in 0, 4 and 9 of its nine 2x cells
	// (bench/results/protect-2026-12-02-matrix.md, 2026-12-07). Off, the spread between runs is the system's
	// alone, as the routing checks' hit spread over three runs of one seeded cell needs.
	VarySeed bool `yaml:"vary_seed"`
	// Warmup and Duration replace the workloads' (Duration is the measured window of a steady load; a spike's
	// window is its At + For + After). Seed, when set, replaces theirs.
	Warmup   time.Duration `yaml:"warmup"`
	Duration time.Duration `yaml:"duration"`
	Seed     uint64        `yaml:"seed"`
	// Timeout bounds each request (the scenario's timeout).
	Timeout time.Duration `yaml:"timeout"`
	// MaxRate is the highest arrival rate (requests/s, at a spike's peak) a cell may ask of this machine; a cell
	// over it is refused when the matrix is expanded, naming its rate, rather than measuring a late load
	// generator. Default 120.
	MaxRate float64 `yaml:"max_rate"`

	Fleets []FleetAxis `yaml:"fleets"`
	Sizes  []SizeAxis  `yaml:"sizes"`
	Seats  []int       `yaml:"seats"`
	// SeatsFrom is how the gateway knows each engine's seats: "policy" states every backend's max_num_seqs in
	// the generated gateway config (the simulator's own figure, as an operator who set vLLM's --max-num-seqs
	// would), "engine" runs the simulators in SGLang's dialect, whose /get_server_info states them, and names
	// the backends' engine sglang, so that the gateway reads them there as it would from SGLang, "discover"
	// leaves the gateway to learn them (vLLM's dialect states none: the probe). Optional; without it the gateway
	// is told nothing, as with discover, and no name segment is added.
	SeatsFrom []string       `yaml:"seats_from"`
	Workloads []WorkloadAxis `yaml:"workloads"`
	Loads     []LoadAxis     `yaml:"loads"`
	Events    []EventAxis    `yaml:"events"`
	// Exclude drops the cells that match any entry: an entry maps axis names (fleet, size, seats, seats_from,
	// workload, load, event) to a value's name ("!name": any other value), and matches when every axis it names does.
	Exclude []map[string]string `yaml:"exclude"`
	Columns []Column            `yaml:"columns"`

	file string
}

// Checks names the check set of a matrix and the roles of its columns (by column name).
type Checks struct {
	// Kind is "routing" (issue 19: the subject against every other column, the oracle apart) or "protect"
	// (issue 15: the subject with shedding against the reference without it and the unloaded column).
	Kind string `yaml:"kind"`
	// Subject is the column judged; default adaptive (routing) or shedding (protect).
	Subject string `yaml:"subject"`
	// Oracle is the routing ground-truth column; default oracle. Every other routing column is a baseline, but
	// Replicas.
	Oracle string `yaml:"oracle"`
	// Replicas, when set, is the routing column that runs the subject's strategy through gateway replicas
	// (Column.Replicas): not a baseline; on cells with multi-turn sessions its conversations, alternating between
	// the replicas turn by turn, must stay on their backend (RoutingReplicaStay).
	Replicas string `yaml:"replicas"`
	// Reference (default no-shedding) and Unloaded (default unloaded) are the protect columns; Critical and
	// Standard the priority values of those classes (default critical, standard).
	Reference string `yaml:"reference"`
	Unloaded  string `yaml:"unloaded"`
	Critical  string `yaml:"critical"`
	Standard  string `yaml:"standard"`
}

// FleetAxis is one fleet file; Name defaults to the file name.
type FleetAxis struct {
	Name string `yaml:"name"`
	File string `yaml:"file"`
}

// SizeAxis is a fleet size: N backends made from the fleet file (ReplicateFleet), with Set written over every
// entry (simulator keys). Name defaults to "nN".
type SizeAxis struct {
	Name string         `yaml:"name"`
	N    int            `yaml:"n"`
	Set  map[string]any `yaml:"set"`
	// Slower, when > 1, makes every backend that many times slower (SlowFleet): the same physics, fast and slow
	// backends in the same proportion, at a capacity (and a load) a big fleet's machine can drive.
	Slower float64 `yaml:"slower"`
}

// WorkloadAxis is one workload file; Name defaults to the file name.
type WorkloadAxis struct {
	Name string `yaml:"name"`
	File string `yaml:"file"`
}

// LoadAxis is how hard a cell is driven, in multiples of the cell's own Capacity (FleetCapacity): a steady
// Load, or with Spike a base of Load and a spike of Spike times capacity lasting For, starting At after the
// warm-up (default 2s) and followed by After of the base load (default 5s).
type LoadAxis struct {
	Name  string        `yaml:"name"`
	Load  float64       `yaml:"load"`
	Spike float64       `yaml:"spike"`
	For   time.Duration `yaml:"for"`
	At    time.Duration `yaml:"at"`
	After time.Duration `yaml:"after"`
}

// EventAxis is a fault in a cell: at At on the timeline (or, with AtSpike, that fraction into the spike), POST
// Control to the cell's Backend-th backend's /sim/control (0 = the first). An entry without Control is the
// cell without a fault.
type EventAxis struct {
	Name    string         `yaml:"name"`
	Backend int            `yaml:"backend"`
	At      time.Duration  `yaml:"at"`
	AtSpike float64        `yaml:"at_spike"`
	Control map[string]any `yaml:"control"`
}

// Cell is one combination of axis values.
type Cell struct {
	// Name is the values' names joined by "/" in axis order
	// (fleet/size[/seats][/seats-FROM]/workload/load[/event]).
	Name  string
	Axes  map[string]string
	Fleet FleetAxis
	Size  SizeAxis
	Seats int // 0: the fleet file's
	// SeatsFrom is Matrix.SeatsFrom's value ("": the axis is not set).
	SeatsFrom string
	Workload  WorkloadAxis
	Load      LoadAxis
	Event     *EventAxis
}

// defaultMaxRate is Matrix.MaxRate's default, from the 2-core machine the matrices were sized on: 110
// requests/s to 8 simulators kept the load generator on time, 94 to 64 simulators did not
// (bench/matrix/routing.yaml and protect.yaml, their headers).
const defaultMaxRate = 120

// LoadMatrix reads and validates a matrix file (errors as FileErrors).
func LoadMatrix(path string) (*Matrix, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bench: matrix: %w", err)
	}
	var m Matrix
	doc, err := decodeStrict(path, data, &m)
	if err != nil {
		return nil, err
	}
	m.file = path
	m.setDefaults(baseName(path))
	var errs fieldErrors
	m.validate(&errs)
	if err := errs.resolve(path, doc); err != nil {
		return nil, err
	}
	return &m, nil
}

func (m *Matrix) setDefaults(name string) {
	if m.Name == "" {
		m.Name = name
	}
	if m.Runs == 0 {
		m.Runs = 3
	}
	if m.MaxRate == 0 {
		m.MaxRate = defaultMaxRate
	}
	c := &m.Checks
	switch c.Kind {
	case "routing":
		c.Subject = cmpOr(c.Subject, "adaptive")
		c.Oracle = cmpOr(c.Oracle, "oracle")
	case "protect":
		c.Subject = cmpOr(c.Subject, "shedding")
		c.Reference = cmpOr(c.Reference, "no-shedding")
		c.Unloaded = cmpOr(c.Unloaded, "unloaded")
		c.Critical = cmpOr(c.Critical, "critical")
		c.Standard = cmpOr(c.Standard, "standard")
	}
	for i := range m.Fleets {
		m.Fleets[i].Name = cmpOr(m.Fleets[i].Name, baseName(m.Fleets[i].File))
	}
	for i := range m.Sizes {
		m.Sizes[i].Name = cmpOr(m.Sizes[i].Name, "n"+strconv.Itoa(m.Sizes[i].N))
	}
	for i := range m.Workloads {
		m.Workloads[i].Name = cmpOr(m.Workloads[i].Name, baseName(m.Workloads[i].File))
	}
	for i := range m.Loads {
		l := &m.Loads[i]
		if l.Spike > 0 {
			l.At = cmp0(l.At, 2*time.Second)
			l.After = cmp0(l.After, 5*time.Second)
		}
		if l.Name == "" {
			l.Name = "load" + strconv.FormatFloat(l.Load, 'g', 3, 64)
			if l.Spike > 0 {
				l.Name = strconv.FormatFloat(l.Spike, 'g', 3, 64) + "x-" + l.For.String()
			}
		}
	}
	for i := range m.Columns {
		m.Columns[i].Name = cmpOr(m.Columns[i].Name, m.Columns[i].Strategy)
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func cmp0(d, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return d
}

// axisNames are the axes in cell-name order.
var axisNames = []string{"fleet", "size", "seats", "seats_from", "workload", "load", "event"}

func (m *Matrix) validate(errs *fieldErrors) {
	names := map[string]bool{}
	for _, c := range m.Columns {
		names[c.Name] = true
	}
	need := func(path, col string) {
		if !names[col] {
			errs.add(path, "no column named %q", col)
		}
	}
	switch c := m.Checks; c.Kind {
	case "routing":
		need("checks.subject", c.Subject)
		if c.Replicas != "" {
			need("checks.replicas", c.Replicas)
		}
		if m.VarySeed {
			errs.add("vary_seed", "the routing checks' hit spread is over runs of one seed")
		}
	case "protect":
		need("checks.subject", c.Subject)
		need("checks.reference", c.Reference)
		need("checks.unloaded", c.Unloaded)
	default:
		errs.add("checks.kind", "unknown check set %q (routing or protect)", c.Kind)
	}
	if m.Runs < 1 || m.MaxRate < 0 || m.Warmup < 0 || m.Duration < 0 || m.Timeout < 0 {
		errs.add("runs", "runs must be >= 1; max_rate, warmup, duration and timeout >= 0")
	}
	if len(m.Fleets) == 0 || len(m.Sizes) == 0 || len(m.Workloads) == 0 || len(m.Loads) == 0 {
		errs.add("fleets", "fleets, sizes, workloads and loads each need at least one entry")
	}
	if len(m.Columns) == 0 {
		errs.add("columns", "at least one column is needed")
	}
	for i, f := range m.Fleets {
		if f.File == "" {
			errs.add(fmt.Sprintf("fleets[%d].file", i), "missing fleet file")
		}
	}
	for i, s := range m.Sizes {
		if s.N < 1 {
			errs.add(fmt.Sprintf("sizes[%d].n", i), "a fleet size must be >= 1, got %d", s.N)
		}
		if s.Slower != 0 && !(s.Slower >= 1) {
			errs.add(fmt.Sprintf("sizes[%d].slower", i), "slower must be >= 1, got %v", s.Slower)
		}
	}
	for i, s := range m.Seats {
		if s < 1 {
			errs.add(fmt.Sprintf("seats[%d]", i), "seats must be >= 1, got %d", s)
		}
	}
	for i, f := range m.SeatsFrom {
		if f != "policy" && f != "engine" && f != "discover" {
			errs.add(fmt.Sprintf("seats_from[%d]", i), "seats_from is policy, engine or discover, got %q", f)
		}
	}
	for i, w := range m.Workloads {
		if w.File == "" {
			errs.add(fmt.Sprintf("workloads[%d].file", i), "missing workload file")
		}
	}
	for i, l := range m.Loads {
		switch {
		case !(l.Load > 0):
			errs.add(fmt.Sprintf("loads[%d].load", i), "load must be > 0 (a multiple of the cell's capacity)")
		case l.Spike < 0 || (l.Spike > 0 && l.For <= 0):
			errs.add(fmt.Sprintf("loads[%d]", i), "a spike needs spike > 0 and for > 0")
		}
	}
	for i, e := range m.Events {
		if e.Name == "" || e.Backend < 0 || e.At < 0 || e.AtSpike < 0 || e.AtSpike > 1 {
			errs.add(fmt.Sprintf("events[%d]", i), "an event needs a name, backend >= 0, at >= 0, at_spike in [0, 1]")
		}
	}
	for i, ex := range m.Exclude {
		for k := range ex {
			if !slices.Contains(axisNames, k) {
				errs.add(fmt.Sprintf("exclude[%d].%s", i, k), "unknown axis (one of %s)", strings.Join(axisNames, ", "))
			}
		}
	}
	seen := map[string]bool{}
	for i, c := range m.Columns {
		if c.Strategy == "" {
			errs.add(fmt.Sprintf("columns[%d].strategy", i), "missing strategy")
		}
		if seen[c.Name] {
			errs.add(fmt.Sprintf("columns[%d].name", i), "duplicate column name %q", c.Name)
		}
		seen[c.Name] = true
		for j, w := range c.Workloads {
			if !slices.ContainsFunc(m.Workloads, func(a WorkloadAxis) bool { return a.Name == w }) {
				errs.add(fmt.Sprintf("columns[%d].workloads[%d]", i, j), "no workload named %q", w)
			}
		}
	}
}

// ColumnsOf returns the columns cell c runs (a column may name the workloads it runs in).
func (m *Matrix) ColumnsOf(c Cell) []Column { return m.columnsFor(c.Workload.Name) }

// columnsFor returns the columns a cell of workload w runs: those without a workloads list, and those whose
// list names w (without the list: a scenario's columns have none).
func (m *Matrix) columnsFor(w string) []Column {
	var out []Column
	for _, c := range m.Columns {
		if len(c.Workloads) == 0 || slices.Contains(c.Workloads, w) {
			c.Workloads = nil
			out = append(out, c)
		}
	}
	return out
}

// Path resolves a path named in the matrix file.
func (m *Matrix) Path(p string) string {
	if filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(m.file), p)
}

// Cells expands the matrix: the cross product of its axes in file order (the last axis varies fastest), less
// the excluded cells, less those whose name the filter does not match (nil: all).
func (m *Matrix) Cells(filter *regexp.Regexp) []Cell {
	seats := []int{0}
	if len(m.Seats) > 0 {
		seats = m.Seats
	}
	froms := []string{""}
	if len(m.SeatsFrom) > 0 {
		froms = m.SeatsFrom
	}
	events := []*EventAxis{nil}
	for i := range m.Events {
		if i == 0 {
			events = events[:0]
		}
		events = append(events, &m.Events[i])
	}
	var out []Cell
	for _, f := range m.Fleets {
		for _, sz := range m.Sizes {
			for _, st := range seats {
				for _, from := range froms {
					for _, w := range m.Workloads {
						for _, l := range m.Loads {
							for _, ev := range events {
								c := Cell{Fleet: f, Size: sz, Seats: st, SeatsFrom: from, Workload: w, Load: l, Event: ev,
									Axes: map[string]string{"fleet": f.Name, "size": sz.Name, "workload": w.Name, "load": l.Name}}
								parts := []string{f.Name, sz.Name}
								if st > 0 {
									c.Axes["seats"] = "s" + strconv.Itoa(st)
									parts = append(parts, c.Axes["seats"])
								}
								if from != "" {
									c.Axes["seats_from"] = from
									parts = append(parts, "seats-"+from)
								}
								parts = append(parts, w.Name, l.Name)
								if ev != nil {
									c.Axes["event"] = ev.Name
									parts = append(parts, ev.Name)
								}
								c.Name = strings.Join(parts, "/")
								if m.excluded(c) || (filter != nil && !filter.MatchString(c.Name)) {
									continue
								}
								out = append(out, c)
							}
						}
					}
				}
			}
		}
	}
	return out
}

// excluded reports whether an exclude entry matches c. A seats or size value matches its name or its number.
func (m *Matrix) excluded(c Cell) bool {
	for _, ex := range m.Exclude {
		all := true
		for axis, want := range ex {
			neg := strings.HasPrefix(want, "!")
			want = strings.TrimPrefix(want, "!")
			got, ok := c.Axes[axis]
			match := ok && (got == want || (axis == "size" && strconv.Itoa(c.Size.N) == want) ||
				(axis == "seats" && strconv.Itoa(c.Seats) == want))
			if match == neg {
				all = false
				break
			}
		}
		if all && len(ex) > 0 {
			return true
		}
	}
	return false
}

// CellPlan is a cell made concrete: its generated fleet and scenario, and what the checks need to know of it.
type CellPlan struct {
	Cell
	Scenario *Scenario
	Capacity Capacity
	// Rate is the base arrival rate (requests/s) and Peak the highest (at the spike's or a workload burst's top).
	Rate, Peak float64
	// Backends are the generated fleet's names, in order.
	Backends []string
	// Mixed is true when the fleet's backends differ in physics (any simulator setting but name, listen, region
	// and seed); SharedPrefix when the workload sends shared prefixes or multi-turn sessions (prefix hits are
	// possible).
	Mixed, SharedPrefix bool
	// Spike is the spike's window on the timeline, when the load has one.
	Spike *Burst
	// CriticalShare is the workload's share of requests of the checks' critical class (its priority weight over
	// all weights; 0 without priorities).
	CriticalShare float64
}

// Prepare writes the cell's fleet (fleet.yaml) and scenario (scenario.yaml) to dir and loads the scenario: the
// same files "switchyard bench compare -scenario DIR/scenario.yaml" runs by hand. The rate follows from the
// cell's capacity; a cell whose peak rate is over MaxRate is an error.
func (m *Matrix) Prepare(c Cell, dir string) (*CellPlan, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("bench: matrix: %w", err)
	}
	p := &CellPlan{Cell: c}
	set := map[string]any{}
	for k, v := range c.Size.Set {
		set[k] = v
	}
	if c.Seats > 0 {
		set["max_num_seqs"] = c.Seats
	}
	if c.SeatsFrom == "engine" {
		set["dialect"] = sim.DialectSGLang
	}
	fleetPath := filepath.Join(dir, "fleet.yaml")
	names, err := ReplicateFleet(m.Path(c.Fleet.File), fleetPath, c.Size.N, set)
	if err != nil {
		return nil, err
	}
	p.Backends = names
	if c.Size.Slower > 1 {
		if err := SlowFleet(fleetPath, c.Size.Slower); err != nil {
			return nil, err
		}
	}
	switch c.SeatsFrom {
	case "policy":
		if err := StateSeats(fleetPath); err != nil {
			return nil, err
		}
	case "engine":
		if err := NameEngine(fleetPath, "sglang"); err != nil { // the gateway's built-in engine of that name
			return nil, err
		}
	}
	if p.Mixed, err = mixedFleet(fleetPath); err != nil {
		return nil, err
	}
	wpath, err := filepath.Abs(m.Path(c.Workload.File))
	if err != nil {
		return nil, fmt.Errorf("bench: matrix: %w", err)
	}
	w, err := LoadWorkload(wpath)
	if err != nil {
		return nil, err
	}
	p.SharedPrefix = w.Prefix != nil || w.Sessions != nil
	var total float64
	for _, pr := range w.Priorities {
		total += pr.Weight
		if pr.Value == m.Checks.Critical {
			p.CriticalShare += pr.Weight
		}
	}
	if total > 0 {
		p.CriticalShare /= total
	}
	if w, err = w.Apply(Overrides{Warmup: m.Warmup, Duration: m.Duration, Seed: m.Seed}); err != nil {
		return nil, err
	}
	if p.Capacity, err = FleetCapacity(fleetPath, w); err != nil {
		return nil, err
	}
	p.Rate = c.Load.Load * p.Capacity.RequestsPS
	sc := scenarioFile{
		Name:     m.Name + "/" + c.Name,
		Fleet:    fleetPath,
		Workload: wpath,
		Rate:     p.Rate,
		Warmup:   w.Warmup.String(),
		Duration: w.Duration.String(),
		Seed:     w.Seed,
		SLO:      slowedSLO(w.SLO, c.Size.Slower),
		Columns:  m.columnsFor(c.Workload.Name),
	}
	if m.Timeout > 0 {
		sc.Timeout = m.Timeout.String()
	}
	span := w.Span()
	p.Peak = p.Rate
	if c.Load.Spike > 0 {
		b := Burst{At: w.Warmup + c.Load.At, Duration: c.Load.For, Multiplier: c.Load.Spike / c.Load.Load}
		p.Spike = &b
		span = b.At + b.Duration + c.Load.After
		sc.Duration = (span - w.Warmup).String()
		sc.Bursts = []burstFile{{At: b.At.String(), Duration: b.Duration.String(), Multiplier: b.Multiplier}}
		p.Peak = c.Load.Spike * p.Capacity.RequestsPS
	} else {
		for _, b := range w.Bursts {
			if b.At+b.Duration > span {
				return nil, fmt.Errorf("bench: matrix: cell %s: workload %s bursts until %v, past the cell's %v",
					c.Name, w.Name, b.At+b.Duration, span)
			}
			p.Peak = max(p.Peak, p.Rate*b.Multiplier)
		}
	}
	if m.MaxRate > 0 && p.Peak > m.MaxRate {
		return nil, fmt.Errorf("bench: matrix: cell %s asks %.0f requests/s at its peak (capacity %.1f), over "+
			"max_rate %.0f: fewer or smaller backends, or a lower load", c.Name, p.Peak, p.Capacity.RequestsPS, m.MaxRate)
	}
	if ev := c.Event; ev != nil && ev.Control != nil {
		if ev.Backend >= len(names) {
			return nil, fmt.Errorf("bench: matrix: cell %s: event %s names backend %d of %d", c.Name, ev.Name,
				ev.Backend, len(names))
		}
		at := ev.At
		if ev.AtSpike > 0 && p.Spike != nil {
			at = p.Spike.At + time.Duration(ev.AtSpike*float64(p.Spike.Duration))
		}
		sc.Events = []eventFile{{At: at.String(), Backend: names[ev.Backend], Control: ev.Control, Label: ev.Name}}
	}
	data, err := yaml.Marshal(sc)
	if err != nil {
		return nil, fmt.Errorf("bench: matrix: %w", err)
	}
	head := fmt.Sprintf("# Generated by switchyard bench matrix from %s, cell %s: capacity %.2f requests/s "+
		"(mean prompt %.0f, output %.0f tokens), base rate %.2f (%gx capacity).\n", m.file, c.Name,
		p.Capacity.RequestsPS, p.Capacity.PromptTokens, p.Capacity.OutputTokens, p.Rate, c.Load.Load)
	path := filepath.Join(dir, "scenario.yaml")
	if err := os.WriteFile(path, append([]byte(head), data...), 0o644); err != nil {
		return nil, fmt.Errorf("bench: matrix: %w", err)
	}
	if p.Scenario, err = LoadScenario(path); err != nil {
		return nil, err
	}
	return p, nil
}

// scenarioFile is the YAML form of a generated scenario (Scenario's fields as its file spells them).
type scenarioFile struct {
	Name     string      `yaml:"name"`
	Fleet    string      `yaml:"fleet"`
	Workload string      `yaml:"workload"`
	Rate     float64     `yaml:"rate"`
	Warmup   string      `yaml:"warmup"`
	Duration string      `yaml:"duration"`
	Seed     uint64      `yaml:"seed"`
	Timeout  string      `yaml:"timeout,omitempty"`
	SLO      *sloFile    `yaml:"slo,omitempty"`
	Bursts   []burstFile `yaml:"bursts,omitempty"`
	Columns  []Column    `yaml:"columns"`
	Events   []eventFile `yaml:"events,omitempty"`
}

type sloFile struct {
	TTFT string `yaml:"ttft,omitempty"`
	ITL  string `yaml:"itl,omitempty"`
}

// slowedSLO returns the workload's objectives made f times looser, for a fleet made f times slower (SizeAxis.Slower),
// or nil when there is nothing to scale. A cell's objectives were written for the fleet's own speed: kept as they
// are on a fleet twice as slow, an inter-token objective of 50 ms on engines of 40 ms steps that slow with load
// (fixed seats) is met only by idle engines, and adaptive routing, which ranks a backend predicted to miss the
// objective below every one that meets it, spread conversations over idle backends and gave up their cached
// history (64 fixed-seat engines, multi-turn: 25% of turns on the previous turn's backend, against 81% with the
// objective scaled; bench/results/routing-2026-12-02-matrix.md, run 12).
func slowedSLO(s SLO, f float64) *sloFile {
	if f <= 1 || (s.TTFT <= 0 && s.ITL <= 0) {
		return nil
	}
	var o sloFile
	if s.TTFT > 0 {
		o.TTFT = time.Duration(float64(s.TTFT) * f).String()
	}
	if s.ITL > 0 {
		o.ITL = time.Duration(float64(s.ITL) * f).String()
	}
	return &o
}

type burstFile struct {
	At         string  `yaml:"at"`
	Duration   string  `yaml:"duration"`
	Multiplier float64 `yaml:"multiplier"`
}

type eventFile struct {
	At      string         `yaml:"at"`
	Backend string         `yaml:"backend"`
	Control map[string]any `yaml:"control"`
	Label   string         `yaml:"label"`
}

// mixedFleet reports whether the fleet file's backends differ in any simulator setting but their identity.
func mixedFleet(path string) (bool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return false, fmt.Errorf("bench: matrix: %w", err)
	}
	cfgs, err := sim.ParseFleet(path, data)
	if err != nil {
		return false, fmt.Errorf("bench: matrix: %w", err)
	}
	norm := func(c sim.Config) sim.Config {
		c.Name, c.Listen, c.Region, c.Seed = "", "", "", 0
		return c
	}
	for _, c := range cfgs[1:] {
		if !reflect.DeepEqual(norm(c), norm(cfgs[0])) {
			return true, nil
		}
	}
	return false, nil
}

// StateSeats rewrites the fleet file at path so that the gateway's policy states each backend's seats: every
// entry's gateway mapping gets max_num_seqs, the simulator's own (its entry's, else the simulator's default), as
// an operator who started vLLM with --max-num-seqs would write it into backends[].max_num_seqs.
func StateSeats(path string) error {
	return rewriteGateway(path, func(cfg *sim.Config, gw map[string]any) { gw["max_num_seqs"] = cfg.MaxNumSeqs })
}

// NameEngine rewrites the fleet file at path so that the gateway reads every backend as an engine of that name
// (backends[].engine): the simulators' dialect must match it.
func NameEngine(path, engine string) error {
	return rewriteGateway(path, func(_ *sim.Config, gw map[string]any) { gw["engine"] = engine })
}

// rewriteGateway rewrites each entry's gateway mapping of the fleet file at path with set, given the entry's
// simulator configuration.
func rewriteGateway(path string, set func(cfg *sim.Config, gw map[string]any)) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("bench: fleet: %w", err)
	}
	cfgs, err := sim.ParseFleet(path, data)
	if err != nil {
		return fmt.Errorf("bench: fleet: %w", err)
	}
	var entries []map[string]any
	if err := yaml.Unmarshal(data, &entries); err != nil {
		return yamlErrors(path, err)
	}
	if len(entries) != len(cfgs) {
		return fmt.Errorf("bench: fleet: %s: %d entries, %d simulators", path, len(entries), len(cfgs))
	}
	for i, e := range entries {
		gw, _ := e["gateway"].(map[string]any)
		if gw == nil {
			gw = map[string]any{}
		}
		set(&cfgs[i], gw)
		e["gateway"] = gw
	}
	out, err := yaml.Marshal(entries)
	if err != nil {
		return fmt.Errorf("bench: fleet: %w", err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return fmt.Errorf("bench: fleet: %w", err)
	}
	return nil
}

// SlowFleet rewrites the fleet file at path so that every backend takes f times as long for everything it does
// (its itl, itl_per_seq, overhead and rtt multiplied by f, its prefill_tps divided by f; a key the entry leaves
// out starts from the simulator's default): one engine's step then equals the original's at slowdown f. Seats,
// KV room and the fleet's mix are kept, so TTFT ratios between strategies hold while the rate that saturates
// the fleet falls by f.
func SlowFleet(path string, f float64) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("bench: fleet: %w", err)
	}
	var entries []map[string]any
	if err := yaml.Unmarshal(data, &entries); err != nil {
		return yamlErrors(path, err)
	}
	def := sim.DefaultConfig()
	durs := map[string]time.Duration{"itl": def.ITL, "itl_per_seq": def.ITLPerSeq, "overhead": def.Overhead, "rtt": def.RTT}
	for i, e := range entries {
		for k, d := range durs {
			if v, ok := e[k]; ok {
				s, _ := v.(string)
				if d, err = time.ParseDuration(s); err != nil {
					return &FileError{File: path, Line: 1, Msg: fmt.Sprintf("entry %d: %s: %v is not a duration", i, k, v)}
				}
			}
			if d > 0 {
				e[k] = time.Duration(float64(d) * f).String()
			}
		}
		tps := def.PrefillTPS
		switch v := e["prefill_tps"].(type) {
		case int:
			tps = float64(v)
		case float64:
			tps = v
		case nil:
		default:
			return &FileError{File: path, Line: 1, Msg: fmt.Sprintf("entry %d: prefill_tps: %v is not a number", i, v)}
		}
		e["prefill_tps"] = tps / f
	}
	out, err := yaml.Marshal(entries)
	if err != nil {
		return fmt.Errorf("bench: fleet: %w", err)
	}
	if err := os.WriteFile(path, out, 0o644); err != nil {
		return fmt.Errorf("bench: fleet: %w", err)
	}
	return nil
}
