package admission

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

// classCounters are switchyard_shed_total's children for one reason, one per class, resolved once so that a
// refusal does no label lookup. The zero value (no metrics) counts nothing.
type classCounters [NumClasses]prometheus.Counter

func newClassCounters(m *metrics.Gateway, reason string) classCounters {
	var cc classCounters
	if m == nil {
		return cc
	}
	for i := range cc {
		cc[i] = m.Shed.WithLabelValues(reason, ClassAt(i).String())
	}
	return cc
}

func (cc *classCounters) inc(c Class) {
	if x := cc[c.Index()]; x != nil {
		x.Inc()
	}
}

// shedCounters resolves switchyard_shed_total for every refusal an *Error can carry.
type shedCounters struct {
	byReason map[string]*classCounters
}

func newShedCounters(m *metrics.Gateway, reasons ...string) shedCounters {
	sc := shedCounters{byReason: make(map[string]*classCounters, len(reasons))}
	for _, r := range reasons {
		cc := newClassCounters(m, r)
		sc.byReason[r] = &cc
	}
	return sc
}

// count counts err's refusal for class c when err is an *Error with a known shed reason.
func (sc *shedCounters) count(err error, c Class) {
	e, ok := err.(*Error)
	if !ok || e.Reason == "" {
		return
	}
	if cc := sc.byReason[e.Reason]; cc != nil {
		cc.inc(c)
	}
}
