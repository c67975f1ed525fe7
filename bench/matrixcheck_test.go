package bench

import (
	"math"
	"strings"
	"testing"
)

func hit(x float64) *float64 { return &x }

// routingRun is one run's reports: round_robin and least_request baselines, adaptive, the oracle.
func routingRun(rr, lr, ad, adHit, orHit float64) []*RunReport {
	return []*RunReport{
		{Name: "round_robin", TTFT: Quantiles{P99: rr}, PrefixHitRate: hit(0.2)},
		{Name: "least_request", TTFT: Quantiles{P99: lr}, PrefixHitRate: hit(0.3)},
		{Name: "adaptive", TTFT: Quantiles{P99: ad}, PrefixHitRate: hit(adHit)},
		{Name: "oracle", TTFT: Quantiles{P99: 1}, PrefixHitRate: hit(orHit)},
	}
}

func statuses(j Judgement) map[string]string {
	m := map[string]string{}
	for _, c := range j.Checks {
		m[c.Name] = c.Status
	}
	return m
}

func figure(j Judgement, name string) Range {
	for _, f := range j.Figures {
		if f.Name == name {
			return f.Range
		}
	}
	return Range{}
}

func TestJudgeRouting(t *testing.T) {
	c := Checks{Kind: "routing", Subject: "adaptive", Oracle: "oracle"}
	const (
		best   = "p99 <= 1.05x best"
		each   = "p99 <= 0.8x each (mixed)"
		hitChk = "hit >= 0.9x oracle (shared)"
		spread = "hit spread <= 0.05"
	)
	for _, tc := range []struct {
		name          string
		runs          [][]*RunReport
		mixed, shared bool
		want          map[string]string
	}{
		{"wins everywhere", [][]*RunReport{routingRun(200, 100, 70, 0.80, 0.85), routingRun(210, 110, 75, 0.82, 0.85)},
			true, true, map[string]string{best: CheckPass, each: CheckPass, hitChk: CheckPass, spread: CheckPass}},
		{"one run 6% over the best", [][]*RunReport{routingRun(200, 100, 100, 0.8, 0.8), routingRun(200, 100, 106, 0.8, 0.8)},
			false, false, map[string]string{best: CheckFail, each: CheckNA, hitChk: CheckNA, spread: CheckPass}},
		{"within 5% but not 20% under each", [][]*RunReport{routingRun(200, 100, 90, 0.8, 0.8)},
			true, false, map[string]string{best: CheckPass, each: CheckFail, hitChk: CheckNA, spread: CheckNA}},
		{"hit far from the oracle, unstable", [][]*RunReport{routingRun(200, 100, 50, 0.57, 0.85), routingRun(200, 100, 50, 0.88, 0.85)},
			false, true, map[string]string{best: CheckPass, hitChk: CheckFail, spread: CheckFail}},
		{"oracle missing", [][]*RunReport{routingRun(200, 100, 50, 0.8, 0.8)[:3]},
			false, true, map[string]string{best: CheckPass, hitChk: CheckError}},
		{"a baseline did not run", [][]*RunReport{{{Name: "round_robin", Error: "not ready"},
			{Name: "least_request", TTFT: Quantiles{P99: 100}}, {Name: "adaptive", TTFT: Quantiles{P99: 50}}}},
			false, false, map[string]string{best: CheckError}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := Judge(c, tc.runs, tc.mixed, tc.shared)
			got := statuses(j)
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: %s, want %s (checks %+v, figures %+v)", k, got[k], v, j.Checks, j.Figures)
				}
			}
			if len(j.PerRun) != len(tc.runs) {
				t.Errorf("%d per-run figure sets for %d runs", len(j.PerRun), len(tc.runs))
			}
		})
	}
	j := Judge(c, [][]*RunReport{routingRun(200, 100, 70, 0.80, 0.80), routingRun(200, 140, 84, 0.72, 0.90)}, true, true)
	if r := figure(j, "p99/best"); r.String() != "0.6-0.7" || r.N != 2 {
		t.Errorf("p99/best %+v, want 0.6-0.7 (84/140 and 70/100: each run against its own best baseline)", r)
	}
	if r := figure(j, "p99/round_robin"); r.Min != 0.35 || r.Max != 0.42 {
		t.Errorf("p99/round_robin %+v", r)
	}
	if r := figure(j, "hit/oracle"); r.String() != "0.8-1.00" {
		t.Errorf("hit/oracle %+v", r)
	}
	if r := figure(j, "hit"); r.String() != "0.72-0.8" {
		t.Errorf("hit %q", r.String())
	}
}

