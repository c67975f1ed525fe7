//go:build unix

package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/switchyard/switchyard/sim"
)

// BenchmarkSimulatorITL holds the simulator to its promise: 1,000 concurrent streams spread evenly over 8
// simulated backends in this process (125 decoding sequences each), measured client-side over real loopback
// HTTP. The promised ITL is the model's own step time for the batch each backend ran at,
// ITL + ITLPerSeq*(running-1) = 20ms + 0.1ms*124 = 32.4ms, and the benchmark reports the client's mean and p99
// inter-token gap as ratios to it. Only the steady window counts: gaps after every stream had its first token
// and before any stream finished, so every step is a pure decode step of the full batch.
//
//	go test -run '^$' -bench SimulatorITL -benchtime 1x ./bench/
//
// Results are recorded in bench/results/simulator-itl.md.
func BenchmarkSimulatorITL(b *testing.B) {
	const (
		backends  = 8
		streams   = 1000
		maxTokens = 300 // about 10s of decoding at 32.4ms a step
	)
	for range b.N {
		r := runSimITL(b, backends, streams, maxTokens)
		b.ReportMetric(r.meanGap.Seconds()*1e3, "mean-itl-ms")
		b.ReportMetric(r.p50Gap.Seconds()*1e3, "p50-itl-ms")
		b.ReportMetric(r.p90Gap.Seconds()*1e3, "p90-itl-ms")
		b.ReportMetric(r.p99Gap.Seconds()*1e3, "p99-itl-ms")
		b.ReportMetric(r.promised.Seconds()*1e3, "promised-itl-ms")
		b.ReportMetric(r.meanGap.Seconds()/r.promised.Seconds(), "mean/promised")
		b.ReportMetric(r.p99Gap.Seconds()/r.promised.Seconds(), "p99/promised")
		b.ReportMetric(r.engineITL.Seconds()/r.promised.Seconds(), "engine/promised")
		b.ReportMetric(r.cpu, "cpu-cores")
		b.ReportMetric(r.within10, "share-within-10%")
		b.Logf("streams %d over %d backends, batch %v per backend; steady window %v, %d gaps; "+
			"client ITL mean %v p50 %v p90 %v p95 %v p99 %v max %v; %.1f%% of gaps within 10%% of the promise; "+
			"promised %v; engine-side mean %v; ratios mean %.3f p99 %.3f; engine loop lag mean %v, "+
			"%.1f%% of steps ended >10ms late; process CPU %.2f cores; machine load %s; errors %d",
			streams, backends, r.batch, r.window.Round(time.Millisecond), r.gaps, r.meanGap.Round(time.Microsecond),
			r.p50Gap.Round(time.Microsecond), r.p90Gap.Round(time.Microsecond), r.p95Gap.Round(time.Microsecond),
			r.p99Gap.Round(time.Microsecond), r.maxGap.Round(time.Microsecond), 100*r.within10,
			r.promised, r.engineITL.Round(time.Microsecond), r.meanGap.Seconds()/r.promised.Seconds(),
			r.p99Gap.Seconds()/r.promised.Seconds(), r.lagMean.Round(time.Microsecond), 100*r.lateSteps, r.cpu,
			loadAvg(), r.errors)
		if r.errors > 0 {
			b.Errorf("%d streams failed", r.errors)
		}
	}
}

type simITLResult struct {
	batch                   []float64
	promised, engineITL     time.Duration
	meanGap, p50Gap, p90Gap time.Duration
	p95Gap, p99Gap, maxGap  time.Duration
	window                  time.Duration
	gaps, errors            int
	within10                float64 // share of gaps within 10% of the promise
	lagMean                 time.Duration
	lateSteps               float64 // share of engine steps whose end was processed >10ms late
	cpu                     float64 // process CPU time / wall time during the run
}

