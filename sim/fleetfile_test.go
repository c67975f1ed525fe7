package sim

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseFleetGood(t *testing.T) {
	src := `# two regions
- name: use-1
  region: us-east
  listen: 127.0.0.1:8001
  prefill_tps: 20000
  itl: 12ms
  itl_per_seq: 0.05ms
  overhead: 8ms
  max_num_seqs: 128
  max_batched_tokens: 2048
  kv_blocks: 4096
  default_max_tokens: 64
  rtt: 0s
  fail_rate: 0.01
  embedding_dim: 768
  seed: 7
  model: big
- {name: euw-1, region: eu-west, listen: "127.0.0.1:8002", rtt: 40ms}
`
	cfgs, err := ParseFleet("fleet.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	want0 := Config{Name: "use-1", Region: "us-east", Listen: "127.0.0.1:8001", Model: "big", PrefillTPS: 20000,
		ITL: 12 * time.Millisecond, ITLPerSeq: 50 * time.Microsecond, Overhead: 8 * time.Millisecond,
		MaxNumSeqs: 128, MaxBatchedTokens: 2048, KVBlocks: 4096, DefaultMaxTokens: 64, FailRate: 0.01, EmbeddingDim: 768,
		Seed: 7, SchedulingPolicy: PolicyFCFS, StatesSeats: true}
	want1 := DefaultConfig()
	want1.Name, want1.Region, want1.Listen, want1.RTT = "euw-1", "eu-west", "127.0.0.1:8002", 40*time.Millisecond
	if len(cfgs) != 2 || cfgs[0] != want0 || cfgs[1] != want1 {
		t.Errorf("got %+v\nwant %+v\n     %+v", cfgs, want0, want1)
	}
}

func TestParseFleetDialect(t *testing.T) {
	// The limit may come before the dialect in an entry: only the whole entry is checked against it.
	src := `- {name: t, max_concurrent_requests: 4, dialect: tgi, states_seats: false}
- {name: s, dialect: sglang}
- {name: v}
`
	cfgs, err := ParseFleet("fleet.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if c := cfgs[0]; c.Dialect != DialectTGI || c.MaxConcurrentRequests != 4 || c.StatesSeats {
		t.Errorf("t: dialect %q, max_concurrent_requests %d, states_seats %v", c.Dialect, c.MaxConcurrentRequests,
			c.StatesSeats)
	}
	if c := cfgs[1]; c.Dialect != DialectSGLang || !c.StatesSeats || c.MaxConcurrentRequests != 0 {
		t.Errorf("s: dialect %q, states_seats %v, max_concurrent_requests %d", c.Dialect, c.StatesSeats,
			c.MaxConcurrentRequests)
	}
	if c := cfgs[2]; c.Dialect != "" || c.dialect() != DialectVLLM {
		t.Errorf("v: dialect %q (%q), want the zero value meaning vllm", c.Dialect, c.dialect())
	}
}

