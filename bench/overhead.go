package bench

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"
)

// OverheadRow is what one proxy adds to the direct path, in the same run: differences in milliseconds and ratios
// of its latency percentiles to the direct ones, and its CPU time per 1,000 requests.
type OverheadRow struct {
	Proxy           string  `json:"proxy"`
	TTFTP50AddedMS  float64 `json:"ttft_p50_added_ms"`
	TTFTP99AddedMS  float64 `json:"ttft_p99_added_ms"`
	TTFTP50Ratio    float64 `json:"ttft_p50_ratio"`
	TTFTP99Ratio    float64 `json:"ttft_p99_ratio"`
	E2EP50AddedMS   float64 `json:"e2e_p50_added_ms"`
	E2EP99AddedMS   float64 `json:"e2e_p99_added_ms"`
	E2EP50Ratio     float64 `json:"e2e_p50_ratio"`
	E2EP99Ratio     float64 `json:"e2e_p99_ratio"`
	CPUPer1kReqS    float64 `json:"cpu_s_per_1k_requests"`
	CPUCores        float64 `json:"cpu_cores"`
	ProxyErrorCount int     `json:"errors"`
}

// OverheadOptions configures Overhead.
type OverheadOptions struct {
	Env
	// Fleet is a fleet file; its first backend is the one measured.
	Fleet    string
	Workload *Workload
	// Strategy is the gateway's strategy (one backend: it only changes the code path); default round_robin.
	Strategy string
	// Proxies are the reference proxies to try when installed: "nginx", "haproxy".
	Proxies []string
}

