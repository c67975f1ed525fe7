package admission

import (
	"context"
	"crypto/sha256"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

// The per-request calls of admission, as the request path makes them. Run with
//
//	go test -run '^$' -bench . -benchmem ./admission/

func BenchmarkAuthenticate(b *testing.B) {
	cfgs := make([]KeyConfig, 1000)
	for i := range cfgs {
		cfgs[i] = KeyConfig{Name: string(rune('a'+i%26)) + string(rune(i)), Hash: sha256.Sum256([]byte{byte(i), byte(i >> 8)})}
	}
	cfgs[500].Hash = sha256.Sum256([]byte("sk-live-0123456789abcdef0123456789abcdef"))
	ks, err := NewKeys(cfgs)
	if err != nil {
		b.Fatal(err)
	}
	h := []byte("Bearer sk-live-0123456789abcdef0123456789abcdef")
	p := DefaultPriorities()
	hdr := []byte("sheddable")
	b.ReportAllocs()
	for b.Loop() {
		k, err := ks.Authenticate(h)
		if err != nil {
			b.Fatal(err)
		}
		_ = Authorize(k, "m")
		_ = p.Class(k, hdr)
	}
}

func BenchmarkRateLimit(b *testing.B) {
	ks, _ := NewKeys([]KeyConfig{{Name: "k", Hash: sha256.Sum256([]byte("k")), RequestsPerMinute: 1 << 40, TokensPerMinute: 1 << 50}})
	k := ks.All()[0]
	l := NewLocalLimiter(ks, nil, nil, metrics.New(prometheus.NewRegistry()))
	var buf []byte
	set := func(string, []byte) {}
	b.ReportAllocs()
	for b.Loop() {
		q := l.Take(k, 1500)
		if q.Err != nil {
			b.Fatal(q.Err)
		}
		buf = q.AppendHeaders(buf, set)
		l.Settle(k, &q, 700)
	}
}

func BenchmarkRateLimitParallel(b *testing.B) {
	ks, _ := NewKeys([]KeyConfig{{Name: "k", Hash: sha256.Sum256([]byte("k")), RequestsPerMinute: 1 << 40, TokensPerMinute: 1 << 50}})
	k := ks.All()[0]
	l := NewLocalLimiter(ks, nil, nil, nil)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			q := l.Take(k, 1500)
			l.Settle(k, &q, 700)
		}
	})
}

func BenchmarkShedDecide(b *testing.B) {
	s := NewShedder(DefaultShedParams(), metrics.New(prometheus.NewRegistry()))
	k := NewCalibration()
	for range CalibrationWindow {
		k.Observe(Sheddable, 300*time.Millisecond, 200*time.Millisecond, 150*time.Millisecond, 100*time.Millisecond)
	}
	in := ShedInput{Class: Sheddable, SLO: time.Second, TTFT: 400 * time.Millisecond, Wait: 100 * time.Millisecond,
		Saturation: 0.6, Queued: 1, Calibration: k}
	sats := []float64{0.2, 0.5, 0.9, 1.1}
	b.ReportAllocs()
	for b.Loop() {
		in.Saturation = PoolSaturation(sats)
		_ = s.Decide(&in)
	}
}

func BenchmarkCapAcquireRelease(b *testing.B) {
	cs := NewCaps(CapParams{}, metrics.New(prometheus.NewRegistry()))
	cs.Update([]CapConfig{{Name: "b"}})
	c := cs.Get("b")
	b.ReportAllocs()
	for b.Loop() {
		if !c.Full() && c.TryAcquire() {
			c.Observe(100*time.Millisecond, 100*time.Millisecond, 0)
			c.Release()
		}
	}
}

func BenchmarkCapAcquireReleaseParallel(b *testing.B) {
	cs := NewCaps(CapParams{}, nil)
	cs.Update([]CapConfig{{Name: "b", MaxConcurrency: 1 << 20}})
	c := cs.Get("b")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if c.TryAcquire() {
				c.Release()
			}
		}
	})
}

// BenchmarkQueueFastPath: Wait with capacity free and nobody waiting (the common case: every request goes
// through the queue's fast path).
func BenchmarkQueueFastPath(b *testing.B) {
	q := NewQueue(QueueConfig[*job]{Dispatch: func(*job) error { return nil }, Metrics: metrics.New(prometheus.NewRegistry())})
	defer q.Close()
	j := &job{}
	ctx := context.Background()
	dl := time.Now().Add(time.Hour)
	b.ReportAllocs()
	for b.Loop() {
		if err := q.Wait(ctx, j, Standard, dl); err != nil {
			b.Fatal(err)
		}
		q.Signal()
	}
}

// BenchmarkQueueContended: goroutines compete for 2 slots, so most requests really queue and are dispatched by
// Signal from the requests that finish: the full enqueue -> wait -> dispatch -> wake cycle.
func BenchmarkQueueContended(b *testing.B) {
	var slots atomic.Int64
	slots.Store(2)
	dispatch := func(*job) error {
		if slots.Add(-1) < 0 {
			slots.Add(1)
			return ErrNoCapacity
		}
		return nil
	}
	q := NewQueue(QueueConfig[*job]{Dispatch: dispatch, Size: 1 << 16, Metrics: metrics.New(prometheus.NewRegistry())})
	defer q.Close()
	dl := time.Now().Add(time.Hour)
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		j := &job{}
		ctx := context.Background()
		for pb.Next() {
			if err := q.Wait(ctx, j, Standard, dl); err != nil {
				b.Error(err)
				return
			}
			slots.Add(1)
			q.Signal()
		}
	})
}

func BenchmarkBudgets(b *testing.B) {
	r := NewRetryBudget(20, 3, nil)
	h := NewHedgeBudget(5, 3, nil)
	b.ReportAllocs()
	for b.Loop() {
		r.Begin()
		h.Request()
		if r.Allow() {
			r.Done()
		}
		h.Allow()
		r.End()
	}
}

func BenchmarkOutlier(b *testing.B) {
	d := NewOutlierDetector(OutlierParams{}, nil, metrics.New(prometheus.NewRegistry()), nil)
	d.Update([]string{"a", "b"})
	o := d.Get("a")
	b.ReportAllocs()
	for b.Loop() {
		if o.Available() && o.Acquire() {
			o.Observe(true, 100*time.Millisecond, 100*time.Millisecond)
		}
	}
}
