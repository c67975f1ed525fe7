package admission

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/switchyard/switchyard/internal/redistest"
)

// redisLimiter returns a RedisLimiter on the test server under a prefix of the test's own, on clk, with a
// generous timeout (these tests check arithmetic, not latency).
func redisLimiter(t *testing.T, ks *Keys, clk Clock, onErr func(string, error)) (*RedisLimiter, redis.UniversalClient) {
	t.Helper()
	c := redistest.Client(t, redistest.Addr(t))
	return NewRedisLimiter(c, RedisLimiterOptions{Prefix: redistest.Prefix(t), Timeout: 2 * time.Second,
		Local: NewLocalLimiter(ks, nil, clk, nil), Clock: clk, OnError: onErr}), c
}

func ceilMS(d time.Duration) time.Duration {
	return (d + time.Millisecond - 1) / time.Millisecond * time.Millisecond
}

// TestRedisLimiterExactlyNPerWindow is TestRequestsExactlyNPerWindow for the Lua script: a burst of exactly N,
// Retry-After exact to the millisecond, and exactly N per window after that.
func TestRedisLimiterExactlyNPerWindow(t *testing.T) {
	for _, n := range []int64{1, 7, 60, 1000} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			clk := newFakeClock()
			ks, k := limitedKeys(t, n, 0)
			l, _ := redisLimiter(t, ks, clk, func(op string, err error) { t.Errorf("redis error (%s): %v", op, err) })
			for i := range n {
				if q := l.Take(k, 1); q.Err != nil {
					t.Fatalf("request %d of the burst refused: %v", i+1, q.Err)
				}
			}
			q := l.Take(k, 1)
			if !errors.Is(q.Err, ErrRateLimitRequests) {
				t.Fatalf("request %d admitted", n+1)
			}
			if want := ceilMS(RateWindow / time.Duration(n)); q.RetryAfter != want {
				t.Errorf("RetryAfter = %v, want %v", q.RetryAfter, want)
			}
			if q.Requests.Remaining != 0 || q.Requests.Limit != n || q.Requests.Reset != RateWindow {
				t.Errorf("allowance after the burst = %+v", q.Requests)
			}
			// Three more windows: every refusal says exactly when the next request passes (not a millisecond
			// earlier), and exactly 3n pass.
			end := clk.Now().Add(3 * RateWindow)
			admitted := int64(0)
			for {
				q := l.Take(k, 1)
				if q.Err == nil {
					admitted++
					continue
				}
				if clk.Now().Add(q.RetryAfter).After(end) {
					break
				}
				clk.Advance(q.RetryAfter - time.Millisecond)
				if l.Take(k, 1).Err == nil {
					t.Fatalf("admitted 1ms before Retry-After")
				}
				clk.Advance(time.Millisecond)
			}
			if admitted != 3*n {
				t.Errorf("admitted %d in 3 windows, want exactly %d", admitted, 3*n)
			}
		})
	}
}

// TestRedisLimiterMatchesLocal drives the Lua script and LocalLimiter through the same random takes, settles
// and clock steps (whole milliseconds, Redis's resolution): every decision, Retry-After and header agrees.
func TestRedisLimiterMatchesLocal(t *testing.T) {
	for _, lim := range []struct{ rpm, tpm int64 }{{7, 0}, {0, 1000}, {30, 5000}, {600, 100000}} {
		t.Run(fmt.Sprintf("rpm%d_tpm%d", lim.rpm, lim.tpm), func(t *testing.T) {
			clk := newFakeClock()
			ks, k := limitedKeys(t, lim.rpm, lim.tpm)
			rl, _ := redisLimiter(t, ks, clk, func(op string, err error) { t.Errorf("redis error (%s): %v", op, err) })
			local := NewLocalLimiter(ks, nil, clk, nil)
			rng := rand.New(rand.NewPCG(1, uint64(lim.rpm+lim.tpm)))
			var open []Quota // admitted on both, not settled yet
			for i := range 400 {
				switch op := rng.IntN(10); {
				case op < 5:
					n := int64(rng.IntN(int(max(lim.tpm/4, 3))))
					a, b := rl.Take(k, n), local.Take(k, n)
					if !errors.Is(a.Err, b.Err) || a.RetryAfter != ceilMS(b.RetryAfter) || a.Reserved != b.Reserved ||
						a.Requests.Remaining != b.Requests.Remaining || a.Requests.Reset != ceilMS(b.Requests.Reset) ||
						a.Tokens.Remaining != b.Tokens.Remaining || a.Tokens.Reset != ceilMS(b.Tokens.Reset) ||
						a.Requests.Limit != b.Requests.Limit || a.Tokens.Limit != b.Tokens.Limit {
						t.Fatalf("step %d take %d:\nredis %+v\nlocal %+v", i, n, a, b)
					}
					if a.Err == nil {
						open = append(open, a)
					}
				case op < 7 && len(open) > 0:
					q := open[0]
					open = open[1:]
					used := int64(rng.IntN(int(2*q.Reserved + 1)))
					rl.Settle(k, &q, used)
					local.Settle(k, &q, used)
				default:
					clk.Advance(time.Duration(rng.IntN(5000)) * time.Millisecond)
				}
			}
		})
	}
}

