package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Discovery: a backend with discover in place of url is a template that stands for every address a DNS name
// resolves to (a Kubernetes headless Service's ready pods), one backend per address, named
// <name>-<ip>:<port> (<name>-[<ipv6>]:<port>) with the URL http://<ip>:<port> and every other field of the
// template. Models that name the template (in targets, or by its models) are served by all of them.
//
// The watcher owns the lookups: it resolves each template when a policy is loaded (at start and on every reload
// that adds or changes one), then again every discover.interval in a goroutine of its Run. An answer that differs
// from the addresses in force is compiled and swapped in as a reload is (Compile, then an atomic swap), so a
// backend that keeps its address keeps its name, URL and learned state (routing.Registry.Sync). The rules for a
// bad answer:
//   - a failed lookup (timeout, SERVFAIL, no DNS server) keeps the addresses in force, however long it lasts,
//     logged once when it starts and once when it ends;
//   - an empty answer (no record, NXDOMAIN: what a headless Service with no ready pod answers) keeps the
//     addresses in force for emptyHold intervals, logged once, then drops them: a Deployment scaled to zero
//     leaves, a DNS hiccup during a rollout does not empty the fleet.
//
// docs/config.md documents the same rules for operators.

// Resolver is what discovery asks DNS. *net.Resolver implements it; tests give a fake.
type Resolver interface {
	// LookupHost returns the addresses of host.
	LookupHost(ctx context.Context, host string) ([]string, error)
	// LookupSRV returns the SRV records of name (service and proto empty: name is looked up as given).
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

var _ Resolver = (*net.Resolver)(nil)

// WithResolver makes the watcher discover backends through r instead of net.DefaultResolver.
func WithResolver(r Resolver) WatcherOption { return func(w *Watcher) { w.resolver = r } }

// The discover types.
const (
	DiscoverA   = "a"   // address records (A and AAAA) of dns, each served on port
	DiscoverSRV = "srv" // SRV records of dns: each record's target and port
)

const (
	defaultDiscoverType     = DiscoverA
	defaultDiscoverInterval = 10 * time.Second
	minDiscoverInterval     = time.Second
	// emptyHold is how many intervals an empty answer keeps the addresses in force before they are dropped.
	emptyHold = 3
	// maxLookup bounds one lookup (all of an SRV answer's hosts together), at most an interval.
	maxLookup = 5 * time.Second
)

// dnsRE is a DNS name: dot-separated labels of letters, digits, '-' and '_' (SRV names: _http._tcp.svc), an
// optional final dot.
var dnsRE = regexp.MustCompile(`^([A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.)*[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.?$`)

// defaultDiscover fills a discover section the file set.
func (r *report) defaultDiscover(d *Discover, p string) {
	if d.Type == "" {
		d.Type = defaultDiscoverType
	}
	if !r.set(p + ".interval") {
		d.Interval = defaultDiscoverInterval
	}
}

// validateDiscover checks backends[i] (at p) when it sets discover: not with url, a DNS name, a type, a port
// for type a and none for srv, an interval of at least a second; and that no other backend's name could be
// one of its instances'.
func (r *report) validateDiscover(c *Config, p string, b *Backend) {
	d := b.Discover
	dp := p + ".discover"
	if r.set(p + ".url") {
		r.errorf(dp, "url and discover are exclusive: give url for one server, discover for the addresses a DNS name resolves to")
	}
	switch {
	case d.DNS == "":
		r.errorf(dp+".dns", "required: the DNS name to resolve, such as vllm.inference.svc.cluster.local")
	case len(d.DNS) > 253 || !dnsRE.MatchString(d.DNS) || net.ParseIP(d.DNS) != nil:
		r.errorf(dp+".dns", fmt.Sprintf("invalid DNS name %q: a host name, without scheme or port", d.DNS))
	}
	switch d.Type {
	case DiscoverA:
		if !r.set(dp + ".port") {
			r.errorf(dp+".port", "required with type a: the port the instances serve on")
		} else if d.Port < 1 || d.Port > 65535 {
			r.errorf(dp+".port", "must be between 1 and 65535")
		}
	case DiscoverSRV:
		if r.set(dp + ".port") {
			r.errorf(dp+".port", "not with type srv: each SRV record carries its port")
		}
	default:
		r.errorf(dp+".type", fmt.Sprintf("unknown type %q (one of: %s, %s)", d.Type, DiscoverA, DiscoverSRV))
	}
	if d.Interval < minDiscoverInterval {
		r.errorf(dp+".interval", fmt.Sprintf("must be at least %v", minDiscoverInterval))
	}
	for i := range c.Backends {
		if o := &c.Backends[i]; !o.discovers() && strings.HasPrefix(o.Name, b.Name+"-") {
			r.errorf(fmt.Sprintf("backends[%d].name", i), fmt.Sprintf("names starting with %q are reserved for the instances discovered for backend %s", b.Name+"-", b.Name))
		}
	}
}

// discovers reports whether b is a discovery template.
func (b *Backend) discovers() bool { return b.Discover.DNS != "" || b.Discover.Type != "" }

// expandBackends returns c's backends with each template replaced by one backend per address found[name]
// (host:port, sorted) holds for it, and the instances' names by template name.
func (c *Config) expandBackends(found map[string][]string) ([]Backend, map[string][]string) {
	out := make([]Backend, 0, len(c.Backends))
	instances := map[string][]string{}
	for _, b := range c.Backends {
		if !b.discovers() {
			out = append(out, b)
			continue
		}
		names := []string{} // a template without addresses still has an entry: its targets expand to none
		for _, addr := range found[b.Name] {
			e := b
			e.Name = b.Name + "-" + addr
			e.URL = "http://" + addr
			e.Discover = Discover{}
			out = append(out, e)
			names = append(names, e.Name)
		}
		instances[b.Name] = names
	}
	return out, instances
}

// expandTargets replaces each target that names a template with one target per instance.
func expandTargets(ts []Target, instances map[string][]string) []Target {
	out := make([]Target, 0, len(ts))
	for _, t := range ts {
		names, ok := instances[t.Backend]
		if !ok {
			out = append(out, t)
			continue
		}
		for _, n := range names {
			out = append(out, Target{Backend: n, Model: t.Model})
		}
	}
	return out
}

// lookup resolves d to its instances' addresses (host:port), sorted, each once. An answer without records
// (NXDOMAIN included) is an empty list and no error.
func lookup(ctx context.Context, res Resolver, d Discover) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, min(d.Interval, maxLookup))
	defer cancel()
	var addrs []string
	switch d.Type {
	case DiscoverSRV:
		_, srvs, err := res.LookupSRV(ctx, "", "", d.DNS)
		if err != nil {
			return nil, notFound(err)
		}
		for _, s := range srvs {
			host := strings.TrimSuffix(s.Target, ".")
			ips := []string{host}
			if net.ParseIP(host) == nil {
				if ips, err = res.LookupHost(ctx, host); err != nil {
					if err = notFound(err); err != nil {
						return nil, err
					}
				}
			}
			for _, ip := range ips {
				addrs = append(addrs, net.JoinHostPort(ip, strconv.Itoa(int(s.Port))))
			}
		}
	default:
		ips, err := res.LookupHost(ctx, d.DNS)
		if err != nil {
			return nil, notFound(err)
		}
		for _, ip := range ips {
			addrs = append(addrs, net.JoinHostPort(ip, strconv.Itoa(d.Port)))
		}
	}
	slices.Sort(addrs)
	return slices.Compact(addrs), nil
}

