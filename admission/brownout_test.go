package admission

import "testing"

func TestBrownout(t *testing.T) {
	b := DefaultBrownout()
	idle := Pool{Saturation: 0.1}
	for _, tc := range []struct {
		name              string
		class             Class
		primary, degraded Pool
		want              bool
	}{
		{"calm primary", Standard, Pool{Saturation: 0.3}, idle, false},
		{"sheddable at the shedding onset", Sheddable, Pool{Saturation: 0.4}, idle, true},
		{"standard below its threshold", Standard, Pool{Saturation: 0.7}, idle, false},
		{"standard near full", Standard, Pool{Saturation: 0.9}, idle, true},
		{"standard when every backend is saturated", Standard, Pool{Saturation: 0.6, Saturated: true}, idle, true},
		{"critical never", Critical, Pool{Saturation: 1.5, Saturated: true}, idle, false},
		{"degraded pool saturated too", Standard, Pool{Saturation: 1, Saturated: true}, Pool{Saturation: 0.5, Saturated: true}, false},
		{"degraded pool no better", Sheddable, Pool{Saturation: 0.6}, Pool{Saturation: 0.8}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := b.Degrade(tc.class, tc.primary, tc.degraded); got != tc.want {
				t.Errorf("Degrade = %v, want %v", got, tc.want)
			}
		})
	}
	if (Brownout{}).Degrade(Sheddable, Pool{Saturation: 1.5, Saturated: true}, idle) {
		t.Error("the zero Brownout degrades")
	}
}
