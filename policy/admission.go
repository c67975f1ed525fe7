package policy

import (
	"strings"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/proxy"
)

// This file turns the policy's protection settings (priorities, api_keys, the queue limits) into admission's
// runtime objects. admission owns the rules; the policy only names them.

// classIndex returns the admission.Class.Index of the class the policy names name (critical, standard or
// sheddable, lower case as admission spells them), or -1 when name is none of them.
func classIndex(name string) int {
	for i := range admission.NumClasses {
		if admission.ClassAt(i).String() == name {
			return i
		}
	}
	return -1
}

// classOf returns the class named name; validation has ruled out other names.
func classOf(name string) admission.Class {
	if i := classIndex(name); i >= 0 {
		return admission.ClassAt(i)
	}
	return admission.Standard
}

// validClasses lists the class names, most important first, for error messages: "critical, standard, sheddable".
func validClasses() string {
	names := make([]string, admission.NumClasses)
	for i := range names {
		names[i] = admission.ClassAt(i).String()
	}
	return strings.Join(names, ", ")
}

// priorities returns how requests get their class: admission's defaults, with the policy's header, default class
// and SLO factors.
func (c *Config) priorities() admission.Priorities {
	p := admission.DefaultPriorities()
	p.Header = c.Priorities.Header
	p.Default = classOf(c.Priorities.Default)
	for _, cl := range c.Priorities.Classes {
		if i := classIndex(cl.Name); i >= 0 {
			p.SLOFactor[i] = cl.SLOFactor
		}
	}
	return p
}

// keys builds the API key set; nil when the policy has none (no authentication). The keys hold only hashes: the
// decoder hashed ${ENV} keys as it read them.
func (c *Config) keys() (*admission.Keys, error) {
	cfgs := make([]admission.KeyConfig, len(c.APIKeys))
	for i, k := range c.APIKeys {
		cfgs[i] = admission.KeyConfig{
			Name:              k.Name,
			Hash:              k.Key,
			Class:             classOf(k.Priority),
			Models:            k.Models,
			RequestsPerMinute: int64(k.Limits.RequestsPerMinute),
			TokensPerMinute:   int64(k.Limits.TokensPerMinute),
			CacheOptIn:        k.CacheOptIn,
			Budget:            budgetOf(&c.APIKeys[i]),
			Objective:         k.Objective,
		}
	}
	return admission.NewKeys(cfgs)
}

// hasKeyLimits reports whether some key has a rate limit.
func (c *Config) hasKeyLimits() bool {
	for _, k := range c.APIKeys {
		if k.Limits.RequestsPerMinute > 0 || k.Limits.TokensPerMinute > 0 {
			return true
		}
	}
	return false
}

// compileAdmission fills s's admission settings from c. keys is what c.keys built; prev is the snapshot being
// replaced (nil on the first load).
//
// The limiter is built on the previous snapshot's, so that a key that keeps its name keeps its buckets across
// the reload (a reload neither refills nor empties a budget), and it is nil when no key has a limit (the
// request path then skips rate limiting). Building it installs the new limits in the buckets it shares with the
// previous limiter at once: call it only when nothing can fail any more. The shedder is always built, so that
// shedding on a prediction and the sheddable curve work without keys; it takes the policy's SLO factors.
func (c *Config) compileAdmission(s *proxy.Snapshot, keys *admission.Keys, prev *proxy.Snapshot, m *metrics.Gateway) {
	s.Keys = keys
	s.Priorities = c.priorities()
	if c.hasKeyLimits() {
		var old *admission.LocalLimiter
		if prev != nil {
			switch l := prev.Limiter.(type) {
			case *admission.LocalLimiter:
				old = l
			case localer: // a shared limiter (Shared.Limiter) around one
				old = l.Local()
			}
		}
		// Limiter is an interface: assign only a non-nil limiter, so that "no limiter" stays a nil interface.
		s.Limiter = admission.NewLocalLimiter(keys, old, nil, m)
	}
	s.Objectives = proxy.Objectives{Header: c.Objectives.Header, SecondsPerDollar: c.Objectives.SecondsPerDollar}
	if c.hasBudgets() { // cost.go
		var old *admission.LocalSpender
		if prev != nil {
			switch sp := prev.Spender.(type) {
			case *admission.LocalSpender:
				old = sp
			case spendLocaler:
				old = sp.Local()
			}
		}
		s.Spender = admission.NewLocalSpender(keys, old, nil, m)
	}
	if c.Limits.Shedding == nil || *c.Limits.Shedding {
		sp := admission.DefaultShedParams()
		sp.Priorities = s.Priorities
		s.Shedder = admission.NewShedder(sp, m)
	}
	s.Queue = proxy.QueueSettings{Size: c.Limits.QueueSize, Timeout: c.Limits.QueueTimeout}
}

// spendLocaler is a shared spender that decides on a local one when it cannot share (admission.RedisSpender).
type spendLocaler interface {
	Local() *admission.LocalSpender
}

// localer is a shared rate limiter that decides on a local one when it cannot share (admission.RedisLimiter).
type localer interface {
	Local() *admission.LocalLimiter
}
