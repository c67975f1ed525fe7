package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"
)

// MatrixOptions configures RunMatrix.
type MatrixOptions struct {
	// Env's WorkDir is unused: each run works in OUT/cells/CELL/runN/work.
	Env
	Matrix *Matrix
	// Out is the output directory: matrix.md, matrix.json, and per cell its generated files and each run's
	// report.json and plots.
	Out string
	// Runs overrides the matrix's runs when > 0.
	Runs int
	// Filter keeps the cells whose name it matches; nil keeps all.
	Filter *regexp.Regexp
}

// MatrixReport is matrix.json.
type MatrixReport struct {
	Command string        `json:"command"`
	Date    string        `json:"date"`
	Machine Machine       `json:"machine"`
	Matrix  string        `json:"matrix"`
	Checks  Checks        `json:"checks"`
	Runs    int           `json:"runs"`
	Cells   []*CellResult `json:"cells"`
	// ElapsedS is the whole matrix's wall time in seconds.
	ElapsedS float64 `json:"elapsed_s"`
}

// CellResult is one cell of a matrix: what it ran at, its judgement and every run's per-column figures.
type CellResult struct {
	Name         string            `json:"name"`
	Axes         map[string]string `json:"axes"`
	Backends     int               `json:"backends"`
	Capacity     Capacity          `json:"capacity"`
	Rate         float64           `json:"rate"`
	Peak         float64           `json:"peak_rate"`
	Mixed        bool              `json:"mixed"`
	SharedPrefix bool              `json:"shared_prefix"`
	// Error is set when the cell could not be prepared; it then has no runs.
	Error     string `json:"error,omitempty"`
	Judgement `json:"judgement"`
	// RunColumns holds each run's columns' figures, in run and column order.
	RunColumns [][]ColumnFigures `json:"runs"`
	ElapsedS   float64           `json:"elapsed_s"`
}

// ColumnFigures is the part of a column's RunReport a matrix keeps (the whole report is in the run's
// report.json).
type ColumnFigures struct {
	Name          string                  `json:"name"`
	Error         string                  `json:"error,omitempty"`
	Requests      int                     `json:"requests"`
	OK            int                     `json:"ok"`
	TTFT          Quantiles               `json:"ttft_ms"`
	OutputTPS     float64                 `json:"output_tokens_per_s"`
	SLOAttainment float64                 `json:"slo_attainment"`
	PrefixHitRate *float64                `json:"prefix_hit_rate,omitempty"`
	SessionStay   *float64                `json:"session_stay,omitempty"`
	Backends      map[string]int          `json:"backends,omitempty"`
	Priorities    map[string]*ClassReport `json:"priorities,omitempty"`
	Bursts        []BurstReport           `json:"bursts,omitempty"`
	SendLateP99   float64                 `json:"send_late_p99_ms"`
	Pick          *Quantiles              `json:"pick_ms,omitempty"`
}

func columnFigures(r *RunReport) ColumnFigures {
	return ColumnFigures{Name: r.Name, Error: r.Error, Requests: r.Requests, OK: r.OK, TTFT: r.TTFT,
		OutputTPS: r.OutputTPS, SLOAttainment: r.SLOAttainment, PrefixHitRate: r.PrefixHitRate,
		SessionStay: r.SessionStay, Backends: r.Backends, Priorities: r.Priorities, Bursts: r.Bursts,
		SendLateP99: r.SendLate.P99, Pick: r.Pick}
}

// cellDir is a cell's directory under out: its name with "/" as "_".
func cellDir(out, cell string) string {
	return filepath.Join(out, "cells", strings.ReplaceAll(cell, "/", "_"))
}

