package admission

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

func limitedKeys(t testing.TB, rpm, tpm int64) (*Keys, *Key) {
	t.Helper()
	ks, err := NewKeys([]KeyConfig{
		{Name: "k", Hash: sha256.Sum256([]byte("k")), RequestsPerMinute: rpm, TokensPerMinute: tpm},
		{Name: "free", Hash: sha256.Sum256([]byte("free"))},
	})
	if err != nil {
		t.Fatal(err)
	}
	return ks, ks.All()[0]
}

// TestRequestsExactlyNPerWindow: a full bucket admits exactly N at once, then one every window/N, so a steady
// stream gets exactly N per minute, never N+1 through rounding, whatever N.
func TestRequestsExactlyNPerWindow(t *testing.T) {
	for _, n := range []int64{1, 7, 60, 600, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			clk := newFakeClock()
			ks, k := limitedKeys(t, n, 0)
			l := NewLocalLimiter(ks, nil, clk, nil)
			for i := range n {
				if q := l.Take(k, 1); q.Err != nil {
					t.Fatalf("request %d of the burst refused: %v", i+1, q.Err)
				}
			}
			q := l.Take(k, 1)
			if !errors.Is(q.Err, ErrRateLimitRequests) {
				t.Fatalf("request %d admitted", n+1)
			}
			// The refusal says exactly when the next one passes: ceil(window/n).
			want := (RateWindow + time.Duration(n) - 1) / time.Duration(n)
			if q.RetryAfter != want {
				t.Errorf("RetryAfter = %v, want %v", q.RetryAfter, want)
			}
			clk.Advance(want - 1)
			if q := l.Take(k, 1); q.Err == nil {
				t.Fatalf("admitted 1ns before RetryAfter")
			}
			clk.Advance(1)
			if q := l.Take(k, 1); q.Err != nil {
				t.Fatalf("refused at RetryAfter: %v", q.Err)
			}
			// Sustained: try every millisecond for 10 windows; exactly 10n more pass (the bucket is empty now).
			admitted := int64(0)
			start := clk.Now()
			for clk.Now().Sub(start) < 10*RateWindow {
				clk.Advance(time.Millisecond)
				if l.Take(k, 1).Err == nil {
					admitted++
				}
			}
			// One extra is possible only from the fraction already accrued since the last admission.
			if admitted != 10*n {
				t.Errorf("admitted %d in 10 windows, want exactly %d", admitted, 10*n)
			}
		})
	}
}

func TestTokensReserveAndSettle(t *testing.T) {
	clk := newFakeClock()
	ks, k := limitedKeys(t, 0, 1000)
	l := NewLocalLimiter(ks, nil, clk, nil)

	q := l.Take(k, 600)
	if q.Err != nil || q.Reserved != 600 || q.Tokens.Remaining != 400 || q.Tokens.Limit != 1000 {
		t.Fatalf("first take = %+v", q)
	}
	if q.Requests.Limit != 0 {
		t.Errorf("unlimited requests must report Limit 0 (no headers), got %+v", q.Requests)
	}
	q2 := l.Take(k, 600)
	if !errors.Is(q2.Err, ErrRateLimitTokens) || q2.Reserved != 0 {
		t.Fatalf("second take = %+v, want refused for tokens with nothing reserved", q2)
	}
	// 200 tokens are missing: at 1000/min that is 12s.
	if q2.RetryAfter != 12*time.Second {
		t.Errorf("RetryAfter = %v, want 12s", q2.RetryAfter)
	}
	// The first request used only 100 tokens: 500 come back and the second fits now.
	l.Settle(k, &q, 100)
	if q3 := l.Take(k, 600); q3.Err != nil || q3.Tokens.Remaining != 300 {
		t.Fatalf("after the refund: %+v", q3)
	}
	// An overrun is charged: reserved 600, used 1500 leaves the key 600 in debt.
	l.Settle(k, &Quota{Reserved: 600}, 1500)
	q4 := l.Take(k, 1)
	if !errors.Is(q4.Err, ErrRateLimitTokens) || q4.Tokens.Remaining != 0 {
		t.Fatalf("in debt: %+v", q4)
	}
	if q4.RetryAfter != 601*RateWindow/1000 {
		t.Errorf("RetryAfter in debt = %v, want %v", q4.RetryAfter, 601*RateWindow/1000)
	}
	// A refund never fills the bucket beyond its limit.
	clk.Advance(RateWindow)
	l.Settle(k, &Quota{Reserved: 1000}, 0)
	if q5 := l.Take(k, 0); q5.Tokens.Remaining != 1000 {
		t.Errorf("remaining after a refund to a full bucket = %d, want 1000", q5.Tokens.Remaining)
	}
}

