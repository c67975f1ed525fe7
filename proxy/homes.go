package proxy

import (
	"container/list"
	"sync"
	"time"
)

// homes remembers which backend created each stored response of the Responses API, so that the requests that
// name one later (GET, DELETE and cancel of /v1/responses/{id}, a new request with previous_response_id) go to
// the engine that holds it: engines keep responses in their own memory, and no other engine knows them.
//
// It is a bounded LRU with a TTL: at most max entries (the least recently used goes first) and none older
// than ttl. A response the table has lost (evicted, or created before a restart, or through another replica)
// is looked for on the backends themselves (responses.go), and found again is remembered.
//
// Concurrency: safe for concurrent use; one mutex, held for a map operation and a list move.
type homes struct {
	mu    sync.Mutex
	byID  map[string]*list.Element // of *home
	order list.List                // most recently used first
	max   int
	ttl   time.Duration
	now   func() time.Time
}

// home is where one response lives.
type home struct {
	id      string
	model   string // the public model it was created for
	backend string // the backend's name in the policy
	at      time.Time
}

// Bounds of the table. An entry costs about 200 bytes with its id, so the table stays under about 20 MB; a
// day is longer than engines keep responses in memory under load, and a response found after that is
// remembered again.
const (
	defaultHomesMax = 100_000
	defaultHomesTTL = 24 * time.Hour
	maxResponseID   = 256 // longer ids are not remembered (and are not ids any engine makes)
)

func newHomes(max int, ttl time.Duration, now func() time.Time) *homes {
	if now == nil {
		now = time.Now
	}
	return &homes{byID: make(map[string]*list.Element), max: max, ttl: ttl, now: now}
}

// put remembers that the response id lives on backend, for model.
func (h *homes) put(id []byte, model, backend string) {
	if len(id) == 0 || len(id) > maxResponseID {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	if e, ok := h.byID[string(id)]; ok {
		r := e.Value.(*home)
		r.model, r.backend, r.at = model, backend, now
		h.order.MoveToFront(e)
		return
	}
	r := &home{id: string(id), model: model, backend: backend, at: now}
	h.byID[r.id] = h.order.PushFront(r)
	for h.order.Len() > h.max {
		h.drop(h.order.Back())
	}
}

// get returns where the response id lives, if the table knows.
func (h *homes) get(id []byte) (home, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.byID[string(id)]
	if !ok {
		return home{}, false
	}
	r := e.Value.(*home)
	if h.now().Sub(r.at) > h.ttl {
		h.drop(e)
		return home{}, false
	}
	h.order.MoveToFront(e)
	return *r, true
}

// forget drops the response id (deleted by its client).
func (h *homes) forget(id []byte) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e, ok := h.byID[string(id)]; ok {
		h.drop(e)
	}
}

func (h *homes) drop(e *list.Element) {
	delete(h.byID, e.Value.(*home).id)
	h.order.Remove(e)
}

// len returns the number of responses remembered.
func (h *homes) len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.order.Len()
}
