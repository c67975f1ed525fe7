package admission

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

// TestSheddableCurve pins the default curve at several saturation levels: gentle onset, everything refused once
// every backend is at capacity.
func TestSheddableCurve(t *testing.T) {
	c := DefaultShedParams().Curves[Sheddable.Index()]
	for _, tc := range []struct {
		s, want float64
	}{
		{0, 0}, {0.2, 0.00032}, {0.4, 0.01024}, {0.5, 0.03125}, {0.7, 0.16807}, {0.9, 0.59049}, {1, 1}, {1.5, 1},
	} {
		if got := c.P(tc.s); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("P(%v) = %v, want %v", tc.s, got, tc.want)
		}
	}
	for _, i := range []int{Critical.Index(), Standard.Index()} {
		if p := DefaultShedParams().Curves[i].P(1.5); p != 0 {
			t.Errorf("class %v has a default curve (P(1.5) = %v)", ClassAt(i), p)
		}
	}
	// llm-d's form: k = Full^-power, so k 300, power 5 is Full = 300^(-1/5).
	llmd := Curve{Full: math.Pow(300, -0.2), Power: 5}
	if got := llmd.P(0.15); math.Abs(got-300*math.Pow(0.15, 5)) > 1e-12 {
		t.Errorf("llm-d curve at 0.15 = %v, want %v", got, 300*math.Pow(0.15, 5))
	}
}

// TestShedCurveRefusesItsShare: over a uniform grid of draws, the share of sheddable requests refused at
// saturation S is the curve's probability, and standard and critical requests are never refused by it.
func TestShedCurveRefusesItsShare(t *testing.T) {
	s := NewShedder(DefaultShedParams(), nil)
	const n = 10000
	for _, sat := range []float64{0.3, 0.5, 0.8, 0.95, 1.2} {
		for _, class := range []Class{Critical, Standard, Sheddable} {
			t.Run(fmt.Sprintf("S=%v/%v", sat, class), func(t *testing.T) {
				shed := 0
				for i := range n {
					d := s.decide(&ShedInput{Class: class, Saturation: sat}, (float64(i)+0.5)/n)
					if d.Verdict == Shed {
						shed++
						if !errors.Is(d.Err, ErrOverloaded) || d.RetryAfter < time.Second || d.RetryAfter > 5*time.Second {
							t.Fatalf("refusal %+v", d)
						}
					}
				}
				want := 0.0
				if class == Sheddable {
					want = DefaultShedParams().Curves[Sheddable.Index()].P(sat)
				}
				if got := float64(shed) / n; math.Abs(got-want) > 1.0/n {
					t.Errorf("refused %.4f, want %.4f", got, want)
				}
			})
		}
	}
}

