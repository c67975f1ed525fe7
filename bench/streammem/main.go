// Command streammem measures what an open stream costs a real gateway process in memory (issue 16): it starts
// `switchyard serve` (the binary given with -switchyard) in front of a slow engine it serves itself on loopback,
// opens -streams concurrent streaming chat requests over -ramp, each answered with -tokens content events
// -gap apart, samples the gateway's resident memory from /proc while they are all open, and prints a Markdown
// table: RSS before, with every stream open, the peak (VmHWM), KiB per open stream, the gateway's CPU time per
// relayed event, how every stream ended, and the gateway's own counters of ended streams, with the load average
// at the start and the end. -prompt pads every request body. bench/results/2026-12-02-stream-memory.md quotes it; docs/profiling.md says how to read it.
//
//	go build -o switchyard ./cmd/switchyard
//	go run ./bench/streammem -switchyard ./switchyard -streams 2000
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/bench"
	"github.com/switchyard/switchyard/bench/internal/childgw"
)

func main() {
	bin := flag.String("switchyard", "./switchyard", "the switchyard binary to measure")
	streams := flag.Int("streams", 2000, "concurrent streams")
	ramp := flag.Duration("ramp", 10*time.Second, "time over which the streams are opened")
	tokens := flag.Int("tokens", 60, "content events per stream")
	gap := flag.Duration("gap", 500*time.Millisecond, "time between two content events")
	prompt := flag.Int("prompt", 0, "bytes of prompt text added to each request (0: a short question), to show what the request body costs an open stream")
	flag.Parse()
	if err := run(*bin, *streams, *ramp, *tokens, *gap, *prompt); err != nil {
		fmt.Fprintln(os.Stderr, "streammem:", err)
		os.Exit(1)
	}
}

// slowEngine streams tokens content events gap apart to every chat request, flushing each, then the usage
// chunk and [DONE], as an engine decoding at 1/gap tokens a second does.
func slowEngine(tokens int, gap time.Duration) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path != "/v1/chat/completions" {
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		ev := func(s string) bool {
			if _, err := io.WriteString(w, "data: "+s+"\n\n"); err != nil {
				return false
			}
			fl.Flush()
			return true
		}
		if !ev(`{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`) {
			return
		}
		t := time.NewTicker(gap)
		defer t.Stop()
		for range tokens {
			select {
			case <-r.Context().Done():
				return
			case <-t.C:
			}
			if !ev(`{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]}`) {
				return
			}
		}
		ev(`{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[{"index":0,"delta":{},"finish_reason":"length"}]}`)
		ev(fmt.Sprintf(`{"id":"c1","object":"chat.completion.chunk","model":"m","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":%d,"total_tokens":%d}}`, tokens, tokens+12))
		ev("[DONE]")
	})}
	go func() { _ = srv.Serve(ln) }()
	return srv, "http://" + ln.Addr().String(), nil
}

// stream sends one streaming request and says how it ended: "complete", the error event's message, or the
// transport error.
func stream(ctx context.Context, client *http.Client, base, body string, open *atomic.Int64) string {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return "request: " + err.Error()
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return "transport: " + firstWords(err.Error())
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return fmt.Sprintf("status %d: %s", resp.StatusCode, b)
	}
	open.Add(1)
	defer open.Add(-1)
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Bytes()
		if bytes.HasPrefix(line, []byte(`data: {"error"`)) {
			return "error event: " + string(line[len("data: "):])
		}
		if bytes.Equal(line, []byte("data: [DONE]")) {
			return "complete"
		}
	}
	if err := sc.Err(); err != nil {
		return "read: " + firstWords(err.Error())
	}
	return "ended without [DONE]"
}