func TestTokensExceedLimitIsFinal(t *testing.T) {
	ks, k := limitedKeys(t, 10, 1000)
	l := NewLocalLimiter(ks, nil, newFakeClock(), nil)
	q := l.Take(k, 1001)
	if !errors.Is(q.Err, ErrTokensExceedLimit) || q.RetryAfter != 0 || !ErrTokensExceedLimit.NoRetry {
		t.Fatalf("take beyond the limit = %+v; want a final refusal without Retry-After", q)
	}
	if q.Requests.Remaining != 10 {
		t.Errorf("a refusal charged a request: remaining %d", q.Requests.Remaining)
	}
}

// TestBothLimits: a request passes only if both windows have room, and charges neither when one refuses.
func TestBothLimits(t *testing.T) {
	clk := newFakeClock()
	ks, k := limitedKeys(t, 2, 100)
	l := NewLocalLimiter(ks, nil, clk, nil)
	if q := l.Take(k, 90); q.Err != nil {
		t.Fatal(q.Err)
	}
	q := l.Take(k, 20) // requests allow, tokens do not
	if !errors.Is(q.Err, ErrRateLimitTokens) || q.Requests.Remaining != 1 {
		t.Fatalf("%+v: want a token refusal that leaves the request budget alone", q)
	}
	if q := l.Take(k, 10); q.Err != nil {
		t.Fatal(q.Err)
	}
	q = l.Take(k, 50) // both short: requests refuse, and RetryAfter waits for both
	if !errors.Is(q.Err, ErrRateLimitRequests) {
		t.Fatalf("%+v: want a request refusal", q)
	}
	if want := 30 * time.Second; q.RetryAfter != want { // 50 tokens at 100/min
		t.Errorf("RetryAfter = %v, want %v (the longer of both waits)", q.RetryAfter, want)
	}
}

func TestUnlimitedAndUnknownKeys(t *testing.T) {
	ks, _ := limitedKeys(t, 1, 1)
	l := NewLocalLimiter(ks, nil, newFakeClock(), nil)
	free := ks.All()[1]
	stranger := &Key{Name: "not-in-this-policy", RequestsPerMinute: 1}
	for i := range 100 {
		for _, k := range []*Key{nil, free, stranger} {
			if q := l.Take(k, 1e9); q.Err != nil || q.Requests.Limit != 0 || q.Tokens.Limit != 0 {
				t.Fatalf("take %d for %v = %+v", i, k, q)
			}
		}
	}
	l.Settle(nil, &Quota{Reserved: 1}, 2) // no-op, no panic
	l.Settle(free, &Quota{Reserved: 1}, 2)
}

// TestReloadKeepsBuckets: a reload neither refills nor empties a key's budget, and applies a new limit at once.
func TestReloadKeepsBuckets(t *testing.T) {
	clk := newFakeClock()
	ks, k := limitedKeys(t, 10, 0)
	l := NewLocalLimiter(ks, nil, clk, nil)
	for range 8 {
		l.Take(k, 1)
	}
	ks2, k2 := limitedKeys(t, 10, 0)
	l2 := NewLocalLimiter(ks2, l, clk, nil)
	if q := l2.Take(k2, 1); q.Err != nil || q.Requests.Remaining != 1 {
		t.Fatalf("after reload: %+v, want 1 remaining", q)
	}
	ks3, k3 := limitedKeys(t, 5, 0)
	l3 := NewLocalLimiter(ks3, l2, clk, nil)
	if q := l3.Take(k3, 1); q.Err != nil || q.Requests.Limit != 5 || q.Requests.Remaining != 0 {
		t.Fatalf("lowered limit: %+v", q)
	}
	// The old limiter shares the bucket: requests still on the old policy draw from the same budget.
	if q := l.Take(k, 1); q.Err == nil {
		t.Error("the old policy's limiter has its own budget")
	}
}

