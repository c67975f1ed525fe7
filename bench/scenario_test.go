package bench

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/sim"
)

// TestShippedScenarios checks that every scenario loads, that its workload loads, that its fleet is a valid
// simulator fleet (parsed by the simulator's own loader) and that its events name backends of that fleet.
func TestShippedScenarios(t *testing.T) {
	files, err := filepath.Glob("scenarios/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios (%v)", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			sc, err := LoadScenario(f)
			if err != nil {
				t.Fatal(err)
			}
			w, err := LoadWorkload(sc.Path(sc.Workload))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := w.Apply(sc.Overrides()); err != nil {
				t.Fatal(err)
			}
			cfgs, err := sim.LoadFleet(sc.Path(sc.Fleet))
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, c := range cfgs {
				names = append(names, c.Name)
			}
			for _, e := range sc.Events {
				if !slices.Contains(names, e.Backend) {
					t.Errorf("event %q names %q, not in %v", e.Label, e.Backend, names)
				}
			}
		})
	}
	fleets, _ := filepath.Glob("fleets/*.yaml")
	for _, f := range fleets {
		if _, err := sim.LoadFleet(f); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

func TestScenarioErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.yaml")
	text := "fleet: f.yaml\nworkload: w.yaml\ncolumns:\n  - {strategy: direct}\n  - {name: direct, strategy: adaptive}\n  - {name: x}\nevents:\n  - {at: 1s}\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadScenario(path)
	var fe FileErrors
	if !errors.As(err, &fe) {
		t.Fatalf("got %v", err)
	}
	got := err.Error()
	for _, want := range []string{path + ":5: columns[1].name: duplicate", path + ":6: columns[2].strategy: missing", path + ":8: events[0]"} {
		if !strings.Contains(got, want) {
			t.Errorf("errors %q lack %q", got, want)
		}
	}
}

func TestPrepareFleetAndGatewayConfig(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "f.yaml")
	if err := os.WriteFile(src, []byte("- {name: a, listen: 127.0.0.1:1, region: r1, itl: 5ms}\n- {name: b, model: other}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "out.yaml")
	bs, err := PrepareFleet(src, dst)
	if err != nil {
		t.Fatal(err)
	}
	cfgs, err := sim.LoadFleet(dst)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 2 || cfgs[0].Listen == "127.0.0.1:1" || "http://"+cfgs[1].Listen != bs[1].URL || cfgs[0].ITL.String() != "5ms" {
		t.Fatalf("backends %+v, configs %+v", bs, cfgs)
	}
	if bs[1].Model != "other" || bs[0].Model != DefaultModel || bs[0].Region != "r1" {
		t.Fatalf("backends %+v", bs)
	}
	cfg, err := GatewayConfig(GatewaySpec{Listen: "127.0.0.1:2", AdminListen: "127.0.0.1:3", Model: "m",
		Strategy: "adaptive", Backends: bs, Gateway: map[string]any{"redis": ""},
		ModelOverlay: map[string]any{"slo": map[string]any{"ttft": "300ms"}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"listen: 127.0.0.1:2", "admin_listen: 127.0.0.1:3", "region: r1", "strategy: adaptive",
		"ttft: 300ms", "url: " + bs[0].URL, "engine: vllm", `redis: ""`} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("config lacks %q:\n%s", want, cfg)
		}
	}
}

// TestScenarioReplicasErrors: replicas need a gateway and 2 to MaxReplicas of them; a workloads list belongs to
// a matrix.
func TestScenarioReplicasErrors(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "s.yaml")
	text := "fleet: f.yaml\nworkload: w.yaml\ncolumns:\n" +
		"  - {name: a, strategy: adaptive, replicas: 2}\n" + // line 4: fine
		"  - {name: b, strategy: direct, replicas: 2}\n" +
		"  - {name: c, strategy: adaptive, replicas: 1}\n" +
		"  - {name: d, strategy: adaptive, replicas: 9}\n" +
		"  - {name: e, strategy: adaptive, workloads: [multi-turn]}\n"
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadScenario(path)
	if err == nil {
		t.Fatal("no error")
	}
	got := err.Error()
	for _, want := range []string{
		path + ":5: columns[1].replicas: a direct column has no gateway",
		path + ":6: columns[2].replicas: replicas must be 2 to 8",
		path + ":7: columns[3].replicas: replicas must be 2 to 8 (or absent: one gateway), got 9",
		path + ":8: columns[4].workloads: workloads chooses a matrix's cells",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("errors %q lack %q", got, want)
		}
	}
	if strings.Contains(got, "columns[0]") {
		t.Errorf("two replicas of a gateway column refused: %q", got)
	}
}
