package sim

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// gatewayKeys are fleet-entry keys that configure the gateway in front of the backend, not the simulator:
// bench's generated config reads them (cost, tier, gateway: bench/fleet.go); ParseFleet skips them.
var gatewayKeys = map[string]bool{"cost": true, "tier": true, "gateway": true}

// LoadFleet reads and parses a fleet file (see ParseFleet).
func LoadFleet(path string) ([]Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sim: fleet: %w", err)
	}
	return ParseFleet(path, data)
}

// ParseFleet parses a fleet file named name: a YAML list with one mapping per backend, whose keys are the CLI
// flags' names in snake case (name, listen, region, model, prefill_tps, itl, itl_per_seq, overhead,
// max_num_seqs, scheduling_policy, max_batched_tokens, kv_blocks, default_max_tokens, embedding_dim, rtt,
// fail_rate, the physics keys physics, batching, load_factor, block_size, eviction, chunked_prefill, jitter and
// prefill_knee, the dialect keys dialect, states_seats and max_concurrent_requests, and seed); durations are written like 20ms; a physics preset fills the physics keys the entry
// does not name, wherever it stands in the entry; the keys cost, tier and gateway belong to bench's gateway
// and are skipped. Each entry starts from DefaultConfig; name is required and unique, listen defaults to a free
// loopback port. For example:
//
//	# fleet.yaml: two regions
//	- {name: use-1, region: us-east, listen: 127.0.0.1:8001}
//	- {name: euw-1, region: eu-west, listen: 127.0.0.1:8002, rtt: 80ms, itl: 25ms}
//
// Decoding is strict: an unknown or repeated key, a value of the wrong type or out of range is an error that
// names the file and line, as "fleet.yaml:7: itl: \"fast\" is not a duration (like 20ms)".
func ParseFleet(name string, data []byte) ([]Config, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, yamlError(name, err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return nil, fmt.Errorf("sim: fleet: %s: no backends", name)
	}
	root := doc.Content[0]
	if root.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("sim: fleet: %s:%d: want a list of backends", name, root.Line)
	}
	if len(root.Content) == 0 {
		return nil, fmt.Errorf("sim: fleet: %s:%d: no backends", name, root.Line)
	}
	byKey := make(map[string]knob, len(knobs))
	for _, k := range knobs {
		byKey[k.key] = k
	}
	names := make(map[string]int)
	listens := make(map[string]int)
	cfgs := make([]Config, 0, len(root.Content))
	for _, entry := range root.Content {
		fail := func(line int, format string, args ...any) error {
			return fmt.Errorf("sim: fleet: %s:%d: %s", name, line, fmt.Sprintf(format, args...))
		}
		if entry.Kind != yaml.MappingNode {
			return nil, fail(entry.Line, "want a mapping (name: ..., listen: ...)")
		}
		cfg := DefaultConfig()
		seen := make(map[string]bool)
		var named uint64
		for i := 0; i+1 < len(entry.Content); i += 2 {
			key, val := entry.Content[i], entry.Content[i+1]
			if gatewayKeys[key.Value] && key.Kind == yaml.ScalarNode {
				continue // the gateway's, for bench's generated config (bench/fleet.go)
			}
			k, ok := byKey[key.Value]
			if !ok || key.Kind != yaml.ScalarNode {
				return nil, fail(key.Line, "unknown field %q (want one of %s)", key.Value, keyList())
			}
			if seen[key.Value] {
				return nil, fail(key.Line, "%s: repeated", key.Value)
			}
			seen[key.Value] = true
			if val.Kind != yaml.ScalarNode || val.Tag == "!!null" {
				return nil, fail(val.Line, "%s: want a single value", key.Value)
			}
			if err := k.apply(&cfg, val.Value, &named); err != nil {
				return nil, fail(val.Line, "%s: %v", key.Value, err)
			}
		}
		if !seen["name"] {
			return nil, fail(entry.Line, "name: required")
		}
		if prev, ok := names[cfg.Name]; ok {
			return nil, fail(lineOf(entry, "name"), "name: %q is already used on line %d", cfg.Name, prev)
		}
		names[cfg.Name] = lineOf(entry, "name")
		if cfg.Listen != "" && !strings.HasSuffix(cfg.Listen, ":0") {
			if prev, ok := listens[cfg.Listen]; ok {
				return nil, fail(lineOf(entry, "listen"), "listen: %s is already used on line %d", cfg.Listen, prev)
			}
			listens[cfg.Listen] = lineOf(entry, "listen")
		}
		for _, k := range knobs { // what one key could not check alone: max_concurrent_requests needs dialect tgi
			if err := k.check(&cfg); err != nil {
				return nil, fail(lineOf(entry, k.key), "%s: %v", k.key, err)
			}
		}
		cfgs = append(cfgs, cfg)
	}
	return cfgs, nil
}

func lineOf(entry *yaml.Node, key string) int {
	for i := 0; i+1 < len(entry.Content); i += 2 {
		if entry.Content[i].Value == key {
			return entry.Content[i].Line
		}
	}
	return entry.Line
}

func keyList() string {
	keys := make([]string, len(knobs))
	for i, k := range knobs {
		keys[i] = k.key
	}
	return strings.Join(keys, ", ")
}

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): (.*)$`)

// yamlError turns a yaml.v3 syntax error ("yaml: line 3: mapping values are not allowed in this context") into
// "name:3: mapping values are not allowed in this context".
func yamlError(name string, err error) error {
	msg := err.Error()
	var te *yaml.TypeError
	if errors.As(err, &te) && len(te.Errors) > 0 {
		msg = te.Errors[0]
	}
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		return fmt.Errorf("sim: fleet: %s:%d: %s", name, line, m[2])
	}
	return fmt.Errorf("sim: fleet: %s: %s", name, strings.TrimPrefix(msg, "yaml: "))
}