// TestConcurrentTakeExactlyN: many goroutines at the same instant get exactly N admissions between them.
func TestConcurrentTakeExactlyN(t *testing.T) {
	const n = 500
	ks, k := limitedKeys(t, n, 0)
	l := NewLocalLimiter(ks, nil, newFakeClock(), nil)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				if l.Take(k, 1).Err == nil {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if admitted.Load() != n {
		t.Errorf("admitted %d, want exactly %d", admitted.Load(), n)
	}
}

func TestRateLimitCountsRefusals(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	ks, k := limitedKeys(t, 1, 0)
	l := NewLocalLimiter(ks, nil, newFakeClock(), m)
	l.Take(k, 1)
	l.Take(k, 1)
	l.Take(k, 1)
	if got := value(t, m.Shed.WithLabelValues(ReasonRateLimitRequests, "standard")); got != 2 {
		t.Errorf("switchyard_shed_total{reason=rate_limit_requests} = %v, want 2", got)
	}
}

func TestAllowanceReset(t *testing.T) {
	clk := newFakeClock()
	ks, k := limitedKeys(t, 60, 6000)
	l := NewLocalLimiter(ks, nil, clk, nil)
	q := l.Take(k, 600)
	if q.Requests.Reset != time.Second || q.Tokens.Reset != 6*time.Second {
		t.Errorf("resets = %v, %v; want 1s (one request at 60/min) and 6s (600 tokens at 6000/min)", q.Requests.Reset, q.Tokens.Reset)
	}
	clk.Advance(500 * time.Millisecond)
	q = l.Take(k, 0)
	if q.Requests.Reset != 1500*time.Millisecond {
		t.Errorf("requests reset = %v, want 1.5s", q.Requests.Reset)
	}
}

func TestAppendHeaders(t *testing.T) {
	q := Quota{
		Requests: Allowance{Limit: 600, Remaining: 599, Reset: 100 * time.Millisecond},
		Tokens:   Allowance{Limit: 100000, Remaining: 90000, Reset: 6 * time.Minute},
	}
	got := map[string]string{}
	q.AppendHeaders(nil, func(name string, value []byte) { got[name] = string(value) })
	want := map[string]string{
		"x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "599", "x-ratelimit-reset-requests": "100ms",
		"x-ratelimit-limit-tokens": "100000", "x-ratelimit-remaining-tokens": "90000", "x-ratelimit-reset-tokens": "6m0s",
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("headers = %v\nwant %v", got, want)
	}
	got = map[string]string{}
	(&Quota{Tokens: Allowance{Limit: 5}}).AppendHeaders(nil, func(name string, value []byte) { got[name] = string(value) })
	if len(got) != 3 || got["x-ratelimit-remaining-tokens"] != "0" || got["x-ratelimit-reset-tokens"] != "0s" {
		t.Errorf("tokens-only headers = %v", got)
	}
}

// TestAppendDuration: the same text as time.Duration.String after rounding up to the millisecond.
func TestAppendDuration(t *testing.T) {
	for _, d := range []time.Duration{
		1, time.Millisecond, 999 * time.Millisecond, time.Second, 1500 * time.Millisecond, 2394 * time.Millisecond,
		1010 * time.Millisecond, 59*time.Second + 999*time.Millisecond, time.Minute, 6 * time.Minute,
		90*time.Second + 250*time.Millisecond, time.Hour, 26*time.Hour + 3*time.Minute + 7*time.Second,
		1234567 * time.Microsecond, 100*time.Millisecond + 1,
	} {
		want := ((d + time.Millisecond - 1) / time.Millisecond * time.Millisecond).String()
		if got := string(AppendDuration(nil, d)); got != want {
			t.Errorf("AppendDuration(%d ns) = %q, want %q", int64(d), got, want)
		}
	}
	if got := string(AppendDuration([]byte("x="), 0)); got != "x=0s" {
		t.Errorf("AppendDuration(0) = %q", got)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{{0, 1}, {time.Millisecond, 1}, {time.Second, 1}, {time.Second + 1, 2}, {12 * time.Second, 12}} {
		if got := RetryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

func TestEstimateTokens(t *testing.T) {
	for _, tc := range []struct {
		prompt, max, seqs int
		want              int64
	}{
		{100, 50, 1, 150},
		{100, 0, 1, 100 + DefaultCompletionTokens},
		{10, 4000, 1, 4010},                        // max_completion_tokens 4000 over max_tokens 1
		{10, 100, 3, 310},                          // n: 3
		{10, 0, 2, 10 + 2*DefaultCompletionTokens}, // no limit: the default per sequence
		{10, 50, 0, 60},                            // no sequence count: one
		{-5, 50, 1, 50},                            // no prompt estimate
		{0, 1<<31 - 1, 128 * 100_000, maxEstimate}, // saturates instead of overflowing
		{maxEstimate + 1, 1, 1, maxEstimate},
	} {
		if got := EstimateTokens(tc.prompt, tc.max, tc.seqs); got != tc.want {
			t.Errorf("EstimateTokens(%d, %d, %d) = %d, want %d", tc.prompt, tc.max, tc.seqs, got, tc.want)
		}
	}
}
