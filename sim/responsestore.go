package sim

import (
	"encoding/json"
	"net/http"
	"sync"
)

// Bounds of a backend's response store: at most this many responses and this many bytes of their conversations
// and texts, the oldest evicted first. vLLM's own store (VLLM_ENABLE_RESPONSES_API_STORE) never evicts.
const (
	maxStoredResponses = 10_000
	maxStoredBytes     = 256 << 20
)

// storedResponse is one response kept for GET /v1/responses/{id}, cancel and previous_response_id. Every field
// is guarded by the store's lock once the response is in the store.
type storedResponse struct {
	obj  responseObject
	conv []byte // the canonical conversation through this response's output: the prefix of a continuation
	seq  *seq   // a background response's sequence, for cancel
	size int    // bytes charged to the store
}

// responseStore is a bounded map of responses by id, safe for concurrent use.
type responseStore struct {
	mu    sync.Mutex
	byID  map[string]*storedResponse
	order []*storedResponse // oldest first; an entry replaced under the same id stays here until its turn
	bytes int
}

func newResponseStore() *responseStore {
	return &responseStore{byID: make(map[string]*storedResponse)}
}

// put stores r under its id (replacing an earlier response with the same id, as a reused X-Request-Id makes)
// and evicts the oldest responses past the bounds. r must not be changed afterwards except under the lock.
func (st *responseStore) put(r *storedResponse) {
	r.size = len(r.conv) + 2*len(r.obj.text()) + 512
	st.mu.Lock()
	defer st.mu.Unlock()
	st.byID[r.obj.ID] = r
	st.order = append(st.order, r)
	st.bytes += r.size
	for len(st.order) > 1 && (len(st.order) > maxStoredResponses || st.bytes > maxStoredBytes) {
		old := st.order[0]
		st.order[0] = nil
		st.order = st.order[1:]
		st.bytes -= old.size
		if st.byID[old.obj.ID] == old {
			delete(st.byID, old.obj.ID)
		}
	}
}

// update runs fn on the response stored under id, under the lock, and reports whether there was one.
func (st *responseStore) update(id string, fn func(r *storedResponse)) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.byID[id]
	if ok {
		fn(r)
	}
	return ok
}

// writeInvalidRequest answers status with OpenAI's error body for the Responses API's store errors:
// {"error":{"message":..,"type":"invalid_request_error","param":null,"code":null}}.
func writeInvalidRequest(w http.ResponseWriter, status int, msg string) {
	var e struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	e.Error.Message, e.Error.Type = msg, "invalid_request_error"
	body, _ := json.Marshal(e)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

func writeResponseNotFound(w http.ResponseWriter, id string) {
	writeInvalidRequest(w, http.StatusNotFound, "Response with id '"+id+"' not found.")
}
