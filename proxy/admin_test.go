package proxy

import (
	"encoding/json"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/routing"
)

func startAdmin(t *testing.T, gw *gateway) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: NewAdmin(gw.s, gw.reg), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestAdminEndpoints(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", nil)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 2, be.URL(), deadURL(t)), Options{})
	admin := startAdmin(t, gw)
	rawPost(t, gw.url, "/v1/chat/completions", []byte(`{"model":"sim-model","max_tokens":2,"messages":[{"role":"user","content":"x"}]}`), nil)

	if code, body := get(t, admin+"/healthz"); code != 200 || body != "ok\n" {
		t.Errorf("/healthz %d %q", code, body)
	}
	if code, body := get(t, admin+"/readyz"); code != 200 {
		t.Errorf("/readyz %d %q", code, body)
	}
	code, body := get(t, admin+"/metrics")
	if code != 200 || !strings.Contains(body, "gen_ai_server_request_duration_seconds_bucket") ||
		!strings.Contains(body, `switchyard_requests_total{backend="b0",code="200",model="sim-model"} 1`) {
		t.Errorf("/metrics %d lacks the request: %s", code, body[:min(len(body), 500)])
	}
	var bs []BackendStatus
	code, body = get(t, admin+"/debug/backends")
	if err := json.Unmarshal([]byte(body), &bs); err != nil || code != 200 || len(bs) != 2 {
		t.Fatalf("/debug/backends %d %v: %s", code, err, body)
	}
	if bs[0].Name != "b0" || bs[0].Breaker != "closed" || bs[0].Requests != 1 || !bs[0].Healthy {
		t.Errorf("/debug/backends[0] = %+v", bs[0])
	}
	// Each backend says its engine and which load signals it provides and lacks (vLLM states no batch limit, nor
	// a ceiling of requests it holds).
	if bs[0].Engine != routing.EngineVLLM || len(bs[0].Signals) != 7 || !slices.Equal(bs[0].Lacks, []string{"max_seqs", "max_inflight"}) ||
		!strings.Contains(body, `"signals": [`) || !strings.Contains(body, `"lacks": [`) {
		t.Errorf("/debug/backends[0] engine %q signals %v lacks %v", bs[0].Engine, bs[0].Signals, bs[0].Lacks)
	}
	code, body = get(t, admin+"/debug/config")
	if code != 200 || !strings.Contains(body, `"hash": "test"`) || !strings.Contains(body, `"strategy": "test"`) {
		t.Errorf("/debug/config %d %s", code, body)
	}
	// Draining fails readiness at once.
	gw.s.draining.Store(true)
	if code, body := get(t, admin+"/readyz"); code != 503 || !strings.Contains(body, "draining") {
		t.Errorf("/readyz while draining: %d %q", code, body)
	}
}

// TestAdminModels checks /debug/models through the real gateway and a simulated engine of 16 seats stated in the
// policy: before any traffic no seat is held; once critical requests came, the reserve is active, counts the
// engine's seats and those a running request holds, and holds at least one of them for critical requests.
func TestAdminModels(t *testing.T) {
	t.Parallel()
	gw := statedSeatGateway(t, 16)
	admin := startAdmin(t, gw)
	models := func() []ModelStatus {
		t.Helper()
		var ms []ModelStatus
		code, body := get(t, admin+"/debug/models")
		if err := json.Unmarshal([]byte(body), &ms); err != nil || code != 200 || len(ms) != 1 {
			t.Fatalf("/debug/models %d %v: %s", code, err, body)
		}
		return ms
	}
	if m := models()[0]; m.Name != "sim-model" || m.Reserve.Active || m.Reserve.Seats != 0 ||
		m.Reserve.FleetSeats != 16 || m.Reserve.FreeSeats != 16 {
		t.Errorf("before any request: %+v", m)
	}
	for range 3 {
		if a := post(t, gw.url, seatBody(2), criticalHeader); a.code != 200 {
			t.Fatalf("critical: %d %s", a.code, a.body)
		}
	}
	done := make(chan answer, 1)
	go func() { done <- post(t, gw.url, seatBody(200), nil) }() // 2 s at 10 ms a token
	waitFor(t, 5*time.Second, func() bool { return models()[0].Reserve.FreeSeats == 15 })
	m := models()[0]
	if r := m.Reserve; !r.Active || r.FleetSeats != 16 || r.Seats < 1 || r.Seats > 8 || r.CriticalPerSecond <= 0 ||
		r.CompletionsPerSecond <= 0 || r.CriticalShare <= 0 || r.Rho <= 0 || m.Queued != 0 {
		t.Errorf("with critical demand and one request running: %+v", m)
	}
	if a := <-done; a.code != 200 {
		t.Errorf("standard: %d %s", a.code, a.body)
	}
}
