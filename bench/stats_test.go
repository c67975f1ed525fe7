package bench

import (
	"math"
	"slices"
	"testing"
)

// refPercentile is the definition, computed the slow way: the smallest sample value v such that at least p% of
// the samples are <= v.
func refPercentile(xs []float64, p float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	for _, v := range s {
		n := 0
		for _, x := range s {
			if x <= v {
				n++
			}
		}
		if float64(n) >= p/100*float64(len(s))-1e-9 {
			return v
		}
	}
	return s[len(s)-1]
}

func TestPercentileAgainstReference(t *testing.T) {
	r := newTestRand()
	for _, n := range []int{1, 2, 3, 7, 10, 99, 100, 101, 999, 1000, 1001} {
		xs := make([]float64, n)
		for i := range xs {
			xs[i] = math.Round(r.ExpFloat64()*1000) / 10 // ties happen
		}
		q := Summarize(slices.Clone(xs))
		for _, c := range []struct {
			p   float64
			got float64
		}{{50, q.P50}, {90, q.P90}, {99, q.P99}, {99.9, q.P999}} {
			if want := refPercentile(xs, c.p); c.got != want {
				t.Errorf("n=%d p%v: got %v, want %v", n, c.p, c.got, want)
			}
		}
		sum := 0.0
		for _, x := range xs {
			sum += x
		}
		if math.Abs(q.Mean-sum/float64(n)) > 1e-9 || q.Max != slices.Max(xs) || q.N != n {
			t.Errorf("n=%d: mean %v max %v", n, q.Mean, q.Max)
		}
	}
}

func TestPercentileKnownValues(t *testing.T) {
	xs := make([]float64, 1000)
	for i := range xs {
		xs[i] = float64(1000 - i) // 1..1000, unsorted
	}
	q := Summarize(xs)
	if q.P50 != 500 || q.P90 != 900 || q.P99 != 990 || q.P999 != 999 || q.Max != 1000 || q.Mean != 500.5 {
		t.Fatalf("got %+v", q)
	}
	if (Summarize(nil) != Quantiles{}) {
		t.Fatal("empty sample must give zeros")
	}
}
