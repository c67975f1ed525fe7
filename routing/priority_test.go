package routing

import "testing"

func TestPriorityValue(t *testing.T) {
	for _, tc := range []struct {
		order PriorityOrder
		want  [3]int // critical, standard, sheddable
		send  bool
	}{
		{PriorityLowFirst, [3]int{-1, 0, 1}, true},  // vLLM: lower runs first
		{PriorityHighFirst, [3]int{1, 0, -1}, true}, // SGLang's default: higher runs first
		{PriorityNone, [3]int{0, 0, 0}, false},
	} {
		spec := NewEngineSpec(EngineSpec{Name: "e", Priority: tc.order})
		for rank := range 3 {
			v, ok := spec.PriorityValue(rank)
			if ok != tc.send || v != tc.want[rank] {
				t.Errorf("%v rank %d: %d, %v; want %d, %v", tc.order, rank, v, ok, tc.want[rank], tc.send)
			}
		}
	}
	for _, name := range BuiltinEngineNames() {
		if _, ok := BuiltinEngine(name).PriorityValue(0); ok {
			t.Errorf("built-in %s sends a priority: it depends on how the engine was started", name)
		}
	}
	var nilSpec *EngineSpec
	if _, ok := nilSpec.PriorityValue(0); ok {
		t.Error("a nil spec sends a priority")
	}
}
