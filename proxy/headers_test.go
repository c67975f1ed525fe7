package proxy

import (
	"bufio"
	"bytes"
	"context"
	"github.com/valyala/fasthttp"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/routing"
)

// recordingBackend answers every request with a one-token SSE stream and records the headers it received.
type recordingBackend struct {
	*httptest.Server
	mu   sync.Mutex
	got  []http.Header
	hits []string
}

func newRecordingBackend(t *testing.T) *recordingBackend {
	rb := &recordingBackend{}
	rb.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rb.mu.Lock()
		rb.got = append(rb.got, r.Header.Clone())
		rb.hits = append(rb.hits, r.Host+r.URL.Path)
		rb.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Set-Cookie", "backend=secret")
		_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}`+"\n\n")
		_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`+"\n\n")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(rb.Close)
	return rb
}

func TestUpstreamHeaders(t *testing.T) {
	t.Parallel()
	rb := newRecordingBackend(t)
	snap := snapshotOf(&routing.RoundRobin{}, 2, rb.URL)
	// The backend's own key replaces the client's.
	editBackends(snap, func(c *routing.BackendConfig) { c.APIKey = "backend-secret" })
	gw := startGateway(t, snap, Options{})

	body := `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"x"}]}`
	resp, out := rawPost(t, gw.url, "/v1/chat/completions", []byte(body), map[string]string{
		"Authorization":       "Bearer client-key",
		"Proxy-Authorization": "Basic xyz",
		"Connection":          "X-Secret-Hop",
		"X-Secret-Hop":        "must not pass",
		"Te":                  "trailers",
		"X-Switchyard-Debug":  "internal",
		"X-Request-Id":        "client-id-1",
		"X-Custom":            "kept",
		"Cookie":              "session=abc",
	})
	if resp.StatusCode != 200 || !strings.Contains(string(out), `"content":"hi"`) {
		t.Fatalf("status %d body %s", resp.StatusCode, out)
	}
	if resp.Header.Get("Set-Cookie") != "" {
		t.Error("the backend's Set-Cookie reached the client")
	}
	rb.mu.Lock()
	defer rb.mu.Unlock()
	if len(rb.got) != 1 {
		t.Fatalf("backend saw %d requests", len(rb.got))
	}
	h := rb.got[0]
	checks := []struct{ name, want string }{
		{"Authorization", "Bearer backend-secret"},
		{"Proxy-Authorization", ""},
		{"X-Secret-Hop", ""},
		{"Te", ""},
		{"X-Switchyard-Debug", ""},
		{"Cookie", ""},
		{"X-Request-Id", "client-id-1"},
		{"X-Custom", "kept"},
		{"Content-Type", "application/json"},
	}
	for _, c := range checks {
		if got := h.Get(c.name); got != c.want {
			t.Errorf("upstream %s = %q, want %q", c.name, got, c.want)
		}
	}
	if xff := h.Get("X-Forwarded-For"); xff != "127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q, want the client's address", xff)
	}
	if !strings.HasSuffix(rb.hits[0], "/v1/chat/completions") {
		t.Errorf("upstream path %q", rb.hits[0])
	}
}

// TestClientCannotChooseUpstream: URLs or hosts in the body or headers never redirect the request.
func TestClientCannotChooseUpstream(t *testing.T) {
	t.Parallel()
	rb := newRecordingBackend(t)
	trap, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer trap.Close()
	trapped := make(chan struct{}, 1)
	go func() {
		if c, err := trap.Accept(); err == nil {
			trapped <- struct{}{}
			c.Close()
		}
	}()
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 2, rb.URL), Options{})
	evil := "http://" + trap.Addr().String()
	body := `{"model":"sim-model","api_base":"` + evil + `","base_url":"` + evil + `","url":"` + evil + `","messages":[{"role":"user","content":"x"}]}`
	resp, out := rawPost(t, gw.url, "/v1/chat/completions", []byte(body), map[string]string{
		"X-Upstream-Url": evil, "X-Forwarded-Host": trap.Addr().String(), "Host": trap.Addr().String(),
	})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d body %s", resp.StatusCode, out)
	}
	select {
	case <-trapped:
		t.Fatal("the gateway connected to an address the client chose")
	case <-time.After(200 * time.Millisecond):
	}
}

