package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// Issue 14's findings about clients and engines that send too much, too slowly, or what they should not: each
// through the real gateway over loopback, each failing on the code before its fix.

// rawExchange writes req on a fresh connection and reads one response, with a deadline.
func rawExchange(t *testing.T, url string, req []byte) (*http.Response, []byte) {
	t.Helper()
	c, err := net.DialTimeout("tcp", strings.TrimPrefix(url, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write(req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer before the body was sent: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	return resp, b
}

// TestRefusedBeforeTheBodyIsRead: a request the gateway will refuse from its headers (a bad key, an unknown
// endpoint, a body over the bound) is answered without its body being read: here the body is never sent, and
// the answer still comes.
func TestRefusedBeforeTheBodyIsRead(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", nil)
	snap := withAdmission(snapshotOf(&routing.RoundRobin{}, 0, be.URL()), key("k", "sk-good", admission.Standard, 0))
	gw := startGateway(t, snap, Options{MaxBodyBytes: 1 << 20})
	for _, tc := range []struct {
		name, path, auth string
		length           int
		status           int
		code             string
	}{
		{"no key", "/v1/chat/completions", "", 30 << 20, 401, ""},
		{"bad key", "/v1/chat/completions", "Bearer sk-bad", 30 << 20, 401, ""},
		{"unknown endpoint", "/v1/nothing", "Bearer sk-good", 30 << 20, 404, "not_found"},
		{"too large", "/v1/chat/completions", "Bearer sk-good", 30 << 20, 413, "request_too_large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n", tc.path, tc.length)
			if tc.auth != "" {
				req += "Authorization: " + tc.auth + "\r\n"
			}
			resp, body := rawExchange(t, gw.url, []byte(req+"\r\n{\"model\":"))
			if resp.StatusCode != tc.status || (tc.code != "" && !bytes.Contains(body, []byte(tc.code))) {
				t.Errorf("%d %s, want %d %s", resp.StatusCode, body, tc.status, tc.code)
			}
		})
	}
	t.Run("chunked body with a bad key", func(t *testing.T) {
		// A chunk larger than what the gateway reads of a refused request: refused at its size line.
		req := "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\nAuthorization: Bearer sk-bad\r\n\r\n100000\r\n0123456789abcdef"
		resp, _ := rawExchange(t, gw.url, []byte(req))
		if resp.StatusCode != 401 {
			t.Errorf("%d, want 401", resp.StatusCode)
		}
	})
	t.Run("a small body with a bad key: a clean 401, the connection kept", func(t *testing.T) {
		c := dial(t, gw.url)
		resp, body := c.post("/v1/chat/completions", shortChat) // no key
		if resp.StatusCode != 401 || !bytes.Contains(body, []byte("invalid_api_key")) {
			t.Errorf("%d %s", resp.StatusCode, body)
		}
		if resp, _ := c.post("/v1/chat/completions", shortChat); resp.StatusCode != 401 {
			t.Errorf("the same connection, again: %d", resp.StatusCode)
		}
	})
	t.Run("Expect: 100-continue gets the refusal before sending the body", func(t *testing.T) {
		req := "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nExpect: 100-continue\r\nContent-Length: 31457280\r\nAuthorization: Bearer sk-bad\r\n\r\n"
		resp, _ := rawExchange(t, gw.url, []byte(req))
		if resp.StatusCode != 401 {
			t.Errorf("%d, want 401", resp.StatusCode)
		}
	})
	t.Run("a client still sending a large body reads its 401", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodPost, gw.url+"/v1/chat/completions", io.LimitReader(zeroReader{}, 30<<20))
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = 30 << 20
		req.Header.Set("Authorization", "Bearer sk-bad")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("the client saw %v, not its refusal", err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Errorf("%d, want 401", resp.StatusCode)
		}
	})
	t.Run("a good key still gets in", func(t *testing.T) {
		resp, body := rawPost(t, gw.url, "/v1/chat/completions", []byte(shortChat), map[string]string{"Authorization": "Bearer sk-good"})
		if resp.StatusCode != 200 {
			t.Errorf("%d %s", resp.StatusCode, body)
		}
	})
	t.Run("a long model name is not echoed whole", func(t *testing.T) {
		body := `{"model":"` + strings.Repeat("m", 1<<19) + `","messages":[{"role":"user","content":"x"}]}`
		resp, got := rawPost(t, gw.url, "/v1/chat/completions", []byte(body), map[string]string{"Authorization": "Bearer sk-good"})
		if resp.StatusCode != 404 || len(got) > 1024 {
			t.Errorf("%d with %d bytes of answer, want 404 with the name cut short", resp.StatusCode, len(got))
		}
	})
}