func runSimITL(b *testing.B, backends, streams, maxTokens int) simITLResult {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfgs := make([]sim.Config, backends)
	for i := range cfgs {
		cfgs[i] = sim.DefaultConfig()
		cfgs[i].Name = fmt.Sprintf("itl-%d", i)
	}
	fleet, err := sim.StartFleet(ctx, cfgs)
	if err != nil {
		b.Fatal(err)
	}
	defer fleet.Close()
	urls := fleet.URLs()
	tr := &http.Transport{MaxIdleConnsPerHost: streams, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	times := make([][]time.Time, streams)
	errs := make([]error, streams)
	cpu0, wall0 := cpuTime(), time.Now()
	var wg sync.WaitGroup
	b.ResetTimer()
	for i := range streams {
		wg.Go(func() {
			// Distinct short prompts (16 tokens), so no two streams share a prefix.
			body := fmt.Sprintf(`{"model":"sim-model","stream":true,"max_tokens":%d,`+
				`"messages":[{"role":"user","content":"stream %05d %s"}]}`, maxTokens, i, strings.Repeat("x", 40))
			times[i], errs[i] = readStreamTimes(ctx, client, urls[i%backends]+"/v1/chat/completions", body, maxTokens)
		})
	}
	// Sample each backend's batch size in the middle of the run, from its own vllm:num_requests_running.
	time.Sleep(time.Duration(maxTokens/2) * 32 * time.Millisecond)
	var res simITLResult
	for _, u := range urls {
		res.batch = append(res.batch, scrapeMetric(b, u, "vllm:num_requests_running"))
	}
	wg.Wait()
	b.StopTimer()
	res.cpu = (cpuTime() - cpu0).Seconds() / time.Since(wall0).Seconds()

	var engSum, engCount float64
	for _, u := range urls {
		engSum += scrapeMetric(b, u, "vllm:inter_token_latency_seconds_sum")
		engCount += scrapeMetric(b, u, "vllm:inter_token_latency_seconds_count")
	}
	res.engineITL = time.Duration(engSum / engCount * 1e9)
	var lagSum, lagCount, lagOK float64
	for _, u := range urls {
		lagSum += scrapeMetric(b, u, "sim_engine_loop_lag_seconds_sum")
		lagCount += scrapeMetric(b, u, "sim_engine_loop_lag_seconds_count")
		lagOK += scrapeMetric(b, u, `sim_engine_loop_lag_seconds_bucket{model_name="sim-model",le="0.01"}`)
	}
	res.lagMean = time.Duration(lagSum / lagCount * 1e9)
	res.lateSteps = 1 - lagOK/lagCount

	// Steady window: after the last first token, before the first last token.
	var from, to time.Time
	for i, ts := range times {
		if errs[i] != nil || len(ts) != maxTokens {
			res.errors++
			if res.errors == 1 {
				b.Logf("stream %d: %d tokens, %v", i, len(ts), errs[i])
			}
			continue
		}
		if ts[0].After(from) {
			from = ts[0]
		}
		if to.IsZero() || ts[len(ts)-1].Before(to) {
			to = ts[len(ts)-1]
		}
	}
	res.window = to.Sub(from)
	var gaps []time.Duration
	for _, ts := range times {
		for j := 1; j < len(ts); j++ {
			if ts[j-1].After(from) && !ts[j].After(to) {
				gaps = append(gaps, ts[j].Sub(ts[j-1]))
			}
		}
	}
	if len(gaps) == 0 {
		b.Fatal("no gaps in the steady window")
	}
	slices.Sort(gaps)
	var sum time.Duration
	for _, g := range gaps {
		sum += g
	}
	res.gaps = len(gaps)
	res.meanGap = sum / time.Duration(len(gaps))
	res.p50Gap = gaps[len(gaps)/2]
	res.p90Gap = gaps[len(gaps)*90/100]
	res.p95Gap = gaps[len(gaps)*95/100]
	res.p99Gap = gaps[len(gaps)*99/100]
	res.maxGap = gaps[len(gaps)-1]
	// The model's promise at the batch the backends ran (their mean running count, sampled mid-run).
	var batch float64
	for _, n := range res.batch {
		batch += n
	}
	batch /= float64(len(res.batch))
	c := sim.DefaultConfig()
	res.promised = c.ITL + time.Duration(float64(c.ITLPerSeq)*(batch-1))
	near := 0
	for _, g := range gaps {
		if d := g - res.promised; d <= res.promised/10 && -d <= res.promised/10 {
			near++
		}
	}
	res.within10 = float64(near) / float64(len(gaps))
	return res
}

// readStreamTimes posts body and returns the arrival time of each content chunk (the role chunk excluded).
func readStreamTimes(ctx context.Context, client *http.Client, url, body string, want int) ([]time.Time, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("status %d: %s", resp.StatusCode, msg)
	}
	times := make([]time.Time, 0, want)
	r := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			if err == io.EOF {
				return times, nil
			}
			return times, err
		}
		if bytes.HasPrefix(line, []byte(`data: {`)) && bytes.Contains(line, []byte(`"delta":{"content"`)) {
			times = append(times, time.Now())
		}
	}
}

func scrapeMetric(b *testing.B, base, name string) float64 {
	b.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			if err != nil {
				b.Fatal(err)
			}
			return v
		}
	}
	b.Fatalf("%s: no %s", base, name)
	return 0
}

// loadAvg is the machine's 1-minute load average, to say how busy the shared machine was during the run.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Fields(string(data))[0]
}

// cpuTime is this process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
