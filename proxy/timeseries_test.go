package proxy

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestTimeseriesHistBin(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{
		{0, 0},
		{100 * time.Microsecond, 0},
		{512 * time.Microsecond, 0},
		{639 * time.Microsecond, 0},
		{640 * time.Microsecond, 1},
		{1024 * time.Microsecond, 4},
		{1535 * time.Microsecond, 5},
		{1536 * time.Microsecond, 6},
		{time.Hour, histBins - 1},
		{-time.Second, 0},
	} {
		t.Run(tc.d.String(), func(t *testing.T) {
			if got := histBin(tc.d); got != tc.want {
				t.Errorf("histBin(%v) = %d, want %d", tc.d, got, tc.want)
			}
		})
	}
}

// TestTimeseriesQuantileError checks the stated bound: a quantile read from the histogram is within
// QuantileError of the exact sample quantile, for values inside the bins' range.
func TestTimeseriesQuantileError(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	worst := 0.0
	for trial := range 200 {
		var h hist
		n := 1 + r.IntN(500)
		vals := make([]time.Duration, n)
		for i := range vals {
			// Log-uniform over 0.6 ms .. 30 s.
			vals[i] = time.Duration(math.Exp(math.Log(0.6e6) + r.Float64()*(math.Log(30e9)-math.Log(0.6e6))))
			h[histBin(vals[i])]++
		}
		slices.Sort(vals)
		for _, q := range []float64{0.5, 0.9, 0.99, 1} {
			exact := float64(vals[int(math.Ceil(q*float64(n)))-1]) / 1e6
			got, ok := h.quantile(q)
			if !ok {
				t.Fatal("empty")
			}
			e := math.Abs(got-exact) / exact
			worst = max(worst, e)
			if e > QuantileError+1e-9 {
				t.Errorf("trial %d: q%.2f = %.3f ms, exact %.3f ms: error %.1f%% > %.1f%%", trial, q, got, exact, 100*e, 100*QuantileError)
			}
		}
	}
	t.Logf("worst relative error %.1f%% (bound %.1f%%)", 100*worst, 100*QuantileError)
}

func TestTimeseriesRingsAndSnapshot(t *testing.T) {
	t.Parallel()
	var ts timeseries
	const now = 1_700_000_000
	// 10 seconds of traffic on a and b: a 4 requests/s at 100 ms TTFT, b 2/s at 1 s; two sheds a second.
	for sec := int64(now - 10); sec < now; sec++ {
		for range 4 {
			ts.observe("a", &sample{sec: sec, ttft: 100 * time.Millisecond, itl: 20 * time.Millisecond, hasBackend: true})
		}
		for range 2 {
			ts.observe("b", &sample{sec: sec, ttft: time.Second, itl: 40 * time.Millisecond, hasBackend: true})
			ts.observe("none", &sample{sec: sec, shed: true})
		}
	}
	// The current second is not reported; nor are seconds older than the window.
	ts.observe("a", &sample{sec: now, hasBackend: true})
	ts.observe("a", &sample{sec: now - 400, hasBackend: true})
	out := ts.snapshot(now, 20, 2)
	if out.StepS != 2 || out.WindowS != 20 || len(out.T) != 10 || out.T[9] != now-2 {
		t.Fatalf("shape: step %d window %d t %v", out.StepS, out.WindowS, out.T)
	}
	names := []string{}
	for _, s := range out.Series {
		names = append(names, s.Name)
	}
	if !slices.Equal(names, []string{"fleet", "a", "b"}) {
		t.Fatalf("series %v, want fleet, a, b (no ring for requests that reached no backend)", names)
	}
	fleet, a, b := out.Series[0], out.Series[1], out.Series[2]
	last := len(out.T) - 1
	if fleet.RequestsPerS[last] != 8 || fleet.ShedPerS[last] != 2 || a.RequestsPerS[last] != 4 || b.ShedPerS[last] != 0 {
		t.Errorf("rates: fleet %v shed %v a %v b shed %v", fleet.RequestsPerS, fleet.ShedPerS, a.RequestsPerS, b.ShedPerS)
	}
	if !math.IsNaN(float64(a.TTFTP50[0])) || a.RequestsPerS[0] != 0 {
		t.Errorf("a point before the traffic: %v requests, TTFT %v; want 0 and none", a.RequestsPerS[0], a.TTFTP50[0])
	}
	within := func(got jsonMs, want float64) bool { return math.Abs(float64(got)-want) <= want*QuantileError }
	if !within(a.TTFTP50[last], 100) || !within(b.TTFTP99[last], 1000) || !within(fleet.TTFTP99[last], 1000) ||
		!within(fleet.TTFTP50[last], 100) || !within(b.ITLP50[last], 40) {
		t.Errorf("quantiles: a p50 %v, b p99 %v, fleet p50 %v p99 %v, b ITL %v", a.TTFTP50[last], b.TTFTP99[last],
			fleet.TTFTP50[last], fleet.TTFTP99[last], b.ITLP50[last])
	}
	js, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(js), `"ttft_p50_ms":[null,null,null,null,null,`) || !strings.Contains(string(js), `"requests_per_s":[`) {
		t.Errorf("JSON: %s", js[:min(len(js), 600)])
	}
	// A bucket is reused a ring's length later: the old second's counts are gone.
	ts.observe("a", &sample{sec: now - 10 + tsBuckets, hasBackend: true})
	if got := ts.snapshot(now-10+tsBuckets+1, 1, 1).Series[1].RequestsPerS[0]; got != 1 {
		t.Errorf("a reused bucket counts %v, want 1", got)
	}
}

// TestTimeseriesSeriesBound: at most maxSeries backends have a ring; a new one takes the ring of one idle for
// the whole window, and otherwise counts in the fleet only.
func TestTimeseriesSeriesBound(t *testing.T) {
	t.Parallel()
	var ts timeseries
	const now = 1_700_000_000
	for i := range maxSeries {
		ts.observe(fmt.Sprintf("b%d", i), &sample{sec: now - tsBuckets - 1 + int64(min(i, 1))*tsBuckets, hasBackend: true})
	}
	// b0 is idle for longer than the window; the others are not.
	ts.observe("new1", &sample{sec: now, hasBackend: true})
	ts.observe("new2", &sample{sec: now, hasBackend: true})
	m := *ts.byName.Load()
	if len(m) != maxSeries || m["b0"] != nil || m["new1"] == nil || m["new2"] != nil {
		t.Errorf("rings: %d, b0 %v new1 %v new2 %v", len(m), m["b0"] != nil, m["new1"] != nil, m["new2"] != nil)
	}
	if got := ts.snapshot(now+1, 1, 1).Series[0].RequestsPerS[0]; got != 2 {
		t.Errorf("the fleet counts %v requests in the last second, want 2", got)
	}
}
