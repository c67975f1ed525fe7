package policy

import (
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/proxy"
	"github.com/switchyard/switchyard/routing"
)

var (
	// Backend and key names appear in response headers, metric labels and logs.
	nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$`)
	// Region names appear in paths (regions.us-east) and labels: no dots.
	regionRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
	// headerRE is an HTTP field name (RFC 9110 token).
	headerRE = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
)

const (
	maxRetries   = 10
	maxBodyLimit = 1 << 30
)

// validate checks what decoding cannot: values in range, names unique, references that resolve. It reports every
// problem it finds; it never prints a secret.
func (r *report) validate(c *Config) {
	r.checkSupported() // first, so that on a line it comes before the details
	r.validateTop(c)
	engines := r.validateEngines(c) // engines.go
	regions := r.validateBackends(c, engines)
	r.validateModels(c, regions)
	r.validateRegions(c, regions)
	r.validateRouted(c, regions) // regions.go
	r.validatePriorities(c)
	r.validateAuth(c) // auth.go
	r.validateKeys(c)
	r.validateCost(c) // cost.go
	r.validateLimits(c)
	r.validateReload(c)
}

func (r *report) validateTop(c *Config) {
	r.addr("listen", c.Listen)
	r.addr("admin_listen", c.AdminListen)
	if _, port, err := net.SplitHostPort(c.Listen); err == nil && port != "0" && c.Listen == c.AdminListen {
		r.errorf("admin_listen", "must differ from listen") // port 0 is "any free port" for each of them
	}
	r.regionName("region", c.Region)
	r.validateRedis(c.Redis) // redis.go; never prints the URL
	r.responseCaches(c, true)
	r.validateObserve(c) // observe.go
}

// addr checks a listen address: host:port, the host possibly empty (all interfaces).
func (r *report) addr(path, s string) {
	_, port, err := net.SplitHostPort(s)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	if err != nil {
		r.errorf(path, fmt.Sprintf("expected host:port such as 127.0.0.1:8080, got %q", s))
	}
}

func (r *report) regionName(path, s string) bool {
	if !regionRE.MatchString(s) {
		r.errorf(path, fmt.Sprintf("invalid region name %q: use letters, digits, '-' and '_'", s))
		return false
	}
	return true
}

// validateBackends checks the backends and returns the regions they run in (plus the gateway's own).
func (r *report) validateBackends(c *Config, engines map[string]bool) map[string]bool {
	regions := map[string]bool{c.Region: true}
	if len(c.Backends) == 0 {
		r.errorf("backends", "at least one backend is required")
	}
	names := map[string]int{}
	for i := range c.Backends {
		b, p := &c.Backends[i], fmt.Sprintf("backends[%d]", i)
		r.validateHosted(c, p, b) // hosted.go
		r.uniqueName(p+".name", b.Name, "backend", names, i, "backends")
		if r.set(p + ".discover") {
			r.validateDiscover(c, p, b) // discover.go
		} else {
			r.backendURL(p+".url", b.URL)
		}
		if r.regionName(p+".region", b.Region) {
			regions[b.Region] = true
		}
		r.engineName(p+".engine", b.Engine, engines)
		if len(b.Models) == 0 {
			r.errorf(p+".models", "at least one model is required")
		}
		seen := map[string]bool{}
		for j, m := range b.Models {
			mp := fmt.Sprintf("%s.models[%d]", p, j)
			r.modelName(mp, m)
			if seen[m] {
				r.errorf(mp, fmt.Sprintf("duplicate model %q", m))
			}
			seen[m] = true
		}
		switch {
		case b.Weight < 0:
			r.errorf(p+".weight", "must be >= 0")
		case b.Weight == 0:
			r.errorf(p+".weight", "0 (draining) is not supported yet: remove the backend, or give a weight > 0")
		}
		if b.MaxConcurrency < 0 {
			r.errorf(p+".max_concurrency", "must be >= 0 (0: adaptive)")
		}
		if b.MaxNumSeqs < 0 {
			r.errorf(p+".max_num_seqs", "must be >= 0 (0: from the engine)")
		}
		if b.Tier != "dedicated" && b.Tier != "overflow" {
			r.errorf(p+".tier", fmt.Sprintf("unknown tier %q (one of: dedicated, overflow)", b.Tier))
		}
		if b.Cost.Input < 0 {
			r.errorf(p+".cost.input", "must be >= 0")
		}
		if b.Cost.CachedInput < 0 {
			r.errorf(p+".cost.cached_input", "must be >= 0")
		}
		if b.Cost.Output < 0 {
			r.errorf(p+".cost.output", "must be >= 0")
		}
		r.timeouts(p+".timeouts", b.Timeouts)
	}
	return regions
}

// uniqueName checks a required, well-formed, unique name; names maps names to the index that first used them.
func (r *report) uniqueName(path, name, what string, names map[string]int, i int, list string) {
	switch {
	case name == "":
		r.errorf(path, "required")
		return
	case !nameRE.MatchString(name):
		r.errorf(path, fmt.Sprintf("invalid %s name %q: use letters, digits, '.', '_', '-' and ':' (at most 64)", what, name))
		return
	}
	if first, dup := names[name]; dup {
		r.errorf(path, fmt.Sprintf("duplicate %s name %q (also %s[%d])", what, name, list, first))
		return
	}
	names[name] = i
}

func (r *report) modelName(path, name string) bool {
	switch {
	case name == "":
		r.errorf(path, "required")
	case len(name) > 256 || strings.ContainsFunc(name, func(c rune) bool { return unicode.IsSpace(c) || unicode.IsControl(c) }):
		r.errorf(path, fmt.Sprintf("invalid model name %q: no white space, at most 256 bytes", name))
	default:
		return true
	}
	return false
}

// backendURL checks a backend's base URL. Its value is never printed: it may come from the environment and carry
// a credential.
func (r *report) backendURL(path, s string) {
	if s == "" {
		r.errorf(path, "required")
		return
	}
	u, err := url.Parse(s)
	switch {
	case err != nil, u.Scheme != "http" && u.Scheme != "https" || u.Host == "" || u.Opaque != "":
		r.errorf(path, "must be an absolute http:// or https:// URL, such as http://10.0.0.5:8000")
	case u.User != nil:
		r.errorf(path, "must not contain user info (user:password@): give credentials in api_key")
	case u.RawQuery != "" || u.ForceQuery:
		r.errorf(path, "must not have a query (?...)")
	case u.Fragment != "" || strings.Contains(s, "#"):
		r.errorf(path, "must not have a fragment (#...)")
	case u.Hostname() == "":
		r.errorf(path, "must name a host")
	case strings.HasSuffix(strings.TrimRight(u.Path, "/"), "/v1"):
		r.errorf(path, "must not end in /v1: request paths such as /v1/chat/completions are appended to it")
	}
}

// timeouts checks the timeouts the file set at p (defaults are valid by construction, and a backend's inherited
// ones are checked once, under limits.timeouts).
func (r *report) timeouts(p string, t Timeouts) {
	for _, f := range []struct {
		name string
		v    time.Duration
	}{{"connect", t.Connect}, {"first_byte", t.FirstByte}, {"idle", t.Idle}, {"total", t.Total}} {
		if r.set(p+"."+f.name) && f.v <= 0 {
			r.errorf(p+"."+f.name, "must be positive")
		}
	}
	if (r.set(p+".total") || r.set(p+".first_byte")) && t.FirstByte > 0 && t.Total > 0 && t.Total < t.FirstByte {
		r.errorf(p+".total", fmt.Sprintf("must be at least first_byte (%v)", t.FirstByte))
	}
}

func (r *report) validateModels(c *Config, regions map[string]bool) {
	if len(c.Models) == 0 {
		r.errorf("models", "at least one model is required")
	}
	backends := map[string]*Backend{}
	for i := range c.Backends {
		backends[c.Backends[i].Name] = &c.Backends[i]
	}
	models := map[string]int{}
	for i, m := range c.Models {
		p := fmt.Sprintf("models[%d]", i)
		if r.modelName(p+".name", m.Name) {
			if first, dup := models[m.Name]; dup {
				r.errorf(p+".name", fmt.Sprintf("duplicate model name %q (also models[%d])", m.Name, first))
			} else {
				models[m.Name] = i
			}
		}
	}
	for i, m := range c.Models {
		p := fmt.Sprintf("models[%d]", i)
		if _, err := newStrategy(c, &m, nil, nil); err != nil {
			r.errorf(p+".strategy", err.Error())
		}
		r.targets(p, m, backends)
		for _, f := range []struct {
			name string
			v    time.Duration
		}{{"ttft", m.SLO.TTFT}, {"itl", m.SLO.ITL}} {
			if r.set(p+".slo."+f.name) && f.v <= 0 {
				r.errorf(p+".slo."+f.name, "must be positive")
			}
		}
		if m.Retries < 0 || m.Retries > maxRetries {
			r.errorf(p+".retries", fmt.Sprintf("must be between 0 and %d", maxRetries))
		}
		if r.set(p + ".hedge") {
			r.hedge(p+".hedge", m, backends)
		}
		switch m.Preempt {
		case "", "off", "sheddable", "standard":
		default:
			r.errorf(p+".preempt", fmt.Sprintf("%q: must be off, sheddable or standard", m.Preempt))
		}
		if m.DegradeTo != "" {
			switch _, ok := models[m.DegradeTo]; {
			case m.DegradeTo == m.Name:
				r.errorf(p+".degrade_to", "a model cannot degrade to itself")
			case !ok:
				r.errorf(p+".degrade_to", fmt.Sprintf("unknown model %q", m.DegradeTo))
			}
		}
		r.regionList(p+".allowed_regions", m.AllowedRegions, regions)
		r.endpoints(p+".endpoints", m.Endpoints)
	}
	r.degradeCycles(c, models)
}

// endpoints checks a model's endpoint groups: known names, each once.
func (r *report) endpoints(p string, list []string) {
	seen := map[string]bool{}
	for j, name := range list {
		ep := fmt.Sprintf("%s[%d]", p, j)
		if _, ok := proxy.ParseEndpoint(name); !ok {
			msg := fmt.Sprintf("unknown endpoint group %q (known: %s)", name, strings.Join(proxy.EndpointNames(), ", "))
			if s := suggest(name, proxy.EndpointNames()); s != "" {
				msg += fmt.Sprintf("; did you mean %q?", s)
			}
			r.errorf(ep, msg)
		} else if seen[name] {
			r.errorf(ep, fmt.Sprintf("duplicate endpoint group %q", name))
		}
		seen[name] = true
	}
}

// targets checks a model's targets: each names a backend that lists the upstream model, once.
func (r *report) targets(p string, m Model, backends map[string]*Backend) {
	if len(m.Targets) == 0 {
		// When a backend's models did not decode, the model may well be served: say nothing more.
		if m.Name != "" && !r.badPattern("backends") && !r.badPattern("backends[]") && !r.badPattern("backends[].models") {
			r.errorf(p, fmt.Sprintf("no backend serves %q: list it in a backend's models, or give targets", m.Name))
		}
		return
	}
	seen := map[Target]bool{}
	for j, t := range m.Targets {
		tp := fmt.Sprintf("%s.targets[%d]", p, j)
		b, ok := backends[t.Backend]
		switch {
		case t.Backend == "":
			r.errorf(tp+".backend", "required")
		case !ok:
			r.errorf(tp+".backend", fmt.Sprintf("unknown backend %q", t.Backend))
		case !slices.Contains(b.Models, t.Model):
			r.errorf(tp+".model", fmt.Sprintf("backend %q does not list model %q in its models", t.Backend, t.Model))
		case seen[t]:
			r.errorf(tp, fmt.Sprintf("duplicate target %s/%s", t.Backend, t.Model))
		}
		seen[t] = true
	}
}

// hedge checks a model's hedging: after is set, and shorter than the first-byte timeout of some target (past
// it the attempt has failed and a retry, not a hedge, takes over), and the budget is a percentage.
func (r *report) hedge(p string, m Model, backends map[string]*Backend) {
	var firstByte time.Duration // the longest first-byte timeout of the model's backends
	for _, t := range m.Targets {
		if b, ok := backends[t.Backend]; ok {
			firstByte = max(firstByte, b.Timeouts.FirstByte)
		}
	}
	switch h := m.Hedge; {
	case h.After <= 0:
		r.errorf(p+".after", "required, and must be positive")
	case firstByte > 0 && h.After >= firstByte:
		r.errorf(p+".after", fmt.Sprintf("must be shorter than the backends' timeouts.first_byte (%v): an attempt that has no first byte by then has failed, and is retried rather than hedged", firstByte))
	}
	if b := m.Hedge.BudgetPercent; b <= 0 || b > 100 {
		r.errorf(p+".budget_percent", "must be in (0, 100]")
	}
}

// degradeCycles reports each degrade_to chain that loops, once, at the first model of the loop.
func (r *report) degradeCycles(c *Config, models map[string]int) {
	for i, m := range c.Models {
		chain := []string{m.Name}
		for j := i; ; {
			next, ok := models[c.Models[j].DegradeTo]
			if !ok || next == j || len(chain) > len(c.Models) {
				break
			}
			chain = append(chain, c.Models[next].Name)
			if next == i {
				if slices.IndexFunc(chain[:len(chain)-1], func(n string) bool { return models[n] < i }) < 0 {
					r.errorf(fmt.Sprintf("models[%d].degrade_to", i), "degrade_to forms a cycle: "+strings.Join(chain, " -> "))
				}
				break
			}
			j = next
		}
	}
}

// regionList checks a list of region names: known, and each once.
func (r *report) regionList(p string, list []string, regions map[string]bool) {
	seen := map[string]bool{}
	for j, reg := range list {
		rp := fmt.Sprintf("%s[%d]", p, j)
		switch {
		case !r.regionName(rp, reg):
		case !regions[reg]:
			r.errorf(rp, fmt.Sprintf("unknown region %q (known: %s)", reg, strings.Join(slices.Sorted(maps.Keys(regions)), ", ")))
		case seen[reg]:
			r.errorf(rp, fmt.Sprintf("duplicate region %q", reg))
		}
		seen[reg] = true
	}
}

func (r *report) validateRegions(c *Config, regions map[string]bool) {
	for _, name := range slices.Sorted(maps.Keys(c.Regions)) {
		p := "regions." + name
		if !r.regionName(p, name) {
			continue
		}
		if !regions[name] {
			r.errorf(p, fmt.Sprintf("unknown region %q (known: %s)", name, strings.Join(slices.Sorted(maps.Keys(regions)), ", ")))
		}
		fo := c.Regions[name].Failover
		if slices.Contains(fo, name) {
			r.errorf(p+".failover", "a region cannot fail over to itself")
		}
		r.regionList(p+".failover", fo, regions)
		if len(fo) > routing.MaxFailover {
			r.errorf(p+".failover", fmt.Sprintf("%d regions: at most %d", len(fo), routing.MaxFailover))
		}
	}
}

// validatePriorities checks the priorities section. The classes are admission's three (critical, standard,
// sheddable): the file may set their SLO factors, not invent classes, and lists them most important first.
func (r *report) validatePriorities(c *Config) {
	pr := c.Priorities
	if !headerRE.MatchString(pr.Header) {
		r.errorf("priorities.header", fmt.Sprintf("invalid HTTP header name %q", pr.Header))
	}
	seen := map[string]int{}
	last, lastName := -1, "" // the least important class listed so far
	for i, cl := range pr.Classes {
		p := fmt.Sprintf("priorities.classes[%d]", i)
		k := classIndex(cl.Name)
		first, dup := seen[cl.Name]
		switch {
		case cl.Name == "":
			r.errorf(p+".name", "required")
		case k < 0:
			r.unknownClass(p+".name", cl.Name)
		case dup:
			r.errorf(p+".name", fmt.Sprintf("duplicate class %q (also priorities.classes[%d])", cl.Name, first))
		case k < last:
			r.errorf(p+".name", fmt.Sprintf("%s is listed after %s: list classes most important first (%s)", cl.Name, lastName, validClasses()))
		default:
			last, lastName = k, cl.Name
		}
		if !dup {
			seen[cl.Name] = i
		}
		if cl.SLOFactor <= 0 {
			r.errorf(p+".slo_factor", "must be positive")
		}
	}
	if classIndex(pr.Default) < 0 {
		r.unknownClass("priorities.default", pr.Default)
	}
}

// unknownClass reports a name that is not one of admission's classes.
func (r *report) unknownClass(path, name string) {
	r.errorf(path, fmt.Sprintf("unknown class %q (one of: %s)", name, validClasses()))
}

func (r *report) validateKeys(c *Config) {
	names := map[string]int{}
	hashes := map[KeyHash]int{}
	models := map[string]bool{}
	for _, m := range c.Models {
		models[m.Name] = true
	}
	for i, k := range c.APIKeys {
		p := fmt.Sprintf("api_keys[%d]", i)
		r.uniqueName(p+".name", k.Name, "key", names, i, "api_keys")
		switch first, dup := hashes[k.Key]; {
		case !r.set(p + ".key"):
			r.errorf(p+".key", "required: ${ENV_VAR} or sha256:<hex>")
		case dup:
			r.errorf(p+".key", fmt.Sprintf("the same key as api_keys[%d]", first))
		default:
			hashes[k.Key] = i
		}
		// A priority left out (or "") is priorities.default, whose errors are reported there.
		if f, ok := r.fields[p+".priority"]; ok && !f.empty && classIndex(k.Priority) < 0 {
			r.unknownClass(p+".priority", k.Priority)
		}
		for j, m := range k.Models {
			if !models[m] {
				r.errorf(fmt.Sprintf("%s.models[%d]", p, j), fmt.Sprintf("unknown model %q", m))
			}
		}
		if k.Limits.RequestsPerMinute < 0 {
			r.errorf(p+".limits.requests_per_minute", "must be >= 0 (0: unlimited)")
		}
		switch tpm := k.Limits.TokensPerMinute; {
		case tpm < 0:
			r.errorf(p+".limits.tokens_per_minute", "must be >= 0 (0: unlimited)")
		case tpm > 0 && tpm < admission.DefaultCompletionTokens:
			r.errorf(p+".limits.tokens_per_minute", fmt.Sprintf("must be 0 (unlimited) or at least %d: a request without max_tokens reserves %d tokens, and could never pass",
				admission.DefaultCompletionTokens, admission.DefaultCompletionTokens))
		}
	}
}

func (r *report) validateLimits(c *Config) {
	l := c.Limits
	if l.MaxBodyBytes <= 0 || l.MaxBodyBytes > maxBodyLimit {
		r.errorf("limits.max_body_bytes", "must be between 1 and 1GiB")
	}
	if l.HeaderReadTimeout <= 0 {
		r.errorf("limits.header_read_timeout", "must be positive")
	}
	if l.DrainTimeout < 0 {
		r.errorf("limits.drain_timeout", "must be >= 0")
	}
	if l.ShutdownGrace < 0 {
		r.errorf("limits.shutdown_grace", "must be >= 0")
	}
	if l.QueueSize <= 0 {
		r.errorf("limits.queue_size", "must be positive")
	}
	if l.QueueTimeout <= 0 {
		r.errorf("limits.queue_timeout", "must be positive")
	}
	r.timeouts("limits.timeouts", l.Timeouts)
}
