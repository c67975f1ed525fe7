package bench

import (
	"fmt"
	"math"
	"slices"
)

// The thresholds of the two check sets, as the issues state them (issue 19's and issue 15's "Done when").
const (
	// Routing: the subject's p99 TTFT within 5% of the best baseline's in every cell, 20% under every
	// baseline's in mixed-fleet cells; its prefix hit rate within 10% of the oracle's on shared-prefix cells,
	// and varying by at most 0.05 over the runs of a cell.
	RoutingP99VsBest   = 1.05
	RoutingP99VsEach   = 0.8
	RoutingHitVsOracle = 0.9
	RoutingHitSpread   = 0.05
	// RoutingReplicaStay: a conversation whose turns alternate between two gateway replicas stays on its
	// backend for at least 95% of its follow-up turns under the subject's strategy.
	RoutingReplicaStay = 0.95
	// Protect: critical success >= 99%; critical p99 TTFT over the spike within 1.5x of the unloaded run's;
	// output tokens/s >= 90% of the no-shedding run's; admitted standard requests' p99 TTFT within their
	// objective (the workload's TTFT SLO, which the generated gateway config is given).
	ProtectCriticalOK    = 0.99
	ProtectCriticalSpike = 1.5
	ProtectOutput        = 0.9
	ProtectStandard      = 1.0
)

// Check outcomes.
const (
	CheckPass  = "pass"
	CheckFail  = "FAIL"
	CheckNA    = "-"     // the check does not apply to the cell (not mixed, no shared prefix, one run)
	CheckError = "error" // a run lacks a figure the check needs (a column did not run)
	// CheckInfeasible: no gateway can pass the check on the cell (ProtectFeasibility says why); the figure is
	// still measured and shown.
	CheckInfeasible = "infeasible"
)

// Range is a figure's minimum and maximum over a cell's runs; N counts the runs that had it.
type Range struct {
	Min float64 `json:"min"`
	Max float64 `json:"max"`
	N   int     `json:"n"`
}

func (r *Range) add(x float64) {
	if r.N == 0 || x < r.Min {
		r.Min = x
	}
	if r.N == 0 || x > r.Max {
		r.Max = x
	}
	r.N++
}

// String is "min-max" (one value when they agree), "-" without data.
func (r Range) String() string {
	switch {
	case r.N == 0:
		return "-"
	case f3(r.Min) == f3(r.Max):
		return f3(r.Min)
	}
	return f3(r.Min) + "-" + f3(r.Max)
}

// Figure is one named figure of a cell over its runs.
type Figure struct {
	Name  string `json:"name"`
	Range Range  `json:"range"`
}

// CheckResult is one check of a cell.
type CheckResult struct {
	Name   string `json:"name"`
	Status string `json:"status"`
	Detail string `json:"detail,omitempty"`
}

// Judgement is a cell's figures (in column order of the table) and checks, from its runs.
type Judgement struct {
	Figures []Figure      `json:"figures"`
	Checks  []CheckResult `json:"checks"`
	// PerRun holds each run's own figures, by name (the ranges' inputs).
	PerRun []map[string]float64 `json:"per_run"`
}

// Judge computes the figures and checks of the kind of checks over runs, each run one Compare's reports (one
// per column). mixed and shared say whether the mixed-fleet and shared-prefix checks apply.
func Judge(c Checks, runs [][]*RunReport, mixed, shared bool) Judgement {
	switch c.Kind {
	case "routing":
		return judgeRouting(c, runs, mixed, shared)
	case "protect":
		return judgeProtect(c, runs)
	}
	return Judgement{Checks: []CheckResult{{Name: c.Kind, Status: CheckError, Detail: "unknown check set"}}}
}

// judge collects per-run figures (missing ones absent from the run's map) into ordered ranges.
type judge struct {
	order []string
	per   []map[string]float64
}

func (j *judge) set(run int, name string, x float64) {
	if !slices.Contains(j.order, name) {
		j.order = append(j.order, name)
	}
	if !math.IsNaN(x) && !math.IsInf(x, 0) {
		j.per[run][name] = x
	}
}

