// Command hostile measures what hostile traffic costs a real gateway process in memory: parallel unauthenticated
// uploads of large bodies, and an engine that floods bytes before its first token. It starts `switchyard serve`
// (the binary given with -switchyard) with a policy that has one API key, in front of a flood engine it serves
// itself on loopback, sends the traffic, samples the gateway's resident memory from /proc while it runs, and
// prints a Markdown table: each request's status and time, and the gateway's RSS before, at its peak (VmHWM)
// and after. bench/results/hostile-memory.md quotes it; docs/security.md describes the bounds it exercises.
//
//	go build -o switchyard ./cmd/switchyard
//	go run ./bench/hostile -switchyard ./switchyard
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/bench"
	"github.com/switchyard/switchyard/bench/internal/childgw"
)

func main() {
	bin := flag.String("switchyard", "./switchyard", "the switchyard binary to measure")
	uploads := flag.Int("uploads", 8, "parallel unauthenticated uploads")
	uploadMB := flag.Int("upload-mb", 30, "size of each upload, MB")
	floodMB := flag.Int("flood-mb", 400, "bytes the engine sends before its first token, MB")
	flag.Parse()
	if err := run(*bin, *uploads, *uploadMB, *floodMB); err != nil {
		fmt.Fprintln(os.Stderr, "hostile:", err)
		os.Exit(1)
	}
}

// floodEngine answers every chat request with an SSE stream that begins with n bytes of comments; it counts
// the bytes it managed to send.
func floodEngine(n int64, sent *atomic.Int64) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	piece := []byte(": " + strings.Repeat("x", 65533) + "\n\n") // 64 KiB a comment
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/metrics" || r.URL.Path == "/health" {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for total := int64(0); total < n; total += int64(len(piece)) {
			if _, err := w.Write(piece); err != nil {
				return
			}
			sent.Add(int64(len(piece)))
		}
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":"stop"}]}`+"\n\ndata: [DONE]\n\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	return srv, "http://" + ln.Addr().String(), nil
}

// zeros is an endless body of JSON-ish bytes, never held in memory.
type zeros struct{ left int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.left <= 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), z.left)
	for i := range p[:n] {
		p[i] = ' '
	}
	z.left -= n
	return int(n), nil
}

type result struct {
	what   string
	status string
	took   time.Duration
}

func run(bin string, uploads, uploadMB, floodMB int) error {
	var sent atomic.Int64
	eng, engURL, err := floodEngine(int64(floodMB)<<20, &sent)
	if err != nil {
		return err
	}
	defer eng.Close()
	api, err := bench.FreePort()
	if err != nil {
		return err
	}
	admin, err := bench.FreePort()
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "hostile-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	policy := fmt.Sprintf(`listen: 127.0.0.1:%d
admin_listen: 127.0.0.1:%d
backends:
  - name: flood
    url: %s
    engine: openai
    models: [m]
models:
  - name: m
    retries: 0
api_keys:
  - name: bench
    key: ${HOSTILE_KEY}
`, api, admin, engURL)
	// ${ENV} keys are hashed at load: the child inherits HOSTILE_KEY.
	if err := os.Setenv("HOSTILE_KEY", "sk-bench"); err != nil {
		return err
	}
	gw, err := childgw.Start(bin, dir, policy, fmt.Sprintf("http://127.0.0.1:%d", admin))
	if err != nil {
		return err
	}
	defer gw.Stop()
	base := fmt.Sprintf("http://127.0.0.1:%d", api)
	before := gw.StatusKiB("VmRSS")
	var peak atomic.Int64
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Add(1)
	go func() {
		defer sampler.Done()
		for {
			if v := gw.StatusKiB("VmRSS"); v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	client := &http.Client{Timeout: 5 * time.Minute, Transport: &http.Transport{ExpectContinueTimeout: 5 * time.Second}}
	var mu sync.Mutex
	var results []result
	var wg sync.WaitGroup
	record := func(what string, start time.Time, resp *http.Response, err error) {
		st := ""
		if err != nil {
			st = "error: " + err.Error()
		} else {
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
			_ = resp.Body.Close()
			st = fmt.Sprintf("%d %s", resp.StatusCode, strings.TrimSpace(string(b)))
		}
		mu.Lock()
		results = append(results, result{what, st, time.Since(start)})
		mu.Unlock()
	}
	// The uploads of the attack as it was reported (no Expect header), and two of a client that asks first.
	for i := range uploads + 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, base+"/v1/chat/completions",
				&zeros{left: int64(uploadMB) << 20})
			req.ContentLength = int64(uploadMB) << 20
			req.Header.Set("Content-Type", "application/json")
			what := fmt.Sprintf("upload %d (%d MB, no key)", i+1, uploadMB)
			if i >= uploads {
				req.Header.Set("Expect", "100-continue")
				what = fmt.Sprintf("upload %d (%d MB, no key, Expect: 100-continue)", i+1, uploadMB)
			}
			resp, err := client.Do(req)
			record(what, start, resp, err)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions",
			strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer sk-bench")
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		record(fmt.Sprintf("stream from an engine flooding %d MB before its first token", floodMB), start, resp, err)
	}()
	wg.Wait()
	time.Sleep(500 * time.Millisecond)
	close(stop)
	sampler.Wait()
	after := gw.StatusKiB("VmRSS")
	hwm := gw.StatusKiB("VmHWM")

	fmt.Printf("| request | answer | time |\n|---|---|---|\n")
	for _, r := range results {
		fmt.Printf("| %s | %s | %.2f s |\n", r.what, strings.ReplaceAll(r.status, "|", "\\|"), r.took.Seconds())
	}
	fmt.Printf("\n| gateway RSS | MB |\n|---|---|\n")
	fmt.Printf("| before | %.1f |\n| peak (VmHWM) | %.1f |\n| peak sampled every 20 ms | %.1f |\n| after | %.1f |\n",
		float64(before)/1024, float64(hwm)/1024, float64(peak.Load())/1024, float64(after)/1024)
	fmt.Printf("\nthe engine sent %.1f MB before the gateway closed the stream\n", float64(sent.Load())/(1<<20))
	return nil
}