// Overhead runs the same plan straight to a simulator, through the gateway and through each installed reference
// proxy, each on a fresh simulator, and returns the runs (direct first) and the added latency of each proxy.
// A proxy that is not installed is skipped with a log line; one that fails to start is reported with Error set.
func Overhead(ctx context.Context, opt OverheadOptions) ([]*RunReport, []OverheadRow, error) {
	plan, err := NewPlan(opt.Workload)
	if err != nil {
		return nil, nil, err
	}
	if opt.Strategy == "" {
		opt.Strategy = "round_robin"
	}
	e := &opt.Env
	e.logf("overhead: workload %s, %d requests over %v", opt.Workload.Name, len(plan.Items), opt.Workload.Span())
	kinds := []string{"direct", "gateway"}
	for _, p := range opt.Proxies {
		if _, err := exec.LookPath(p); err != nil && p != "fasthttp" {
			e.logf("overhead: %s is not installed, skipped", p)
			continue
		}
		kinds = append(kinds, p)
	}
	var runs []*RunReport
	for i, kind := range kinds {
		r, err := overheadRun(ctx, e, opt, plan, kind, fmt.Sprintf("%02d-%s", i, kind))
		if ctx.Err() != nil {
			return runs, nil, ctx.Err()
		}
		if err != nil {
			if kind == "direct" {
				return nil, nil, err
			}
			e.logf("overhead: %s: %v", kind, err)
			r = &RunReport{Name: kind, Error: err.Error()}
		}
		runs = append(runs, r)
	}
	base := runs[0]
	var rows []OverheadRow
	for _, r := range runs[1:] {
		if r.Error != "" {
			continue
		}
		row := OverheadRow{
			Proxy:          r.Name,
			TTFTP50AddedMS: r.TTFT.P50 - base.TTFT.P50, TTFTP99AddedMS: r.TTFT.P99 - base.TTFT.P99,
			TTFTP50Ratio: safeDiv(r.TTFT.P50, base.TTFT.P50), TTFTP99Ratio: safeDiv(r.TTFT.P99, base.TTFT.P99),
			E2EP50AddedMS: r.E2E.P50 - base.E2E.P50, E2EP99AddedMS: r.E2E.P99 - base.E2E.P99,
			E2EP50Ratio: safeDiv(r.E2E.P50, base.E2E.P50), E2EP99Ratio: safeDiv(r.E2E.P99, base.E2E.P99),
			ProxyErrorCount: r.Requests - r.OK,
		}
		if r.CPU != nil {
			row.CPUPer1kReqS, row.CPUCores = r.CPU.Per1kReqS, r.CPU.Utilization
		}
		rows = append(rows, row)
	}
	return runs, rows, nil
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func overheadRun(ctx context.Context, e *Env, opt OverheadOptions, plan *Plan, kind, tag string) (*RunReport, error) {
	fleet, backends, err := e.startFleet(ctx, opt.Fleet, tag)
	if err != nil {
		return nil, err
	}
	defer fleet.Stop()
	backend := backends[0]
	target := backend.URL
	var proxy *Proc
	switch kind {
	case "direct":
	case "gateway":
		spec := GatewaySpec{Model: plan.Workload.Model, Strategy: opt.Strategy, Backends: backends[:1]}
		proxy, target, err = e.startGateway(ctx, spec, tag)
	default:
		proxy, target, err = startReferenceProxy(ctx, e, kind, backend, tag)
	}
	if err != nil {
		return nil, err
	}
	if proxy != nil {
		defer proxy.Stop()
	}
	var cpu0 time.Duration
	if proxy != nil {
		if cpu0, err = proxy.CPUTime(); err != nil {
			return nil, err
		}
	}
	e.logf("overhead: %s: running against %s", kind, target)
	res, err := Run(ctx, RunConfig{Name: kind, BaseURL: target, Plan: plan, Timeout: e.Timeout})
	if err != nil {
		return nil, err
	}
	r := Summary(res, target, plan.Workload.SLO)
	if proxy != nil {
		cpu1, err := proxy.CPUTime()
		if err != nil {
			return nil, err
		}
		r.CPU = cpuUse(kind, cpu1-cpu0, r.Sent, res.Elapsed)
	}
	return r, nil
}

// startReferenceProxy starts nginx or HAProxy as a single process (so its CPU time is one /proc entry) with
// response buffering off and keep-alive to the backend, on a free port.
func startReferenceProxy(ctx context.Context, e *Env, kind string, b FleetBackend, tag string) (*Proc, string, error) {
	port, err := FreePort()
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	upstream := b.URL[len("http://"):]
	// Absolute: nginx resolves -e and -c against its -p prefix, so a relative -out doubled the path.
	dir, err := filepath.Abs(filepath.Join(e.WorkDir, tag))
	if err != nil {
		return nil, "", fmt.Errorf("bench: %s: %w", kind, err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		return nil, "", fmt.Errorf("bench: %s: %w", kind, err)
	}
	var conf string
	var argv []string
	switch kind {
	case "nginx":
		conf = fmt.Sprintf(nginxConf, dir, dir, dir, dir, dir, dir, dir, upstream, addr)
		argv = []string{"nginx", "-p", dir, "-e", filepath.Join(dir, "error.log"), "-c", filepath.Join(dir, "proxy.conf")}
	case "haproxy":
		conf = fmt.Sprintf(haproxyConf, addr, upstream)
		argv = []string{"haproxy", "-db", "-f", filepath.Join(dir, "proxy.conf")}
	case "fasthttp":
		// This binary's bare pass-through (Passthrough): the stack's floor, no configuration file.
		conf = "# switchyard bench passthrough: no configuration\n"
		argv = []string{e.Exe, "bench", "passthrough", "-listen", addr, "-upstream", upstream}
	default:
		return nil, "", fmt.Errorf("bench: unknown reference proxy %q (nginx, haproxy or fasthttp)", kind)
	}
	if err := os.WriteFile(filepath.Join(dir, "proxy.conf"), []byte(conf), 0o644); err != nil {
		return nil, "", fmt.Errorf("bench: %s: %w", kind, err)
	}
	p, err := StartProc(ctx, kind, filepath.Join(e.WorkDir, tag+"-"+kind+".log"), e.argv(argv...)...)
	if err != nil {
		return nil, "", err
	}
	if err := WaitTCP(ctx, addr, e.ready(), p); err != nil {
		p.Stop()
		return nil, "", err
	}
	return p, "http://" + addr, nil
}

// nginxConf: one process, no buffering either way, HTTP/1.1 keep-alive upstream, every path under the prefix dir
// (so it runs unprivileged and leaves nothing behind).
const nginxConf = `daemon off;
master_process off;
worker_processes 1;
pid %s/nginx.pid;
error_log %s/error.log warn;
events { worker_connections 16384; }
http {
    access_log off;
    client_body_temp_path %s/tmp/body;
    proxy_temp_path %s/tmp/proxy;
    fastcgi_temp_path %s/tmp/fastcgi;
    uwsgi_temp_path %s/tmp/uwsgi;
    scgi_temp_path %s/tmp/scgi;
    upstream backend { server %s; keepalive 1024; }
    server {
        listen %s;
        location / {
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_request_buffering off;
            proxy_read_timeout 600s;
        }
    }
}
`

// haproxyConf: one thread, HTTP mode, connection reuse to the backend, and http-no-delay so that each SSE event is
// forwarded as it arrives instead of being merged with the next ones.
const haproxyConf = `global
    maxconn 9000
    nbthread 1
defaults
    mode http
    timeout connect 5s
    timeout client 600s
    timeout server 600s
    option http-keep-alive
    option http-no-delay
frontend fe
    bind %s
    default_backend be
backend be
    http-reuse always
    server s1 %s
`

// PrintOverhead writes the added-latency table.
func PrintOverhead(out io.Writer, runs []*RunReport, rows []OverheadRow) {
	if len(runs) == 0 {
		return
	}
	base := runs[0]
	fmt.Fprintf(out, "direct: TTFT p50 %s p99 %s ms, e2e p50 %s p99 %s ms, %d requests\n",
		f3(base.TTFT.P50), f3(base.TTFT.P99), f3(base.E2E.P50), f3(base.E2E.P99), base.Requests)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "proxy\tTTFT p50 +ms\tTTFT p99 +ms\tTTFT p50 x\tTTFT p99 x\te2e p50 +ms\te2e p99 +ms\tCPU s/1k req\tcores\terrors\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.3f\t%.3f\t%s\t%s\t%.3f\t%.2f\t%d\t\n", r.Proxy, f3(r.TTFTP50AddedMS),
			f3(r.TTFTP99AddedMS), r.TTFTP50Ratio, r.TTFTP99Ratio, f3(r.E2EP50AddedMS), f3(r.E2EP99AddedMS),
			r.CPUPer1kReqS, r.CPUCores, r.ProxyErrorCount)
	}
	tw.Flush()
	for _, r := range runs {
		if r.Error != "" {
			fmt.Fprintf(out, "%s: not measured: %s\n", r.Name, firstLine(r.Error))
		}
	}
}

func firstLine(s string) string {
	for i := range s {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}
