package proxy

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/routing"
)

// Engine answers as an attacker (or a broken engine) sends them: any status, any content type, any body, any
// framing, down to raw bytes that are not HTTP at all. Whatever comes, the gateway answers its client within
// its timeouts, leaves no goroutine behind, and stays alive (an unrecovered panic would end the test binary).

// engineAnswer is one scripted engine answer.
type engineAnswer struct {
	status  int
	ctype   string
	body    []byte
	framing uint8 // 0 Content-Length, 1 chunked (split in pieces), 2 close-delimited, 3 body is the raw response
	stall   bool  // send the headers, then nothing until the connection is closed
}

// rawBackend is an engine on a raw TCP listener that answers every request with the current answer.
type rawBackend struct {
	ln    net.Listener
	cur   atomic.Pointer[engineAnswer]
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]bool
}

func newRawBackend(t testing.TB) *rawBackend {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rb := &rawBackend{ln: ln, conns: map[net.Conn]bool{}}
	rb.cur.Store(&engineAnswer{status: 200, ctype: "application/json", body: []byte(`{}`)})
	rb.wg.Add(1)
	go func() {
		defer rb.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			rb.mu.Lock()
			rb.conns[c] = true
			rb.mu.Unlock()
			rb.wg.Add(1)
			go func() {
				defer rb.wg.Done()
				rb.serve(c)
				rb.mu.Lock()
				delete(rb.conns, c)
				rb.mu.Unlock()
			}()
		}
	}()
	t.Cleanup(rb.close)
	return rb
}

func (rb *rawBackend) url() string { return "http://" + rb.ln.Addr().String() }

func (rb *rawBackend) close() {
	_ = rb.ln.Close()
	rb.mu.Lock()
	for c := range rb.conns {
		_ = c.Close()
	}
	rb.mu.Unlock()
	rb.wg.Wait()
}

func (rb *rawBackend) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		a := rb.cur.Load()
		_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
		if a.framing == 3 {
			_, _ = c.Write(a.body)
			return
		}
		var b bytes.Buffer
		fmt.Fprintf(&b, "HTTP/1.1 %d X\r\n", a.status)
		if a.ctype != "" {
			fmt.Fprintf(&b, "Content-Type: %s\r\n", a.ctype)
		}
		switch a.framing {
		case 0:
			fmt.Fprintf(&b, "Content-Length: %d\r\n\r\n", len(a.body))
			b.Write(a.body)
		case 1:
			b.WriteString("Transfer-Encoding: chunked\r\n\r\n")
			for rest := a.body; len(rest) > 0; {
				n := min(len(rest), 1+len(rest)/3)
				fmt.Fprintf(&b, "%x\r\n%s\r\n", n, rest[:n])
				rest = rest[n:]
			}
			b.WriteString("0\r\n\r\n")
		case 2:
			b.WriteString("Connection: close\r\n\r\n")
			b.Write(a.body)
		}
		if a.stall {
			_, _ = c.Write(b.Bytes()[:bytes.Index(b.Bytes(), []byte("\r\n\r\n"))+4])
			_, _ = io.Copy(io.Discard, c) // until the gateway gives up and closes
			return
		}
		if _, err := c.Write(b.Bytes()); err != nil || a.framing == 2 {
			return
		}
	}
}

// hostileRoutes are the client requests sent, one per route and mode.
var hostileRoutes = []struct {
	method, path, ctype, body string
}{
	{"POST", "/v1/chat/completions", "", `{"model":"sim-model","messages":[{"role":"user","content":"hi"}]}`},
	{"POST", "/v1/chat/completions", "", `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`},
	{"POST", "/v1/completions", "", `{"model":"sim-model","prompt":"hi","stream":true}`},
	{"POST", "/v1/embeddings", "", `{"model":"sim-model","input":"hi"}`},
	{"POST", "/v1/responses", "", `{"model":"sim-model","input":"hi"}`},
	{"POST", "/v1/responses", "", `{"model":"sim-model","input":"hi","stream":true}`},
	{"POST", "/v1/responses", "", `{"model":"sim-model","input":"hi","background":true}`},
	{"GET", "/v1/responses/resp_1", "", ``},
	{"POST", "/v1/messages", "", `{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`},
	{"POST", "/v1/messages", "", `{"model":"sim-model","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}`},
	{"POST", "/v1/rerank", "", `{"model":"sim-model","query":"q","documents":["a"]}`},
	{"POST", "/tokenize", "", `{"model":"sim-model","prompt":"hi"}`},
	{"POST", "/v1/audio/transcriptions", "multipart/form-data; boundary=XX", "--XX\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nsim-model\r\n--XX\r\nContent-Disposition: form-data; name=\"stream\"\r\n\r\ntrue\r\n--XX--\r\n"},
}

