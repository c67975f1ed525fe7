package policy

import (
	"fmt"
	"slices"
	"strings"
)

// Regions: the gateway's region comes first, then regions.<region>.failover in order (routing.Regional turns that
// order into tiers at run time). Two filters narrow a model's targets when the policy is compiled:
//   - models[].allowed_regions keeps the targets in those regions (data residency);
//   - when the gateway's region has an entry in regions, the targets outside it and its failover regions are
//     dropped: the failover order is the complete list of where its traffic may go. Without an entry every
//     region may serve, the others after the gateway's own.
//
// A model left with no target is an error, at the allowed_regions that emptied it or at the model.

// failover returns the gateway region's failover order, and whether the policy gives one (an entry in regions,
// even with an empty list: "never leave the region").
func (c *Config) failover() ([]string, bool) {
	r, ok := c.Regions[c.Region]
	return r.Failover, ok
}

// routedTargets returns the targets of m that its allowed_regions and the gateway's failover scope keep, in the
// file's order. m must be one of c's models, after defaults.
func (c *Config) routedTargets(m *Model) []Target {
	fo, scoped := c.failover()
	regionOf := make(map[string]string, len(c.Backends))
	for _, b := range c.Backends {
		regionOf[b.Name] = b.Region
	}
	var out []Target
	for _, t := range m.Targets {
		reg := regionOf[t.Backend]
		if len(m.AllowedRegions) > 0 && !slices.Contains(m.AllowedRegions, reg) {
			continue
		}
		if scoped && reg != c.Region && !slices.Contains(fo, reg) {
			continue
		}
		out = append(out, t)
	}
	return out
}

// validateRouted reports each model that its allowed_regions or the failover scope leaves without a target. A
// model whose targets, allowed regions or the failover order already have errors is skipped: the emptiness
// would follow from them. regions are the known region names.
func (r *report) validateRouted(c *Config, regions map[string]bool) {
	fo, scoped := c.failover()
	for _, reg := range fo {
		if !regionRE.MatchString(reg) || !regions[reg] {
			return
		}
	}
	backend := make(map[string]*Backend, len(c.Backends))
	for i := range c.Backends {
		backend[c.Backends[i].Name] = &c.Backends[i]
	}
models:
	for i := range c.Models {
		m := &c.Models[i]
		if len(m.Targets) == 0 {
			continue // reported: no backend serves it
		}
		for _, t := range m.Targets {
			if b, ok := backend[t.Backend]; !ok || !regionRE.MatchString(b.Region) {
				continue models
			}
		}
		for _, reg := range m.AllowedRegions {
			if !regionRE.MatchString(reg) || !regions[reg] {
				continue models
			}
		}
		if len(c.routedTargets(m)) > 0 {
			continue
		}
		p := fmt.Sprintf("models[%d]", i)
		served := targetRegions(m, backend)
		if len(m.AllowedRegions) > 0 && !slices.ContainsFunc(served, func(s string) bool { return slices.Contains(m.AllowedRegions, s) }) {
			r.errorf(p+".allowed_regions", fmt.Sprintf("no target of %q is in these regions (its targets are in %s)", m.Name, strings.Join(served, ", ")))
			continue
		}
		if scoped {
			scope := c.Region
			if len(fo) > 0 {
				scope += " or its failover regions (" + strings.Join(fo, ", ") + ")"
			}
			msg := fmt.Sprintf("%q has no target in %s", m.Name, scope)
			if len(m.AllowedRegions) > 0 {
				msg += " that its allowed_regions allow"
			}
			r.errorf(p, fmt.Sprintf("%s; its targets are in %s: list their region in regions.%s.failover", msg,
				strings.Join(served, ", "), c.Region))
		}
	}
}

// targetRegions returns the regions of m's targets, each once, in the order of the targets.
func targetRegions(m *Model, backend map[string]*Backend) []string {
	var out []string
	for _, t := range m.Targets {
		if reg := backend[t.Backend].Region; !slices.Contains(out, reg) {
			out = append(out, reg)
		}
	}
	return out
}