func TestShedDecide(t *testing.T) {
	const slo = 500 * time.Millisecond
	for _, tc := range []struct {
		name string
		in   ShedInput
		want Verdict
		err  error
	}{
		{"idle fleet admits", ShedInput{Class: Standard, SLO: slo, TTFT: 100 * time.Millisecond}, Admit, nil},
		{"no SLO, no prediction: admit", ShedInput{Class: Sheddable}, Admit, nil},
		{"saturated pool queues standard", ShedInput{Class: Standard, Saturated: true}, Enqueue, nil},
		{"waiting requests: nobody overtakes them", ShedInput{Class: Critical, Queued: 3}, Enqueue, nil},

		// sheddable: objective = 0.5 * SLO = 250ms
		{"sheddable within objective", ShedInput{Class: Sheddable, SLO: slo, TTFT: 240 * time.Millisecond}, Admit, nil},
		{"sheddable misses objective", ShedInput{Class: Sheddable, SLO: slo, TTFT: 260 * time.Millisecond}, Shed, ErrSLO},
		{"sheddable misses with the queue wait", ShedInput{Class: Sheddable, SLO: slo, TTFT: 200 * time.Millisecond, Wait: 100 * time.Millisecond, Queued: 1}, Shed, ErrSLO},
		{"sheddable on an idle backend is not shed on prediction", ShedInput{Class: Sheddable, SLO: slo, TTFT: time.Second, Idle: true}, Admit, nil},
		{"sheddable with unknown prediction", ShedInput{Class: Sheddable, SLO: slo}, Admit, nil},
		{"sheddable on a full fleet", ShedInput{Class: Sheddable, Saturation: 1}, Shed, ErrOverloaded},

		// standard: objective = SLO = 500ms; shed when the prediction, wait included, misses it and it would wait
		{"standard past its objective with a queue", ShedInput{Class: Standard, SLO: slo, TTFT: 600 * time.Millisecond, Queued: 1}, Shed, ErrSLO},
		{"standard past its objective on a saturated fleet", ShedInput{Class: Standard, SLO: slo, TTFT: 600 * time.Millisecond, Saturated: true}, Shed, ErrSLO},
		{"standard misses with the queue wait", ShedInput{Class: Standard, SLO: slo, TTFT: 200 * time.Millisecond, Wait: 400 * time.Millisecond, Queued: 1}, Shed, ErrSLO},
		{"standard within its objective, wait included, queues", ShedInput{Class: Standard, SLO: slo, TTFT: 200 * time.Millisecond, Wait: 250 * time.Millisecond, Queued: 1}, Enqueue, nil},
		{"standard past its objective that can start now goes", ShedInput{Class: Standard, SLO: slo, TTFT: 1100 * time.Millisecond, Wait: time.Second}, Admit, nil},
		{"standard on a full fleet queues", ShedInput{Class: Standard, Saturation: 1.5, Saturated: true}, Enqueue, nil},

		// critical: never shed on prediction, queues
		{"critical far past its SLO", ShedInput{Class: Critical, SLO: slo, TTFT: 10 * time.Second, Queued: 5, Saturation: 1.5}, Enqueue, nil},
		{"critical far past its SLO, capacity free", ShedInput{Class: Critical, SLO: slo, TTFT: 10 * time.Second}, Admit, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewShedder(DefaultShedParams(), nil)
			d := s.decide(&tc.in, 0.999) // a draw the curve refuses only at p = 1
			if d.Verdict != tc.want || !errors.Is(d.Err, tc.err) {
				t.Fatalf("decide = %v %v, want %v %v", d.Verdict, d.Err, tc.want, tc.err)
			}
			if d.Verdict == Shed {
				var e *Error
				if !errors.As(d.Err, &e) || e.Status != 503 || e.NoRetry || d.RetryAfter <= 0 {
					t.Errorf("a shed must be a retryable 503 with Retry-After: %+v %+v", e, d)
				}
			}
		})
	}
}

func TestShedSLOFactor(t *testing.T) {
	p := DefaultShedParams()
	p.Priorities.SLOFactor[Sheddable.Index()] = 2 // a patient batch class
	s := NewShedder(p, nil)
	if d := s.decide(&ShedInput{Class: Sheddable, SLO: time.Second, TTFT: 1900 * time.Millisecond}, 0.99); d.Verdict != Admit {
		t.Errorf("slo_factor 2: %v", d.Verdict)
	}
	if d := s.decide(&ShedInput{Class: Sheddable, SLO: time.Second, TTFT: 2100 * time.Millisecond}, 0.99); d.Verdict != Shed {
		t.Errorf("slo_factor 2 past 2x: %v", d.Verdict)
	}
}

func TestShedCountsRefusals(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	s := NewShedder(DefaultShedParams(), m)
	s.decide(&ShedInput{Class: Sheddable, Saturation: 1}, 0.5)
	s.decide(&ShedInput{Class: Standard, SLO: time.Second, TTFT: 3 * time.Second, Queued: 1}, 0.5)
	s.decide(&ShedInput{Class: Critical, SLO: time.Second, TTFT: 3 * time.Second, Queued: 1}, 0.5)
	if got := value(t, m.Shed.WithLabelValues(ReasonSaturated, "sheddable")); got != 1 {
		t.Errorf("shed{saturated,sheddable} = %v", got)
	}
	if got := value(t, m.Shed.WithLabelValues(ReasonSLO, "standard")); got != 1 {
		t.Errorf("shed{slo,standard} = %v", got)
	}
	if got := value(t, m.Shed.WithLabelValues(ReasonSLO, "critical")); got != 0 {
		t.Errorf("shed{slo,critical} = %v", got)
	}
}

