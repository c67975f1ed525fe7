package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/browsertest"
	"github.com/switchyard/switchyard/sim"
)

// TestStatusPageScreenshot makes the screenshot of the status page under load that docs/status-page.png is
// (README, "Status page"): the demo's fleet and gateway on free loopback ports, a minute of changing load
// (a ramp, a burst of long prompts that the adaptive strategy must spread and admission control sheds for
// its sheddable share, then a calm), then a screenshot in headless Chromium. It runs only when
// SWITCHYARD_STATUS_SCREENSHOT names the PNG to write; SWITCHYARD_STATUS_LOAD changes the load's length
// (default 60s).
//
//	SWITCHYARD_STATUS_SCREENSHOT=$PWD/docs/status-page.png go test -run TestStatusPageScreenshot -timeout 5m ./cmd/switchyard/
func TestStatusPageScreenshot(t *testing.T) {
	out := os.Getenv("SWITCHYARD_STATUS_SCREENSHOT")
	if out == "" {
		t.Skip("set SWITCHYARD_STATUS_SCREENSHOT=FILE.png to make the status page's screenshot")
	}
	browsertest.Chromium(t)
	load := 60 * time.Second
	if v := os.Getenv("SWITCHYARD_STATUS_LOAD"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("SWITCHYARD_STATUS_LOAD: %v", err)
		}
		load = d
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	cfgs := make([]sim.Config, len(demoFleet))
	for i, d := range demoFleet {
		c := sim.DefaultConfig()
		c.Name, c.Region, c.Listen = d.name, d.region, "127.0.0.1:0"
		c.PrefillTPS, c.ITL, c.RTT = d.prefillTPS, d.itl, d.rtt
		c.KVBlocks = 4096
		c.Seed = uint64(i + 1)
		cfgs[i] = c
	}
	fleet, err := sim.StartFleet(ctx, cfgs)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(demoPolicy("127.0.0.1:0", "127.0.0.1:0", fleet)), 0o644); err != nil {
		t.Fatal(err)
	}
	type addrs struct{ client, admin string }
	ready := make(chan addrs, 1)
	served := make(chan error, 1)
	go func() {
		served <- serve(ctx, path, slog.New(slog.NewTextHandler(io.Discard, nil)), func(c, a string) { ready <- addrs{c, a} })
	}()
	var gw addrs
	select {
	case gw = <-ready:
	case err := <-served:
		t.Fatalf("serve: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway did not start")
	}
	defer func() {
		cancel()
		<-served
	}()

	counts := drivePhases(t, "http://"+gw.client, load)
	t.Logf("load: %v", counts)
	window := int(load/time.Second) + 20
	browsertest.Screenshot(t, fmt.Sprintf("http://%s/?window=%d", gw.admin, window), out,
		browsertest.Options{Width: 1400, Height: 1600, Budget: 4 * time.Second})
	t.Logf("wrote %s", out)
}

// drivePhases sends an open-loop load of streaming chat requests for d, in four phases: a ramp from 4 to 30
// requests a second, a burst of long prompts (4,000 tokens: prefill dominates, sheddable ones miss their
// objective), a plateau, a calm. A fifth of the requests are sheddable, a twentieth critical. It returns the
// answers by status.
func drivePhases(t *testing.T, base string, d time.Duration) map[int]int {
	t.Helper()
	client := &http.Client{Timeout: 60 * time.Second}
	r := rand.New(rand.NewPCG(7, 11))
	words := strings.Fields("the gateway routes every request to the backend that will answer first judged by what it measures " +
		"time to first token inter token latency queue depth and the prefix each engine holds in its cache")
	prompt := func(tokens int) string {
		var b strings.Builder
		fmt.Fprintf(&b, "tenant %d: ", r.IntN(8)) // a few shared prefixes
		for b.Len() < tokens*4 {
			b.WriteString(words[r.IntN(len(words))])
			b.WriteByte(' ')
		}
		return b.String()
	}
	var (
		mu     sync.Mutex
		counts = map[int]int{}
		wg     sync.WaitGroup
	)
	start := time.Now()
	for now := time.Duration(0); now < d; now = time.Since(start) {
		f := float64(now) / float64(d)
		rate, tokens := 4+26*f/0.3, 150 // the ramp
		switch {
		case f >= 0.3 && f < 0.5:
			rate, tokens = 12, 4000 // long prompts
		case f >= 0.5 && f < 0.8:
			rate = 30
		case f >= 0.8:
			rate = 6
		}
		class := "standard"
		switch x := r.Float64(); {
		case x < 0.2:
			class = "sheddable"
		case x < 0.25:
			class = "critical"
		}
		body := fmt.Sprintf(`{"model":"sim-model","stream":true,"max_tokens":%d,"messages":[{"role":"user","content":%q}]}`,
			20+r.IntN(40), prompt(tokens/2+r.IntN(tokens)))
		wg.Go(func() {
			code := 0
			req, err := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
			if err == nil {
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-Switchyard-Priority", class)
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
			}
			mu.Lock()
			counts[code]++
			mu.Unlock()
		})
		time.Sleep(time.Duration(r.ExpFloat64() / rate * float64(time.Second)))
	}
	wg.Wait()
	return counts
}
