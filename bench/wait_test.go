package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
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

// TestTakenPortRetried: a gateway whose port another process took in the moment after FreePorts picked it
// exits at once saying so, and the harness starts it again on fresh ports; the first attempt's error names the
// port, and any other failure is not retried.
func TestTakenPortRetried(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(helperEnv, "1")
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "gw.yaml")
	text := "listen: " + taken.Addr().String() + "\nadmin_listen: 127.0.0.1:1\n" +
		"backends: [{name: b, url: 'http://127.0.0.1:1'}]\nmodels: [{name: m, strategy: adaptive}]\n"
	if err := os.WriteFile(cfg, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := StartProc(context.Background(), "gateway", filepath.Join(dir, "gw.log"), exe, "serve", "-config", cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	start := time.Now()
	err = WaitHTTP(context.Background(), "http://127.0.0.1:1/readyz", 20*time.Second, p)
	if err == nil || !portTaken(err) || time.Since(start) > 10*time.Second {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}

	calls := 0
	try := func(fail func() error) error {
		calls = 0
		_, _, err := onFreePorts(func() (*Proc, int, error) { calls++; return nil, 0, fail() })
		return err
	}
	err = try(func() error {
		if calls < 3 {
			return fmt.Errorf("bench: gateway exited: %w", errors.New("listen tcp: bind: Address already in use"))
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("taken twice: %d calls, %v", calls, err)
	}
	err = try(func() error { return errors.New("bench: not ready after 20s") })
	if err == nil || calls != 1 {
		t.Errorf("another failure: %d calls, %v", calls, err)
	}
	err = try(func() error { return errors.New("address already in use") })
	if err == nil || calls != 3 {
		t.Errorf("always taken: %d calls, %v", calls, err)
	}
}
