package admission

import (
	"testing"
)

func TestParseClass(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Class
		ok   bool
	}{
		{"critical", Critical, true},
		{"standard", Standard, true},
		{"sheddable", Sheddable, true},
		{"  Critical\t", Critical, true},
		{"SHEDDABLE", Sheddable, true},
		{"", Standard, false},
		{"urgent", Standard, false},
		{"critica", Standard, false},
		{"critical1", Standard, false},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, ok := ParseClass([]byte(tc.in))
			if got != tc.want || ok != tc.ok {
				t.Errorf("ParseClass(%q) = %v, %v; want %v, %v", tc.in, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestClassOrder(t *testing.T) {
	if !Critical.Above(Standard) || !Standard.Above(Sheddable) || Sheddable.Above(Critical) || Standard.Above(Standard) {
		t.Error("class order is not critical > standard > sheddable")
	}
	for i := range NumClasses {
		if ClassAt(i).Index() != i {
			t.Errorf("ClassAt(%d).Index() = %d", i, ClassAt(i).Index())
		}
	}
	if Class(5).Index() != 0 || Class(-7).Index() != 2 {
		t.Error("out-of-range classes must clamp to the nearest class")
	}
	var zero Class
	if zero != Standard {
		t.Error("the zero Class must be Standard, so that an unset field never promotes a request")
	}
}

func TestPrioritiesClass(t *testing.T) {
	p := DefaultPriorities()
	batch := &Key{Name: "batch", Class: Sheddable}
	team := &Key{Name: "team", Class: Standard}
	trusted := &Key{Name: "svc", Class: Critical}
	for _, tc := range []struct {
		name   string
		key    *Key
		header string
		want   Class
	}{
		{"no keys, no header: default", nil, "", Standard},
		{"no keys: header chooses critical", nil, "critical", Critical},
		{"no keys: header chooses sheddable", nil, "sheddable", Sheddable},
		{"no keys: unknown header ignored", nil, "vip", Standard},
		{"key class without header", batch, "", Sheddable},
		{"key cannot raise itself", batch, "critical", Sheddable},
		{"standard key cannot claim critical", team, "critical", Standard},
		{"standard key may demote itself", team, "sheddable", Sheddable},
		{"critical key is trusted to choose", trusted, "standard", Standard},
		{"critical key keeps critical", trusted, "", Critical},
		{"unknown header keeps the key's class", trusted, "bogus", Critical},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h []byte
			if tc.header != "" {
				h = []byte(tc.header)
			}
			if got := p.Class(tc.key, h); got != tc.want {
				t.Errorf("Class = %v, want %v", got, tc.want)
			}
		})
	}
	sheddableDefault := Priorities{Default: Sheddable}
	if got := sheddableDefault.Class(nil, nil); got != Sheddable {
		t.Errorf("Default is not applied: %v", got)
	}
	if f := (&Priorities{}).Factor(Critical); f != 1 {
		t.Errorf("unset factor = %v, want 1", f)
	}
	if f := p.Factor(Sheddable); f != 0.5 {
		t.Errorf("default sheddable factor = %v, want 0.5", f)
	}
}
