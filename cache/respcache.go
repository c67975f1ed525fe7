package cache

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Store keeps exact responses by key (ResponseKey), each for a time: the response cache of
// docs/design.md, "Response cache". MemoryStore keeps them in the process, RedisStore shares them between replicas.
// Implementations are safe for concurrent use; Get and Set honour ctx's deadline.
type Store interface {
	// Get returns the value stored under key, or ok false when there is none (or it expired).
	Get(ctx context.Context, key string) (val []byte, ok bool, err error)
	// Set stores val under key for ttl. The store keeps its own copy.
	Set(ctx context.Context, key string, val []byte, ttl time.Duration) error
}

// ResponseKey is the cache key of a request: the hex SHA-256 of the public model name and the request's
// canonical body (the caller decides what canonical means: same answer, same bytes).
func ResponseKey(model string, canonical []byte) string {
	h := sha256.New()
	h.Write([]byte(model))
	h.Write([]byte{0})
	h.Write(canonical)
	return hex.EncodeToString(h.Sum(nil))
}

// MemoryStore is a Store in the process: at most maxBytes of values (keys and bookkeeping not counted), the
// least recently used evicted first, each entry dropped when its TTL passes. Safe for concurrent use.
type MemoryStore struct {
	maxBytes int
	now      func() time.Time

	mu    sync.Mutex
	bytes int
	lru   *list.List // of *memEntry, most recently used first
	byKey map[string]*list.Element
}

type memEntry struct {
	key   string
	val   []byte
	until time.Time
}

var _ Store = (*MemoryStore)(nil)

// NewMemoryStore returns an empty store of at most maxBytes (a value larger than that is never kept). now is the
// clock (nil: time.Now).
func NewMemoryStore(maxBytes int, now func() time.Time) *MemoryStore {
	if now == nil {
		now = time.Now
	}
	return &MemoryStore{maxBytes: maxBytes, now: now, lru: list.New(), byKey: make(map[string]*list.Element)}
}

// Get implements Store.
func (s *MemoryStore) Get(_ context.Context, key string) ([]byte, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	el, ok := s.byKey[key]
	if !ok {
		return nil, false, nil
	}
	e := el.Value.(*memEntry)
	if !s.now().Before(e.until) {
		s.remove(el)
		return nil, false, nil
	}
	s.lru.MoveToFront(el)
	return e.val, true, nil
}

// Set implements Store.
func (s *MemoryStore) Set(_ context.Context, key string, val []byte, ttl time.Duration) error {
	if len(val) > s.maxBytes || ttl <= 0 {
		return nil
	}
	e := &memEntry{key: key, val: append([]byte(nil), val...), until: s.now().Add(ttl)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if el, ok := s.byKey[key]; ok {
		s.remove(el)
	}
	for s.bytes+len(val) > s.maxBytes && s.lru.Len() > 0 {
		s.remove(s.lru.Back())
	}
	s.byKey[key] = s.lru.PushFront(e)
	s.bytes += len(val)
	return nil
}

// MaxBytes returns the store's bound.
func (s *MemoryStore) MaxBytes() int { return s.maxBytes }

// Len returns the number of entries and the bytes of their values.
func (s *MemoryStore) Len() (entries, bytes int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lru.Len(), s.bytes
}

func (s *MemoryStore) remove(el *list.Element) {
	e := s.lru.Remove(el).(*memEntry)
	delete(s.byKey, e.key)
	s.bytes -= len(e.val)
}

// RedisStore is a Store in Redis, shared by the gateway replicas: each value at prefix+"rc:{"+key+"}" with its
// TTL (Redis evicts by its own maxmemory policy beyond that). Safe for concurrent use.
type RedisStore struct {
	c      redis.UniversalClient
	prefix string
}

var _ Store = (*RedisStore)(nil)

// NewRedisStore returns a store in c under prefix (e.g. "switchyard:").
func NewRedisStore(c redis.UniversalClient, prefix string) *RedisStore {
	return &RedisStore{c: c, prefix: prefix}
}

func (s *RedisStore) key(k string) string { return s.prefix + "rc:{" + k + "}" }

// Get implements Store.
func (s *RedisStore) Get(ctx context.Context, key string) ([]byte, bool, error) {
	v, err := s.c.Get(ctx, s.key(key)).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return v, true, nil
}

// Set implements Store.
func (s *RedisStore) Set(ctx context.Context, key string, val []byte, ttl time.Duration) error {
	return s.c.Set(ctx, s.key(key), val, ttl).Err()
}
