package policy

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/switchyard/switchyard/admission"
)

// WriteSummary writes a one-screen description of c for `switchyard check`: the gateway's addresses, the
// priority classes and the queue, the API keys (by name and class), the backends of each region (in failover
// order) and their concurrency caps, and each model with its strategy, targets (those its regions keep),
// hedging and brownout target. It never prints a
// secret: not a key, not a key's hash.
func (c *Config) WriteSummary(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: valid (sha256 %s)\n", c.File, short(c.Hash))
	fmt.Fprintf(&b, "gateway   listen %s  admin %s  region %s", c.Listen, c.AdminListen, c.Region)
	if c.Redis.Enabled() {
		fmt.Fprintf(&b, "  redis [redacted] (%s, prefix %q, timeout %v, sync every %v, pool %d, breaker %d failures/%v)",
			c.Redis.Mode, c.Redis.KeyPrefix, c.Redis.Timeout, c.Redis.SyncInterval, c.Redis.PoolSize,
			c.Redis.BreakerFailures, c.Redis.BreakerCoolDown)
	}
	b.WriteString("\n")

	pr := c.priorities()
	fmt.Fprintf(&b, "priority  header %s  default %s  slo_factor", pr.Header, pr.Default)
	for i := range admission.NumClasses {
		fmt.Fprintf(&b, " %s %g", admission.ClassAt(i), pr.SLOFactor[i])
	}
	fmt.Fprintf(&b, "\nqueue     %d per model  timeout %v\n", c.Limits.QueueSize, c.Limits.QueueTimeout)
	if c.Limits.Shedding != nil && !*c.Limits.Shedding {
		fmt.Fprintf(&b, "shedding  off: every request goes straight to a backend\n")
	}
	c.writeKeys(&b)

	byRegion := map[string][]string{}
	var regions []string
	for _, be := range c.Backends {
		if _, ok := byRegion[be.Region]; !ok {
			regions = append(regions, be.Region)
		}
		name := be.Name
		if be.discovers() {
			name += fmt.Sprintf("(discover %s %s)", be.Discover.Type, be.Discover.DNS) // discover.go
		}
		byRegion[be.Region] = append(byRegion[be.Region], name)
	}
	// The gateway's own region first, then its failover regions in order, then the others as the file lists them.
	fo, scoped := c.failover()
	rank := func(r string) int {
		if r == c.Region {
			return 0
		}
		if i := slices.Index(fo, r); i >= 0 {
			return 1 + i
		}
		return 1 + len(fo)
	}
	slices.SortStableFunc(regions, func(a, b string) int { return rank(a) - rank(b) })
	width := 0
	for _, r := range regions {
		width = max(width, len(r))
	}
	fmt.Fprintf(&b, "backends  %d\n", len(c.Backends))
	for _, r := range regions {
		local := ""
		switch i := slices.Index(fo, r); {
		case r == c.Region:
			local = "  (local)"
		case i >= 0:
			local = fmt.Sprintf("  (failover %d)", i+1)
		case scoped:
			local = "  (not used: not in regions." + c.Region + ".failover)"
		}
		fmt.Fprintf(&b, "  %-*s  %s%s\n", width, r, strings.Join(byRegion[r], " "), local)
	}
	var caps []string
	for _, be := range c.Backends {
		if be.MaxConcurrency > 0 {
			caps = append(caps, fmt.Sprintf("%s %d", be.Name, be.MaxConcurrency))
		}
	}
	switch {
	case len(caps) == 0:
		b.WriteString("  max_concurrency adaptive\n")
	case len(caps) == len(c.Backends):
		fmt.Fprintf(&b, "  max_concurrency %s\n", strings.Join(caps, ", "))
	default:
		fmt.Fprintf(&b, "  max_concurrency %s; the others adaptive\n", strings.Join(caps, ", "))
	}

	width = 0
	for _, m := range c.Models {
		width = max(width, len(m.Name))
	}
	fmt.Fprintf(&b, "models    %d\n", len(c.Models))
	for i, m := range c.Models {
		fmt.Fprintf(&b, "  %-*s  strategy %s  retries %d", width, m.Name, m.Strategy, m.Retries)
		if m.SLO.TTFT > 0 || m.SLO.ITL > 0 {
			b.WriteString("  slo")
			if m.SLO.TTFT > 0 {
				fmt.Fprintf(&b, " ttft %v", m.SLO.TTFT)
			}
			if m.SLO.ITL > 0 {
				fmt.Fprintf(&b, " itl %v", m.SLO.ITL)
			}
		}
		routed := c.routedTargets(&c.Models[i])
		targets := make([]string, len(routed))
		for i, t := range routed {
			targets[i] = t.Backend
			if t.Model != m.Name {
				targets[i] += "=" + t.Model
			}
		}
		fmt.Fprintf(&b, "\n  %-*s  targets %s", width, "", strings.Join(targets, " "))
		if len(m.AllowedRegions) > 0 {
			fmt.Fprintf(&b, "  (allowed_regions %s)", strings.Join(m.AllowedRegions, " "))
		}
		b.WriteString("\n")
		if m.Hedge.After > 0 || m.DegradeTo != "" {
			fmt.Fprintf(&b, "  %-*s ", width, "")
			if m.Hedge.After > 0 {
				fmt.Fprintf(&b, " hedge after %v budget %g%%", m.Hedge.After, m.Hedge.BudgetPercent)
			}
			if m.DegradeTo != "" {
				fmt.Fprintf(&b, " degrade_to %s", m.DegradeTo)
			}
			b.WriteString("\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeKeys lists the API keys by name, with their class, models and limits; never the key or its hash.
func (c *Config) writeKeys(b *strings.Builder) {
	if c.Auth == AuthNone {
		b.WriteString("api keys  none (auth: none): no authentication; any caller may claim any priority\n")
		return
	}
	fmt.Fprintf(b, "api keys  %d: requests need Authorization: Bearer <key>\n", len(c.APIKeys))
	width := 0
	for _, k := range c.APIKeys {
		width = max(width, len(k.Name))
	}
	for _, k := range c.APIKeys {
		models := "all models"
		if len(k.Models) > 0 {
			models = "models " + strings.Join(k.Models, " ")
		}
		limits := "no limits"
		if l := k.Limits; l.RequestsPerMinute > 0 || l.TokensPerMinute > 0 {
			var ls []string
			if l.RequestsPerMinute > 0 {
				ls = append(ls, fmt.Sprintf("%d requests/min", l.RequestsPerMinute))
			}
			if l.TokensPerMinute > 0 {
				ls = append(ls, fmt.Sprintf("%d tokens/min", l.TokensPerMinute))
			}
			limits = strings.Join(ls, " ")
		}
		fmt.Fprintf(b, "  %-*s  %-9s  %s  %s\n", width, k.Name, k.Priority, models, limits)
	}
}
