package bench

import (
	"math/rand/v2"
	"testing"
)

// testWorkload parses an inline workload (defaults apply; the name is "test").
func testWorkload(t *testing.T, yaml string) *Workload {
	t.Helper()
	w, err := ParseWorkload("test.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("workload: %v", err)
	}
	return w
}

func newTestRand() *rand.Rand { return rand.New(rand.NewPCG(1, 2)) }