// notFound returns nil for a DNS answer that the name has no such records, err otherwise.
func notFound(err error) error {
	var de *net.DNSError
	if errors.As(err, &de) && de.IsNotFound {
		return nil
	}
	return fmt.Errorf("discover: %w", err)
}

// discovery is what the watcher knows about one template. The watcher's mu guards it.
type discovery struct {
	spec       Discover  // what is looked up; a reload that changes it starts a new discovery
	addrs      []string  // the addresses in force, sorted
	next       time.Time // when to look again
	emptySince time.Time // when the answers became empty while addrs were kept; zero otherwise
	failing    bool      // the last lookup failed (logged when it started)
}

// update applies one lookup's outcome at now and reports whether the addresses in force changed. It logs the
// start and the end of failures, and of empty answers, once each.
func (d *discovery) update(name string, addrs []string, err error, now time.Time, log *slog.Logger) bool {
	d.next = now.Add(d.spec.Interval)
	if err != nil {
		if !d.failing {
			log.Warn("backend discovery failed; the addresses in force stay until it succeeds", "backend", name,
				"dns", d.spec.DNS, "addresses", len(d.addrs), "error", err.Error())
		}
		d.failing = true
		return false
	}
	if d.failing {
		log.Info("backend discovery recovered", "backend", name, "dns", d.spec.DNS, "addresses", len(addrs))
		d.failing = false
	}
	if len(addrs) == 0 && len(d.addrs) > 0 {
		hold := emptyHold * d.spec.Interval
		if d.emptySince.IsZero() {
			d.emptySince = now
			log.Warn("backend discovery found no address; the addresses in force stay for a while", "backend", name,
				"dns", d.spec.DNS, "addresses", len(d.addrs), "for", hold)
		}
		if now.Sub(d.emptySince) < hold {
			return false
		}
		log.Warn("backend discovery found no address for too long; dropping the instances", "backend", name,
			"dns", d.spec.DNS, "dropped", len(d.addrs))
	}
	d.emptySince = time.Time{}
	if slices.Equal(addrs, d.addrs) {
		return false
	}
	added, removed := diff(addrs, d.addrs)
	if len(addrs) > 0 || len(d.addrs) > 0 {
		log.Info("backend discovery", "backend", name, "dns", d.spec.DNS, "addresses", len(addrs), "added", added, "removed", removed)
	}
	d.addrs = addrs
	return true
}