// protectRun is one run: the subject with a spike report, the reference and the unloaded column.
func protectRun(critOK, critN int, spikeP99, unloadedP99, out, refOut, stdP99 float64) []*RunReport {
	crit := &ClassReport{Requests: critN, OK: critOK, TTFT: Quantiles{N: critOK, P99: spikeP99 / 2}}
	return []*RunReport{
		{Name: "shedding", OutputTPS: out, SLO: SLOms{TTFT: 1000},
			Priorities: map[string]*ClassReport{"critical": crit, "standard": {Requests: 50, OK: 20, TTFT: Quantiles{N: 20, P99: stdP99}}},
			Bursts: []BurstReport{{OutputTPS: out,
				Classes: map[string]*ClassReport{"critical": {Requests: 10, OK: 10, TTFT: Quantiles{N: 10, P99: spikeP99}}}}}},
		{Name: "no-shedding", OutputTPS: refOut, Bursts: []BurstReport{{OutputTPS: refOut}}},
		{Name: "unloaded", Priorities: map[string]*ClassReport{"critical": {Requests: 20, OK: 20, TTFT: Quantiles{N: 20, P99: unloadedP99}}}},
	}
}

func TestJudgeProtect(t *testing.T) {
	c := Checks{Kind: "protect", Subject: "shedding", Reference: "no-shedding", Unloaded: "unloaded", Critical: "critical", Standard: "standard"}
	const (
		ok    = "crit ok >= 99%"
		spike = "crit p99 <= 1.5x unloaded"
		out   = "out >= 90% ref"
		std   = "std p99 <= slo"
	)
	for _, tc := range []struct {
		name string
		runs [][]*RunReport
		want map[string]string
	}{
		{"holds", [][]*RunReport{protectRun(100, 100, 140, 100, 950, 1000, 900)},
			map[string]string{ok: CheckPass, spike: CheckPass, out: CheckPass, std: CheckPass}},
		// The whole run's critical p99 (spike/2) would pass; the spike's own fails: the checks read the spike.
		{"the spike's tail", [][]*RunReport{protectRun(100, 100, 330, 100, 950, 1000, 900)},
			map[string]string{spike: CheckFail}},
		{"lost critical, throttled, standard late", [][]*RunReport{protectRun(98, 100, 100, 100, 850, 1000, 1200)},
			map[string]string{ok: CheckFail, spike: CheckPass, out: CheckFail, std: CheckFail}},
		{"second run fails", [][]*RunReport{protectRun(100, 100, 100, 100, 950, 1000, 900), protectRun(100, 100, 160, 100, 950, 1000, 900)},
			map[string]string{spike: CheckFail}},
		{"no unloaded column", [][]*RunReport{protectRun(100, 100, 100, 100, 950, 1000, 900)[:2]},
			map[string]string{spike: CheckError, ok: CheckPass}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := Judge(c, tc.runs, false, false)
			got := statuses(j)
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: %s, want %s (checks %+v, figures %+v)", k, got[k], v, j.Checks, j.Figures)
				}
			}
		})
	}
	j := Judge(c, [][]*RunReport{protectRun(99, 100, 120, 100, 900, 1000, 500), protectRun(100, 100, 150, 100, 950, 1000, 700)}, false, false)
	if r := figure(j, "crit p99/unloaded"); r.String() != "1.20-1.50" {
		t.Errorf("crit p99/unloaded %+v", r)
	}
	if r := figure(j, "std p99/slo"); r.String() != "0.5-0.7" {
		t.Errorf("std p99/slo %q", r.String())
	}
	var b strings.Builder
	PrintMatrix(&b, &MatrixReport{Matrix: "p", Runs: 2, Checks: c, Cells: []*CellResult{
		{Name: "f/n1/w/2x", Rate: 5, Peak: 20, Capacity: Capacity{RequestsPS: 10}, Judgement: j},
		{Name: "f/n8/w/2x", Error: "bench: matrix: cell asks 900 requests/s"},
	}})
	for _, want := range []string{"| cell | req/s (capacity) | crit ok | crit p99/unloaded |", "| f/n1/w/2x | 5.00, peak 20.0 (10.0) | 0.99-1.00 | 1.20-1.50 |",
		"| pass | pass | pass |", "| f/n8/w/2x | not run: bench: matrix: cell asks 900"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
}