// declare fixes a figure's place in the order even when no run has it.
func (j *judge) declare(names ...string) {
	for _, n := range names {
		if !slices.Contains(j.order, n) {
			j.order = append(j.order, n)
		}
	}
}

func (j *judge) rng(name string) Range {
	var r Range
	for _, m := range j.per {
		if x, ok := m[name]; ok {
			r.add(x)
		}
	}
	return r
}

func (j *judge) figures() []Figure {
	out := make([]Figure, len(j.order))
	for i, n := range j.order {
		out[i] = Figure{Name: n, Range: j.rng(n)}
	}
	return out
}

// bound checks that every run has the figure and that it keeps within the limit (max <= limit, or min >=
// limit when atLeast).
func (j *judge) bound(check, name string, limit float64, atLeast bool) CheckResult {
	r := j.rng(name)
	res := CheckResult{Name: check}
	switch {
	case r.N < len(j.per):
		res.Status, res.Detail = CheckError, fmt.Sprintf("%s in %d of %d runs", name, r.N, len(j.per))
	case atLeast && r.Min >= limit, !atLeast && r.Max <= limit:
		res.Status = CheckPass
	default:
		res.Status, res.Detail = CheckFail, fmt.Sprintf("%s %s", name, r)
	}
	return res
}

func newJudge(runs int) *judge {
	j := &judge{per: make([]map[string]float64, runs)}
	for i := range j.per {
		j.per[i] = map[string]float64{}
	}
	return j
}

func column(reports []*RunReport, name string) *RunReport {
	for _, r := range reports {
		if r.Name == name && r.Error == "" {
			return r
		}
	}
	return nil
}

// judgeRouting: p99/best is the subject's p99 TTFT over the lowest baseline p99 of the run; p99/NAME over
// each baseline's; hit/oracle the subject's prefix hit rate over the oracle's; hit the subject's hit rate,
// whose max-min over the runs is the spread; stay the share of its conversations' follow-up turns answered by
// the previous turn's backend (RunReport.SessionStay; a figure without a check: one gateway keeps them by its
// own state), and stay/replicas the same share in the Replicas column, whose turns alternate between gateway
// replicas (checked against RoutingReplicaStay where the cell has conversations). Baselines are the columns
// other than the subject, the oracle and the replicas.
func judgeRouting(c Checks, runs [][]*RunReport, mixed, shared bool) Judgement {
	j := newJudge(len(runs))
	var baselines []string
	for _, reps := range runs {
		for _, r := range reps {
			if r.Name != c.Subject && r.Name != c.Oracle && r.Name != c.Replicas && !slices.Contains(baselines, r.Name) {
				baselines = append(baselines, r.Name)
			}
		}
	}
	j.declare("p99/best")
	for _, b := range baselines {
		j.declare("p99/" + b)
	}
	j.declare("hit", "hit/oracle", "stay")
	if c.Replicas != "" {
		j.declare("stay/replicas")
	}
	for i, reps := range runs {
		if r := column(reps, c.Replicas); c.Replicas != "" && r != nil && r.SessionStay != nil {
			j.set(i, "stay/replicas", *r.SessionStay)
		}
		s := column(reps, c.Subject)
		if s == nil {
			continue
		}
		if s.SessionStay != nil {
			j.set(i, "stay", *s.SessionStay)
		}
		best, all := math.Inf(1), true
		for _, name := range baselines {
			b := column(reps, name)
			if b == nil {
				all = false
				continue
			}
			j.set(i, "p99/"+name, s.TTFT.P99/b.TTFT.P99)
			best = min(best, b.TTFT.P99)
		}
		if all && len(baselines) > 0 {
			j.set(i, "p99/best", s.TTFT.P99/best)
		}
		if s.PrefixHitRate != nil {
			j.set(i, "hit", *s.PrefixHitRate)
			if o := column(reps, c.Oracle); o != nil && o.PrefixHitRate != nil {
				j.set(i, "hit/oracle", *s.PrefixHitRate / *o.PrefixHitRate)
			}
		}
	}
	checks := []CheckResult{j.bound(fmt.Sprintf("p99 <= %gx best", RoutingP99VsBest), "p99/best", RoutingP99VsBest, false)}
	each := CheckResult{Name: fmt.Sprintf("p99 <= %gx each (mixed)", RoutingP99VsEach), Status: CheckNA}
	if mixed {
		each.Status = CheckPass
		if len(baselines) == 0 {
			each.Status, each.Detail = CheckError, "no baseline column"
		}
		for _, b := range baselines {
			if r := j.bound(each.Name, "p99/"+b, RoutingP99VsEach, false); r.Status != CheckPass {
				each = r
				break
			}
		}
	}
	checks = append(checks, each)
	hit := CheckResult{Name: fmt.Sprintf("hit >= %gx oracle (shared)", RoutingHitVsOracle), Status: CheckNA}
	if shared {
		hit = j.bound(hit.Name, "hit/oracle", RoutingHitVsOracle, true)
	}
	checks = append(checks, hit)
	spread := CheckResult{Name: fmt.Sprintf("hit spread <= %g", RoutingHitSpread), Status: CheckNA}
	if len(runs) >= 2 {
		r := j.rng("hit")
		switch {
		case r.N < len(runs):
			spread.Status, spread.Detail = CheckError, fmt.Sprintf("hit in %d of %d runs", r.N, len(runs))
		case r.Max-r.Min <= RoutingHitSpread:
			spread.Status = CheckPass
		default:
			spread.Status, spread.Detail = CheckFail, fmt.Sprintf("hit %s", r)
		}
	}
	checks = append(checks, spread)
	if c.Replicas != "" {
		stay := CheckResult{Name: fmt.Sprintf("stay/replicas >= %g (conversations)", RoutingReplicaStay), Status: CheckNA}
		if j.rng("stay/replicas").N > 0 {
			stay = j.bound(stay.Name, "stay/replicas", RoutingReplicaStay, true)
		}
		checks = append(checks, stay)
	}
	return Judgement{Figures: j.figures(), Checks: checks, PerRun: j.per}
}