func TestRedisLimiterSettle(t *testing.T) {
	clk := newFakeClock()
	ks, k := limitedKeys(t, 0, 1000)
	l, c := redisLimiter(t, ks, clk, func(op string, err error) { t.Errorf("redis error (%s): %v", op, err) })
	q := l.Take(k, 600)
	if q.Err != nil || q.Tokens.Remaining != 400 {
		t.Fatalf("first take = %+v", q)
	}
	if q2 := l.Take(k, 600); !errors.Is(q2.Err, ErrRateLimitTokens) || q2.RetryAfter != 12*time.Second || q2.Reserved != 0 {
		t.Fatalf("second take = %+v, want refused for 12s with nothing reserved", q2)
	}
	l.Settle(k, &q, 100) // 500 come back
	if q3 := l.Take(k, 600); q3.Err != nil || q3.Tokens.Remaining != 300 {
		t.Fatalf("after the refund: %+v", q3)
	}
	l.Settle(k, &Quota{Reserved: 600}, 1500) // an overrun of 900 leaves the key 600 in debt
	q4 := l.Take(k, 1)
	if !errors.Is(q4.Err, ErrRateLimitTokens) || q4.RetryAfter != 601*RateWindow/1000 {
		t.Fatalf("in debt: %+v", q4)
	}
	// The key lives exactly as long as its bucket takes to fill (plus a second), never forever.
	ttl, err := c.PTTL(context.Background(), l.key(k)).Result()
	if err != nil || ttl <= 0 || ttl > 1600*RateWindow/1000+time.Second {
		t.Fatalf("key TTL = %v, %v", ttl, err)
	}
	if q := l.Take(k, 2000); !errors.Is(q.Err, ErrTokensExceedLimit) || q.RetryAfter != 0 {
		t.Fatalf("beyond the limit = %+v", q)
	}
}

// TestRedisLimiterSharedByReplicas: two replicas (two limiters, two clients) racing on one key admit exactly N
// between them.
func TestRedisLimiterSharedByReplicas(t *testing.T) {
	const n = 50
	ks, k := limitedKeys(t, n, 0)
	addr := redistest.Addr(t)
	prefix := redistest.Prefix(t)
	var lims [2]*RedisLimiter
	for i := range lims {
		lims[i] = NewRedisLimiter(redistest.Client(t, addr), RedisLimiterOptions{Prefix: prefix, Timeout: 2 * time.Second,
			Local: NewLocalLimiter(ks, nil, nil, nil), OnError: func(op string, err error) { t.Errorf("%s: %v", op, err) }})
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for range 20 {
				if q := lims[g%2].Take(k, 1); q.Err == nil {
					admitted.Add(1)
				} else if q.RetryAfter <= 0 {
					t.Errorf("refusal without Retry-After: %+v", q)
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got != n {
		t.Fatalf("two replicas admitted %d, want exactly %d", got, n)
	}
}

// TestRedisLimiterDegrades: with Redis unreachable (refused, or silent past the timeout) every request is
// decided by the local limiter within the timeout, the failure is reported, and Settle goes back to the local
// buckets.
func TestRedisLimiterDegrades(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0") // accepts, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	refused, _ := net.Listen("tcp", "127.0.0.1:0")
	refusedAddr := refused.Addr().String()
	refused.Close()

	for _, tc := range []struct{ name, addr string }{{"refused", refusedAddr}, {"silent", silent.Addr().String()}} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newFakeClock()
			ks, k := limitedKeys(t, 3, 1000)
			c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{tc.addr}, MaxRetries: -1, DialerRetries: 1,
				ContextTimeoutEnabled: true, DisableIdentity: true})
			defer c.Close()
			var errs atomic.Int64
			local := NewLocalLimiter(ks, nil, clk, nil)
			l := NewRedisLimiter(c, RedisLimiterOptions{Prefix: "x:", Timeout: 20 * time.Millisecond, Local: local,
				OnError: func(op string, err error) {
					if op != "ratelimit" {
						t.Errorf("op %q", op)
					}
					errs.Add(1)
				}})
			for i := range 4 {
				start := time.Now()
				q := l.Take(k, 100)
				if d := time.Since(start); d > 500*time.Millisecond {
					t.Errorf("take %d waited %v on a dead Redis", i, d)
				}
				if (i < 3) != (q.Err == nil) {
					t.Fatalf("take %d = %+v: the local limit of 3 must decide", i, q)
				}
				if q.Err == nil {
					l.Settle(k, &q, 10) // refunds 90 to the local bucket
				}
			}
			if errs.Load() != 4 {
				t.Errorf("reported %d errors, want 4 (one per take; settles of local reservations never touch Redis)", errs.Load())
			}
			if q := local.Take(k, 0); q.Tokens.Remaining != 1000-30 {
				t.Errorf("local tokens remaining %d, want 970: the settles went elsewhere", q.Tokens.Remaining)
			}
		})
	}
}

