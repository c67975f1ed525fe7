package admission

// Class is a request's priority class. The zero value is Standard, so a field nobody set never promotes a
// request. Classes are ordered: Critical > Standard > Sheddable (compare with Above, or the values themselves:
// a larger Class is more important).
type Class int8

// The priority classes (docs/design.md, "Routing and protection"). Critical traffic keeps its latency: it is never
// shed on a prediction, only queued. Standard traffic is shed only when it would miss its objective anyway. Sheddable
// traffic gives way first: gradually as the fleet saturates, and whenever it would miss its objective.
const (
	Sheddable Class = -1
	Standard  Class = 0
	Critical  Class = 1
)

// NumClasses is the number of classes; Class.Index maps each to [0, NumClasses).
const NumClasses = 3

// Index returns c's position from the most important: Critical 0, Standard 1, Sheddable 2. Queue bands and
// per-class tables are indexed by it. An out-of-range Class counts as the nearest valid one.
func (c Class) Index() int {
	switch {
	case c >= Critical:
		return 0
	case c <= Sheddable:
		return 2
	}
	return 1
}

// Above reports whether c is more important than d.
func (c Class) Above(d Class) bool { return c.Index() < d.Index() }

var classNames = [NumClasses]string{"critical", "standard", "sheddable"}

// String returns the class name as the policy, the priority header and metric labels spell it.
func (c Class) String() string { return classNames[c.Index()] }

// ClassAt returns the class whose Index is i (0 Critical, 1 Standard, 2 Sheddable).
func ClassAt(i int) Class { return Critical - Class(i) }

// ParseClass returns the class named s ("critical", "standard" or "sheddable", ASCII case-insensitive,
// surrounding spaces ignored) and whether s named one. It does not allocate, so the request path can pass a
// header value as is.
func ParseClass(s []byte) (Class, bool) {
	s = trimSpace(s)
	for i, n := range classNames {
		if equalFold(s, n) {
			return ClassAt(i), true
		}
	}
	return Standard, false
}

// DefaultPriorityHeader is the request header in which a client names its class, unless the policy's
// priorities.header says otherwise.
const DefaultPriorityHeader = "x-switchyard-priority"

// Priorities decides a request's class. Build it from the policy's priorities section; the zero value makes
// every request Standard, with SLO factors of 1. It is immutable once built and safe for concurrent use.
//
// The rule (from the API key or the priority header, docs/design.md, "Routing and protection"):
//   - A request's base class is its API key's class, or Default when no keys are configured (key nil).
//   - The priority header may choose any class at or below a ceiling: the key's class when keys are
//     configured, Critical when they are not (a gateway without keys trusts every caller equally). So a key's
//     class is the most its requests can claim, a critical key is "trusted" to mark each request, and any
//     caller may demote its own batch traffic to sheddable. An unknown header value is ignored (base class).
type Priorities struct {
	// Header is the request header the request path reads and passes to Class. Default DefaultPriorityHeader
	// (DefaultPriorities sets it; admission itself never reads headers).
	Header string
	// Default is the class of a request that names none when no keys are configured; the policy also gives it to
	// keys that name no priority. Default Standard (the zero value).
	Default Class
	// SLOFactor multiplies a model's TTFT objective for each class (indexed by Class.Index) when shedding and
	// when bounding a queued request's wait: below 1 sheds the class earlier, above 1 later. 0 means 1.
	// Defaults (DefaultPriorities): critical 2, standard 1, sheddable 0.5.
	SLOFactor [NumClasses]float64
}

// DefaultPriorities returns the policy's defaults: header x-switchyard-priority, Default Standard; SLO factors
// critical 2, standard 1, sheddable 0.5.
func DefaultPriorities() Priorities {
	return Priorities{Header: DefaultPriorityHeader, Default: Standard, SLOFactor: [NumClasses]float64{2, 1, 0.5}}
}

// Class returns the class of a request authenticated as key (nil when no keys are configured) that sent header
// (the priority header's value; nil or empty when absent). Call it once per request, after Authenticate. It
// does not allocate.
func (p *Priorities) Class(key *Key, header []byte) Class {
	base, ceiling := p.Default, Critical
	if key != nil {
		base, ceiling = key.Class, key.Class
	}
	if len(header) > 0 {
		if c, ok := ParseClass(header); ok {
			if c.Above(ceiling) {
				return ceiling
			}
			return c
		}
	}
	return base
}

// Factor returns the SLO factor of class c (1 when unset).
func (p *Priorities) Factor(c Class) float64 {
	if f := p.SLOFactor[c.Index()]; f > 0 {
		return f
	}
	return 1
}

func trimSpace(s []byte) []byte {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// equalFold reports whether s equals the lower-case ASCII t, ignoring ASCII case.
func equalFold(s []byte, t string) bool {
	if len(s) != len(t) {
		return false
	}
	for i := range len(s) {
		c := s[i]
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != t[i] {
			return false
		}
	}
	return true
}
