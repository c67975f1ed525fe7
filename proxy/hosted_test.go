package proxy

import (
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/routing"
)

// tlsBackend is an https backend with a certificate of its own test CA (not in the system roots), recording the
// requests it receives and counting failed TLS handshakes.
type tlsBackend struct {
	*httptest.Server
	mu        sync.Mutex
	reqs      []*http.Request
	handshake handshakeLog
}

// handshakeLog counts the server's TLS handshake errors (http.Server logs them).
type handshakeLog struct {
	mu   sync.Mutex
	errs int
}

func (l *handshakeLog) Write(p []byte) (int, error) {
	if strings.Contains(string(p), "TLS handshake error") {
		l.mu.Lock()
		l.errs++
		l.mu.Unlock()
	}
	return len(p), nil
}

func (l *handshakeLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.errs
}

func newTLSBackend(t *testing.T) *tlsBackend {
	tb := &tlsBackend{}
	tb.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		tb.mu.Lock()
		tb.reqs = append(tb.reqs, r.Clone(r.Context()))
		tb.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}`+"\n\n")
		_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`+"\n\n")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	tb.Config.ErrorLog = log.New(&tb.handshake, "", 0)
	tb.StartTLS()
	t.Cleanup(tb.Close)
	return tb
}

// caBundle returns the backend's CA as a bundle, as policy builds it from ca_file.
func (tb *tlsBackend) caBundle(t *testing.T) *routing.CABundle {
	ca, err := routing.NewCABundle(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: tb.Certificate().Raw}))
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

// hostedSnapshot is one hosted backend at url, configured by edit.
func hostedSnapshot(t *testing.T, url string, edit func(*routing.BackendConfig)) *Snapshot {
	t.Helper()
	snap := snapshotOf(&routing.RoundRobin{}, 0, url)
	cfg := *snap.Backends[0].Config()
	cfg.Engine = routing.EngineOpenAIHosted
	cfg.Models = []string{"gpt-4o-2024"}
	edit(&cfg)
	snap.Backends[0] = routing.NewBackend(&cfg)
	snap.Models["sim-model"].Targets[0] = routing.Target{Backend: snap.Backends[0], Model: "gpt-4o-2024"}
	return snap
}

func TestHostedUpstreamTLS(t *testing.T) {
	t.Parallel()
	path, err := routing.ParsePathTemplate("/openai/deployments/{model}/{endpoint}")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		key     string // the backend's api_key
		forward bool
		want    string // the Authorization the backend must see
	}{
		{"api key", "backend-secret", false, "Bearer backend-secret"},
		{"forwarded", "", true, "Bearer client-key"},
		{"dropped", "", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tb := newTLSBackend(t)
			snap := hostedSnapshot(t, tb.URL+"/prefix", func(c *routing.BackendConfig) {
				c.CA = tb.caBundle(t)
				c.Path = path
				c.Query = "api-version=2024-10-21"
				c.Headers = []routing.Header{{Name: "api-key", Value: "azure-secret"}, {Name: "X-Custom", Value: "operator"}}
				c.APIKey, c.ForwardAuthorization = tc.key, tc.forward
			})
			gw := startGateway(t, snap, Options{})
			body := `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"x"}]}`
			resp, out := rawPost(t, gw.url, "/v1/chat/completions", []byte(body), map[string]string{
				"Authorization": "Bearer client-key", "X-Custom": "client", "api-key": "client-api-key",
			})
			if resp.StatusCode != 200 || !strings.Contains(string(out), `"content":"hi"`) {
				t.Fatalf("status %d body %s", resp.StatusCode, out)
			}
			tb.mu.Lock()
			defer tb.mu.Unlock()
			if len(tb.reqs) != 1 {
				t.Fatalf("backend saw %d requests", len(tb.reqs))
			}
			r := tb.reqs[0]
			if r.URL.Path != "/prefix/openai/deployments/gpt-4o-2024/chat/completions" || r.URL.RawQuery != "api-version=2024-10-21" {
				t.Errorf("upstream URL %s?%s", r.URL.Path, r.URL.RawQuery)
			}
			for name, want := range map[string]string{
				"Authorization": tc.want, "Api-Key": "azure-secret", "X-Custom": "operator", "Content-Type": "application/json",
			} {
				if got := r.Header.Values(name); len(got) > 1 || r.Header.Get(name) != want {
					t.Errorf("upstream %s = %q, want exactly %q", name, got, want)
				}
			}
			if tb.handshake.count() != 0 {
				t.Errorf("%d TLS handshakes failed", tb.handshake.count())
			}
		})
	}
}

func TestHostedUpstreamWithoutCAFailsTLS(t *testing.T) {
	t.Parallel()
	tb := newTLSBackend(t)
	snap := hostedSnapshot(t, tb.URL, func(c *routing.BackendConfig) {}) // no ca_file: the system roots
	gw := startGateway(t, snap, Options{})
	body := `{"model":"sim-model","messages":[{"role":"user","content":"x"}]}`
	resp, out := rawPost(t, gw.url, "/v1/chat/completions", []byte(body), nil)
	if resp.StatusCode < 500 {
		t.Fatalf("status %d body %s: the gateway trusted a certificate of an unknown CA", resp.StatusCode, out)
	}
	tb.mu.Lock()
	n := len(tb.reqs)
	tb.mu.Unlock()
	// The server logs the failed handshake when it reads the client's alert, which may come after the answer.
	for deadline := time.Now().Add(5 * time.Second); tb.handshake.count() == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if n != 0 || tb.handshake.count() == 0 {
		t.Fatalf("backend saw %d requests and %d failed handshakes; want none and some", n, tb.handshake.count())
	}
}