func TestRedisLimiterUnlimited(t *testing.T) {
	ks, _ := NewKeys([]KeyConfig{{Name: "free", Hash: sha256.Sum256([]byte("free"))}})
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}})
	defer c.Close()
	l := NewRedisLimiter(c, RedisLimiterOptions{Local: NewLocalLimiter(ks, nil, nil, nil),
		OnError: func(string, error) { t.Error("an unlimited key must not touch Redis") }})
	for _, k := range []*Key{nil, ks.All()[0]} {
		if q := l.Take(k, 1e9); q.Err != nil || q.Requests.Limit != 0 {
			t.Fatalf("%+v", q)
		}
		l.Settle(k, &Quota{Reserved: 5}, 1)
	}
}

// TestRedisLimiterSettlesOffThePath: after Start, Settle only queues; Stop sends what is queued; a limiter
// for a reloaded policy (WithLocal) shares the state.
func TestRedisLimiterSettlesOffThePath(t *testing.T) {
	clk := newFakeClock()
	ks, k := limitedKeys(t, 0, 1000)
	l, _ := redisLimiter(t, ks, clk, func(op string, err error) { t.Errorf("redis error (%s): %v", op, err) })
	l.Start()
	q := l.Take(k, 600)
	l.Settle(k, &q, 100)
	l.Stop()
	if got := l.Take(k, 0).Tokens.Remaining; got != 900 {
		t.Fatalf("remaining %d after the queued refund, want 900", got)
	}
	reloaded := l.WithLocal(NewLocalLimiter(ks, nil, clk, nil))
	if got := reloaded.Take(k, 0).Tokens.Remaining; got != 900 || reloaded.Local() == l.Local() {
		t.Fatalf("the reloaded limiter sees %d remaining, want the shared 900 and a new fallback", got)
	}
	reloaded.Settle(k, &Quota{Reserved: 100}, 0) // without the goroutine: sent at once
	if got := l.Take(k, 0).Tokens.Remaining; got != 1000 {
		t.Fatalf("remaining %d after a synchronous refund, want 1000", got)
	}
}

// BenchmarkRedisLimiterTake is one rate-limit decision in Redis: one EVALSHA round trip (compare
// BenchmarkRateLimit, the local decision).
func BenchmarkRedisLimiterTake(b *testing.B) {
	ks, _ := NewKeys([]KeyConfig{{Name: "k", Hash: sha256.Sum256([]byte("k")), RequestsPerMinute: 1 << 40, TokensPerMinute: 1 << 50}})
	k := ks.All()[0]
	c := redistest.Client(b, redistest.Addr(b))
	l := NewRedisLimiter(c, RedisLimiterOptions{Prefix: redistest.Prefix(b), Timeout: time.Second,
		Local: NewLocalLimiter(ks, nil, nil, nil), OnError: func(op string, err error) { b.Fatal(op, err) }})
	b.ReportAllocs()
	for b.Loop() {
		if q := l.Take(k, 1500); q.Err != nil {
			b.Fatal(q.Err)
		}
	}
}