// TestProtectFeasibility: a cell whose critical demand alone reaches the fleet's capacity cannot hold its
// critical p99 on first-come-first-served engines; its check says so and keeps the measured figure.
func TestProtectFeasibility(t *testing.T) {
	c := Checks{Kind: "protect", Subject: "shedding", Reference: "no-shedding", Unloaded: "unloaded", Critical: "critical", Standard: "standard"}
	const spike = "crit p99 <= 1.5x unloaded"
	for _, tc := range []struct {
		name   string
		demand float64
		p99    float64
		want   string
	}{
		{"feasible, fails", 0.4, 330, CheckFail},
		{"feasible, holds", 0.4, 140, CheckPass},
		{"critical alone fills the fleet", 1.0, 330, CheckInfeasible},
		{"beyond the fleet, holds anyway", 1.2, 140, CheckPass},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := [][]*RunReport{protectRun(100, 100, tc.p99, 100, 950, 1000, 900)}
			j := ProtectFeasibility(Judge(c, runs, false, false), c, runs, Feasibility{CritDemand: tc.demand})
			if got := statuses(j)[spike]; got != tc.want {
				t.Errorf("%s: %s, want %s (%+v)", spike, got, tc.want, j.Checks)
			}
			if r := figure(j, "crit demand"); r.N != 1 || r.Min != tc.demand {
				t.Errorf("crit demand figure %+v, want %v", r, tc.demand)
			}
			if r := figure(j, "crit p99/unloaded"); r.N != 1 {
				t.Errorf("crit p99/unloaded %+v: the measured figure must stay", r)
			}
		})
	}
}

// TestProtectSmallFleet: on one engine of 8 seats (SeatShare 0.12, 2.76 completions/s, unloaded critical p99 90
// ms) 90% of the no-shedding run's output needs the fleet full at least 17% of the time, and the critical requests
// that find it so wait past the p99's 45 ms budget unless a completion comes within it (at most 12%): at least
// 15% of them would wait past it, against the 1% the p99 allows. The check that fails while the other holds is
// infeasible; both failing stay failures; a fleet of 64 seats is not judged so.
func TestProtectSmallFleet(t *testing.T) {
	c := Checks{Kind: "protect", Subject: "shedding", Reference: "no-shedding", Unloaded: "unloaded", Critical: "critical", Standard: "standard"}
	const (
		spike = "crit p99 <= 1.5x unloaded"
		out   = "out >= 90% ref"
	)
	for _, tc := range []struct {
		name               string
		share, p99, outTPS float64
		wantSpike, wantOut string
		bound              float64
	}{
		{"8 seats, critical held", 0.1214, 120, 690, CheckPass, CheckInfeasible, 0.1544},
		{"8 seats, output held", 0.1214, 400, 950, CheckInfeasible, CheckPass, 0.1544},
		{"8 seats, neither", 0.1214, 400, 690, CheckFail, CheckFail, 0.1544},
		{"64 seats", 1.0 / 64, 120, 690, CheckPass, CheckFail, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := [][]*RunReport{protectRun(100, 100, tc.p99, 90, tc.outTPS, 1000, 900)}
			f := Feasibility{CritDemand: 0.4, SeatShare: tc.share, Completions: 2.76}
			j := ProtectFeasibility(Judge(c, runs, false, false), c, runs, f)
			st := statuses(j)
			if st[spike] != tc.wantSpike || st[out] != tc.wantOut {
				t.Errorf("%s %s, %s %s; want %s, %s (%+v)", spike, st[spike], out, st[out], tc.wantSpike, tc.wantOut, j.Checks)
			}
			if r := figure(j, "crit wait bound"); r.N != 1 || math.Abs(r.Min-tc.bound) > 5e-4 {
				t.Errorf("crit wait bound %+v, want %v", r, tc.bound)
			}
		})
	}
}

// TestProtectOutputInTheSpike: out/ref compares the output the fleet delivered while the spike lasted, not over
// each column's whole window: a reference that serves its backlog after a 10 s spike delivers more over its
// longer window (the whole-window ratio 0.75 here) although shedding kept the fleet as busy in the spike.
func TestProtectOutputInTheSpike(t *testing.T) {
	c := Checks{Kind: "protect", Subject: "shedding", Reference: "no-shedding", Unloaded: "unloaded", Critical: "critical", Standard: "standard"}
	const out = "out >= 90% ref"
	for _, tc := range []struct {
		name                   string
		spike, refSpike, whole float64
		want                   string
	}{
		{"busy in the spike, less after it", 950, 1000, 0.75, CheckPass},
		{"idle seats in the spike", 800, 1000, 0.95, CheckFail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := [][]*RunReport{protectRun(100, 100, 140, 100, tc.spike, tc.refSpike, 900)}
			runs[0][0].OutputTPS, runs[0][1].OutputTPS = 750*tc.whole/0.75, 1000
			j := Judge(c, runs, false, false)
			if got := statuses(j)[out]; got != tc.want {
				t.Errorf("%s: %s, want %s (%+v)", out, got, tc.want, j.Checks)
			}
			if r := figure(j, "out/ref all"); r.N != 1 || math.Abs(r.Min-tc.whole) > 1e-9 {
				t.Errorf("out/ref all %+v, want %v", r, tc.whole)
			}
		})
	}
}

