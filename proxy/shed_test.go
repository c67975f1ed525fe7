package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/switchyard/switchyard/routing"
)

// TestOpenStreamHoldsNoPrompt: once a streamed answer is committed, the gateway holds none of the request's
// prompt while the stream waits for tokens (shedRequest): neither the client's body, nor the body sent upstream,
// nor the canonical prompt. 64 streams with a 128 KiB prompt each are held open after their first event; the heap
// they add, per stream, must stay under one prompt (the gateway held three copies before, the engine and client
// of this test none, and everything else a stream holds is a few tens of KiB).
func TestOpenStreamHoldsNoPrompt(t *testing.T) {
	const streams, promptBytes = 64, 128 << 10
	release := make(chan struct{})
	var opened sync.WaitGroup
	opened.Add(streams)
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"sim-model","choices":[{"index":0,"delta":{"content":"hi"}}]}`+"\n\n")
		w.(http.Flusher).Flush()
		<-release
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer engine.Close()
	snap := snapshotOf(&routing.RoundRobin{}, 0, engine.URL)
	gw := startGateway(t, snap, Options{})
	body := []byte(`{"model":"sim-model","stream":true,"messages":[{"role":"user","content":"` +
		strings.Repeat("x", promptBytes) + `"}]}`)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: streams}}
	defer client.CloseIdleConnections()

	heap := func() uint64 {
		// Twice: a pooled buffer nobody took survives one collection (sync.Pool's victim cache), and what the
		// streams gave back is in no one's hands here, where no new request comes to take it.
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	// A first stream warms the pools, as a gateway that served requests before has them warm.
	warm := func(n int, wait bool) *sync.WaitGroup {
		var done sync.WaitGroup
		for range n {
			done.Add(1)
			go func() {
				defer done.Done()
				resp, err := client.Post(gw.url+"/v1/chat/completions", "application/json", bytes.NewReader(body))
				if err != nil {
					t.Error(err)
					opened.Done()
					return
				}
				defer resp.Body.Close()
				br := bufio.NewReader(resp.Body)
				line, err := br.ReadString('\n')
				if err != nil || !strings.Contains(line, `"hi"`) {
					t.Errorf("first line %q, %v", line, err)
				}
				if wait {
					opened.Done()
				}
				_, _ = io.Copy(io.Discard, br)
			}()
		}
		return &done
	}
	before := heap()
	done := warm(streams, true)
	opened.Wait()
	during := heap()
	close(release)
	done.Wait()
	if t.Failed() {
		return
	}
	per := (int64(during) - int64(before)) / streams
	t.Logf("heap per open stream: %d KiB (prompt %d KiB)", per>>10, promptBytes>>10)
	if per > promptBytes {
		t.Errorf("each open stream adds %d KiB of heap, more than its %d KiB prompt: the gateway holds the prompt while the stream waits",
			per>>10, promptBytes>>10)
	}
}
