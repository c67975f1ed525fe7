package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A one-cell, one-run matrix through real child processes (the test binary as "switchyard sim -fleet" and as
// the fake gateway of compare_test.go): the cell's fleet is replicated, its rate follows from its capacity,
// every column runs (the oracle against the simulators' real /sim/predict), and matrix.json and matrix.md hold
// the judged cell.
func TestMatrixEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes for a few seconds")
	}
	rep, out, log := runTestMatrix(t, map[string]string{
		"fleet.yaml": "- {name: sim-x, region: here, prefill_tps: 50000, itl: 5ms, overhead: 1ms, max_num_seqs: 4, seed: 1}\n",
		"wl.yaml": `
arrival: {process: fixed, rate: 1}
warmup: 500ms
duration: 2s
prompt: {dist: fixed, value: 40}
output: {dist: fixed, value: 8}
prefix: {groups: 2, tokens: 128}
`,
		"m.yaml": `
checks: {kind: routing}
runs: 1
fleets: [{file: fleet.yaml}]
sizes: [{n: 2}]
workloads: [{file: wl.yaml}]
loads: [{name: light, load: 0.05}]
columns: [{strategy: round_robin}, {strategy: adaptive}, {strategy: oracle}]
`})
	if len(rep.Cells) != 1 {
		t.Fatalf("%d cells", len(rep.Cells))
	}
	c := rep.Cells[0]
	if c.Error != "" || c.Name != "fleet/n2/wl/light" || c.Backends != 2 || len(c.RunColumns) != 1 || len(c.RunColumns[0]) != 3 {
		t.Fatalf("cell %+v\n%s", c, log.String())
	}
	// 0.05 of two backends' capacity: the sent rate is the computed one, not the workload's 1/s.
	if c.Rate <= 0 || c.Rate != 0.05*c.Capacity.RequestsPS || len(c.Capacity.PerBackend) != 2 {
		t.Errorf("rate %v, capacity %+v", c.Rate, c.Capacity)
	}
	for _, col := range c.RunColumns[0] {
		// The fake gateway spreads; the oracle may keep every request where the prefix is cached.
		if col.Error != "" || col.OK != col.Requests || col.Requests < 10 || (col.Name != "oracle" && len(col.Backends) != 2) {
			t.Errorf("%s: error %q, %d of %d ok, backends %v\n%s", col.Name, col.Error, col.OK, col.Requests, col.Backends, log.String())
		}
	}
	// The oracle asked the real simulators' /sim/predict before each request and sent it to one of them.
	if o := c.RunColumns[0][2]; o.Pick == nil || o.Pick.N != o.Requests || o.PrefixHitRate == nil {
		t.Errorf("oracle: pick %+v, hit rate %v", o.Pick, o.PrefixHitRate)
	}
	st := statuses(c.Judgement)
	if r := figure(c.Judgement, "p99/best"); r.N != 1 || r.Min <= 0 {
		t.Errorf("p99/best %+v", r)
	}
	if s := st["p99 <= 1.05x best"]; s != CheckPass && s != CheckFail {
		t.Errorf("p99 check %q", s)
	}
	if r := figure(c.Judgement, "hit/oracle"); r.N != 1 || r.Min <= 0 {
		t.Errorf("hit/oracle %+v", r)
	}
	if s := st["hit >= 0.9x oracle (shared)"]; s != CheckPass && s != CheckFail {
		t.Errorf("hit check on a shared-prefix cell: %q", s)
	}
	if st["p99 <= 0.8x each (mixed)"] != CheckNA || st["hit spread <= 0.05"] != CheckNA {
		t.Errorf("checks that do not apply to one homogeneous run: %+v", c.Checks)
	}
	var doc MatrixReport
	data, err := os.ReadFile(filepath.Join(out, "matrix.json"))
	if err == nil {
		err = json.Unmarshal(data, &doc)
	}
	if err != nil || len(doc.Cells) != 1 || len(doc.Cells[0].PerRun) != 1 || doc.ElapsedS <= 0 {
		t.Errorf("matrix.json: %v, %+v", err, doc)
	}
	md, err := os.ReadFile(filepath.Join(out, "matrix.md"))
	if err != nil || !strings.Contains(string(md), "| fleet/n2/wl/light |") {
		t.Errorf("matrix.md: %v\n%s", err, md)
	}
	for _, f := range []string{"fleet.yaml", "scenario.yaml", "run1/report.json"} {
		if _, err := os.Stat(filepath.Join(cellDir(out, c.Name), f)); err != nil {
			t.Errorf("cell file: %v", err)
		}
	}
}