// judgeProtect: crit ok is the subject's critical success share over the measured window; crit p99/unloaded
// its critical p99 TTFT over the requests scheduled inside the spike (the workload's first burst, from its
// first second; the whole window when there is no burst) over the unloaded column's critical p99; out/ref the
// output tokens/s the fleet delivered while the spike lasted (BurstReport.OutputTPS; over the whole window
// when there is no burst) over the reference's in the same window, so that it measures the capacity shedding
// left idle while the fleet was overloaded, not the backlog the reference serves after the spike (out/ref all
// is the whole-window ratio, a figure without a check); std p99/slo its admitted standard requests' p99 TTFT
// over the TTFT objective.
func judgeProtect(c Checks, runs [][]*RunReport) Judgement {
	j := newJudge(len(runs))
	j.declare("crit ok", "crit p99/unloaded", "out/ref", "std p99/slo", "crit p99 ms", "unloaded p99 ms", "crit n",
		"out/ref all")
	for i, reps := range runs {
		s := column(reps, c.Subject)
		if s == nil {
			continue
		}
		if cr := s.Priorities[c.Critical]; cr != nil && cr.Requests > 0 {
			j.set(i, "crit ok", float64(cr.OK)/float64(cr.Requests))
		}
		var crit *ClassReport
		if len(s.Bursts) > 0 {
			crit = s.Bursts[0].Classes[c.Critical]
		} else {
			crit = s.Priorities[c.Critical]
		}
		if crit != nil && crit.TTFT.N > 0 {
			// How many first tokens the p99 is over: a short spike on a small fleet has few.
			j.set(i, "crit n", float64(crit.TTFT.N))
			j.set(i, "crit p99 ms", crit.TTFT.P99)
			if u := column(reps, c.Unloaded); u != nil {
				if uc := u.Priorities[c.Critical]; uc != nil && uc.TTFT.N > 0 {
					j.set(i, "unloaded p99 ms", uc.TTFT.P99)
					j.set(i, "crit p99/unloaded", crit.TTFT.P99/uc.TTFT.P99)
				}
			}
		}
		if ref := column(reps, c.Reference); ref != nil && ref.OutputTPS > 0 {
			j.set(i, "out/ref all", s.OutputTPS/ref.OutputTPS)
			switch {
			case len(s.Bursts) == 0:
				j.set(i, "out/ref", s.OutputTPS/ref.OutputTPS)
			case len(ref.Bursts) > 0 && ref.Bursts[0].OutputTPS > 0:
				j.set(i, "out/ref", s.Bursts[0].OutputTPS/ref.Bursts[0].OutputTPS)
			}
		}
		if st := s.Priorities[c.Standard]; st != nil && st.TTFT.N > 0 && s.SLO.TTFT > 0 {
			j.set(i, "std p99/slo", st.TTFT.P99/s.SLO.TTFT)
		}
	}
	checks := []CheckResult{
		j.bound(checkCritOK, "crit ok", ProtectCriticalOK, true),
		j.bound(checkCritSpike, "crit p99/unloaded", ProtectCriticalSpike, false),
		j.bound(checkOutput, "out/ref", ProtectOutput, true),
		j.bound("std p99 <= slo", "std p99/slo", ProtectStandard, false),
	}
	return Judgement{Figures: j.figures(), Checks: checks, PerRun: j.per}
}

