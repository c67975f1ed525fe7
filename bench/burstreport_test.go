package bench

import (
	"testing"
	"time"
)

// A burst's report counts exactly the measured requests scheduled inside it, by class, and the per-second
// series splits each second by class.
func TestSummaryBurstsAndClassWindows(t *testing.T) {
	w := testWorkload(t, `
arrival: {process: fixed, rate: 10}
warmup: 1s
duration: 3s
bursts: [{at: 2s, duration: 1s, multiplier: 2}]
prompt: {dist: fixed, value: 1}
output: {dist: fixed, value: 4}
priorities: [{value: critical, weight: 1}, {value: standard, weight: 1}]
`)
	p, err := NewPlan(w)
	if err != nil {
		t.Fatal(err)
	}
	res := &Result{Name: "x", Plan: p, Samples: make([]Sample, len(p.Items))}
	want := map[string]*ClassReport{"critical": {}, "standard": {}}
	wantAll := ClassReport{}
	var critMax float64
	for i, it := range p.Items {
		ttft := time.Duration(i+1) * time.Millisecond
		s := Sample{Index: i, Sent: true, Stream: true, Status: 200, SendAt: it.At, TTFT: ttft, E2E: ttft + time.Millisecond,
			ContentEvents: 4, OutputTokens: 4}
		shed := i%5 == 0
		if shed {
			s = Sample{Index: i, Sent: true, Stream: true, Status: 503, Err: ErrStatus, SendAt: it.At}
		}
		res.Samples[i] = s
		if it.Warmup || it.At < 2*time.Second || it.At >= 3*time.Second {
			continue
		}
		c := want[it.Priority]
		c.Requests++
		wantAll.Requests++
		if shed {
			c.Shed++
			wantAll.Shed++
		} else {
			c.OK++
			wantAll.OK++
			if it.Priority == "critical" {
				critMax = max(critMax, float64(ttft)/float64(time.Millisecond))
			}
		}
	}
	r := Summary(res, "t", SLO{})
	if len(r.Bursts) != 1 {
		t.Fatalf("%d burst reports", len(r.Bursts))
	}
	b := r.Bursts[0]
	if b.At != 2*time.Second || b.Multiplier != 2 || b.All.Requests != wantAll.Requests || b.All.OK != wantAll.OK ||
		b.All.Shed != wantAll.Shed || wantAll.Requests < 15 {
		t.Errorf("burst all %+v, want %+v", b.All, wantAll)
	}
	for k, c := range want {
		got := b.Classes[k]
		if got == nil || got.Requests != c.Requests || got.OK != c.OK || got.Shed != c.Shed || got.TTFT.N != c.OK {
			t.Errorf("burst class %s: %+v, want %+v", k, got, c)
		}
	}
	if got := b.Classes["critical"].TTFT.Max; got != critMax {
		t.Errorf("critical max TTFT in the burst %v, want %v (a request outside the burst counted?)", got, critMax)
	}
	var n int
	for _, win := range r.Series {
		for _, cw := range win.Classes {
			n += cw.N
		}
	}
	if n != len(p.Items) {
		t.Errorf("class windows count %d requests, want %d", n, len(p.Items))
	}
	if cw := r.Series[2].Classes["critical"]; cw == nil || cw.N == 0 || cw.TTFTP99 == 0 {
		t.Errorf("second 2 critical window %+v", cw)
	}
}
