package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/routing"
)

// countingBackend is newRecordingBackend's engine that counts the connections it accepted; idle, when set, is
// how long it keeps an idle keep-alive connection before closing it (uvicorn, which serves vLLM, closes them after
// 5 s).
func countingBackend(t *testing.T, idle time.Duration) (*httptest.Server, *atomic.Int64) {
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}`+"\n\n")
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Config.IdleTimeout = idle
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

// TestUpstreamConnectionsAreReused: requests one after the other, streamed or not, go over one upstream
// connection; a stream the client abandons closes its connection (how the engine learns to stop generating).
func TestUpstreamConnectionsAreReused(t *testing.T) {
	t.Parallel()
	srv, conns := countingBackend(t, 0)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, srv.URL), Options{})
	for i := range 10 {
		body := fmt.Sprintf(`{"model":"sim-model","stream":%v,"messages":[{"role":"user","content":"x"}]}`, i%2 == 0)
		resp, out := rawPost(t, gw.url, "/v1/chat/completions", []byte(body), nil)
		if resp.StatusCode != 200 || !strings.Contains(string(out), `hi`) {
			t.Fatalf("request %d: status %d body %s", i, resp.StatusCode, out)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("10 requests one after the other opened %d upstream connections, want 1", n)
	}
}

// TestUpstreamIdleConnectionClosedByTheEngine: an engine closes a keep-alive connection that sat idle; the next
// request does not fail on it (the pool checks a connection that was idle before reusing it), so no attempt
// fails and none is retried.
func TestUpstreamIdleConnectionClosedByTheEngine(t *testing.T) {
	t.Parallel()
	srv, conns := countingBackend(t, idleCheck/2)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, srv.URL), Options{})
	body := []byte(`{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"x"}]}`)
	for i := range 2 {
		if i > 0 {
			time.Sleep(idleCheck + idleCheck/2) // past the engine's idle timeout and the pool's check
		}
		resp, out := rawPost(t, gw.url, "/v1/chat/completions", body, nil)
		if resp.StatusCode != 200 || !strings.Contains(string(out), `hi`) {
			t.Fatalf("request %d: status %d body %s", i, resp.StatusCode, out)
		}
	}
	if f := counterValue(t, gw.reg, "switchyard_upstream_errors_total"); f != 0 {
		t.Errorf("%v failed upstream attempts; a connection the engine closed was used", f)
	}
	if n := conns.Load(); n != 2 {
		t.Errorf("%d upstream connections, want 2 (the engine closed the first)", n)
	}
}

// TestUpstreamInterimResponses: 1xx responses before the answer are read past; more than maxInterim fail the
// attempt.
func TestUpstreamInterimResponses(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, maxInterim, maxInterim + 1} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			br := bufio.NewReader(c)
			var req fasthttp.Request
			if err := req.Read(br); err != nil {
				return
			}
			ev := "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n"
			_, _ = io.WriteString(c, strings.Repeat("HTTP/1.1 100 Continue\r\n\r\n", n)+
				"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: "+fmt.Sprint(len(ev))+"\r\n\r\n"+ev)
			_, _ = io.Copy(io.Discard, c)
		}()
		gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, "http://"+ln.Addr().String()), Options{})
		resp, out := rawPost(t, gw.url, "/v1/chat/completions", []byte(`{"model":"sim-model","messages":[{"role":"user","content":"x"}]}`), nil)
		ok := resp.StatusCode == 200 && strings.Contains(string(out), `"hi"`)
		if ok != (n <= maxInterim) {
			t.Errorf("%d interim responses: status %d body %s", n, resp.StatusCode, out)
		}
	}
}

// TestUpstreamConnHoldsNoHeaderBuffer: a response whose headers came with its first events gives the header
// buffer back once the body reader has taken those events, so an open stream does not hold it.
func TestUpstreamConnHoldsNoHeaderBuffer(t *testing.T) {
	t.Parallel()
	client, server := net.Pipe()
	defer client.Close()
	defer server.Close()
	go func() {
		br := bufio.NewReader(server)
		var req fasthttp.Request
		if err := req.Read(br); err != nil {
			return
		}
		_, _ = io.WriteString(server, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
			"10\r\ndata: 0123456789\r\n2\r\n\n\n\r\n")
		_, _ = io.Copy(io.Discard, server)
	}()
	c := &upConn{Conn: client}
	var req fasthttp.Request
	var resp fasthttp.Response
	req.SetRequestURI("http://engine/v1/chat/completions")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetBodyString("{}")
	if err := c.roundTrip(&req, &resp); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := io.ReadAtLeast(c, buf, len("data: 0123456789\n\n"))
	if err != nil || string(buf[:n]) != "data: 0123456789\n\n" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
	if c.br != nil {
		t.Errorf("the header buffer is held after the bytes it read past the headers were taken")
	}
}