// Feasibility is what a cell's plan says of the protect checks' reach: the critical demand at the spike's peak,
// the seats a backend that goes down takes with it, and what one free seat costs the fleet's output.
type Feasibility struct {
	// CritDemand is the critical requests' demand at the spike's peak over the fleet's capacity: the
	// workload's critical share times the peak rate over the capacity in requests/s (bench/capacity.go).
	CritDemand float64
	// LostSeats are the seats of a backend that goes down inside the spike, dropping its running streams
	// (0: none does).
	LostSeats float64
	// SeatShare is Capacity.SeatShare, the least share of the saturated fleet's output one sequence fewer
	// takes away, and Completions the saturated fleet's completions per second (Capacity.RequestsPS): with them
	// ProtectFeasibility finds a fleet too small to both keep a seat free for critical requests and deliver
	// ProtectOutput (0: not judged).
	SeatShare, Completions float64
}

// The protect checks' names, as the tables print them.
var (
	checkCritOK    = fmt.Sprintf("crit ok >= %g%%", 100*ProtectCriticalOK)
	checkCritSpike = fmt.Sprintf("crit p99 <= %gx unloaded", ProtectCriticalSpike)
	checkOutput    = fmt.Sprintf("out >= %g%% ref", 100*ProtectOutput)
)

// protectP99Allowance is the share of critical requests the p99 check lets exceed its bound.
const protectP99Allowance = 0.01

