package admission

import (
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

func TestRetryBudgetLimit(t *testing.T) {
	for _, tc := range []struct {
		name          string
		percent       float64
		floor, active int
		want          int
	}{
		{"floor on a quiet gateway", 20, 3, 0, 3},
		{"floor beats a small share", 20, 3, 10, 3},
		{"share of live traffic", 20, 3, 100, 20},
		{"share rounds down", 20, 3, 104, 20},
		{"no floor", 10, 0, 5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := NewRetryBudget(tc.percent, tc.floor, nil)
			for range tc.active {
				b.Begin()
			}
			got := 0
			for range 1000 {
				if b.Allow() {
					got++
				}
			}
			if got != tc.want {
				t.Errorf("allowed %d retries, want %d", got, tc.want)
			}
			b.Done()
			if !b.Allow() && tc.want > 0 {
				t.Error("a finished retry did not free its place")
			}
		})
	}
	d := NewRetryBudget(0, -1, nil)
	if d.percent != DefaultRetryPercent || d.floor != DefaultRetryMinConcurrency {
		t.Errorf("defaults = %v%%, %d", d.percent, d.floor)
	}
}

// TestRetryBudgetHolds: a retry storm from many goroutines, each grabbing and holding every retry it can, gets
// exactly the budget between them; the budget follows live traffic.
func TestRetryBudgetHolds(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	b := NewRetryBudget(20, 3, m)
	for range 50 {
		b.Begin() // 50 requests live: budget max(3, 20% of 50) = 10
	}
	storm := func() int64 {
		var held atomic.Int64
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				for range 100 {
					if b.Allow() {
						held.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return held.Load()
	}
	if got := storm(); got != 10 || b.Retries() != 10 {
		t.Fatalf("the storm holds %d retries (%d counted), budget 10", got, b.Retries())
	}
	for range 10 {
		b.Done()
	}
	for range 25 {
		b.End() // traffic halves: budget max(3, 5) = 5
	}
	if got := storm(); got != 5 {
		t.Fatalf("the storm holds %d retries with 25 live requests, budget 5", got)
	}
	for range 5 {
		b.Done()
	}
	for range 25 {
		b.End() // idle: the floor
	}
	if got := storm(); got != 3 {
		t.Fatalf("the storm holds %d retries on an idle gateway, floor 3", got)
	}
	if got := value(t, m.BudgetDenied.WithLabelValues("retry")); got != 3*1600-18 {
		t.Errorf("denials counted %v, want %d", got, 3*1600-18)
	}
}

// TestHedgeBudgetHolds: however hard it is pushed, over N requests at most burst + floor(N * percent) hedges,
// and, spent greedily, exactly that.
func TestHedgeBudgetHolds(t *testing.T) {
	for _, tc := range []struct {
		percent float64
		burst   int
		n       int
	}{
		{5, 3, 1000}, {3, 1, 10000}, {0.5, 2, 999}, {50, 1, 51}, {33.3333, 1, 3000},
	} {
		b := NewHedgeBudget(tc.percent, tc.burst, nil)
		hedges := 0
		for range tc.n {
			b.Request()
			for b.Allow() { // try to hedge every request as often as the budget lets it
				hedges++
			}
		}
		want := tc.burst + int(float64(tc.n)*tc.percent/100+1e-9)
		if hedges != want {
			t.Errorf("%v%% burst %d over %d requests: %d hedges, want exactly %d", tc.percent, tc.burst, tc.n, hedges, want)
		}
	}
}

func TestHedgeBudgetConcurrent(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	b := NewHedgeBudget(5, 3, m)
	var hedges atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 10000 {
				b.Request()
				for range 2 { // greedy: try twice per request
					if b.Allow() {
						hedges.Add(1)
					}
				}
			}
		})
	}
	wg.Wait()
	if max := int64(3 + 80000*5/100); hedges.Load() > max {
		t.Errorf("%d hedges over 80000 requests, budget %d", hedges.Load(), max)
	}
	if hedges.Load() < 80000*5/100-8 {
		t.Errorf("only %d hedges: the budget is not handed out", hedges.Load())
	}
	if got := value(t, m.BudgetDenied.WithLabelValues("hedge")); got == 0 {
		t.Error("denials not counted")
	}
}

func TestBudgetsDoNotAllocate(t *testing.T) {
	r := NewRetryBudget(20, 3, nil)
	h := NewHedgeBudget(5, 3, nil)
	if a := testing.AllocsPerRun(100, func() {
		r.Begin()
		if r.Allow() {
			r.Done()
		}
		r.End()
		h.Request()
		h.Allow()
	}); a != 0 {
		t.Errorf("budgets allocate %v times", a)
	}
}
