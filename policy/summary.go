package policy

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// WriteSummary writes a one-screen description of c for `switchyard check`: the gateway's addresses, the
// backends of each region, and each model with its strategy and targets. It never prints a secret.
func (c *Config) WriteSummary(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: valid (sha256 %s)\n", c.File, short(c.Hash))
	fmt.Fprintf(&b, "gateway   listen %s  admin %s  region %s", c.Listen, c.AdminListen, c.Region)
	if c.Redis != "" {
		b.WriteString("  redis [redacted]")
	}
	b.WriteString("\n")

	byRegion := map[string][]string{}
	var regions []string
	for _, be := range c.Backends {
		if _, ok := byRegion[be.Region]; !ok {
			regions = append(regions, be.Region)
		}
		byRegion[be.Region] = append(byRegion[be.Region], be.Name)
	}
	// The gateway's own region first, then the others in the order the file lists them.
	slices.SortStableFunc(regions, func(a, b string) int { return boolInt(b == c.Region) - boolInt(a == c.Region) })
	width := 0
	for _, r := range regions {
		width = max(width, len(r))
	}
	fmt.Fprintf(&b, "backends  %d\n", len(c.Backends))
	for _, r := range regions {
		local := ""
		if r == c.Region {
			local = "  (local)"
		}
		fmt.Fprintf(&b, "  %-*s  %s%s\n", width, r, strings.Join(byRegion[r], " "), local)
	}

	width = 0
	for _, m := range c.Models {
		width = max(width, len(m.Name))
	}
	fmt.Fprintf(&b, "models    %d\n", len(c.Models))
	for _, m := range c.Models {
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
		targets := make([]string, len(m.Targets))
		for i, t := range m.Targets {
			targets[i] = t.Backend
			if t.Model != m.Name {
				targets[i] += "=" + t.Model
			}
		}
		fmt.Fprintf(&b, "\n  %-*s  targets %s\n", width, "", strings.Join(targets, " "))
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