// hostileHarness is a gateway in front of a rawBackend, with short timeouts so that every answer is bounded.
type hostileHarness struct {
	rb     *rawBackend
	gw     *gateway
	client *http.Client
}

func newHostileHarness(t testing.TB) *hostileHarness {
	rb := newRawBackend(t)
	snap := allEndpoints(snapshotOf(&routing.RoundRobin{}, 0, rb.url()))
	gw := startGateway(t, snap, Options{Timeouts: routing.Timeouts{Connect: time.Second, FirstByte: time.Second, Idle: 500 * time.Millisecond, Total: 3 * time.Second},
		MaxResponseBytes: 1 << 20,
		// The breaker would take the engine out after a few bad answers, and the rest would never reach it.
		Breakers: BreakerSettings{ConsecutiveFailures: 1 << 30, FailureRatio: 2, MinRequests: 1 << 30}})
	gw.s.homes.put([]byte("resp_1"), "sim-model", "b0")
	tr := &http.Transport{MaxIdleConnsPerHost: 4}
	t.Cleanup(tr.CloseIdleConnections)
	return &hostileHarness{rb: rb, gw: gw, client: &http.Client{Transport: tr, Timeout: 15 * time.Second}}
}

// try sends route r with the engine answering a, and fails the test if the gateway does not answer in time
// or answers something that is not HTTP.
func (h *hostileHarness) try(t testing.TB, r int, a *engineAnswer) {
	h.rb.cur.Store(a)
	rt := hostileRoutes[r%len(hostileRoutes)]
	req, err := http.NewRequest(rt.method, h.gw.url+rt.path, bytes.NewReader([]byte(rt.body)))
	if err != nil {
		t.Fatal(err)
	}
	if rt.ctype != "" {
		req.Header.Set("Content-Type", rt.ctype)
	} else if rt.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := h.client.Do(req)
	if err != nil {
		t.Fatalf("%s %s with engine answer %d %q framing %d (%d bytes): no answer: %v", rt.method, rt.path, a.status, a.ctype, a.framing, len(a.body), err)
	}
	_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 8<<20))
	_ = resp.Body.Close()
	if err != nil && resp.Header.Get("Content-Type") != "text/event-stream" && resp.StatusCode != 200 {
		// A relayed whole answer or an error must be read whole; a stream cut by the gateway on a broken
		// engine stream ends with an error event, not a broken body.
		t.Fatalf("%s %s: answer %d broke: %v", rt.method, rt.path, resp.StatusCode, err)
	}
	if counterValue(t, h.gw.reg, "switchyard_panics_total") > 0 {
		t.Fatalf("%s %s with engine answer %d %q framing %d %q: a panic was recovered (see the log): a bug to fix at its cause",
			rt.method, rt.path, a.status, a.ctype, a.framing, a.body)
	}
}

var hostileCTypes = []string{"", "application/json", "text/event-stream", "text/event-stream; charset=utf-8", "audio/mpeg", "text/html", "\x00\xff"}