// TestMatrixReplicasEndToEnd: a column of two gateway replicas (the test binary's fake gateway) shares a
// redis-server the bench starts for it, each replica serves part of the load, and the cell is judged on its
// conversations' stay, the replicas column apart from the baselines.
func TestMatrixReplicasEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes for a few seconds")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server is not installed: run the tests with ./scripts/test, which installs it")
	}
	rep, out, log := runTestMatrix(t, map[string]string{
		"fleet.yaml": "- {name: sim-x, region: here, prefill_tps: 50000, itl: 5ms, overhead: 1ms, max_num_seqs: 4, seed: 1}\n",
		"talk.yaml": `
arrival: {process: poisson, rate: 4}
warmup: 500ms
duration: 3s
prompt: {dist: fixed, value: 40}
output: {dist: fixed, value: 8}
prefix: {groups: 2, tokens: 128}
sessions: {share: 1, users: 4, turns: {dist: fixed, value: 4}}
`,
		"m.yaml": `
checks: {kind: routing, replicas: two}
runs: 1
fleets: [{file: fleet.yaml}]
sizes: [{n: 2}]
workloads: [{file: talk.yaml}]
loads: [{name: light, load: 0.1}]
columns: [{strategy: adaptive}, {strategy: oracle}, {name: two, strategy: adaptive, replicas: 2, workloads: [talk]}]
`})
	c := rep.Cells[0]
	if c.Error != "" || len(c.RunColumns) != 1 || len(c.RunColumns[0]) != 3 {
		t.Fatalf("cell %+v\n%s", c, log.String())
	}
	two := c.RunColumns[0][2]
	if two.Name != "two" || two.Error != "" || two.OK != two.Requests || two.Requests < 8 || two.SessionStay == nil {
		t.Fatalf("replicas column %+v\n%s", two, log.String())
	}
	// Each replica found the shared redis-server and served part of the load.
	work := filepath.Join(out, "cells", "fleet_n2_talk_light", "run1", "work")
	served := 0
	for r := range 2 {
		data, err := os.ReadFile(filepath.Join(work, fmt.Sprintf("02-two-r%d-gateway.log", r)))
		if err != nil {
			t.Fatal(err)
		}
		n := strings.Count(string(data), "fake gateway: served")
		if !strings.Contains(string(data), "fake gateway: redis answers") || n == 0 {
			t.Errorf("replica %d: served %d, log:\n%s", r, n, data)
		}
		served += n
	}
	if served < two.Requests {
		t.Errorf("the replicas served %d requests of %d", served, two.Requests)
	}
	if r := figure(c.Judgement, "stay/replicas"); r.N != 1 || r.Min != *two.SessionStay {
		t.Errorf("stay/replicas %+v, want the column's %v", r, *two.SessionStay)
	}
	if s := statuses(c.Judgement)["stay/replicas >= 0.95 (conversations)"]; s != CheckPass && s != CheckFail {
		t.Errorf("stay check %q", s)
	}
	if r := figure(c.Judgement, "p99/two"); r.N != 0 {
		t.Errorf("the replicas column judged as a baseline: %+v", r)
	}
}

// runTestMatrix writes files (m.yaml the matrix) to a temporary directory and runs the matrix with the test
// binary as the simulator and the fake gateway (compare_test.go); it returns the report, the output directory and
// the harness's log.
func runTestMatrix(t *testing.T, files map[string]string) (*MatrixReport, string, *strings.Builder) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(helperEnv, "1")
	dir := writeFiles(t, files)
	m, err := LoadMatrix(filepath.Join(dir, "m.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	var log strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	rep, err := RunMatrix(ctx, "test", MatrixOptions{Env: Env{Exe: exe, Log: &log, Timeout: 10 * time.Second,
		Ready: 20 * time.Second}, Matrix: m, Out: out})
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	return rep, out, &log
}