// RunMatrix runs every cell of the matrix (that the filter keeps) Runs times, each run a Compare of the cell's
// generated scenario, judges each cell, and writes matrix.json and matrix.md to Out as each cell completes (so
// a stopped matrix keeps what it measured). A cell that cannot be prepared is reported with its Error and the
// others still run; RunMatrix returns an error only when ctx is cancelled or the output cannot be written.
func RunMatrix(ctx context.Context, command string, opt MatrixOptions) (*MatrixReport, error) {
	m := opt.Matrix
	runs := m.Runs
	if opt.Runs > 0 {
		runs = opt.Runs
	}
	rep := &MatrixReport{Command: command, Date: time.Now().UTC().Format(time.RFC3339), Machine: ThisMachine(),
		Matrix: m.Name, Checks: m.Checks, Runs: runs}
	start := time.Now()
	cells := m.Cells(opt.Filter)
	e := opt.Env
	for ci, c := range cells {
		t0 := time.Now()
		dir := cellDir(opt.Out, c.Name)
		res := &CellResult{Name: c.Name, Axes: c.Axes, Backends: c.Size.N}
		rep.Cells = append(rep.Cells, res)
		p, err := m.Prepare(c, dir)
		if err != nil {
			res.Error = err.Error()
			e.logf("matrix %s: cell %d/%d %s: %v", m.Name, ci+1, len(cells), c.Name, err)
			if err := writeMatrix(opt.Out, rep, time.Since(start)); err != nil {
				return rep, err
			}
			continue
		}
		res.Capacity, res.Rate, res.Peak, res.Mixed, res.SharedPrefix = p.Capacity, p.Rate, p.Peak, p.Mixed, p.SharedPrefix
		e.logf("matrix %s: cell %d/%d %s: %d backends, capacity %.1f req/s, rate %.1f (peak %.1f), mixed %v, shared prefix %v",
			m.Name, ci+1, len(cells), c.Name, c.Size.N, p.Capacity.RequestsPS, p.Rate, p.Peak, p.Mixed, p.SharedPrefix)
		var all [][]*RunReport
		for r := range runs {
			runDir := filepath.Join(dir, fmt.Sprintf("run%d", r+1))
			re := e
			re.WorkDir = filepath.Join(runDir, "work")
			if err := os.MkdirAll(re.WorkDir, 0o755); err != nil {
				return rep, fmt.Errorf("bench: matrix: %w", err)
			}
			if re.Timeout <= 0 {
				re.Timeout = p.Scenario.Timeout
			}
			reports, err := Compare(ctx, CompareOptions{Env: re, Scenario: m.RunScenario(p.Scenario, r)})
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
			if err != nil {
				reports = []*RunReport{{Name: "compare", Error: err.Error()}}
			}
			all = append(all, reports)
			figs := make([]ColumnFigures, len(reports))
			for i, r := range reports {
				figs[i] = columnFigures(r)
			}
			res.RunColumns = append(res.RunColumns, figs)
			cr := NewReport(command)
			cr.Runs = reports
			if err := WriteArtifacts(runDir, c.Name, cr); err != nil {
				return rep, err
			}
		}
		res.Judgement = Judge(m.Checks, all, p.Mixed, p.SharedPrefix)
		if m.Checks.Kind == "protect" && p.Capacity.RequestsPS > 0 {
			f := Feasibility{CritDemand: p.CriticalShare * p.Peak / p.Capacity.RequestsPS,
				SeatShare: p.Capacity.SeatShare, Completions: p.Capacity.RequestsPS}
			if p.Spike != nil {
				if ev := c.Event; ev != nil && ev.AtSpike > 0 && ev.Control["down"] == true && c.Seats > 0 {
					f.LostSeats = float64(c.Seats)
				}
			}
			res.Judgement = ProtectFeasibility(res.Judgement, m.Checks, all, f)
		}
		res.ElapsedS = time.Since(t0).Seconds()
		e.logf("matrix %s: cell %s: %s in %.0fs", m.Name, c.Name, checkLine(res.Checks), res.ElapsedS)
		if err := writeMatrix(opt.Out, rep, time.Since(start)); err != nil {
			return rep, err
		}
	}
	rep.ElapsedS = time.Since(start).Seconds()
	return rep, writeMatrix(opt.Out, rep, time.Since(start))
}

// RunScenario returns the scenario of a cell's run r (from 0): sc itself, or with VarySeed a copy on sc's seed
// plus r (sc is not changed).
func (m *Matrix) RunScenario(sc *Scenario, r int) *Scenario {
	if !m.VarySeed || r == 0 {
		return sc
	}
	c := *sc
	c.Seed += uint64(r)
	return &c
}

func checkLine(cs []CheckResult) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = c.Name + " " + c.Status
	}
	return strings.Join(parts, ", ")
}

// writeMatrix writes matrix.json and matrix.md to out.
func writeMatrix(out string, rep *MatrixReport, elapsed time.Duration) error {
	rep.ElapsedS = elapsed.Seconds()
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("bench: matrix: %w", err)
	}
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("bench: matrix: %w", err)
	}
	if err := os.WriteFile(filepath.Join(out, "matrix.json"), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: matrix: %w", err)
	}
	var b strings.Builder
	PrintMatrix(&b, rep)
	if err := os.WriteFile(filepath.Join(out, "matrix.md"), []byte(b.String()), 0o644); err != nil {
		return fmt.Errorf("bench: matrix: %w", err)
	}
	return nil
}

