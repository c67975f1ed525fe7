package bench

import (
	"math"
	"slices"
	"time"
)

// Quantiles summarises a sample of latencies in milliseconds. Percentiles use the nearest-rank definition: the
// p-th percentile is the smallest value such that at least p% of the sample is less than or equal to it (so it is
// always an observed value, and p99.9 of fewer than 1,000 values is the maximum). All fields are 0 when N is 0.
type Quantiles struct {
	N    int     `json:"n"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p999"`
	Mean float64 `json:"mean"`
	Max  float64 `json:"max"`
}

// Summarize computes Quantiles of xs (milliseconds). It sorts xs in place.
func Summarize(xs []float64) Quantiles {
	if len(xs) == 0 {
		return Quantiles{}
	}
	slices.Sort(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return Quantiles{
		N:    len(xs),
		P50:  Percentile(xs, 50),
		P90:  Percentile(xs, 90),
		P99:  Percentile(xs, 99),
		P999: Percentile(xs, 99.9),
		Mean: sum / float64(len(xs)),
		Max:  xs[len(xs)-1],
	}
}

// Percentile returns the nearest-rank p-th percentile (0 < p <= 100) of sorted, which must be sorted ascending
// and non-empty: sorted[ceil(p/100*n)-1].
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	// The small epsilon keeps p*n that is an exact integer in decimal (99.9% of 1000) from rounding up in binary.
	rank := int(math.Ceil(p/100*float64(n) - 1e-9))
	return sorted[min(max(rank, 1), n)-1]
}

// ms converts a duration to float milliseconds.
func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
