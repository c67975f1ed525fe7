package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/openai"
)

// sseServer is a hand-written OpenAI streaming endpoint with known timings: it waits ttft, then writes tokens
// content events gap apart (with a ": ping" comment and a role-only chunk that carry no content), a usage chunk
// and [DONE]. It records when it actually wrote each content event, the reference the client's measurement is
// checked against. tail replaces the end of the stream when set.
type sseServer struct {
	ttft, gap time.Duration
	tokens    int
	tail      string
	status    int

	mu       sync.Mutex
	received time.Time
	writes   []time.Time
}

func (s *sseServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.received = time.Now()
	s.writes = nil
	s.mu.Unlock()
	_, _ = io.Copy(io.Discard, r.Body)
	if s.status != 0 {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(s.status)
		fmt.Fprint(w, `{"error":{"message":"slow down","type":"rate_limit_exceeded","param":null,"code":"rate_limit_exceeded"}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Sim-Backend", "fake-1")
	fl := w.(http.Flusher)
	fmt.Fprint(w, `data: {"choices":[{"index":0,"delta":{"role":"assistant"}}]}`+"\n\n")
	fl.Flush()
	time.Sleep(s.ttft)
	for i := range s.tokens {
		if i > 0 {
			time.Sleep(s.gap)
		}
		if i == 1 {
			fmt.Fprint(w, ": ping\n\n")
		}
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"}}]}\n\n", i)
		fl.Flush()
		s.mu.Lock()
		s.writes = append(s.writes, time.Now())
		s.mu.Unlock()
	}
	if s.tail != "" {
		fmt.Fprint(w, s.tail)
		return
	}
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\n", s.tokens)
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func testItem(stream bool) *Item {
	return &Item{Stream: stream, Endpoint: openai.Chat, Priority: "critical",
		Body: []byte(`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"stream":true}`)}
}

// TestClientTimestamps checks that TTFT and every inter-token gap the client measures agree, within 5%, with
// the times the server actually wrote the events. A descheduled reader can only be late, never early, so on a
// loaded machine the test takes up to three attempts; a measurement bug fails all three.
func TestClientTimestamps(t *testing.T) {
	srv := &sseServer{ttft: 120 * time.Millisecond, gap: 40 * time.Millisecond, tokens: 6}
	ts := httptest.NewServer(srv)
	defer ts.Close()
	c := NewClient(ts.URL, 10*time.Second, nil)
	defer c.Close()
	var problems []string
	for attempt := 1; attempt <= 3; attempt++ {
		now := time.Now()
		s := c.Do(context.Background(), testItem(true), now, now)
		if s.Err != "" {
			t.Fatalf("request failed: %s %s", s.Err, s.ErrMsg)
		}
		if s.ContentEvents != srv.tokens || s.OutputTokens != srv.tokens || s.CachedTokens != 4 || len(s.ITL) != srv.tokens-1 {
			t.Fatalf("content events %d, output tokens %d, cached %d, gaps %d; want %d, %d, 4, %d", s.ContentEvents,
				s.OutputTokens, s.CachedTokens, len(s.ITL), srv.tokens, srv.tokens, srv.tokens-1)
		}
		if s.Pings != 1 || s.Backend != "fake-1" || s.Status != 200 {
			t.Fatalf("pings %d backend %q status %d; want 1, fake-1, 200", s.Pings, s.Backend, s.Status)
		}
		if s.E2E < s.TTFT+time.Duration(srv.tokens-1)*srv.gap {
			t.Fatalf("e2e %v shorter than TTFT plus the gaps", s.E2E)
		}
		srv.mu.Lock()
		refTTFT := srv.writes[0].Sub(srv.received)
		if refTTFT < srv.ttft {
			t.Fatalf("server wrote the first token after %v, before its %v", refTTFT, srv.ttft)
		}
		problems = problems[:0]
		within(&problems, "TTFT", s.TTFT, refTTFT)
		for i, g := range s.ITL {
			within(&problems, fmt.Sprintf("gap %d", i), g, srv.writes[i+1].Sub(srv.writes[i]))
		}
		srv.mu.Unlock()
		if len(problems) == 0 {
			return
		}
		t.Logf("attempt %d: %s", attempt, strings.Join(problems, "; "))
	}
	t.Errorf("the client's timestamps disagreed with the server's in three attempts: %s", strings.Join(problems, "; "))
}

// within records a problem unless got is within 5% of want (or 1ms, for the loopback transfer of tiny gaps).
func within(problems *[]string, what string, got, want time.Duration) {
	tol := max(want/20, time.Millisecond)
	if got < want-tol || got > want+tol {
		*problems = append(*problems, fmt.Sprintf("%s: measured %v, server says %v (tolerance %v)", what, got, want, tol))
	}
}

func TestClientFailures(t *testing.T) {
	cases := []struct {
		name   string
		srv    *sseServer
		stream bool
		err    string
		status int
	}{
		{"error event in a 200 stream", &sseServer{tokens: 2, tail: `data: {"error":{"message":"upstream broke","type":"server_error"}}` + "\n\ndata: [DONE]\n\n"}, true, ErrEvent, 200},
		{"event: error", &sseServer{tokens: 1, tail: "event: error\ndata: {\"message\":\"boom\"}\n\ndata: [DONE]\n\n"}, true, ErrEvent, 200},
		{"no [DONE]", &sseServer{tokens: 3, tail: "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n"}, true, ErrIncomplete, 200},
		{"429", &sseServer{status: 429}, true, ErrStatus, 429},
		{"503", &sseServer{status: 503}, true, ErrStatus, 503},
		{"complete", &sseServer{tokens: 2}, true, "", 200},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ts := httptest.NewServer(tc.srv)
			defer ts.Close()
			c := NewClient(ts.URL, 5*time.Second, nil)
			defer c.Close()
			now := time.Now()
			s := c.Do(context.Background(), testItem(tc.stream), now, now)
			if s.Err != tc.err || s.Status != tc.status {
				t.Fatalf("got err %q status %d (%s), want %q %d", s.Err, s.Status, s.ErrMsg, tc.err, tc.status)
			}
		})
	}
}

func TestClientTransportError(t *testing.T) {
	port, err := FreePort()
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(fmt.Sprintf("http://127.0.0.1:%d", port), time.Second, nil)
	defer c.Close()
	now := time.Now()
	if s := c.Do(context.Background(), testItem(true), now, now); s.Err != ErrTransport || s.Status != 0 {
		t.Fatalf("got %q status %d, want %q", s.Err, s.Status, ErrTransport)
	}
}

func TestClientNonStreaming(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get(PriorityHeader); got != "critical" {
			t.Errorf("priority header %q", got)
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Switchyard-Backend", "gw-picked")
		w.Header().Set("X-Sim-Backend", "ignored")
		fmt.Fprint(w, `{"choices":[{"index":0,"message":{"role":"assistant","content":"hello there"}}],"usage":{"completion_tokens":2}}`)
	}))
	defer ts.Close()
	c := NewClient(ts.URL, 5*time.Second, nil)
	defer c.Close()
	now := time.Now()
	if s := c.Do(context.Background(), testItem(true), now, now); s.Err != ErrBadBody {
		t.Fatalf("a JSON answer to a streaming request: got %q, want %q", s.Err, ErrBadBody)
	}
	s := c.Do(context.Background(), testItem(false), now, now)
	if s.Err != "" || s.OutputTokens != 2 || s.Backend != "gw-picked" || s.TTFT != 0 || s.E2E <= 0 {
		t.Fatalf("got %+v", s)
	}
}

// FuzzReadStream checks that no byte sequence makes the SSE reader panic or report content it did not count.
func FuzzReadStream(f *testing.F) {
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n")
	f.Add(": ping\r\n\r\ndata: {\"error\":{}}\n\n")
	f.Add("event: error\ndata: x\n")
	f.Fuzz(func(t *testing.T, in string) {
		var s Sample
		_ = readStream(strings.NewReader(in), time.Now(), &s)
		if len(s.ITL) != max(s.ContentEvents-1, 0) {
			t.Fatalf("%d gaps for %d content events", len(s.ITL), s.ContentEvents)
		}
	})
}
