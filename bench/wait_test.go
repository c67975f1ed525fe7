package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestWaitMeasured: a run starts once the gateway has scraped every engine it scrapes and runs no seat probe;
// a backend it does not scrape (no signals) is not waited for.
func TestWaitMeasured(t *testing.T) {
	var state atomic.Int32 // 0: not scraped, 1: probing, 2: measured
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/backends" {
			http.NotFound(w, r)
			return
		}
		hosted := `{"name":"h","signals":[],"scraped_at":"0001-01-01T00:00:00Z"}`
		switch state.Load() {
		case 0:
			_, _ = w.Write([]byte(`[` + hosted + `,{"name":"e","signals":["running"],"scraped_at":"0001-01-01T00:00:00Z"}]`))
		case 1:
			_, _ = w.Write([]byte(`[` + hosted + `,{"name":"e","signals":["running"],"scraped_at":"2026-12-06T10:00:00Z","seat_probing":true}]`))
		default:
			_, _ = w.Write([]byte(`[` + hosted + `,{"name":"e","signals":["running"],"scraped_at":"2026-12-06T10:00:00Z"}]`))
		}
	}))
	defer srv.Close()
	for _, st := range []int32{0, 1} {
		state.Store(st)
		if err := WaitMeasured(context.Background(), srv.URL, 300*time.Millisecond, nil); err == nil {
			t.Fatalf("state %d: WaitMeasured returned before the gateway measured its engines", st)
		}
	}
	state.Store(1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		state.Store(2)
	}()
	if err := WaitMeasured(context.Background(), srv.URL, 10*time.Second, nil); err != nil {
		t.Fatal(err)
	}
	if state.Load() != 2 {
		t.Fatal("returned while the seat probe ran")
	}
}