// TestFirstByteTimeout: a backend that accepts connections but never answers is abandoned after the first-byte
// timeout and the request is retried elsewhere.
func TestFirstByteTimeout(t *testing.T) {
	t.Parallel()
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	go func() {
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c) }() // read forever, answer never
		}
	}()
	good := newRecordingBackend(t)
	snap := snapshotOf(&routing.RoundRobin{}, 2, "http://"+hole.Addr().String(), good.URL)
	gw := startGateway(t, snap, Options{Timeouts: routing.Timeouts{FirstByte: 300 * time.Millisecond}})
	start := time.Now()
	resp, out := rawPost(t, gw.url, "/v1/chat/completions", []byte(`{"model":"sim-model","messages":[{"role":"user","content":"x"}]}`), nil)
	if resp.StatusCode != 200 || resp.Header.Get("X-Switchyard-Backend") != "b1" {
		t.Fatalf("status %d backend %q body %s", resp.StatusCode, resp.Header.Get("X-Switchyard-Backend"), out)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 3*time.Second {
		t.Errorf("answered after %v; want the 300 ms first-byte timeout, then the retry", d)
	}
	// With only the black hole, the client gets 504.
	gw2 := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, "http://"+hole.Addr().String()), Options{Timeouts: routing.Timeouts{FirstByte: 200 * time.Millisecond}})
	resp, out = rawPost(t, gw2.url, "/v1/chat/completions", []byte(`{"model":"sim-model","messages":[{"role":"user","content":"x"}]}`), nil)
	if resp.StatusCode != 504 || !strings.Contains(string(out), "upstream_timeout") {
		t.Errorf("status %d body %s, want 504 upstream_timeout", resp.StatusCode, out)
	}
}