func TestParseFleetErrors(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{"unknown key", "- name: a\n  listen: 127.0.0.1:0\n  speed: 3\n", `fleet.yaml:3: unknown field "speed"`},
		{"bad duration", "- name: a\n\n  itl: fast\n", `fleet.yaml:3: itl: "fast" is not a duration`},
		{"out of range", "- name: a\n- name: b\n  fail_rate: 1.5\n", `fleet.yaml:3: fail_rate: 1.5 is outside [0, 1]`},
		{"zero prefill", "- name: a\n  prefill_tps: 0\n", `fleet.yaml:2: prefill_tps: 0 must be > 0`},
		{"not an integer", "- name: a\n  kv_blocks: lots\n", `fleet.yaml:2: kv_blocks: "lots" is not an integer`},
		{"missing name", "- name: a\n- listen: 127.0.0.1:0\n", `fleet.yaml:2: name: required`},
		{"duplicate name", "- name: a\n- name: b\n- name: a\n", `fleet.yaml:3: name: "a" is already used on line 1`},
		{"duplicate listen", "- {name: a, listen: 127.0.0.1:9}\n- {name: b, listen: 127.0.0.1:9}\n",
			`fleet.yaml:2: listen: 127.0.0.1:9 is already used on line 1`},
		{"repeated key", "- name: a\n  itl: 1ms\n  itl: 2ms\n", `fleet.yaml:3: `},
		{"list value", "- name: a\n  itl: [1ms]\n", `fleet.yaml:2: itl: want a single value`},
		{"empty value", "- name: a\n  rtt:\n", `fleet.yaml:2: rtt: want a single value`},
		{"not a list", "name: a\n", `fleet.yaml:1: want a list of backends`},
		{"entry not a mapping", "- a\n", `fleet.yaml:1: want a mapping`},
		{"empty file", "", `fleet.yaml: no backends`},
		{"empty list", "[]\n", `fleet.yaml:1: no backends`},
		{"bad dialect", "- name: a\n  dialect: triton\n", `fleet.yaml:2: dialect: "triton" is not one of vllm, sglang, tgi`},
		{"bad states_seats", "- name: a\n  states_seats: maybe\n", `fleet.yaml:2: states_seats: "maybe" is not true or false`},
		{"negative concurrency", "- name: a\n  dialect: tgi\n  max_concurrent_requests: -1\n",
			`fleet.yaml:3: max_concurrent_requests: -1 must be in [0, `},
		{"concurrency without tgi", "- name: a\n  dialect: sglang\n  max_concurrent_requests: 8\n",
			`fleet.yaml:3: max_concurrent_requests: 8 needs dialect tgi`},
		{"concurrency under the default dialect", "- name: a\n  max_concurrent_requests: 8\n",
			`fleet.yaml:2: max_concurrent_requests: 8 needs dialect tgi (only TGI's router has this limit; dialect is "vllm")`},
		{"syntax error", "- name: a\n- name: b\n  model: x: y\n", `fleet.yaml:3: mapping values are not allowed`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseFleet("fleet.yaml", []byte(tc.src))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error = %v, want it to contain %q", err, tc.want)
			}
			if err != nil && !strings.HasPrefix(err.Error(), "sim: fleet: fleet.yaml") {
				t.Errorf("error %q does not start with the stage and the file", err)
			}
		})
	}
}

func TestLoadFleet(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f.yaml")
	if err := os.WriteFile(path, []byte("- name: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfgs, err := LoadFleet(path)
	if err != nil || len(cfgs) != 1 || cfgs[0].Name != "x" {
		t.Errorf("LoadFleet = %v, %v", cfgs, err)
	}
	if _, err := LoadFleet(path + ".missing"); err == nil || !strings.Contains(err.Error(), "f.yaml.missing") {
		t.Errorf("missing file: %v", err)
	}
}

func TestBenchFleetFilesParse(t *testing.T) {
	// The benchmark harness's fleet files are this package's format: keep them loadable.
	files, _ := filepath.Glob("../bench/fleets/*.yaml")
	for _, f := range files {
		if _, err := LoadFleet(f); err != nil {
			t.Error(err)
		}
	}
}

func FuzzParseFleet(f *testing.F) {
	f.Add([]byte("- name: a\n  itl: 20ms\n"))
	f.Add([]byte("- {name: a, listen: 127.0.0.1:0, fail_rate: 0.5}\n- {name: b, kv_blocks: 16}\n"))
	f.Add([]byte("[]"))
	f.Add([]byte("- name: a\n  rtt: [1]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cfgs, err := ParseFleet("f.yaml", data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "sim: fleet: f.yaml") {
				t.Errorf("error without the file: %v", err)
			}
			return
		}
		for _, c := range cfgs {
			if err := c.Validate(); err != nil {
				t.Errorf("accepted an invalid entry: %v", err)
			}
		}
	})
}
