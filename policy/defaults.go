package policy

import (
	"fmt"
	"slices"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
)

// The schema's defaults: what an absent field means. Each is also stated on its field and in docs/config.md.
const (
	defaultListen            = "127.0.0.1:8080"
	defaultAdminListen       = "127.0.0.1:9090"
	defaultRegion            = "local"
	defaultRetries           = 2
	defaultWeight            = 1.0
	defaultTier              = "dedicated"
	defaultMaxBodyBytes      = 32 << 20
	defaultHeaderReadTimeout = 10 * time.Second
	defaultDrainTimeout      = 60 * time.Second
	defaultShutdownGrace     = 5 * time.Second
	defaultQueueSize         = 1024
	defaultQueueTimeout      = 10 * time.Second
	defaultHedgeBudget       = 5.0
	defaultPriorityHeader    = admission.DefaultPriorityHeader
)

// defaultPriority is the class of a request that names none: admission's default.
var defaultPriority = admission.DefaultPriorities().Default.String()

var defaultTimeouts = Timeouts{
	Connect:   5 * time.Second,
	FirstByte: 60 * time.Second,
	Idle:      60 * time.Second,
	Total:     30 * time.Minute,
}

// defaultClasses are admission's classes, most important first, with their default SLO factors.
var defaultClasses = func() []PriorityClass {
	p := admission.DefaultPriorities()
	cs := make([]PriorityClass, admission.NumClasses)
	for i := range cs {
		cs[i] = PriorityClass{Name: admission.ClassAt(i).String(), SLOFactor: p.Factor(admission.ClassAt(i))}
	}
	return cs
}()

// applyDefaults fills what the file left out. A string field that is empty counts as absent (so ${VAR:-} can
// ask for the default); a number, duration or size counts as absent only when the file does not set it, so that
// an explicit 0 is validated rather than replaced.
func (r *report) applyDefaults(c *Config) {
	str := func(s *string, def string) {
		if *s == "" {
			*s = def
		}
	}
	str(&c.Listen, defaultListen)
	r.defaultCost(c) // cost.go
	str(&c.AdminListen, defaultAdminListen)
	str(&c.Region, defaultRegion)
	str(&c.Auth, AuthAPIKeys)
	r.defaultRedis(&c.Redis)
	r.responseCaches(c, false) // respcache.go
	r.defaultObserve(c)        // observe.go

	l := &c.Limits
	if !r.set("limits.max_body_bytes") {
		l.MaxBodyBytes = defaultMaxBodyBytes
	}
	if !r.set("limits.header_read_timeout") {
		l.HeaderReadTimeout = defaultHeaderReadTimeout
	}
	if !r.set("limits.drain_timeout") {
		l.DrainTimeout = defaultDrainTimeout
	}
	if !r.set("limits.shutdown_grace") {
		l.ShutdownGrace = defaultShutdownGrace
	}
	if !r.set("limits.queue_size") {
		l.QueueSize = defaultQueueSize
	}
	if !r.set("limits.queue_timeout") {
		l.QueueTimeout = defaultQueueTimeout
	}
	r.defaultTimeouts(&l.Timeouts, "limits.timeouts", defaultTimeouts)

	for i := range c.Backends {
		b, p := &c.Backends[i], fmt.Sprintf("backends[%d]", i)
		str(&b.Region, c.Region)
		str(&b.Engine, routing.EngineVLLM)
		str(&b.Tier, defaultTier)
		if !r.set(p+".cost.cached_input") && b.Cost.Input >= 0 {
			b.Cost.CachedInput = b.Cost.Input
		}
		if !r.set(p + ".weight") {
			b.Weight = defaultWeight
		}
		r.defaultTimeouts(&b.Timeouts, p+".timeouts", l.Timeouts)
		if r.set(p + ".discover") {
			r.defaultDiscover(&b.Discover, p+".discover") // discover.go
		}
	}
	r.defaultEngines(c) // engines.go

	for i := range c.Models {
		m, p := &c.Models[i], fmt.Sprintf("models[%d]", i)
		str(&m.Strategy, DefaultStrategy)
		if !r.set(p + ".retries") {
			m.Retries = defaultRetries
		}
		if r.set(p+".hedge") && !r.set(p+".hedge.budget_percent") {
			m.Hedge.BudgetPercent = defaultHedgeBudget
		}
		if len(m.Targets) == 0 {
			for _, b := range c.Backends {
				t := Target{Backend: b.Name, Model: m.Name}
				if m.Name != "" && slices.Contains(b.Models, m.Name) && !slices.Contains(m.Targets, t) {
					m.Targets = append(m.Targets, t)
				}
			}
		}
		for j := range m.Targets {
			str(&m.Targets[j].Model, m.Name)
		}
	}

	pr := &c.Priorities
	str(&pr.Header, defaultPriorityHeader)
	str(&pr.Default, defaultPriority)
	if len(pr.Classes) == 0 {
		pr.Classes = slices.Clone(defaultClasses)
	} else {
		for i := range pr.Classes {
			if !r.set(fmt.Sprintf("priorities.classes[%d].slo_factor", i)) {
				pr.Classes[i].SLOFactor = 1 // an unknown class (an error) gets 1
				if j := classIndex(pr.Classes[i].Name); j >= 0 {
					pr.Classes[i].SLOFactor = defaultClasses[j].SLOFactor
				}
			}
		}
	}
	for i := range c.APIKeys {
		str(&c.APIKeys[i].Priority, pr.Default)
	}
}

func (r *report) defaultTimeouts(t *Timeouts, p string, def Timeouts) {
	for _, f := range []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"connect", &t.Connect, def.Connect},
		{"first_byte", &t.FirstByte, def.FirstByte},
		{"idle", &t.Idle, def.Idle},
		{"total", &t.Total, def.Total},
	} {
		if !r.set(p + "." + f.name) {
			*f.v = f.def
		}
	}
}
