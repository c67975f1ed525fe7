package proxy

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestHomes(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newHomes(3, time.Hour, func() time.Time { return now })
	for i := range 3 {
		h.put([]byte(fmt.Sprint("resp_", i)), "m", fmt.Sprint("b", i))
	}
	if r, ok := h.get([]byte("resp_0")); !ok || r.backend != "b0" || r.model != "m" {
		t.Fatalf("resp_0: %+v %v", r, ok)
	}
	h.put([]byte("resp_3"), "m", "b3") // evicts the least recently used: resp_1 (resp_0 was just read)
	if _, ok := h.get([]byte("resp_1")); ok {
		t.Error("resp_1 survived past the bound")
	}
	for _, id := range []string{"resp_0", "resp_2", "resp_3"} {
		if _, ok := h.get([]byte(id)); !ok {
			t.Errorf("%s lost", id)
		}
	}
	h.put([]byte("resp_2"), "m2", "b9") // moved: the newer home wins
	if r, _ := h.get([]byte("resp_2")); r.backend != "b9" || r.model != "m2" {
		t.Errorf("resp_2 after a move: %+v", r)
	}
	h.forget([]byte("resp_3"))
	if _, ok := h.get([]byte("resp_3")); ok || h.len() != 2 {
		t.Errorf("after forget: len %d", h.len())
	}
	now = now.Add(2 * time.Hour)
	if _, ok := h.get([]byte("resp_0")); ok || h.len() != 1 {
		t.Errorf("an entry past its TTL is still served; len %d", h.len())
	}
	h.put([]byte(strings.Repeat("x", maxResponseID+1)), "m", "b")
	h.put(nil, "m", "b")
	if h.len() != 1 {
		t.Errorf("an empty or over-long id was remembered: len %d", h.len())
	}
}

func TestHomesConcurrent(t *testing.T) {
	h := newHomes(100, time.Hour, nil)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 1000 {
				id := []byte(fmt.Sprint("r", g, "_", i%150))
				h.put(id, "m", "b")
				h.get(id)
				if i%7 == 0 {
					h.forget(id)
				}
			}
		}()
	}
	wg.Wait()
	if n := h.len(); n > 100 {
		t.Errorf("len %d past the bound", n)
	}
}