// TestDrain: on Shutdown, /readyz fails at once, a stream in flight finishes if it can within the drain
// timeout, and one that cannot ends with an SSE error event and [DONE].
func TestDrain(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", nil)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 2, be.URL()), Options{})
	read := func(maxTokens int, out chan<- string) {
		body := `{"model":"sim-model","stream":true,"max_tokens":` + strconv.Itoa(maxTokens) + `,"messages":[{"role":"user","content":"drain"}]}`
		resp, err := http.Post(gw.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			out <- "error: " + err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		out <- string(b)
	}
	short, long := make(chan string, 1), make(chan string, 1)
	go read(20, short)  // 20 tokens x 20 ms: ends within the drain timeout
	go read(1000, long) // 20 s: cut by the drain timeout
	time.Sleep(150 * time.Millisecond)
	if ok, _ := gw.s.Ready(); !ok {
		t.Fatal("not ready before shutdown")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- gw.s.Shutdown(ctx) }()
	time.Sleep(50 * time.Millisecond)
	if ok, why := gw.s.Ready(); ok || why != "draining" {
		t.Errorf("Ready() = %v %q during drain, want false draining", ok, why)
	}
	s := <-short
	if !strings.HasSuffix(s, "data: [DONE]\n\n") || strings.Contains(s, `"error"`) {
		t.Errorf("the short stream was not left to finish: ...%s", s[max(0, len(s)-200):])
	}
	l := <-long
	if !strings.Contains(l, `"code":"shutting_down"`) || !strings.HasSuffix(l, "data: [DONE]\n\n") {
		t.Errorf("the long stream must end with a shutting_down error event and [DONE]: ...%s", l[max(0, len(l)-300):])
	}
	if err := <-done; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

func TestDropRequestHeader(t *testing.T) {
	for _, tc := range []struct {
		name string
		drop bool
	}{
		{"Connection", true}, {"Keep-Alive", true}, {"Proxy-Authorization", true}, {"Proxy-Authenticate", true},
		{"Te", true}, {"Trailer", true}, {"Transfer-Encoding", true}, {"Upgrade", true}, {"Host", true},
		{"Content-Length", true}, {"Authorization", true}, {"Accept-Encoding", true}, {"X-Request-Id", true},
		{"X-Forwarded-For", true}, {"Cookie", true}, {"X-Switchyard-Priority", true}, {"x-switchyard-debug", true},
		{"X-Custom", false}, {"User-Agent", false}, {"Openai-Organization", false}, {"X-Switchyard", false},
	} {
		if got := dropRequestHeader([]byte(tc.name)); got != tc.drop {
			t.Errorf("dropRequestHeader(%q) = %v, want %v", tc.name, got, tc.drop)
		}
	}
}

func TestRequestID(t *testing.T) {
	if got := string(appendRequestID(nil, []byte("abc-123_x.y:z"))); got != "abc-123_x.y:z" {
		t.Errorf("a valid client id was replaced: %q", got)
	}
	for _, bad := range []string{"", "has space", "new\nline", strings.Repeat("a", 129), "ümlaut"} {
		got := appendRequestID(nil, []byte(bad))
		if string(got) == bad || len(got) != 32 || !validRequestID(got) {
			t.Errorf("client id %q gave %q; want a fresh 32-hex id", bad, got)
		}
	}
	if a, b := appendRequestID(nil, nil), appendRequestID(nil, nil); string(a) == string(b) {
		t.Error("two fresh ids are equal")
	}
}

func TestRewriteModel(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"compact", `{"id":"x","model":"llama-3","choices":[]}`, `{"id":"x","model":"public","choices":[]}`},
		{"spaced", `{"id":"x", "model" : "llama-3"}`, `{"id":"x", "model" : "public"}`},
		{"escaped", `{"m\u006fdel":"llama\u002d3"}`, `{"m\u006fdel":"public"}`},
		{"deeper objects are content", `{"model":"llama-3-70b","x":{"model":"llama-3"}}`, `{"model":"llama-3-70b","x":{"model":"llama-3"}}`},
		{"message content is content", `{"choices":[{"message":{"content":"\"model\":\"llama-3\""}}],"model":"llama-3"}`,
			`{"choices":[{"message":{"content":"\"model\":\"llama-3\""}}],"model":"public"}`},
		{"another model", `{"model":"other"}`, `{"model":"other"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(rewriteModel(nil, []byte(tc.in), "llama-3", "public")); got != tc.want {
				t.Errorf("rewriteModel(%s) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}

// TestIdleConnectionClosesSilently: a connection that sends nothing within the header timeout is closed
// without a response (an answer would arrive unsolicited on a client's spare connection).
func TestIdleConnectionClosesSilently(t *testing.T) {
	t.Parallel()
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 2, deadURL(t)), Options{HeaderTimeout: 200 * time.Millisecond})
	c, err := net.Dial("tcp", strings.TrimPrefix(gw.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	b, err := io.ReadAll(c)
	if err != nil || len(b) != 0 {
		t.Errorf("an idle connection got %q (%v); want a silent close", b, err)
	}
}

// FuzzCopyRequestHeaders: whatever headers a client sends, the upstream request carries none that RFC 9110
// section 7.6.1 makes hop-by-hop (nor any a Connection header of the client's names, nor the gateway's own
// x-switchyard-* ones), and every other header the client sent, with its value. Differential: both sides are
// read by net/http, as a Go engine reads them.
func FuzzCopyRequestHeaders(f *testing.F) {
	for _, s := range []string{
		"Connection: keep-alive\r\nConnection: X-A, x-b\r\nX-A: 1\r\nX-B: 2\r\nX-C: 3\r\n",
		"TE: trailers\r\nUpgrade: h2c\r\nKeep-Alive: 5\r\nX-Switchyard-Priority: critical\r\nAccept: */*\r\n",
		"Authorization: Bearer k\r\nCookie: a=b\r\nProxy-Authorization: x\r\nX-Forwarded-For: 1.2.3.4\r\nTraceparent: 00-1-2-01\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, hdr []byte) {
		raw := append([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n"), hdr...)
		raw = append(raw, "\r\n"...)
		var src fasthttp.RequestHeader
		if err := src.Read(bufio.NewReader(bytes.NewReader(raw))); err != nil {
			return // not a request fasthttp accepts: the gateway answers it 400 before any copy
		}
		client, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(raw)))
		if err != nil {
			return // a header set the two parsers disagree on being valid is refused by one of them
		}
		var dst fasthttp.RequestHeader
		copyRequestHeaders(&dst, &src)
		dst.Del(fasthttp.HeaderAuthorization) // prepareRequest's part (tested there): not forwarded by default
		dst.SetMethod(fasthttp.MethodPost)
		dst.SetRequestURI("/v1/chat/completions")
		dst.SetHost("engine")
		up, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(dst.Header())))
		if err != nil {
			t.Fatalf("the upstream request does not parse: %v\n%q", err, dst.Header())
		}
		hop := map[string]bool{"Connection": true, "Keep-Alive": true, "Te": true, "Trailer": true, "Transfer-Encoding": true,
			"Upgrade": true, "Proxy-Authorization": true, "Proxy-Authenticate": true, "Proxy-Connection": true}
		for _, v := range client.Header.Values("Connection") {
			for _, name := range strings.Split(v, ",") {
				if name = strings.TrimSpace(name); name != "" {
					hop[textproto.CanonicalMIMEHeaderKey(name)] = true
				}
			}
		}
		for k := range up.Header {
			if hop[k] || strings.HasPrefix(k, "X-Switchyard-") {
				t.Fatalf("upstream carries %s: %q\nclient sent %q", k, up.Header[k], hdr)
			}
		}
		gatewaySets := map[string]bool{"Host": true, "Content-Length": true, "Accept-Encoding": true, "X-Request-Id": true,
			"X-Forwarded-For": true, "Authorization": true, "Cookie": true, "Content-Type": true, "User-Agent": true}
		for k, vs := range client.Header {
			if hop[k] || gatewaySets[k] || strings.HasPrefix(k, "X-Switchyard-") {
				continue
			}
			// Field values exclude surrounding white space (RFC 9110 section 5.5); parsers differ in trimming it.
			if got, want := trimAll(up.Header.Values(k)), trimAll(vs); got != want {
				t.Fatalf("client header %s = %q reached upstream as %q", k, vs, up.Header.Values(k))
			}
		}
	})
}

// trimAll joins a header's values, trimmed, in sorted order: fasthttp may move an empty value of a repeated
// header behind the others (seen with a fuzzed "Traceparent:" before "Traceparent: 0"); every value arrives.
func trimAll(vs []string) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = strings.Trim(v, " \t")
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}
