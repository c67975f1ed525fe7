package bench

import (
	"fmt"
	"os"
	"strconv"

	"gopkg.in/yaml.v3"
)

// FleetBackend is one simulator of a fleet file as the harness needs it: where to reach it and what it serves.
type FleetBackend struct {
	Name   string
	URL    string // http://host:port, the OpenAI base without /v1
	Region string
	Model  string
	// Price is the entry's "cost" ({input, output, cached_input} per million tokens, cached_input defaulting to
	// input) and Tier its "tier" (dedicated or overflow): gateway settings, passed to the generated config and
	// to the cost columns, never to the simulator.
	Price Price
	Tier  string
	// Gateway is the entry's "gateway" mapping, merged into its generated backends[] entry (max_concurrency,
	// timeouts): settings of the gateway, not of the simulator.
	Gateway map[string]any
}

// Price is a backend's price per million tokens, as the gateway's backends[].cost states it.
type Price struct {
	Input       float64  `yaml:"input" json:"input"`
	Output      float64  `yaml:"output" json:"output"`
	CachedInput *float64 `yaml:"cached_input" json:"cached_input,omitempty"`
}

// Of returns the cost of prompt tokens (cached of them from the prefix cache) and out generated.
func (p Price) Of(prompt, cached, out int) float64 {
	cin := p.Input
	if p.CachedInput != nil {
		cin = *p.CachedInput
	}
	cached = min(cached, prompt)
	return (float64(prompt-cached)*p.Input + float64(cached)*cin + float64(out)*p.Output) / 1e6
}

// IsZero reports whether p charges nothing.
func (p Price) IsZero() bool {
	return p.Input == 0 && p.Output == 0 && (p.CachedInput == nil || *p.CachedInput == 0)
}

// PrepareFleet reads a simulator fleet file (a YAML list of entries keyed like the "switchyard sim" flags; the
// format belongs to the sim package), gives every entry a free loopback port in its "listen" key, writes the
// result to dst and returns the backends in file order. Every other key is copied as is, so the harness needs no
// knowledge of the simulator's knobs. An entry without "name" is an error (the harness routes by name).
func PrepareFleet(src, dst string) ([]FleetBackend, error) {
	data, err := os.ReadFile(src)
	if err != nil {
		return nil, fmt.Errorf("bench: fleet: %w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, yamlErrors(src, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.SequenceNode {
		return nil, &FileError{File: src, Line: 1, Msg: "a fleet file is a YAML list of simulator entries"}
	}
	var out []FleetBackend
	ports, err := FreePorts(len(doc.Content[0].Content))
	if err != nil {
		return nil, err
	}
	for ei, e := range doc.Content[0].Content {
		if e.Kind != yaml.MappingNode {
			return nil, &FileError{File: src, Line: e.Line, Msg: "a fleet entry is a mapping of simulator settings"}
		}
		b := FleetBackend{Model: DefaultModel}
		listen := -1
		var sim []*yaml.Node // the entry less the gateway's keys
		for i := 0; i+1 < len(e.Content); i += 2 {
			switch e.Content[i].Value {
			case "cost":
				if err := e.Content[i+1].Decode(&b.Price); err != nil {
					return nil, &FileError{File: src, Line: e.Content[i+1].Line, Msg: "cost: " + err.Error()}
				}
				continue
			case "tier":
				b.Tier = e.Content[i+1].Value
				continue
			case "gateway":
				if err := e.Content[i+1].Decode(&b.Gateway); err != nil {
					return nil, &FileError{File: src, Line: e.Content[i+1].Line, Msg: "gateway: " + err.Error()}
				}
				continue
			case "name":
				b.Name = e.Content[i+1].Value
			case "region":
				b.Region = e.Content[i+1].Value
			case "model":
				b.Model = e.Content[i+1].Value
			case "listen":
				listen = len(sim) + 1
			}
			sim = append(sim, e.Content[i], e.Content[i+1])
		}
		e.Content = sim
		if b.Name == "" {
			return nil, &FileError{File: src, Line: e.Line, Msg: "fleet entry without a name"}
		}
		addr := "127.0.0.1:" + strconv.Itoa(ports[ei])
		if listen < 0 {
			e.Content = append(e.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: "listen"}, &yaml.Node{Kind: yaml.ScalarNode})
			listen = len(e.Content) - 1
		}
		e.Content[listen] = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: addr}
		b.URL = "http://" + addr
		out = append(out, b)
	}
	if len(out) == 0 {
		return nil, &FileError{File: src, Line: 1, Msg: "empty fleet"}
	}
	outData, err := yaml.Marshal(&doc)
	if err != nil {
		return nil, fmt.Errorf("bench: fleet: %w", err)
	}
	if err := os.WriteFile(dst, outData, 0o644); err != nil {
		return nil, fmt.Errorf("bench: fleet: %w", err)
	}
	return out, nil
}

// ReplicateFleet reads the fleet file src and writes to dst a fleet of n backends made from its entries, with
// every key of set (simulator keys, e.g. {max_num_seqs: 16}) written over each entry. It returns the new
// fleet's entry names in order.
//
// With n at most the file's length, it takes n entries spread evenly over the file (entry i*len/n), so a mixed
// fleet's first half and second half both stay represented (two of heterogeneous.yaml's fast-a, fast-b,
// slow-a, slow-b are fast-a and slow-a). With n larger, entry i is the file's i%len: whole copies of the fleet
// in order, the first keeping the file's names and seeds, copy k (k >= 1) named NAME-rK with seed+K, so that
// replicas draw different text and faults while their physics stay the file's.
func ReplicateFleet(src, dst string, n int, set map[string]any) ([]string, error) {
	if n < 1 {
		return nil, fmt.Errorf("bench: fleet: replicate %s to %d backends: need at least one", src, n)
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return nil, fmt.Errorf("bench: fleet: %w", err)
	}
	var entries []map[string]any
	if err := yaml.Unmarshal(data, &entries); err != nil {
		return nil, yamlErrors(src, err)
	}
	if len(entries) == 0 {
		return nil, &FileError{File: src, Line: 1, Msg: "empty fleet"}
	}
	out := make([]map[string]any, n)
	names := make([]string, n)
	for i := range n {
		j, copyN := i%len(entries), i/len(entries)
		if n <= len(entries) {
			j, copyN = i*len(entries)/n, 0
		}
		e := map[string]any{}
		for k, v := range entries[j] {
			e[k] = v
		}
		for k, v := range set {
			e[k] = v
		}
		name, _ := e["name"].(string)
		if name == "" {
			return nil, &FileError{File: src, Line: 1, Msg: fmt.Sprintf("fleet entry %d without a name", j)}
		}
		if copyN > 0 {
			name += "-r" + strconv.Itoa(copyN)
			seed := uint64(1) // the simulator's default seed
			switch v := e["seed"].(type) {
			case int:
				seed = uint64(v)
			case uint64:
				seed = v
			}
			e["seed"] = seed + uint64(copyN)
		}
		e["name"] = name
		delete(e, "listen") // PrepareFleet gives each its own port
		out[i], names[i] = e, name
	}
	outData, err := yaml.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("bench: fleet: %w", err)
	}
	if err := os.WriteFile(dst, outData, 0o644); err != nil {
		return nil, fmt.Errorf("bench: fleet: %w", err)
	}
	return names, nil
}
