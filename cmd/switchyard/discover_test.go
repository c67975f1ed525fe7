package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestServeDiscoversBackendsFromDNS: a backend given as discover {dns: localhost} (a real DNS answer, from this
// machine's resolver) expands into an instance per address of localhost, and the one on 127.0.0.1, a simulator,
// serves chat requests through the gateway under its discovered name.
func TestServeDiscoversBackendsFromDNS(t *testing.T) {
	addrs, err := net.DefaultResolver.LookupHost(t.Context(), "localhost")
	if err != nil {
		t.Skipf("localhost does not resolve here: %v", err)
	}
	if !strings.Contains(strings.Join(addrs, " "), "127.0.0.1") {
		t.Skipf("localhost resolves to %v, not 127.0.0.1", addrs)
	}
	sims := startSims(t, 1, nil)
	u, err := url.Parse(sims[0].URL())
	if err != nil {
		t.Fatal(err)
	}
	policy := fmt.Sprintf(`listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
auth: none
limits: {drain_timeout: 1s, shutdown_grace: 0s}
backends:
  - name: sim
    discover: {dns: localhost, port: %s, interval: 1s}
    models: [sim-model]
models:
  - {name: sim-model, strategy: round_robin, retries: 2}
`, u.Port())
	gw := startServe(t, policy)
	want := "sim-127.0.0.1:" + u.Port()

	client := &http.Client{Timeout: 10 * time.Second}
	for i := range 5 {
		r := chat(t, client, gw.api, "", smallChat)
		if r.code != http.StatusOK || r.backend != want {
			t.Fatalf("request %d: status %d from backend %q, want 200 from %s", i, r.code, r.backend, want)
		}
	}
	resp, err := client.Get(gw.admin + "/debug/backends")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var backends []struct {
		Name string `json:"name"`
		URL  string `json:"url"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&backends); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, b := range backends {
		found = found || b.Name == want && b.URL == "http://127.0.0.1:"+u.Port()
		if !strings.HasPrefix(b.Name, "sim-") {
			t.Errorf("backend %q is not one of the template's instances", b.Name)
		}
	}
	if !found || len(backends) != len(addrs) {
		t.Errorf("/debug/backends %+v: want one instance per address of localhost (%v), %s among them", backends, addrs, want)
	}
}
