package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/switchyard/switchyard/sim"
)

// demoBackend is one simulated backend of the demo fleet. The addresses are those config.yaml names, so that
// `switchyard serve -config config.yaml` also runs against the demo's fleet; a busy port falls back to a free one.
type demoBackend struct {
	name, region, addr string
	prefillTPS         float64
	itl, rtt           time.Duration
}

var demoFleet = []demoBackend{
	{"use-1", "us-east", "127.0.0.1:8001", 10000, 20 * time.Millisecond, 0},
	{"use-2", "us-east", "127.0.0.1:8002", 10000, 20 * time.Millisecond, 0},
	{"use-3", "us-east", "127.0.0.1:8003", 4000, 35 * time.Millisecond, 0}, // an older GPU: slower prefill and decode
	{"use-4", "us-east", "127.0.0.1:8004", 4000, 35 * time.Millisecond, 0},
	{"euw-1", "eu-west", "127.0.0.1:8011", 10000, 20 * time.Millisecond, 80 * time.Millisecond}, // 80 ms away
	{"euw-2", "eu-west", "127.0.0.1:8012", 10000, 20 * time.Millisecond, 80 * time.Millisecond},
}

// runDemo implements "switchyard demo": a simulated multi-region fleet and a gateway in one process, on
// embedded defaults, until Ctrl-C.
func runDemo(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8080", "the gateway's client-facing address")
	adminListen := fs.String("admin-listen", "127.0.0.1:9090", "the gateway's admin address (/metrics, /debug/backends, status page)")
	logLevel := fs.String("log-level", "warn", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "switchyard demo: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	log, err := newLogger(stderr, *logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "switchyard demo: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	cfgs := make([]sim.Config, len(demoFleet))
	for i, d := range demoFleet {
		c := sim.DefaultConfig()
		c.Name, c.Region, c.Listen = d.name, d.region, d.addr
		c.PrefillTPS, c.ITL, c.RTT = d.prefillTPS, d.itl, d.rtt
		c.KVBlocks = 4096 // 64k tokens each: prefixes compete for cache, so affinity matters
		c.Seed = uint64(i + 1)
		if !portFree(d.addr) {
			c.Listen = "127.0.0.1:0"
		}
		cfgs[i] = c
	}
	fleet, err := sim.StartFleet(ctx, cfgs)
	if err != nil {
		fmt.Fprintf(stderr, "switchyard demo: %v\n", err)
		return 1
	}
	defer fleet.Close()

	dir, err := os.MkdirTemp("", "switchyard-demo-")
	if err != nil {
		fmt.Fprintf(stderr, "switchyard demo: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, []byte(demoPolicy(*listen, *adminListen, fleet)), 0o644); err != nil {
		fmt.Fprintf(stderr, "switchyard demo: %v\n", err)
		return 1
	}
	ready := func(client, admin string) {
		fmt.Fprintf(stdout, "Switchyard demo: a gateway in front of %d simulated vLLM backends in us-east and eu-west.\n\n", len(cfgs))
		for _, b := range fleet.Backends() {
			fmt.Fprintf(stdout, "  backend %-6s %-8s %s\n", b.Name(), b.Region(), b.URL())
		}
		fmt.Fprintf(stdout, "\n  OpenAI base URL  http://%s/v1\n", client)
		fmt.Fprintf(stdout, "  status page      http://%s/\n", admin)
		fmt.Fprintf(stdout, "  metrics          http://%s/metrics\n", admin)
		fmt.Fprintf(stdout, "  policy           %s (edit it: the gateway reloads it live)\n\n", path)
		fmt.Fprintf(stdout, "Try:\n  curl -sN http://%s/v1/chat/completions -H 'Content-Type: application/json' \\\n"+
			"    -d '{\"model\":\"sim-model\",\"stream\":true,\"max_tokens\":20,\"messages\":[{\"role\":\"user\",\"content\":\"Hello!\"}]}'\n\n", client)
		fmt.Fprintln(stdout, "Ctrl-C stops everything.")
	}
	if err := serve(ctx, path, log, ready); err != nil {
		fmt.Fprintf(stderr, "switchyard demo: %v\n", err)
		return 1
	}
	return 0
}

// demoPolicy is the demo gateway's policy: every backend of the fleet serves sim-model, routed adaptively.
func demoPolicy(listen, admin string, fleet *sim.Fleet) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Policy of `switchyard demo`, written at start. Edit it: the gateway reloads it live.\n")
	fmt.Fprintf(&b, "listen: %s\nadmin_listen: %s\nregion: us-east\n", listen, admin)
	// A playground on the local machine: no keys, on purpose, so that the curl it prints works as is. A policy
	// without keys must say so (docs/config.md, auth).
	fmt.Fprintf(&b, "auth: none   # no API keys: any caller may use every model and claim any priority\n")
	fmt.Fprintf(&b, "limits:\n  drain_timeout: 2s\nbackends:\n")
	for _, be := range fleet.Backends() {
		fmt.Fprintf(&b, "  - {name: %s, url: %s, region: %s, engine: vllm, models: [sim-model]}\n", be.Name(), be.URL(), be.Region())
	}
	fmt.Fprintf(&b, "models:\n  - name: sim-model\n    strategy: %s\n    slo: {ttft: 500ms, itl: 50ms}\n    retries: 2\n", demoStrategy)
	return b.String()
}

// demoStrategy is the routing strategy the demo runs: the project's default.
const demoStrategy = "adaptive"

func portFree(addr string) bool {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	ln.Close()
	return true
}
