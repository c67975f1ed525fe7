package bench

import (
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/sim"
)

// writeFiles writes name -> text into a new temporary directory and returns it.
func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

const (
	testFleetMixed = `
- {name: fast, region: here, prefill_tps: 20000, itl: 10ms, itl_per_seq: 0.1ms, max_num_seqs: 32, kv_blocks: 4096, seed: 3}
- {name: slow, region: here, prefill_tps: 5000, itl: 30ms, itl_per_seq: 0.2ms, max_num_seqs: 8, kv_blocks: 1024, seed: 3}
`
	testFleetSame = `
- {name: a, region: here, prefill_tps: 10000, itl: 20ms, max_num_seqs: 16}
- {name: b, region: there, prefill_tps: 10000, itl: 20ms, max_num_seqs: 16, seed: 9}
`
	testWL = `
arrival: {process: fixed, rate: 10}
warmup: 1s
duration: 4s
prompt: {dist: fixed, value: 200}
output: {dist: fixed, value: 50}
`
)

func TestMatrixCells(t *testing.T) {
	dir := writeFiles(t, map[string]string{"m.yaml": `
checks: {kind: protect}
fleets: [{file: f1.yaml}, {name: other, file: f2.yaml}]
sizes: [{n: 1}, {n: 4}]
seats: [8, 64]
workloads: [{file: w.yaml}]
loads: [{load: 0.5, spike: 2, for: 10s}, {name: long, load: 0.5, spike: 3, for: 60s}]
events: [{name: steady}, {name: down, backend: 0, at_spike: 0.5, control: {down: true}}]
exclude:
  - {fleet: other, size: "!4"}     # other fleet only at 4 backends
  - {size: 4, seats: 64}
  - {event: down, load: "!long"}
  - {event: down, fleet: other}
columns: [{name: shedding, strategy: adaptive}, {name: no-shedding, strategy: adaptive}, {name: unloaded, strategy: adaptive, no_bursts: true}]
`})
	m, err := LoadMatrix(filepath.Join(dir, "m.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range m.Cells(nil) {
		names = append(names, c.Name)
	}
	want := []string{
		"f1/n1/s8/w/2x-10s/steady", "f1/n1/s8/w/long/steady", "f1/n1/s8/w/long/down",
		"f1/n1/s64/w/2x-10s/steady", "f1/n1/s64/w/long/steady", "f1/n1/s64/w/long/down",
		"f1/n4/s8/w/2x-10s/steady", "f1/n4/s8/w/long/steady", "f1/n4/s8/w/long/down",
		"other/n4/s8/w/2x-10s/steady", "other/n4/s8/w/long/steady",
	}
	if !slices.Equal(names, want) {
		t.Errorf("cells\n%s\nwant\n%s", strings.Join(names, "\n"), strings.Join(want, "\n"))
	}
	got := m.Cells(regexp.MustCompile(`/n4/.*steady`))
	if len(got) != 4 || got[0].Size.N != 4 || got[0].Seats != 8 || got[0].Event.Name != "steady" {
		t.Errorf("filtered cells %+v", got)
	}
	if m.Checks.Subject != "shedding" || m.Checks.Reference != "no-shedding" || m.Runs != 3 || m.MaxRate != defaultMaxRate {
		t.Errorf("defaults: checks %+v runs %d max_rate %v", m.Checks, m.Runs, m.MaxRate)
	}
	if est := m.Estimate(m.Cells(nil), 1, 0); est <= 0 {
		t.Errorf("estimate %v", est)
	}
}

func TestLoadMatrixErrors(t *testing.T) {
	for _, tc := range []struct{ name, text, want string }{
		{"unknown check set", "checks: {kind: speed}\n", "m.yaml:1: checks.kind: unknown check set"},
		{"subject missing", "checks: {kind: routing}\ncolumns: [{strategy: round_robin}]\n", `no column named "adaptive"`},
		{"unknown axis", "checks: {kind: routing}\nexclude: [{colour: red}]\n", "unknown axis"},
		{"unknown key", "checks: {kind: routing}\nfleet: x\n", "fleet"},
		{"spike without length", "checks: {kind: routing}\nloads: [{load: 0.5, spike: 2}]\n", "a spike needs"},
		{"replicas column missing", "checks: {kind: routing, replicas: two}\ncolumns: [{strategy: adaptive}]\n",
			`checks.replicas: no column named "two"`},
		{"column of an unknown workload", "checks: {kind: routing}\nworkloads: [{file: chat.yaml}]\n" +
			"columns: [{strategy: adaptive, workloads: [chats]}]\n", `columns[0].workloads[0]: no workload named "chats"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := writeFiles(t, map[string]string{"m.yaml": tc.text})
			_, err := LoadMatrix(filepath.Join(dir, "m.yaml"))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestReplicateFleet(t *testing.T) {
	dir := writeFiles(t, map[string]string{"f.yaml": testFleetMixed + `- {name: mid, prefill_tps: 8000, itl: 25ms, cost: {input: 1, output: 2}}
- {name: last, itl: 40ms}
`})
	src := filepath.Join(dir, "f.yaml")
	for _, tc := range []struct {
		n    int
		want []string
	}{
		{1, []string{"fast"}},
		{2, []string{"fast", "mid"}},
		{4, []string{"fast", "slow", "mid", "last"}},
		{9, []string{"fast", "slow", "mid", "last", "fast-r1", "slow-r1", "mid-r1", "last-r1", "fast-r2"}},
	} {
		dst := filepath.Join(dir, "out.yaml")
		names, err := ReplicateFleet(src, dst, tc.n, map[string]any{"max_num_seqs": 4})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(names, tc.want) {
			t.Errorf("n=%d: %v, want %v", tc.n, names, tc.want)
		}
		data, _ := os.ReadFile(dst)
		cfgs, err := sim.ParseFleet(dst, data)
		if err != nil {
			t.Fatalf("n=%d: the simulator refuses the replicated fleet: %v\n%s", tc.n, err, data)
		}
		for i, c := range cfgs {
			if c.MaxNumSeqs != 4 || c.Name != tc.want[i] {
				t.Errorf("n=%d entry %d: %s with %d seats", tc.n, i, c.Name, c.MaxNumSeqs)
			}
		}
		if tc.n == 9 {
			// Copies keep the physics and get their own seeds: fast 3, fast-r1 4, fast-r2 5; last (no seed) 1, 2.
			if cfgs[0].Seed != 3 || cfgs[4].Seed != 4 || cfgs[8].Seed != 5 || cfgs[3].Seed != 1 || cfgs[7].Seed != 2 {
				t.Errorf("seeds %d %d %d %d %d", cfgs[0].Seed, cfgs[4].Seed, cfgs[8].Seed, cfgs[3].Seed, cfgs[7].Seed)
			}
			if cfgs[4].ITL != cfgs[0].ITL || cfgs[5].PrefillTPS != cfgs[1].PrefillTPS {
				t.Errorf("a copy's physics differ from its original")
			}
			if !strings.Contains(string(data), "cost") {
				t.Errorf("the gateway's keys were dropped:\n%s", data)
			}
		}
	}
	if _, err := ReplicateFleet(src, filepath.Join(dir, "x.yaml"), 0, nil); err == nil {
		t.Error("n=0 accepted")
	}
}

// TestRunScenario: with vary_seed a cell's runs are as many schedules (its seed, then one more each run),
// without it one schedule repeated; the cell's own scenario is never changed.
func TestRunScenario(t *testing.T) {
	dir := writeFiles(t, map[string]string{"m.yaml": `
checks: {kind: protect}
vary_seed: true
fleets: [{file: f.yaml}]
sizes: [{n: 1}]
workloads: [{file: w.yaml}]
loads: [{load: 0.5, spike: 2, for: 10s}]
columns: [{name: shedding, strategy: adaptive}, {name: no-shedding, strategy: adaptive}, {name: unloaded, strategy: adaptive}]
`, "r.yaml": `
checks: {kind: routing}
vary_seed: true
fleets: [{file: f.yaml}]
sizes: [{n: 1}]
workloads: [{file: w.yaml}]
loads: [{load: 0.5}]
columns: [{strategy: round_robin}, {strategy: adaptive}]
`})
	if _, err := LoadMatrix(filepath.Join(dir, "r.yaml")); err == nil || !strings.Contains(err.Error(), "r.yaml:3: vary_seed") {
		t.Errorf("vary_seed with the routing checks: %v, want r.yaml:3 refused", err)
	}
	m, err := LoadMatrix(filepath.Join(dir, "m.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if !m.VarySeed {
		t.Fatal("vary_seed not read")
	}
	sc := &Scenario{Name: "c", Seed: 7}
	for r, want := range []uint64{7, 8, 9} {
		if got := m.RunScenario(sc, r); got.Seed != want || got.Name != "c" {
			t.Errorf("run %d: seed %d (%q), want %d", r, got.Seed, got.Name, want)
		}
	}
	if sc.Seed != 7 {
		t.Errorf("the cell's scenario changed: seed %d", sc.Seed)
	}
	m.VarySeed = false
	if got := m.RunScenario(sc, 2); got != sc {
		t.Errorf("without vary_seed run 2 has seed %d, want the cell's scenario itself", got.Seed)
	}
}

// The capacity is the step model's saturation rate: checked here by running the model's own definition (a
// saturated engine's steps until it has finished many requests) instead of restating the closed form.
func TestFleetCapacity(t *testing.T) {
	dir := writeFiles(t, map[string]string{"f.yaml": testFleetMixed, "w.yaml": testWL})
	w, err := LoadWorkload(filepath.Join(dir, "w.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	c, err := FleetCapacity(filepath.Join(dir, "f.yaml"), w)
	if err != nil {
		t.Fatal(err)
	}
	if c.PromptTokens < 200 || c.OutputTokens != 50 || len(c.PerBackend) != 2 {
		t.Fatalf("capacity %+v", c)
	}
	data, _ := os.ReadFile(filepath.Join(dir, "f.yaml"))
	cfgs, _ := sim.ParseFleet("f.yaml", data)
	var sum float64
	for i, cfg := range cfgs {
		got := c.PerBackend[i]
		want := simulateSaturated(cfg, int(c.PromptTokens), int(c.OutputTokens))
		if got < 0.97*want || got > 1.03*want {
			t.Errorf("%s: capacity %.3f req/s, a saturated engine's steps finish %.3f", cfg.Name, got, want)
		}
		sum += got
	}
	if c.RequestsPS != sum || c.OutputTPS != sum*c.OutputTokens {
		t.Errorf("totals %+v, sum %v", c, sum)
	}
	// One sequence fewer costs the fleet least on "slow" (8 seats at 30 ms + 0.2 ms a sequence against fast's 32 at
	// 10 + 0.1), and a little less than 1/8 of that backend's tokens, since its step shortens too.
	if want := (8/31.4 - 7/31.2) / (32/13.1 + 8/31.4); math.Abs(c.SeatShare-want) > 1e-9 {
		t.Errorf("seat share %v, want %v", c.SeatShare, want)
	}
	two := writeFiles(t, map[string]string{"f.yaml": `
- {name: a, region: here, prefill_tps: 10000, itl: 20ms, itl_per_seq: 1ms, max_num_seqs: 4}
- {name: b, region: here, prefill_tps: 10000, itl: 20ms, itl_per_seq: 1ms, max_num_seqs: 4}
`})
	if sc, err := FleetCapacity(filepath.Join(two, "f.yaml"), w); err != nil || math.Abs(sc.SeatShare-(4.0/23-3.0/22)/(8.0/23)) > 1e-12 {
		t.Errorf("two 4-seat backends: seat share %v (%v), want %v", sc.SeatShare, err, (4.0/23-3.0/22)/(8.0/23))
	}
	// The KV cache binds before the seats: 1024 blocks hold 16384 tokens, 65 sequences of 250; 8 seats bind first
	// on "slow"; with prompts of 4000 tokens only 4 sequences fit and the rate drops below the seats' bound.
	long := *w
	long.Prompt = Fixed(4000)
	lc, err := FleetCapacity(filepath.Join(dir, "f.yaml"), &long)
	if err != nil {
		t.Fatal(err)
	}
	if want := simulateSaturated(cfgs[1], 4000, 50); lc.PerBackend[1] < 0.97*want || lc.PerBackend[1] > 1.03*want {
		t.Errorf("slow with long prompts: %.3f, steps give %.3f", lc.PerBackend[1], want)
	}
}

// simulateSaturated steps an engine that always holds as many sequences as its seats and KV cache allow, each
// prefilled whole in the step it is admitted, and returns the requests finished per second.
func simulateSaturated(cfg sim.Config, prompt, output int) float64 {
	seats := min(cfg.MaxNumSeqs, cfg.KVBlocks*sim.BlockTokens/(prompt+output))
	left := make([]int, 0, seats) // decode tokens left per running sequence; -1 = to prefill
	var t time.Duration
	done := 0
	for done < 2000 {
		for len(left) < seats {
			left = append(left, -1)
		}
		prefill, decoders := 0, 0
		for _, l := range left {
			if l < 0 {
				prefill += prompt
			} else {
				decoders++
			}
		}
		d := float64(prefill) / cfg.PrefillTPS * float64(time.Second)
		if decoders > 0 {
			d += float64(cfg.ITL) + float64(cfg.ITLPerSeq)*float64(decoders-1)
		}
		t += time.Duration(d)
		next := left[:0]
		for _, l := range left {
			switch {
			case l < 0:
				l = output - 1 // the prefill step makes the first token
			default:
				l--
			}
			if l <= 0 {
				done++
				continue
			}
			next = append(next, l)
		}
		left = next
	}
	return float64(done) / t.Seconds()
}

func TestPrepare(t *testing.T) {
	dir := writeFiles(t, map[string]string{"mixed.yaml": testFleetMixed, "same.yaml": testFleetSame, "w.yaml": testWL,
		"m.yaml": `
checks: {kind: protect}
warmup: 2s
timeout: 20s
max_rate: 1000
fleets: [{file: mixed.yaml}, {file: same.yaml}]
sizes: [{n: 3}]
workloads: [{file: w.yaml}]
loads: [{name: spike, load: 0.5, spike: 4, for: 10s}]
events: [{name: steady}, {name: down, backend: 1, at_spike: 0.5, control: {down: true}}]
columns: [{name: shedding, strategy: adaptive}, {name: no-shedding, strategy: adaptive}, {name: unloaded, strategy: adaptive, no_bursts: true}]
`})
	m, err := LoadMatrix(filepath.Join(dir, "m.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cells := m.Cells(nil)
	if len(cells) != 4 {
		t.Fatalf("%d cells", len(cells))
	}
	p, err := m.Prepare(cells[1], filepath.Join(dir, "c1"))
	if err != nil {
		t.Fatal(err)
	}
	if !p.Mixed || p.SharedPrefix || len(p.Backends) != 3 {
		t.Errorf("mixed %v shared %v backends %v", p.Mixed, p.SharedPrefix, p.Backends)
	}
	sc := p.Scenario
	if sc.Rate != 0.5*p.Capacity.RequestsPS || p.Peak != 4*p.Capacity.RequestsPS || p.Capacity.RequestsPS <= 0 {
		t.Errorf("rate %v peak %v capacity %v", sc.Rate, p.Peak, p.Capacity.RequestsPS)
	}
	wantBurst := Burst{At: 4 * time.Second, Duration: 10 * time.Second, Multiplier: 8}
	if len(sc.Bursts) != 1 || sc.Bursts[0] != wantBurst || sc.Warmup != 2*time.Second || sc.Duration != 17*time.Second {
		t.Errorf("bursts %+v warmup %v duration %v", sc.Bursts, sc.Warmup, sc.Duration)
	}
	if len(sc.Events) != 1 || sc.Events[0].Backend != p.Backends[1] || sc.Events[0].At != 9*time.Second ||
		sc.Events[0].Control["down"] != true {
		t.Errorf("events %+v", sc.Events)
	}
	if len(sc.Columns) != 3 || !sc.Columns[2].NoBursts || sc.Timeout != 20*time.Second {
		t.Errorf("columns %+v timeout %v", sc.Columns, sc.Timeout)
	}
	same, err := m.Prepare(cells[2], filepath.Join(dir, "c2"))
	if err != nil {
		t.Fatal(err)
	}
	if same.Mixed || len(same.Scenario.Events) != 0 {
		t.Errorf("same fleet: mixed %v (region and seed are not physics), events %v", same.Mixed, same.Scenario.Events)
	}
	m.MaxRate = p.Peak / 2
	if _, err := m.Prepare(cells[1], filepath.Join(dir, "c3")); err == nil || !strings.Contains(err.Error(), "max_rate") {
		t.Errorf("over max_rate: %v", err)
	}
}

// A 64-backend fleet gets 64 distinct ports (one FreePort per backend could hand one out twice).
func TestPrepareFleetDistinctPorts(t *testing.T) {
	dir := writeFiles(t, map[string]string{"f.yaml": testFleetSame})
	big := filepath.Join(dir, "big.yaml")
	if _, err := ReplicateFleet(filepath.Join(dir, "f.yaml"), big, 64, nil); err != nil {
		t.Fatal(err)
	}
	backends, err := PrepareFleet(big, filepath.Join(dir, "ready.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, b := range backends {
		if seen[b.URL] {
			t.Fatalf("%s twice", b.URL)
		}
		seen[b.URL] = true
	}
	if len(seen) != 64 {
		t.Errorf("%d backends", len(seen))
	}
}

// A fleet made f times slower keeps its seats and mix and saturates at 1/f of the rate.
func TestSlowFleet(t *testing.T) {
	dir := writeFiles(t, map[string]string{"f.yaml": testFleetMixed + "- {name: defaults}\n", "w.yaml": testWL})
	src := filepath.Join(dir, "f.yaml")
	slow := filepath.Join(dir, "slow.yaml")
	if _, err := ReplicateFleet(src, slow, 3, nil); err != nil {
		t.Fatal(err)
	}
	if err := SlowFleet(slow, 4); err != nil {
		t.Fatal(err)
	}
	read := func(path string) []sim.Config {
		data, _ := os.ReadFile(path)
		cfgs, err := sim.ParseFleet(path, data)
		if err != nil {
			t.Fatal(err)
		}
		return cfgs
	}
	before, after := read(src), read(slow)
	for i, b := range before {
		a := after[i]
		if a.ITL != 4*b.ITL || a.ITLPerSeq != 4*b.ITLPerSeq || a.Overhead != 4*b.Overhead || a.PrefillTPS != b.PrefillTPS/4 ||
			a.MaxNumSeqs != b.MaxNumSeqs || a.KVBlocks != b.KVBlocks {
			t.Errorf("%s: %+v from %+v", b.Name, a, b)
		}
	}
	w, err := LoadWorkload(filepath.Join(dir, "w.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cb, _ := FleetCapacity(src, w)
	ca, err := FleetCapacity(slow, w)
	if err != nil {
		t.Fatal(err)
	}
	if r := ca.RequestsPS / cb.RequestsPS; r < 0.2499 || r > 0.2501 {
		t.Errorf("capacity %v -> %v, ratio %v, want 1/4", cb.RequestsPS, ca.RequestsPS, r)
	}
	if mixed, _ := mixedFleet(slow); !mixed {
		t.Error("the slowed fleet is no longer mixed")
	}
}

// TestCapacityFollowsThePhysics: the KV bound counts the backend's own block size (one token under the sglang
// preset, not vLLM's 16), and fixed seats serve their prefills side by side rather than in the engine's steps.
func TestCapacityFollowsThePhysics(t *testing.T) {
	cfg := sim.DefaultConfig()
	if err := cfg.SetPhysics(sim.PhysicsSGLang); err != nil {
		t.Fatal(err)
	}
	cfg.MaxNumSeqs, cfg.KVBlocks = 64, 2000 // 2,000 one-token blocks: 8 sequences of 250 tokens
	s := 8.0
	d := cfg.DecodeInterval(8).Seconds()
	if got, want := backendRate(cfg, 200, 50), s/(50*d+s*200/cfg.PrefillTPS); math.Abs(got-want) > 1e-9*want {
		t.Errorf("sglang, KV-bound: %.4f req/s, want %.4f (8 sequences fit)", got, want)
	}
	seats := sim.DefaultConfig()
	seats.Batching, seats.MaxNumSeqs, seats.LoadFactor = sim.BatchSeats, 8, 2
	d = seats.DecodeInterval(8).Seconds()
	f := d / seats.ITL.Seconds()
	if got, want := backendRate(seats, 1000, 50), 8/(1000/seats.PrefillTPS*f+50*d); math.Abs(got-want) > 1e-9*want {
		t.Errorf("seats: %.4f req/s, want %.4f (each seat prefills beside the others)", got, want)
	}
}

// TestSeatsFromAxis: seats_from names its cells, and its policy value makes the generated gateway config state
// each backend's own seats (the seats axis's, else the fleet entry's, else the simulator's default), engine runs
// the simulators in SGLang's dialect and names the backends' engine sglang, while discover leaves the gateway to
// learn them.
func TestSeatsFromAxis(t *testing.T) {
	dir := writeFiles(t, map[string]string{"f.yaml": testFleetMixed + "- {name: plain, gateway: {max_concurrency: 7}}\n",
		"w.yaml": testWL, "m.yaml": `
checks: {kind: protect}
max_rate: 1000
fleets: [{file: f.yaml}]
sizes: [{n: 3}]
seats_from: [policy, engine, discover]
workloads: [{file: w.yaml}]
loads: [{load: 0.5, spike: 2, for: 2s}]
exclude: [{seats_from: discover, size: "!3"}]
columns: [{name: shedding, strategy: adaptive}, {name: no-shedding, strategy: adaptive}, {name: unloaded, strategy: adaptive, no_bursts: true}]
`})
	m, err := LoadMatrix(filepath.Join(dir, "m.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cells := m.Cells(nil)
	if len(cells) != 3 || cells[0].Name != "f/n3/seats-policy/w/2x-2s" || cells[1].Name != "f/n3/seats-engine/w/2x-2s" ||
		cells[2].Name != "f/n3/seats-discover/w/2x-2s" {
		t.Fatalf("cells %+v", cells)
	}
	want := map[string][]any{"seats-policy": {32, 8, sim.DefaultConfig().MaxNumSeqs}, "seats-engine": {nil, nil, nil},
		"seats-discover": {nil, nil, nil}}
	for _, c := range cells {
		out := filepath.Join(dir, "out", c.Axes["seats_from"])
		if _, err := m.Prepare(c, out); err != nil {
			t.Fatal(err)
		}
		bes, err := PrepareFleet(filepath.Join(out, "fleet.yaml"), filepath.Join(out, "fleet.run.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		w := want["seats-"+c.Axes["seats_from"]]
		for i, b := range bes {
			if got := b.Gateway["max_num_seqs"]; got != w[i] {
				t.Errorf("%s: backend %s states %v seats, want %v", c.Name, b.Name, got, w[i])
			}
		}
		if got := bes[2].Gateway["max_concurrency"]; got != 7 {
			t.Errorf("%s: the entry's own gateway settings are lost: %v", c.Name, bes[2].Gateway)
		}
		cfgs, err := sim.LoadFleet(filepath.Join(out, "fleet.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		for i, b := range bes {
			engine, dialect := b.Gateway["engine"], cfgs[i].Dialect
			if c.Axes["seats_from"] == "engine" {
				if engine != "sglang" || dialect != sim.DialectSGLang {
					t.Errorf("%s: backend %s engine %v, simulator dialect %q; want sglang for both", c.Name, b.Name, engine, dialect)
				}
			} else if engine != nil || (dialect != "" && dialect != sim.DialectVLLM) {
				t.Errorf("%s: backend %s engine %v, simulator dialect %q; want vLLM's", c.Name, b.Name, engine, dialect)
			}
		}
	}
	dir = writeFiles(t, map[string]string{"m.yaml": "checks: {kind: protect}\nseats_from: [guess]\n"})
	if _, err := LoadMatrix(filepath.Join(dir, "m.yaml")); err == nil || !strings.Contains(err.Error(), "seats_from is policy, engine or discover") {
		t.Errorf("seats_from guess: %v", err)
	}
}

// TestColumnsOfAWorkload: a column that names workloads runs in their cells alone, and the scenario it becomes
// carries no list.
func TestColumnsOfAWorkload(t *testing.T) {
	dir := writeFiles(t, map[string]string{"same.yaml": testFleetSame, "w.yaml": testWL, "talk.yaml": testWL,
		"m.yaml": `
checks: {kind: routing, replicas: adaptive-replicas}
fleets: [{file: same.yaml}]
sizes: [{n: 2}]
workloads: [{file: w.yaml}, {file: talk.yaml}]
loads: [{name: light, load: 0.2}]
columns: [{strategy: round_robin}, {strategy: adaptive}, {name: adaptive-replicas, strategy: adaptive, replicas: 2, workloads: [talk]}]
`})
	m, err := LoadMatrix(filepath.Join(dir, "m.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range m.Cells(nil) {
		p, err := m.Prepare(c, filepath.Join(dir, strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, col := range p.Scenario.Columns {
			names = append(names, col.Name)
			if len(col.Workloads) != 0 {
				t.Errorf("%s: column %s keeps its workloads list in the scenario", c.Name, col.Name)
			}
		}
		want := "round_robin adaptive"
		if c.Workload.Name == "talk" {
			want += " adaptive-replicas"
		}
		if got := strings.Join(names, " "); got != want || len(m.ColumnsOf(c)) != len(names) {
			t.Errorf("%s runs %q, want %q", c.Name, got, want)
		}
	}
}

// TestPrepareSlowerScalesObjectives: a fleet made twice as slow gets its workload's objectives twice as loose, so
// that what a backend can meet stays what it could at its own speed; a fleet at its speed keeps them.
func TestPrepareSlowerScalesObjectives(t *testing.T) {
	dir := writeFiles(t, map[string]string{"same.yaml": testFleetSame, "w.yaml": testWL + "slo: {ttft: 1s, itl: 50ms}\n",
		"m.yaml": `
checks: {kind: routing}
max_rate: 1000
fleets: [{file: same.yaml}]
sizes: [{n: 2}, {n: 4, slower: 2}]
workloads: [{file: w.yaml}]
loads: [{name: u60, load: 0.6}]
columns: [{strategy: round_robin}, {strategy: adaptive}]
`})
	m, err := LoadMatrix(filepath.Join(dir, "m.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	cells := m.Cells(nil)
	if len(cells) != 2 {
		t.Fatalf("%d cells", len(cells))
	}
	for i, want := range []SLO{{TTFT: time.Second, ITL: 50 * time.Millisecond}, {TTFT: 2 * time.Second, ITL: 100 * time.Millisecond}} {
		p, err := m.Prepare(cells[i], filepath.Join(dir, "c"+strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		w, err := LoadWorkload(p.Scenario.Workload)
		if err != nil {
			t.Fatal(err)
		}
		if w, err = w.Apply(p.Scenario.Overrides()); err != nil {
			t.Fatal(err)
		}
		if w.SLO != want {
			t.Errorf("%s: objectives %+v, want %+v", cells[i].Name, w.SLO, want)
		}
	}
}
