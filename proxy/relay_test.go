package proxy

import (
	"strconv"
	"testing"
)

// TestCodeLabel: the status label is the code's decimal form, and a valid status costs no allocation.
func TestCodeLabel(t *testing.T) {
	for _, code := range []int{0, 99, 200, 429, 499, 502, 599, 600, 1000, -1} {
		if got, want := codeLabel(code), strconv.Itoa(code); got != want {
			t.Errorf("codeLabel(%d) = %q, want %q", code, got, want)
		}
	}
	var sink string
	if n := testing.AllocsPerRun(100, func() { sink = codeLabel(503) }); n != 0 {
		t.Fatalf("codeLabel(503) allocates %.0f times", n)
	}
	_ = sink
}