// PrintMatrix writes the matrix as a markdown table, one row per cell: its rate, each figure as min-max over
// the runs, then each check.
func PrintMatrix(out io.Writer, rep *MatrixReport) {
	fmt.Fprintf(out, "# Matrix %s: %d cells, %d runs each (%s checks)\n\n", rep.Matrix, len(rep.Cells), rep.Runs, rep.Checks.Kind)
	fmt.Fprintf(out, "`%s`, %s, %d CPUs (%s), %s in all.\n\n", rep.Command, rep.Date, rep.Machine.NProc,
		rep.Machine.CPUModel, (time.Duration(rep.ElapsedS) * time.Second).String())
	var figs, checks []string
	for _, c := range rep.Cells {
		for _, f := range c.Figures {
			if !slices.Contains(figs, f.Name) {
				figs = append(figs, f.Name)
			}
		}
		for _, k := range c.Checks {
			if !slices.Contains(checks, k.Name) {
				checks = append(checks, k.Name)
			}
		}
	}
	head := append([]string{"cell", "req/s (capacity)"}, figs...)
	head = append(head, checks...)
	fmt.Fprintf(out, "| %s |\n|%s\n", strings.Join(head, " | "), strings.Repeat("---|", len(head)))
	for _, c := range rep.Cells {
		row := []string{c.Name}
		if c.Error != "" {
			row = append(row, "not run: "+strings.ReplaceAll(firstLine(c.Error), "|", "/"))
			fmt.Fprintf(out, "| %s |\n", strings.Join(row, " | "))
			continue
		}
		rate := fmt.Sprintf("%s (%s)", f3(c.Rate), f3(c.Capacity.RequestsPS))
		if c.Peak > c.Rate {
			rate = fmt.Sprintf("%s, peak %s (%s)", f3(c.Rate), f3(c.Peak), f3(c.Capacity.RequestsPS))
		}
		row = append(row, rate)
		for _, name := range figs {
			v := "-"
			for _, f := range c.Figures {
				if f.Name == name {
					v = f.Range.String()
				}
			}
			row = append(row, v)
		}
		for _, name := range checks {
			v := ""
			for _, k := range c.Checks {
				if k.Name == name {
					v = k.Status
				}
			}
			row = append(row, v)
		}
		fmt.Fprintf(out, "| %s |\n", strings.Join(row, " | "))
	}
	var notes []string
	for _, c := range rep.Cells {
		for _, k := range c.Checks {
			if k.Detail != "" && k.Status != CheckPass {
				notes = append(notes, fmt.Sprintf("- %s: %s: %s %s", c.Name, k.Name, k.Status, k.Detail))
			}
		}
		for ri, run := range c.RunColumns {
			for _, col := range run {
				if col.Error != "" {
					notes = append(notes, fmt.Sprintf("- %s run %d: %s not run: %s", c.Name, ri+1, col.Name, firstLine(col.Error)))
				}
				if col.SendLateP99 > ms(LateWarning) {
					notes = append(notes, fmt.Sprintf("- %s run %d: %s: the load generator sent late (p99 %s ms)",
						c.Name, ri+1, col.Name, f3(col.SendLateP99)))
				}
			}
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(out, "\n%s\n", strings.Join(notes, "\n"))
	}
}

// Estimate is a lower bound of a matrix's wall time: for each cell, runs x columns x (the cell's timeline plus
// startup, what a column spends outside it).
func (m *Matrix) Estimate(cells []Cell, runs int, startup time.Duration) time.Duration {
	var total time.Duration
	for _, c := range cells {
		warm, dur := m.Warmup, m.Duration
		if warm == 0 || dur == 0 {
			if w, err := LoadWorkload(m.Path(c.Workload.File)); err == nil {
				warm, dur = cmp0(warm, w.Warmup), cmp0(dur, w.Duration)
			}
		}
		span := warm + dur
		if c.Load.Spike > 0 {
			span = warm + c.Load.At + c.Load.For + c.Load.After
		}
		total += time.Duration(runs*len(m.columnsFor(c.Workload.Name))) * (span + startup)
	}
	return total
}