// randomAnswer makes an engine answer from a seeded PRNG: bodies that are nearly right are the ones that reach
// the deepest code, so most are made of pieces of real answers, cut and spliced.
func randomAnswer(r *rand.Rand) *engineAnswer {
	pieces := []string{
		"data: ", "data: [DONE]\n\n", "\n\n", "\r\n", ":\n", "event: error\n", "event: response.completed\n",
		`{"choices":[{"delta":{"content":"x"}}]}`, `{"choices":[{"text":"x","index":0}]}`,
		`{"usage":{"prompt_tokens":1,"completion_tokens":2}}`, `{"error":{"message":"m"}}`,
		`{"type":"response.created","response":{"id":"resp_9","model":"sim-model"}}`,
		`{"type":"response.output_text.delta","delta":"x"}`,
		`{"type":"response.completed","response":{"id":"resp_9","status":"completed","usage":{"input_tokens":1,"output_tokens":1}}}`,
		`{"type":"message_start","message":{"id":"m","usage":{"input_tokens":1}}}`,
		`{"type":"content_block_delta","delta":{"type":"text_delta","text":"x"}}`, `{"type":"message_stop"}`,
		`{"object":"list","data":[{"embedding":[0.1]}]}`, `{`, `}`, `"`, `[`, `\u`, "\xff\xfe", "null", "1e999999",
		"HTTP/1.1 200 OK\r\n", "Content-Length: 99999999\r\n", "Transfer-Encoding: chunked\r\n",
	}
	var b []byte
	for range r.IntN(40) {
		b = append(b, pieces[r.IntN(len(pieces))]...)
	}
	if r.IntN(10) == 0 {
		b = append(b, bytes.Repeat([]byte("data: x"), r.IntN(1<<17))...) // a long line without an end
	}
	statuses := []int{200, 200, 200, 201, 204, 301, 400, 404, 422, 429, 500, 502, 503, 599, 100 + r.IntN(500)}
	return &engineAnswer{status: statuses[r.IntN(len(statuses))], ctype: hostileCTypes[r.IntN(len(hostileCTypes))],
		body: b, framing: uint8(r.IntN(4)), stall: r.IntN(40) == 0}
}

// TestHostileEngineAnswers sends every route through the gateway against a few hundred random engine answers
// (a fixed seed: the same cases every run) and checks that each gets an answer, that the gateway still serves
// a good request after them, and that no goroutine is left behind.
//
// The cases are dealt to a few gateways, each in front of its own engine, that run at once: most of the time
// goes to waiting (a stalled engine, an answer that never ends, each up to a timeout of the harness), and in
// one sequence those waits added up to half a minute.
func TestHostileEngineAnswers(t *testing.T) {
	if testing.Short() {
		t.Skip("hundreds of requests with timeouts: not in -short")
	}
	before := runtime.NumGoroutine()
	r := rand.New(rand.NewPCG(13, 14))
	const n, parts = 400, 4
	answers := make([]*engineAnswer, n)
	for i := range answers {
		answers[i] = randomAnswer(r)
	}
	t.Run("parts", func(t *testing.T) {
		for p := range parts {
			t.Run(fmt.Sprint(p), func(t *testing.T) {
				t.Parallel()
				h := newHostileHarness(t)
				for i := p; i < n; i += parts {
					h.try(t, i, answers[i])
				}
				good := &engineAnswer{status: 200, ctype: "application/json", body: []byte(`{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"sim-model"}`)}
				h.rb.cur.Store(good)
				resp, body := rawPost(t, h.gw.url, "/v1/embeddings", []byte(`{"model":"sim-model","input":"x"}`), nil)
				if resp.StatusCode != 200 || string(body) != string(good.body) {
					t.Fatalf("a good request after %d hostile answers: %d %s", n/parts, resp.StatusCode, body)
				}
				if p := counterValue(t, h.gw.reg, "switchyard_panics_total"); p != 0 {
					t.Errorf("%v panics recovered: each is a bug to fix at its cause (see the log)", p)
				}
			}) // its cleanups close the client's connections, the gateway and the engine
		}
	})
	waitFor(t, 10*time.Second, func() bool {
		return runtime.NumGoroutine() <= before+15 // the harness's and the runtime's own
	})
}

// FuzzEngineAnswers is TestHostileEngineAnswers driven by the fuzzer: go test -run XXX -fuzz FuzzEngineAnswers
// ./proxy/ (docs/security.md says how long to run it).
func FuzzEngineAnswers(f *testing.F) {
	f.Add(uint8(0), uint16(200), uint8(1), uint8(0), []byte(`{"choices":[]}`))
	f.Add(uint8(1), uint16(200), uint8(2), uint8(1), []byte("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n"))
	f.Add(uint8(5), uint16(200), uint8(2), uint8(1), []byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n"))
	f.Add(uint8(3), uint16(500), uint8(0), uint8(3), []byte("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}"))
	h := newHostileHarness(f)
	f.Fuzz(func(t *testing.T, route uint8, status uint16, ctype, framing uint8, body []byte) {
		code := int(status)%500 + 100
		h.try(t, int(route), &engineAnswer{status: code, ctype: hostileCTypes[int(ctype)%len(hostileCTypes)], body: body, framing: framing % 4})
	})
}