// diff returns how many of now are not in was, and of was not in now (both sorted).
func diff(now, was []string) (added, removed int) {
	for _, a := range now {
		if _, ok := slices.BinarySearch(was, a); !ok {
			added++
		}
	}
	for _, a := range was {
		if _, ok := slices.BinarySearch(now, a); !ok {
			removed++
		}
	}
	return added, removed
}

// nextDiscovery returns the discoveries of c's templates, and the addresses to compile c with: a template whose
// discover section is unchanged keeps its discovery, a new or changed one is looked up now (at most maxLookup).
// The caller installs them with setDiscovery once c is in force. w.mu must be held (or w not yet shared).
func (w *Watcher) nextDiscovery(ctx context.Context, c *Config) (map[string]*discovery, map[string][]string) {
	next := map[string]*discovery{}
	for i := range c.Backends {
		b := &c.Backends[i]
		if !b.discovers() {
			continue
		}
		if d, ok := w.disc[b.Name]; ok && d.spec == b.Discover {
			next[b.Name] = d
			continue
		}
		d := &discovery{spec: b.Discover}
		addrs, err := lookup(ctx, w.resolver, d.spec)
		d.update(b.Name, addrs, err, time.Now(), w.log)
		next[b.Name] = d
	}
	return next, addresses(next)
}

// addresses returns the addresses in force of each discovery, by template name.
func addresses(disc map[string]*discovery) map[string][]string {
	out := make(map[string][]string, len(disc))
	for name, d := range disc {
		out[name] = d.addrs
	}
	return out
}

// setDiscovery installs the discoveries of the policy just put in force (forgetting the templates it no longer
// has) and tells the discovery loop. w.mu must be held.
func (w *Watcher) setDiscovery(disc map[string]*discovery) {
	w.disc = disc
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// discover is Run's discovery loop: it looks each template up when its interval has passed, and compiles and
// swaps in the policy with the new addresses when an answer changes them. It returns when ctx is done; a lookup
// under way is cancelled then. Time is the package time's, so that tests run it in a testing/synctest bubble.
func (w *Watcher) discover(ctx context.Context) {
	for {
		var wait <-chan time.Time
		w.mu.Lock()
		var next time.Time
		for _, d := range w.disc {
			if next.IsZero() || d.next.Before(next) {
				next = d.next
			}
		}
		w.mu.Unlock()
		var t *time.Timer
		if !next.IsZero() {
			t = time.NewTimer(time.Until(next))
			wait = t.C
		}
		select {
		case <-ctx.Done():
			if t != nil {
				t.Stop()
			}
			return
		case <-w.wake:
		case <-wait:
		}
		if t != nil {
			t.Stop()
		}
		w.refresh(ctx)
	}
}

// refresh looks up every template that is due, without holding w.mu, then applies the answers to the
// discoveries that are still the same (a reload may have replaced them meanwhile) and, when the addresses in
// force changed, compiles the policy in force with them and swaps it in.
func (w *Watcher) refresh(ctx context.Context) {
	type due struct {
		name string
		spec Discover
	}
	now := time.Now()
	var todo []due
	w.mu.Lock()
	for name, d := range w.disc {
		if !now.Before(d.next) {
			todo = append(todo, due{name, d.spec})
		}
	}
	w.mu.Unlock()
	if len(todo) == 0 {
		return
	}
	type answer struct {
		addrs []string
		err   error
	}
	answers := make([]answer, len(todo))
	for i, t := range todo {
		answers[i].addrs, answers[i].err = lookup(ctx, w.resolver, t.spec)
	}
	if ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	changed := false
	for i, t := range todo {
		if d, ok := w.disc[t.name]; ok && d.spec == t.spec {
			changed = d.update(t.name, answers[i].addrs, answers[i].err, time.Now(), w.log) || changed
		}
	}
	if !changed {
		return
	}
	c, cur := w.cfg.Load(), w.snap.Load()
	s, err := c.compile(w.reg, cur, w.m, addresses(w.disc))
	if err != nil {
		w.log.Error("backend discovery: compile failed; the previous backends stay", "error", err.Error())
		return
	}
	w.shared.apply(c, s, cur)
	w.snap.Store(s)
	w.log.Info("backends updated from discovery", "backends", len(s.Backends))
}