// firstWords drops the addresses from a network error, so that equal failures count together.
func firstWords(s string) string {
	if i := strings.LastIndex(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}

// loadAverage is the machine's 1-minute load average (/proc/loadavg), "?" where there is none: the figures are
// quoted with it, since the gateway shares the cores with the engine and the clients.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

func run(bin string, n int, ramp time.Duration, tokens int, gap time.Duration, prompt int) error {
	loadStart := loadAverage()
	body := `{"model":"m","stream":true,"max_tokens":64,"messages":[{"role":"user","content":"Tell me a long story.` +
		strings.Repeat(" story", prompt/len(" story")) + `"}]}`
	eng, engURL, err := slowEngine(tokens, gap)
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
	dir, err := os.MkdirTemp("", "streammem-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	policy := fmt.Sprintf(`listen: 127.0.0.1:%d
admin_listen: 127.0.0.1:%d
auth: none
access_log: {enabled: false}
limits: {shutdown_grace: 0s}
backends:
  - name: slow
    url: %s
    engine: openai
    models: [m]
    max_concurrency: 100000
models:
  - name: m
    retries: 0
`, api, admin, engURL)
	gw, err := childgw.Start(bin, dir, policy, fmt.Sprintf("http://127.0.0.1:%d", admin))
	if err != nil {
		return err
	}
	defer gw.Stop()
	base := fmt.Sprintf("http://127.0.0.1:%d", api)
	// One warm-up stream, so that "before" counts the pools and code a first stream brings in.
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n, MaxConnsPerHost: 0, DisableCompression: true}}
	var open atomic.Int64
	ctx := context.Background()
	if r := stream(ctx, client, base, body, &open); r != "complete" {
		log := gw.Tail(4096)
		return fmt.Errorf("warm-up stream: %s\n%s", r, log)
	}
	time.Sleep(500 * time.Millisecond)
	before := gw.StatusKiB("VmRSS")
	idleMetrics, _ := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", admin))

	cpu0, cpuErr := gw.CPUTime()
	var mu sync.Mutex
	ends := map[string]int{}
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(int64(ramp) * int64(i) / int64(n)))
			r := stream(ctx, client, base, body, &open)
			mu.Lock()
			ends[r]++
			mu.Unlock()
		}()
	}
	// Sample while every stream is open (after the ramp, before the first ones end).
	var full []int64
	var fullMetrics string
	maxOpen := int64(0)
	lifetime := time.Duration(tokens) * gap
	for time.Since(start) < ramp+lifetime {
		o := open.Load()
		maxOpen = max(maxOpen, o)
		if o == int64(n) {
			full = append(full, gw.StatusKiB("VmRSS"))
			if len(full) == 10 {
				fullMetrics, _ = get(fmt.Sprintf("http://127.0.0.1:%d/metrics", admin))
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	took := time.Since(start)
	cpu1, cpuErr1 := gw.CPUTime()
	hwm := gw.StatusKiB("VmHWM")
	after := gw.StatusKiB("VmRSS")
	metrics, _ := get(fmt.Sprintf("http://127.0.0.1:%d/metrics", admin))

	fmt.Printf("%d streams opened over %v, %d content events %v apart each, request bodies of %d bytes; all done in %.1f s; at most %d open at once; load average %s at the start, %s at the end\n\n",
		n, ramp, tokens, gap, len(body), took.Seconds(), maxOpen, loadStart, loadAverage())
	fmt.Println("| gateway RSS | MB |")
	fmt.Println("|---|---|")
	fmt.Printf("| before (one warm-up stream done) | %.1f |\n", float64(before)/1024)
	var open1 int64 = -1
	if len(full) > 0 {
		slices.Sort(full)
		open1 = full[len(full)/2]
		fmt.Printf("| every stream open (median of %d samples) | %.1f |\n", len(full), float64(open1)/1024)
	} else {
		fmt.Printf("| every stream open | never (at most %d at once) |\n", maxOpen)
	}
	for line := range strings.SplitSeq(fullMetrics, "\n") {
		for _, m := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines"} {
			if v, ok := strings.CutPrefix(line, m+" "); ok {
				f, _ := strconv.ParseFloat(v, 64)
				if m == "go_goroutines" {
					fmt.Printf("| with every stream open: %s | %.0f |\n", m, f)
				} else {
					fmt.Printf("| with every stream open: %s | %.1f |\n", m, f/(1<<20))
				}
			}
		}
	}
	if g0, g1 := metricValue(idleMetrics, "go_goroutines"), metricValue(fullMetrics, "go_goroutines"); g0 > 0 && g1 > 0 {
		fmt.Printf("| goroutines per open stream ((with every stream open - before) / %d) | %.2f |\n", n, (g1-g0)/float64(n))
	}
	fmt.Printf("| peak (VmHWM) | %.1f |\n", float64(hwm)/1024)
	fmt.Printf("| after | %.1f |\n\n", float64(after)/1024)
	if open1 > 0 {
		fmt.Printf("**%.1f KiB per open stream** ((every stream open - before) / %d)\n\n", float64(open1-before)/float64(n), n)
	} else if maxOpen > 0 {
		fmt.Printf("**%.1f KiB per open stream at the peak** ((VmHWM - before) / %d)\n\n", float64(hwm-before)/float64(maxOpen), maxOpen)
	}
	if cpuErr == nil && cpuErr1 == nil {
		// Every stream's events, counting the first (the role) and the usage chunk besides the content.
		events := n * (tokens + 2)
		fmt.Printf("Gateway CPU while the streams ran: %.2f s, %.1f µs per relayed event (%d streams x %d events)\n\n",
			(cpu1 - cpu0).Seconds(), float64((cpu1-cpu0).Microseconds())/float64(events), n, tokens+2)
	}
	fmt.Println("| how the stream ended (client side) | streams |")
	fmt.Println("|---|---|")
	keys := make([]string, 0, len(ends))
	for k := range ends {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return ends[keys[i]] > ends[keys[j]] })
	for _, k := range keys {
		fmt.Printf("| %s | %d |\n", strings.ReplaceAll(k, "|", "/"), ends[k])
	}
	fmt.Println()
	fmt.Println("The gateway's counters of ended streams (admin /metrics):")
	fmt.Println()
	fmt.Println("```")
	for line := range strings.SplitSeq(metrics, "\n") {
		if strings.HasPrefix(line, "switchyard_stream_ends_total") || strings.HasPrefix(line, "switchyard_client_disconnects_total") ||
			strings.HasPrefix(line, "switchyard_upstream_errors_total") || strings.HasPrefix(line, "switchyard_requests_total") {
			fmt.Println(line)
		}
	}
	fmt.Println("```")
	return nil
}

// metricValue returns the value of the unlabelled metric name in a Prometheus text exposition, 0 if absent.
func metricValue(text, name string) float64 {
	for line := range strings.SplitSeq(text, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

func get(url string) (string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
