package proxy

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/routing"
)

// TestUpstreamHeaderBound: an engine's response headers are bounded by upstreamReadBuffer. Headers just under
// it reach the stream; headers over it fail the attempt with a 502, and the gateway goes on serving.
func TestUpstreamHeaderBound(t *testing.T) {
	rb := newRawBackend(t)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 0, rb.url()), Options{
		Timeouts: routing.Timeouts{Connect: time.Second, FirstByte: 2 * time.Second, Idle: time.Second, Total: 5 * time.Second}})
	events := "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"model\":\"sim-model\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n" +
		"data: [DONE]\n\n"
	answer := func(headerBytes int) []byte {
		head := "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n"
		head += fmt.Sprintf("Content-Length: %d\r\n", len(events))
		pad := headerBytes - len(head) - len("X-Pad: \r\n\r\n")
		head += "X-Pad: " + strings.Repeat("p", pad) + "\r\n\r\n"
		return []byte(head + events)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	for _, tc := range []struct {
		name        string
		headerBytes int
		want        int
	}{
		{"under the bound", upstreamReadBuffer - 64, http.StatusOK},
		{"over the bound", upstreamReadBuffer + 64, http.StatusBadGateway},
		{"under the bound again", 2 << 10, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rb.cur.Store(&engineAnswer{framing: 3, body: answer(tc.headerBytes)})
			body := `{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`
			resp, err := client.Post(gw.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.want, got)
			}
			if tc.want == http.StatusOK && !bytes.Contains(got, []byte(`"content":"hi"`)) {
				t.Fatalf("the stream lost its content: %s", got)
			}
			if tc.want != http.StatusOK {
				if n := counterValue(t, gw.reg, "switchyard_upstream_limit_exceeded_total"); n != 1 {
					t.Fatalf("switchyard_upstream_limit_exceeded_total = %v, want 1 (limit headers)", n)
				}
			}
		})
	}
}