// floodBackend answers every request with a stream that starts with n bytes of SSE comments (or, with content,
// n bytes of content chunks) and then a real answer.
func floodBackend(t *testing.T, n int, content bool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		piece := ": " + strings.Repeat("x", 4094) + "\n\n"
		if content {
			piece = `data: {"choices":[{"index":0,"delta":{"content":"` + strings.Repeat("y", 4000) + `"}}]}` + "\n\n"
		}
		for sent := 0; sent < n; sent += len(piece) {
			if _, err := io.WriteString(w, piece); err != nil {
				return
			}
		}
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func limitCount(t *testing.T, gw *gateway, limit string) float64 {
	t.Helper()
	return counterWith(t, gw, "switchyard_upstream_limit_exceeded_total", "limit", limit)
}

// TestEngineFloods: an engine that sends more than the gateway holds (comments before the first token, an
// answer too long to assemble) ends the attempt with a 502 that is counted by limit, not with the gateway's
// memory.
func TestEngineFloods(t *testing.T) {
	t.Parallel()
	t.Run("before the first token", func(t *testing.T) {
		t.Parallel()
		be := floodBackend(t, 64<<20, false)
		gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, be.URL), Options{})
		for _, body := range []string{shortChat, shortStream} {
			resp, got := rawPost(t, gw.url, "/v1/chat/completions", []byte(body), nil)
			if resp.StatusCode != 502 {
				t.Errorf("%d %.200s, want 502", resp.StatusCode, got)
			}
		}
		if n := limitCount(t, gw, limitPreFirstToken); n != 2 {
			t.Errorf("%v attempts counted at the pre-first-token bound, want 2", n)
		}
	})
	t.Run("an answer too long to assemble", func(t *testing.T) {
		t.Parallel()
		be := floodBackend(t, 8<<20, true)
		gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, be.URL), Options{MaxResponseBytes: 1 << 20})
		resp, got := rawPost(t, gw.url, "/v1/chat/completions", []byte(shortChat), nil)
		if resp.StatusCode != 502 {
			t.Errorf("%d %.200s, want 502", resp.StatusCode, got)
		}
		if n := limitCount(t, gw, limitAnswer); n != 1 {
			t.Errorf("%v attempts counted at the answer bound, want 1", n)
		}
		// A streaming client gets the same answer relayed: nothing is held, so nothing is bounded.
		resp, got = rawPost(t, gw.url, "/v1/chat/completions", []byte(shortStream), nil)
		if resp.StatusCode != 200 || !bytes.HasSuffix(got, []byte("data: [DONE]\n\n")) || len(got) < 8<<20 {
			t.Errorf("streaming: %d, %d bytes", resp.StatusCode, len(got))
		}
	})
}

// TestStalledClientIsLetGo: a client that stops reading a stream costs a bounded time: when a write has
// waited WriteTimeout the stream ends, and the engine's sequence is aborted with it.
func TestStalledClientIsLetGo(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = 100 * time.Microsecond; c.KVBlocks = 20000 })
	snap := snapshotOf(&routing.RoundRobin{}, 0, be.URL())
	gw := startGateway(t, snap, Options{WriteTimeout: 300 * time.Millisecond})
	c, err := net.Dial("tcp", strings.TrimPrefix(gw.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetReadBuffer(4096) // fill the window quickly
	}
	body := `{"model":"sim-model","stream":true,"max_tokens":200000,"messages":[{"role":"user","content":"go on"}]}`
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	// Read nothing. The gateway must give up on this client and free the engine.
	waitFor(t, 10*time.Second, func() bool { return snap.Backends[0].Inflight() == 1 })
	waitFor(t, 20*time.Second, func() bool {
		return snap.Backends[0].Inflight() == 0 && simGauge(t, be.URL(), "vllm:num_requests_running") == 0
	})
	if n := counterValue(t, gw.reg, "switchyard_client_disconnects_total"); n != 1 {
		t.Errorf("%v client disconnects counted, want 1", n)
	}
}

// TestNoCredentialInLogs: fasthttp's own messages quote raw requests; at debug level, with a malformed request
// that carries a bearer key and an api-key header, the log says what happened and shows neither.
func TestNoCredentialInLogs(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	be := startSim(t, "a", nil)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, be.URL()), Options{Logger: log})
	for _, req := range []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer sk-live-SECRET1\r\napi-key: SECRET2\r\nContent-Length: x\r\n\r\n",
		"GET / HTTP/1.1\r\nAuthorization: Bearer sk-live-SECRET1\r\nX-Api-Key: SECRET2\r\n" + strings.Repeat("X-Pad: y\r\n", 3000) + "\r\n",
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(gw.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, req)
		_, _ = io.ReadAll(c)
		_ = c.Close()
	}
	waitFor(t, 5*time.Second, func() bool { return strings.Contains(logs.String(), "fasthttp") })
	if s := logs.String(); strings.Contains(s, "SECRET") {
		t.Errorf("a credential reached the log:\n%s", s)
	}
}

func TestRedact(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"Authorization: Bearer sk-1\r\nHost: x", "Authorization: [redacted]\r\nHost: x"},
		{`contents: "POST / HTTP/1.1\r\nauthorization:bearer abc\r\n"`, `contents: "POST / HTTP/1.1\r\nauthorization:[redacted]\r\n"`},
		{"api-key: k1\nx-api-key = k2", "api-key: [redacted]\nx-api-key = [redacted]"},
		{"token Bearer abc.def-ghi, next", "token Bearer [redacted], next"},
		{"Cookie: a=b", "Cookie: [redacted]"},
		{"nothing here", "nothing here"},
	} {
		if got := redact(tc.in); got != tc.want {
			t.Errorf("redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestEverySecondConnectionListIsStripped: hop-by-hop headers named by any Connection header, not only the
// first, stay on the client's side.
func TestEverySecondConnectionListIsStripped(t *testing.T) {
	t.Parallel()
	rb := newRecordingBackend(t)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, rb.URL), Options{})
	body := shortChat
	req := fmt.Sprintf("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nConnection: keep-alive\r\nConnection: X-Hop-One, X-Hop-Two\r\n"+
		"X-Hop-One: secret\r\nX-Hop-Two: secret\r\nX-End-To-End: kept\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	resp, got := rawExchange(t, gw.url, []byte(req))
	if resp.StatusCode != 200 {
		t.Fatalf("%d %s", resp.StatusCode, got)
	}
	rb.mu.Lock()
	h := rb.got[len(rb.got)-1]
	rb.mu.Unlock()
	if h.Get("X-Hop-One") != "" || h.Get("X-Hop-Two") != "" || h.Get("X-End-To-End") != "kept" {
		t.Errorf("upstream headers: %v", h)
	}
}

// zeroReader is an endless stream of spaces.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = ' '
	}
	return len(p), nil
}