func TestDeadline(t *testing.T) {
	s := NewShedder(DefaultShedParams(), nil)
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		class     Class
		slo, ttft time.Duration
		qt, want  time.Duration
	}{
		{Critical, time.Second, 100 * time.Millisecond, 10 * time.Second, 10 * time.Second}, // critical waits for capacity
		{Standard, time.Second, 0, 10 * time.Second, time.Second},                           // 1 x SLO, no prediction
		{Standard, time.Second, 300 * time.Millisecond, 10 * time.Second, 700 * time.Millisecond},
		{Sheddable, time.Second, 100 * time.Millisecond, 10 * time.Second, 400 * time.Millisecond}, // 0.5 x SLO - TTFT
		{Standard, time.Second, 2 * time.Second, 10 * time.Second, 0},                              // no chance left
		{Standard, 0, time.Second, 10 * time.Second, 10 * time.Second},                             // no SLO
		{Standard, time.Minute, 0, 10 * time.Second, 10 * time.Second},                             // queue_timeout is shorter
	} {
		in := ShedInput{Class: tc.class, SLO: tc.slo, TTFT: tc.ttft}
		if got := s.Deadline(t0, &in, tc.qt).Sub(t0); got != tc.want {
			t.Errorf("Deadline(%v, slo %v, ttft %v, qt %v) = +%v, want +%v", tc.class, tc.slo, tc.ttft, tc.qt, got, tc.want)
		}
	}
	// A measured serve error of 2x halves what the prediction leaves for waiting.
	k := NewCalibration()
	for range 10 {
		k.Observe(Standard, 0, 0, 200*time.Millisecond, 100*time.Millisecond)
	}
	in := ShedInput{Class: Standard, SLO: time.Second, TTFT: 300 * time.Millisecond, Calibration: k}
	if got := s.Deadline(t0, &in, 10*time.Second).Sub(t0); got != 400*time.Millisecond {
		t.Errorf("Deadline with serve factor 2 = +%v, want +400ms", got)
	}
}

func TestTooLate(t *testing.T) {
	s := NewShedder(DefaultShedParams(), nil)
	for _, tc := range []struct {
		class             Class
		slo, waited, ttft time.Duration
		late              bool
	}{
		{Standard, time.Second, 800 * time.Millisecond, 150 * time.Millisecond, false},
		{Standard, time.Second, 900 * time.Millisecond, 150 * time.Millisecond, true},
		{Sheddable, time.Second, 300 * time.Millisecond, 150 * time.Millisecond, false},
		{Sheddable, time.Second, 400 * time.Millisecond, 150 * time.Millisecond, true},
		{Critical, time.Second, 5 * time.Second, time.Second, false}, // critical is never too late
		{Standard, 0, 5 * time.Second, time.Second, false},           // no objective
	} {
		if late := s.TooLate(tc.class, tc.slo, tc.waited, tc.ttft, nil); late != tc.late {
			t.Errorf("TooLate(%v, slo %v, waited %v, ttft %v) = %v, want %v", tc.class, tc.slo, tc.waited, tc.ttft, late, tc.late)
		}
	}
}

func TestSaturation(t *testing.T) {
	for _, tc := range []struct {
		waiting         int
		kv              float64
		inflight, limit int
		want            float64
	}{
		{0, 0, 0, 0, 0},
		{2, 0.1, 0, 0, 0.5},
		{0, 0.85, 0, 0, 1},
		{1, 0.2, 30, 32, 30.0 / 32},
		{8, 0, 1, 32, 2},
		{0, 0, 64, 32, 2},
	} {
		if got := Saturation(tc.waiting, tc.kv, tc.inflight, tc.limit); math.Abs(got-tc.want) > 1e-12 {
			t.Errorf("Saturation(%d, %v, %d, %d) = %v, want %v", tc.waiting, tc.kv, tc.inflight, tc.limit, got, tc.want)
		}
	}
	if got := PoolSaturation([]float64{0, 0, 0, 10}); got != MaxSaturation/4 {
		t.Errorf("one drowning backend among idle ones: S = %v, want %v", got, MaxSaturation/4)
	}
	if got := PoolSaturation(nil); got != 1 {
		t.Errorf("empty pool S = %v, want 1", got)
	}
	var m PoolMeter
	for _, s := range []float64{0.5, -1, 3} {
		m.Add(s)
	}
	if got := m.S(); got != (0.5+0+MaxSaturation)/3 {
		t.Errorf("PoolMeter S = %v", got)
	}
}

func TestShedDecideDoesNotAllocate(t *testing.T) {
	s := NewShedder(DefaultShedParams(), metrics.New(prometheus.NewRegistry()))
	in := ShedInput{Class: Sheddable, SLO: time.Second, TTFT: 2 * time.Second, Saturation: 0.6}
	if a := testing.AllocsPerRun(100, func() { _ = s.Decide(&in) }); a != 0 {
		t.Errorf("Decide allocates %v times", a)
	}
}
