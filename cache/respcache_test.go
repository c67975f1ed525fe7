package cache

import (
	"context"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/redistest"
)

func TestMemoryStoreBoundsAndExpires(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := NewMemoryStore(10, func() time.Time { return now })
	ctx := context.Background()
	_ = s.Set(ctx, "a", []byte("aaaa"), time.Minute)
	_ = s.Set(ctx, "b", []byte("bbbb"), time.Minute)
	if _, ok, _ := s.Get(ctx, "a"); !ok { // a is now the most recently used
		t.Fatal("a missing")
	}
	_ = s.Set(ctx, "c", []byte("cccc"), time.Minute) // 12 bytes > 10: the least recently used (b) goes
	if _, ok, _ := s.Get(ctx, "b"); ok {
		t.Error("b kept beyond the byte bound")
	}
	if v, ok, _ := s.Get(ctx, "a"); !ok || string(v) != "aaaa" {
		t.Error("a evicted instead of b")
	}
	if n, b := s.Len(); n != 2 || b != 8 {
		t.Errorf("len %d entries %d bytes", n, b)
	}
	_ = s.Set(ctx, "huge", make([]byte, 11), time.Minute)
	if _, ok, _ := s.Get(ctx, "huge"); ok {
		t.Error("a value larger than the store was kept")
	}
	now = now.Add(time.Minute - 1)
	if _, ok, _ := s.Get(ctx, "c"); !ok {
		t.Error("c expired early")
	}
	now = now.Add(1)
	if _, ok, _ := s.Get(ctx, "c"); ok {
		t.Error("c outlived its TTL")
	}
}

func TestRedisStore(t *testing.T) {
	c := redistest.Client(t, redistest.Addr(t))
	s := NewRedisStore(c, redistest.Prefix(t))
	ctx := context.Background()
	k := ResponseKey("m", []byte(`{"messages":[]}`))
	if k == ResponseKey("m2", []byte(`{"messages":[]}`)) || k != ResponseKey("m", []byte(`{"messages":[]}`)) {
		t.Fatal("the key must depend on the model and the body, and only on them")
	}
	if _, ok, err := s.Get(ctx, k); ok || err != nil {
		t.Fatalf("empty store: %v %v", ok, err)
	}
	if err := s.Set(ctx, k, []byte("answer"), 2*time.Second); err != nil {
		t.Fatal(err)
	}
	v, ok, err := s.Get(ctx, k)
	if !ok || err != nil || string(v) != "answer" {
		t.Fatalf("get = %q %v %v", v, ok, err)
	}
	if ttl, _ := c.PTTL(ctx, s.key(k)).Result(); ttl <= 0 || ttl > 2*time.Second {
		t.Fatalf("ttl %v", ttl)
	}
}
