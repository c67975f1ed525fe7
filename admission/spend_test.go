package admission

import (
	"crypto/sha256"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/redistest"
)

func budgetKeys(t *testing.T, b Budget) (*Keys, *Key) {
	t.Helper()
	ks, err := NewKeys([]KeyConfig{{Name: "k", Hash: sha256.Sum256([]byte("k")), Budget: b},
		{Name: "free", Hash: sha256.Sum256([]byte("free"))}})
	if err != nil {
		t.Fatal(err)
	}
	return ks, ks.All()[0]
}

// TestSpendLimits: the hard limit refuses once settled spend plus reservations reach it, the soft limit flags
// degradation, the headers say what is left, and a new period starts from nothing.
func TestSpendLimits(t *testing.T) {
	clk := newFakeClock()
	ks, k := budgetKeys(t, Budget{Limit: 1, Soft: 0.5, Period: time.Hour})
	l := NewLocalSpender(ks, nil, clk, nil)
	if s := l.Reserve(ks.All()[1], 5); s.Active() || s.Err != nil {
		t.Fatalf("a key without a budget got %+v", s)
	}
	var n int
	for {
		s := l.Reserve(k, 0.3)
		if s.Err != nil {
			if !errors.Is(s.Err, ErrBudgetExhausted) || s.Remaining != 0 {
				t.Fatalf("refusal %+v", s)
			}
			break
		}
		if want := n >= 2; s.Soft != want {
			t.Fatalf("request %d: Soft %v, want %v (spent %.2f)", n, s.Soft, want, l.Spent(k))
		}
		l.Settle(k, &s, 0.25)
		n++
	}
	if n != 4 || l.Spent(k) != 1 {
		t.Fatalf("%d requests of 0.25 passed a limit of 1, spent %v; want 4 and 1", n, l.Spent(k))
	}
	hdr := map[string]string{}
	s := l.Reserve(k, 0)
	s.AppendHeaders(nil, func(name string, v []byte) { hdr[name] = string(v) })
	if hdr[HeaderLimitBudget] != "1" || hdr[HeaderRemainingBudget] != "0" || hdr[HeaderResetBudget] == "" {
		t.Fatalf("headers %v", hdr)
	}
	clk.Advance(time.Hour)
	if s := l.Reserve(k, 0.3); s.Err != nil || s.Soft || s.Remaining != 0.7 {
		t.Fatalf("in a new period: %+v", s)
	}
	// A reload keeps the spend by key name.
	l2 := NewLocalSpender(ks, l, clk, nil)
	if s := l2.Reserve(k, 0.8); s.Err != nil {
		t.Fatal(s.Err)
	}
	if s := l2.Reserve(k, 0.1); !errors.Is(s.Err, ErrBudgetExhausted) {
		t.Fatalf("reservations did not survive the reload: %+v", s)
	}
}

// TestRedisSpendSharedWithinOneRequest: two replicas' spenders on one Redis, many concurrent requests each;
// together they spend no more than the limit plus one request.
func TestRedisSpendSharedWithinOneRequest(t *testing.T) {
	const limit, cost = 2.0, 0.03
	ks, k := budgetKeys(t, Budget{Limit: limit, Period: 24 * time.Hour})
	c := redistest.Client(t, redistest.Addr(t))
	prefix := redistest.Prefix(t)
	onErr := func(op string, err error) { t.Errorf("redis error (%s): %v", op, err) }
	replicas := []*RedisSpender{
		NewRedisSpender(c, prefix, 2*time.Second, NewLocalSpender(ks, nil, nil, nil), onErr),
		NewRedisSpender(c, prefix, 2*time.Second, NewLocalSpender(ks, nil, nil, nil), onErr),
	}
	var mu sync.Mutex
	spent, admitted := 0.0, 0
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func(r *RedisSpender) {
			defer wg.Done()
			for {
				s := r.Reserve(k, cost)
				if s.Err != nil {
					return
				}
				r.Settle(k, &s, cost)
				mu.Lock()
				spent += cost
				admitted++
				mu.Unlock()
			}
		}(replicas[g%2])
	}
	wg.Wait()
	if spent > limit+cost+1e-9 || spent < limit-cost-1e-9 {
		t.Fatalf("spent %.4f over %d requests, want within one request (%.2f) of %.2f", spent, admitted, cost, limit)
	}
	t.Logf("spent %.4f in %d requests against a limit of %.2f", spent, admitted, limit)
}