// ProtectFeasibility marks what the protect checks of a cell cannot pass by construction, whatever the gateway,
// with these figures:
//
//	crit demand  Feasibility.CritDemand. At 1 or more the critical requests alone fill every seat of the fleet,
//	             so on engines that schedule first come first served a critical request waits for a running
//	             one to finish however the others are refused: the critical p99 check becomes CheckInfeasible.
//	crit ok bound  with a backend going down in the spike (LostSeats), 1 - min(CritDemand, 1) * LostSeats /
//	             the subject's critical requests: in a full fleet critical requests hold their demand's share
//	             of every backend's seats, and the streams the backend drops have sent tokens already, so no
//	             gateway can retry them. Below ProtectCriticalOK in any run the success check becomes
//	             CheckInfeasible.
//	crit wait bound  the least share of critical requests that find no engine seat and wait past the critical
//	             p99's budget in a fleet delivering ProtectOutput of the no-shedding run's output (which runs
//	             every seat): while a seat is free the fleet delivers at most 1 - SeatShare of that, so it is
//	             full at least 1 - (1 - ProtectOutput) / SeatShare of the time, and Poisson arrivals see the
//	             time average. A request that finds the fleet full waits for a completion, which comes within
//	             the budget, (ProtectCriticalSpike - 1) times the unloaded critical p99, with probability at
//	             most budget * Completions (Markov's inequality on their count). When the bound exceeds the 1%
//	             the p99 lets exceed in every run, the two checks contradict each other: on one engine of 8
//	             seats (SeatShare 0.12, 2.8 completions/s, a 45 ms budget) at 90% output the fleet is full at
//	             least 18% of the time, and at least 15% of critical requests would wait past the budget. Of the
//	             two, the one that fails while the other passes becomes CheckInfeasible (the gateway held one;
//	             no gateway holds both); both failing stay failures. Fleets of 10 seats or more are never
//	             marked (the bound is 0).
//
// Only a failed check is marked; an infeasible one keeps its measured figure, and its detail says why and what
// it measured.
func ProtectFeasibility(j Judgement, c Checks, runs [][]*RunReport, f Feasibility) Judgement {
	j.Figures = append(j.Figures, Figure{Name: "crit demand", Range: Range{Min: f.CritDemand, Max: f.CritDemand, N: 1}})
	var okBound Range
	if f.LostSeats > 0 {
		for _, reps := range runs {
			if s := column(reps, c.Subject); s != nil {
				if cr := s.Priorities[c.Critical]; cr != nil && cr.Requests > 0 {
					okBound.add(max(1-min(f.CritDemand, 1)*f.LostSeats/float64(cr.Requests), 0))
				}
			}
		}
		j.Figures = append(j.Figures, Figure{Name: "crit ok bound", Range: okBound})
	}
	mark := func(name, why string) {
		for i, ch := range j.Checks {
			if ch.Name == name && ch.Status == CheckFail {
				j.Checks[i] = CheckResult{Name: name, Status: CheckInfeasible,
					Detail: fmt.Sprintf("%s (%s: %s)", why, ch.Status, ch.Detail)}
			}
		}
	}
	if f.CritDemand >= 1 {
		mark(checkCritSpike,
			fmt.Sprintf("critical demand %.0f%% of capacity", 100*f.CritDemand))
	}
	if okBound.N > 0 && okBound.Min < ProtectCriticalOK {
		mark(checkCritOK,
			fmt.Sprintf("at most %s: critical streams on the backend that went down", okBound))
	}
	if wait := waitBound(c, runs, f); wait.N > 0 {
		j.Figures = append(j.Figures, Figure{Name: "crit wait bound", Range: wait})
		if wait.Min > protectP99Allowance {
			st := map[string]string{}
			for _, ch := range j.Checks {
				st[ch.Name] = ch.Status
			}
			why := fmt.Sprintf("at %g%% output at least %s of critical requests wait past the p99's budget for a seat",
				100*ProtectOutput, wait)
			switch {
			case st[checkOutput] == CheckFail && st[checkCritSpike] == CheckPass:
				mark(checkOutput, why)
			case st[checkCritSpike] == CheckFail && st[checkOutput] == CheckPass:
				mark(checkCritSpike, why)
			}
		}
	}
	return j
}

// waitBound returns ProtectFeasibility's crit wait bound over the runs that have an unloaded critical p99.
func waitBound(c Checks, runs [][]*RunReport, f Feasibility) Range {
	var r Range
	if f.SeatShare <= 0 || f.Completions <= 0 {
		return r
	}
	full := max(1-(1-ProtectOutput)/f.SeatShare, 0)
	for _, reps := range runs {
		u := column(reps, c.Unloaded)
		if u == nil {
			continue
		}
		if uc := u.Priorities[c.Critical]; uc != nil && uc.TTFT.N > 0 {
			budget := (ProtectCriticalSpike - 1) * uc.TTFT.P99 / 1000 // seconds
			r.add(full * max(1-budget*f.Completions, 0))
		}
	}
	return r
}
