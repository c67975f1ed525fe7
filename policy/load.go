package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/proxy"
	"github.com/switchyard/switchyard/routing"
)

// Parse decodes, defaults and validates the bytes of a policy file; file names it in errors. It expands ${VAR} and
// ${VAR:-default} from the process environment. An invalid file yields a nil *Config and an Errors listing every
// problem, sorted by line. Parse has no side effects.
func Parse(file string, data []byte) (*Config, error) {
	return parse(file, data, os.LookupEnv)
}

func parse(file string, data []byte, lookup func(string) (string, bool)) (*Config, error) {
	r := newReport(file)
	c := &Config{File: file, Hash: hash(data)}
	d := &decoder{report: r, lookup: lookup}
	d.decodeFile(data, c)
	if d.abort || len(r.errs) > 0 && r.errs[0].Path == "" {
		return nil, r.errs.sorted() // the document could not be read (as a whole): nothing more to say
	}
	r.applyDefaults(c)
	r.validate(c)
	if len(r.errs) > 0 {
		return nil, r.errs.sorted()
	}
	c.lines = r.authLines(data)
	return c, nil
}

func hash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Load reads the policy file at path, validates it and compiles it through reg, the registry the caller owns
// and passes to every later load (see NewWatcher for reloading). An invalid file returns an Errors and leaves reg
// untouched.
func Load(path string, reg *routing.Registry) (*Config, *proxy.Snapshot, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("policy: %w", err)
	}
	c, err := Parse(path, data)
	if err != nil {
		return nil, nil, err
	}
	s, err := c.Compile(reg, nil, nil)
	if err != nil {
		return nil, nil, err
	}
	Shared{}.apply(c, s, nil) // shared.go: the models' response caches, in memory
	return c, s, nil
}

// Compile builds the runtime snapshot of a valid Config. It syncs reg to the Config's backends, so a backend that
// keeps its name and URL keeps its *routing.Backend and what was learned about it; prev, the snapshot being
// replaced (nil on the first load), keeps each surviving model's creation time, its region failover state and
// each API key's rate-limit buckets (the new limiter shares them with prev's, which stays usable by requests
// still running on prev). Every model gets a new strategy instance, reporting its prefix-cache lookups and
// region spills to m (nil: no metrics), which also receives admission's refusals. Each model's targets are
// those its allowed_regions and the gateway's failover order keep (regions.go). c must come from Parse; reg
// must not be nil. An error (a strategy or a key set that cannot be built, which validation rules out) leaves
// reg and prev untouched.
//
// A backend with discover stands for no backend here: the watcher compiles with the addresses it discovered
// (compile, discover.go).
func (c *Config) Compile(reg *routing.Registry, prev *proxy.Snapshot, m *metrics.Gateway) (*proxy.Snapshot, error) {
	return c.compile(reg, prev, m, nil)
}

// compile is Compile with found, the addresses (host:port) discovered for each template backend, by name.
func (c *Config) compile(reg *routing.Registry, prev *proxy.Snapshot, m *metrics.Gateway, found map[string][]string) (*proxy.Snapshot, error) {
	now := time.Now()
	strats := make([]routing.Strategy, len(c.Models))
	for i := range c.Models {
		var was routing.Strategy
		if prev != nil {
			if old, ok := prev.Models[c.Models[i].Name]; ok {
				was = old.Strategy
			}
		}
		s, err := newStrategy(c, &c.Models[i], m, was)
		if err != nil {
			return nil, fmt.Errorf("policy: models[%d].strategy: %w", i, err)
		}
		strats[i] = s
	}
	keys, err := c.keys()
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	engines := c.engineSpecs()
	expanded, instances := c.expandBackends(found) // discover.go
	cfgs := make([]*routing.BackendConfig, len(expanded))
	for i, b := range expanded {
		cfgs[i] = &routing.BackendConfig{
			Name:       b.Name,
			URL:        strings.TrimRight(b.URL, "/"),
			Region:     b.Region,
			Engine:     b.Engine,
			EngineSpec: engines[b.Engine],
			APIKey:     b.APIKey.Value(),
			Headers:    upstreamHeaders(&b),
			Query:      upstreamQuery(&b),
			Path:       b.path,
			CA:         b.ca,

			ForwardAuthorization: b.ForwardAuthorization,
			Models:               append([]string(nil), b.Models...),
			Weight:               b.Weight,
			MaxConcurrency:       b.MaxConcurrency,
			MaxNumSeqs:           b.MaxNumSeqs,
			Tier:                 tierOf(b.Tier),
			Price:                routing.Price{Input: b.Cost.Input, CachedInput: b.Cost.CachedInput, Output: b.Cost.Output},
			Timeouts: routing.Timeouts{
				Connect:   b.Timeouts.Connect,
				FirstByte: b.Timeouts.FirstByte,
				Idle:      b.Timeouts.Idle,
				Total:     b.Timeouts.Total,
			},
		}
	}
	backends := reg.Sync(cfgs)
	byName := make(map[string]*routing.Backend, len(backends))
	for _, b := range backends {
		byName[b.Config().Name] = b
	}

	s := &proxy.Snapshot{
		Region:     c.Region,
		Models:     make(map[string]*proxy.Model, len(c.Models)),
		ModelNames: make([]string, 0, len(c.Models)),
		Backends:   backends,
		Loaded:     now,
		Hash:       c.Hash,
	}
	for i, m := range c.Models {
		// allowed_regions and the failover scope (regions.go), then each template's instances
		routed := expandTargets(c.routedTargets(&c.Models[i]), instances)
		pm := &proxy.Model{
			Name:         m.Name,
			Targets:      make([]routing.Target, len(routed)),
			Strategy:     strats[i],
			StrategyName: m.Strategy,
			SLO:          proxy.SLO{TTFT: m.SLO.TTFT, ITL: m.SLO.ITL},
			Retries:      m.Retries,
			Preempt:      m.Preempt == "sheddable" || m.Preempt == "standard",
			PreemptAll:   m.Preempt == "standard",
			Created:      now.Unix(),
			Endpoints:    endpointSet(m.Endpoints),
		}
		pm.Objective, _ = routing.ParseObjective(m.Objective)
		for i, t := range routed {
			pm.Targets[i] = routing.Target{Backend: byName[t.Backend], Model: t.Model}
		}
		if prev != nil {
			if old, ok := prev.Models[m.Name]; ok {
				pm.Created = old.Created
			}
		}
		if m.Hedge.After > 0 {
			pm.Hedge = proxy.Hedge{After: m.Hedge.After, BudgetPercent: m.Hedge.BudgetPercent}
		}
		s.Models[m.Name] = pm
		s.ModelNames = append(s.ModelNames, m.Name)
	}
	for _, md := range c.Models {
		if md.DegradeTo != "" {
			s.Models[md.Name].DegradeTo = s.Models[md.DegradeTo] // validation: it exists, is another model, no cycle
		}
	}
	c.compileAdmission(s, keys, prev, m)
	return s, nil
}

// endpointSet compiles a validated endpoints list; an empty list is proxy.DefaultEndpoints (the zero set).
func endpointSet(names []string) proxy.EndpointSet {
	var set proxy.EndpointSet
	for _, n := range names {
		e, _ := proxy.ParseEndpoint(n)
		set |= e
	}
	return set
}

// tierOf maps a validated tier name to routing's tier.
func tierOf(name string) routing.Tier {
	if name == "overflow" {
		return routing.TierOverflow
	}
	return routing.TierDedicated
}