// TestProtectLostStreams: a 16-seat backend goes down in a spike whose critical demand is 40% of capacity: about
// 0.4 * 16 = 6.4 critical streams drop mid-answer; of 100 critical requests no gateway answers more than 93.6%.
func TestProtectLostStreams(t *testing.T) {
	c := Checks{Kind: "protect", Subject: "shedding", Reference: "no-shedding", Unloaded: "unloaded", Critical: "critical", Standard: "standard"}
	const ok = "crit ok >= 99%"
	for _, tc := range []struct {
		name string
		lost float64
		want string
	}{
		{"no backend down", 0, CheckFail},
		{"a 16-seat backend down", 16, CheckInfeasible},
	} {
		t.Run(tc.name, func(t *testing.T) {
			runs := [][]*RunReport{protectRun(94, 100, 140, 100, 950, 1000, 900)}
			j := ProtectFeasibility(Judge(c, runs, false, false), c, runs, Feasibility{CritDemand: 0.4, LostSeats: tc.lost})
			if got := statuses(j)[ok]; got != tc.want {
				t.Errorf("%s: %s, want %s (%+v)", ok, got, tc.want, j.Checks)
			}
			if r := figure(j, "crit ok bound"); tc.lost > 0 && (r.N != 1 || math.Abs(r.Min-0.936) > 1e-9) {
				t.Errorf("crit ok bound %+v, want 0.936", r)
			}
		})
	}
}

// TestJudgeRoutingReplicas: the replicas column is judged on its conversations' stay alone, never as a
// baseline, and only where the cell has conversations.
func TestJudgeRoutingReplicas(t *testing.T) {
	c := Checks{Kind: "routing", Subject: "adaptive", Oracle: "oracle", Replicas: "adaptive-replicas"}
	const stay = "stay/replicas >= 0.95 (conversations)"
	withReplicas := func(p99 float64, stay *float64) []*RunReport {
		return append(routingRun(200, 100, 90, 0.8, 0.8), &RunReport{Name: "adaptive-replicas", TTFT: Quantiles{P99: p99}, SessionStay: stay})
	}
	for _, tc := range []struct {
		name string
		runs [][]*RunReport
		want string
		min  float64
	}{
		{"stays", [][]*RunReport{withReplicas(50, hit(0.99)), withReplicas(50, hit(0.96))}, CheckPass, 0.96},
		{"moves in one run", [][]*RunReport{withReplicas(50, hit(0.99)), withReplicas(50, hit(0.9))}, CheckFail, 0.9},
		{"no conversations", [][]*RunReport{withReplicas(50, nil)}, CheckNA, 0},
		{"no replicas column", [][]*RunReport{routingRun(200, 100, 90, 0.8, 0.8)}, CheckNA, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := Judge(c, tc.runs, false, false)
			if got := statuses(j)[stay]; got != tc.want {
				t.Errorf("%s = %q, want %q (%+v)", stay, got, tc.want, j.Checks)
			}
			if r := figure(j, "stay/replicas"); r.Min != tc.min {
				t.Errorf("stay/replicas %+v, want min %v", r, tc.min)
			}
			// A replicas column of p99 50 ms would be the best baseline: 90 / 50 = 1.8x.
			if r := figure(j, "p99/best"); r.Max != 0.9 {
				t.Errorf("p99/best %+v: the replicas column counted as a baseline", r)
			}
			if r := figure(j, "p99/adaptive-replicas"); r.N != 0 {
				t.Errorf("p99/adaptive-replicas %+v: not a baseline", r)
			}
		})
	}
	if _, ok := statuses(Judge(Checks{Kind: "routing", Subject: "adaptive", Oracle: "oracle"},
		[][]*RunReport{withReplicas(50, hit(0.5))}, false, false))[stay]; ok {
		t.Error("a stay check without checks.replicas")
	}
}
