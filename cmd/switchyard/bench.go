package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/switchyard/switchyard/bench"
)

// runBench implements "switchyard bench run|compare|overhead|matrix". Exit codes: 0 success, 1 the benchmark ran but
// something failed (a column could not start, every request failed), 2 bad usage or input.
func runBench(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		benchUsage(stderr)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	command := "switchyard bench " + strings.Join(args, " ")
	switch args[0] {
	case "run":
		return benchRun(ctx, command, args[1:], stdout, stderr)
	case "compare":
		return benchCompare(ctx, command, args[1:], stdout, stderr)
	case "overhead":
		return benchOverhead(ctx, command, args[1:], stdout, stderr)
	case "matrix":
		return benchMatrix(ctx, command, args[1:], stdout, stderr)
	case "passthrough":
		return benchPassthrough(ctx, args[1:], stderr)
	case "-h", "-help", "--help", "help":
		benchUsage(stdout)
		return 0
	}
	fmt.Fprintf(stderr, "switchyard bench: unknown subcommand %q\n", args[0])
	benchUsage(stderr)
	return 2
}

func benchUsage(w io.Writer) {
	fmt.Fprint(w, `usage: switchyard bench <subcommand> [flags]

  run       -target URL -workload FILE [-model M] [-rate R] [-duration D] [-seed S] [-out DIR]
            one workload against one OpenAI-compatible target (a gateway or a simulator)
  compare   -scenario FILE [-out DIR] [-columns a,b]
            each column of a scenario on a fresh simulator fleet (and gateway), side by side
  overhead  [-fleet FILE] [-workload FILE] [-out DIR]
            latency the gateway (and nginx/HAProxy, when installed) adds to a simulator
  matrix    -matrix FILE [-runs 3] [-out DIR] [-cells REGEXP] [-list]
            every cell of a matrix (fleets x sizes x workloads x loads ...) as a compare, judged by its checks
  passthrough -upstream HOST:PORT [-listen ADDR]
            a bare fasthttp proxy: overhead's "fasthttp" reference column

"switchyard bench <subcommand> -h" lists every flag.
`)
}

// workloadFlags are the overrides every subcommand accepts. from names what they override in the help text.
type workloadFlags struct {
	from             string
	model            string
	rate             float64
	duration, warmup time.Duration
	seed             uint64
	sloTTFT, sloITL  time.Duration
	timeout          time.Duration
	withModel        bool
}

func (f *workloadFlags) register(fs *flag.FlagSet) {
	if f.from == "" {
		f.from = "the workload's"
	}
	if f.withModel {
		fs.StringVar(&f.model, "model", "", "model name to send (default: the workload's, sim-model when it names none)")
	}
	fs.Float64Var(&f.rate, "rate", 0, "arrival rate in requests/s (default: "+f.from+"; scales a stepped load)")
	fs.DurationVar(&f.duration, "duration", 0, "measured window after the warm-up (default: "+f.from+")")
	fs.DurationVar(&f.warmup, "warmup", 0, "warm-up, sent but not reported (default: "+f.from+")")
	fs.Uint64Var(&f.seed, "seed", 0, "random seed (default: "+f.from+"); same seed, same requests")
	fs.DurationVar(&f.sloTTFT, "slo-ttft", 0, "goodput SLO on time to first token (default: "+f.from+")")
	fs.DurationVar(&f.sloITL, "slo-itl", 0, "goodput SLO on mean inter-token latency (default: "+f.from+")")
	fs.DurationVar(&f.timeout, "timeout", 2*time.Minute, "per-request timeout, send to last byte (compare: default the scenario's timeout, else 2m)")
}

func (f *workloadFlags) overrides() bench.Overrides {
	return bench.Overrides{Model: f.model, Rate: f.rate, Duration: f.duration, Warmup: f.warmup, Seed: f.seed,
		SLO: bench.SLO{TTFT: f.sloTTFT, ITL: f.sloITL}}
}

func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) (bool, int) {
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return false, 0
		}
		return false, 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "switchyard bench %s: unexpected arguments %q\n", fs.Name(), fs.Args())
		return false, 2
	}
	return true, 0
}

func benchRun(ctx context.Context, command string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	wf := workloadFlags{withModel: true}
	wf.register(fs)
	target := fs.String("target", "", "base URL of the OpenAI API, without /v1 (required), e.g. http://127.0.0.1:8080")
	workload := fs.String("workload", "", "workload YAML file (required), e.g. bench/workloads/chat-shared-prefix.yaml")
	name := fs.String("name", "", "name of the run in the report (default: the target's host:port)")
	out := fs.String("out", "", "directory for report.json and the SVG plots (default: none, table only)")
	metrics := fs.String("metrics", "", "comma-separated /metrics URLs of the simulators behind the target, for the prefix hit rate (default: the target's own /metrics)")
	apiKey := fs.String("api-key", "", "sent as Authorization: Bearer KEY")
	if ok, code := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if *target == "" || *workload == "" {
		fmt.Fprintln(stderr, "switchyard bench run: -target and -workload are required")
		return 2
	}
	u, err := url.Parse(*target)
	if err != nil || u.Host == "" {
		fmt.Fprintf(stderr, "switchyard bench run: bad -target %q\n", *target)
		return 2
	}
	if *name == "" {
		*name = u.Host
	}
	w, err := bench.LoadWorkload(*workload)
	if err == nil {
		w, err = w.Apply(wf.overrides())
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	plan, err := bench.NewPlan(w)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	metricURLs := []string{strings.TrimRight(*target, "/") + "/metrics"}
	if *metrics != "" {
		metricURLs = strings.Split(*metrics, ",")
	}
	var headers http.Header
	if *apiKey != "" {
		headers = http.Header{"Authorization": {"Bearer " + *apiKey}}
	}
	fmt.Fprintf(stderr, "bench: %s: %d requests (%d measured) over %v against %s\n", w.Name, len(plan.Items),
		plan.Requests(), w.Span(), *target)
	probe := bench.StartPrefixProbe(ctx, metricURLs)
	res, err := bench.Run(ctx, bench.RunConfig{Name: *name, BaseURL: *target, Plan: plan, Timeout: wf.timeout, Headers: headers})
	if err != nil {
		fmt.Fprintln(stderr, "switchyard bench run:", err)
		return 1
	}
	r := bench.Summary(res, *target, w.SLO)
	r.PrefixHitRate = probe.HitRate(ctx)
	bench.PrintRun(stdout, r)
	if *out != "" {
		rep := bench.NewReport(command)
		rep.Runs = []*bench.RunReport{r}
		if err := bench.WriteArtifacts(*out, w.Name, rep); err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(*out, "report.json"))
	}
	if r.OK == 0 && r.Requests > 0 {
		return 1
	}
	return 0
}

func benchCompare(ctx context.Context, command string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("compare", flag.ContinueOnError)
	wf := workloadFlags{from: "the scenario's, else its workload's"}
	wf.register(fs)
	scenario := fs.String("scenario", "", "scenario YAML file (required), e.g. bench/scenarios/shared-prefix.yaml")
	out := fs.String("out", "", "directory for report.json, the SVG plots and the child logs (default bench/out/SCENARIO)")
	columns := fs.String("columns", "", "comma-separated column names to run (default: all)")
	if ok, code := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if *scenario == "" {
		fmt.Fprintln(stderr, "switchyard bench compare: -scenario is required")
		return 2
	}
	sc, err := bench.LoadScenario(*scenario)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	timeout := wf.timeout
	if sc.Timeout > 0 && !flagSet(fs, "timeout") {
		timeout = sc.Timeout
	}
	env, code := benchEnv(out, "bench/out/"+sc.Name, timeout, stderr)
	if code != 0 {
		return code
	}
	var only []string
	if *columns != "" {
		only = strings.Split(*columns, ",")
	}
	runs, err := bench.Compare(ctx, bench.CompareOptions{Env: env, Scenario: sc, Overrides: wf.overrides(), Only: only})
	if err != nil {
		fmt.Fprintln(stderr, "switchyard bench compare:", err)
		return 1
	}
	bench.PrintCompare(stdout, runs)
	rep := bench.NewReport(command)
	rep.Runs = runs
	if err := bench.WriteArtifacts(*out, sc.Name, rep); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s (report.json, ttft-cdf.svg, ttft-timeline.svg; child logs in work/)\n", *out)
	for _, r := range runs {
		if r.Error != "" {
			return 1
		}
	}
	return 0
}

// benchPassthrough serves bench.Passthrough, the overhead benchmark's bare fasthttp reference proxy, until
// SIGTERM.
func benchPassthrough(ctx context.Context, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("passthrough", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8090", "address to serve on")
	upstream := fs.String("upstream", "", "host:port to pass every request to")
	if ok, code := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if *upstream == "" {
		fmt.Fprintln(stderr, "switchyard bench passthrough: -upstream is required")
		return 2
	}
	if err := bench.Passthrough(ctx, *listen, *upstream); err != nil {
		fmt.Fprintln(stderr, "switchyard bench passthrough:", err)
		return 1
	}
	return 0
}

func benchOverhead(ctx context.Context, command string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("overhead", flag.ContinueOnError)
	var wf workloadFlags
	wf.register(fs)
	fleet := fs.String("fleet", "bench/fleets/single.yaml", "simulator fleet file; its first backend is measured")
	workload := fs.String("workload", "bench/workloads/overhead.yaml", "workload YAML file")
	strategy := fs.String("strategy", "round_robin", "the gateway's routing strategy")
	proxies := fs.String("proxies", "nginx,haproxy", "reference proxies to measure when installed (comma-separated: nginx, haproxy, fasthttp; empty for none)")
	out := fs.String("out", "", "directory for report.json, the plots and the child logs (default bench/out/overhead)")
	cpu := fs.Bool("cpu", false, "issue 16's CPU protocol instead: proxies pinned to one core, a mock backend and the load on the other, alternating rounds (uses -rate, -warmup, -duration, -proxies, -strategy)")
	rounds := fs.Int("rounds", 3, "with -cpu: rounds per proxy (medians are reported)")
	capacity := fs.Duration("capacity", 5*time.Second, "with -cpu: closed-loop window per proxy and round for capacity at saturation (0 skips it)")
	conns := fs.Int("conns", 64, "with -cpu: closed-loop concurrency")
	baseline := fs.String("baseline-exe", "", "with -cpu: another switchyard build to measure as column \"baseline\" in the same rounds (before/after)")
	profile := fs.String("cpuprofile", "", "with -cpu: write a CPU profile of the gateway to FILE (each round overwrites it; docs/profiling.md)")
	if ok, code := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if *cpu {
		if !flagSet(fs, "strategy") {
			*strategy = "adaptive"
		}
		if !flagSet(fs, "proxies") {
			*proxies = "nginx"
		}
		return benchCPU(ctx, command, bench.CPUOptions{
			Strategy: *strategy, Proxies: strings.Split(*proxies, ","), Rate: wf.rate, Warmup: wf.warmup,
			Duration: wf.duration, Rounds: *rounds, Capacity: *capacity, Conns: *conns, LoadCPU: 1,
			BaselineExe: *baseline,
		}, *out, *profile, wf.timeout, stdout, stderr)
	}
	w, err := bench.LoadWorkload(*workload)
	if err == nil {
		w, err = w.Apply(wf.overrides())
	}
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	env, code := benchEnv(out, "bench/out/overhead", wf.timeout, stderr)
	if code != 0 {
		return code
	}
	var px []string
	if *proxies != "" {
		px = strings.Split(*proxies, ",")
	}
	runs, rows, err := bench.Overhead(ctx, bench.OverheadOptions{Env: env, Fleet: *fleet, Workload: w, Strategy: *strategy, Proxies: px})
	if err != nil {
		fmt.Fprintln(stderr, "switchyard bench overhead:", err)
		return 1
	}
	bench.PrintCompare(stdout, runs)
	fmt.Fprintln(stdout)
	bench.PrintOverhead(stdout, runs, rows)
	rep := bench.NewReport(command)
	rep.Runs, rep.Overhead = runs, rows
	if err := bench.WriteArtifacts(*out, "overhead", rep); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s\n", *out)
	for _, r := range runs {
		if r.Error != "" {
			return 1
		}
	}
	return 0
}

// benchMatrix runs "bench matrix": exit 0 when every cell ran and passed its checks, 1 when a check failed or
// something did not run, 2 for bad usage or input.
func benchMatrix(ctx context.Context, command string, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("matrix", flag.ContinueOnError)
	file := fs.String("matrix", "", "matrix YAML file (required), e.g. bench/matrix/routing.yaml")
	runs := fs.Int("runs", 0, "runs per cell (default: the matrix's runs, else 3)")
	out := fs.String("out", "", "directory for matrix.md, matrix.json and each cell's runs (default bench/out/matrix-NAME)")
	cells := fs.String("cells", "", "run only the cells whose name (fleet/size[/seats]/workload/load[/event]) matches this regexp")
	list := fs.Bool("list", false, "list the cells with their rates and the matrix's least wall time, run nothing")
	timeout := fs.Duration("timeout", 0, "per-request timeout, send to last byte (default: the matrix's timeout, else 2m)")
	if ok, code := parseFlags(fs, args, stderr); !ok {
		return code
	}
	if *file == "" {
		fmt.Fprintln(stderr, "switchyard bench matrix: -matrix is required")
		return 2
	}
	m, err := bench.LoadMatrix(*file)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 2
	}
	var filter *regexp.Regexp
	if *cells != "" {
		if filter, err = regexp.Compile(*cells); err != nil {
			fmt.Fprintf(stderr, "switchyard bench matrix: -cells: %v\n", err)
			return 2
		}
	}
	n := m.Runs
	if *runs > 0 {
		n = *runs
	}
	if *list {
		return listMatrix(m, filter, n, stdout, stderr)
	}
	env, code := benchEnv(out, "bench/out/matrix-"+m.Name, *timeout, stderr)
	if code != 0 {
		return code
	}
	start := time.Now()
	rep, err := bench.RunMatrix(ctx, command, bench.MatrixOptions{Env: env, Matrix: m, Out: *out, Runs: *runs, Filter: filter})
	if rep != nil {
		bench.PrintMatrix(stdout, rep)
	}
	fmt.Fprintf(stdout, "\nwrote %s (matrix.md, matrix.json; each cell's runs in cells/)\ntotal time %s\n",
		*out, time.Since(start).Round(time.Second))
	if err != nil {
		fmt.Fprintln(stderr, "switchyard bench matrix:", err)
		return 1
	}
	for _, c := range rep.Cells {
		if c.Error != "" {
			return 1
		}
		for _, k := range c.Checks {
			if k.Status == bench.CheckFail || k.Status == bench.CheckError {
				return 1
			}
		}
	}
	return 0
}

// listMatrix prints each cell with its capacity and rates (preparing it in a temporary directory) and the
// matrix's least wall time.
func listMatrix(m *bench.Matrix, filter *regexp.Regexp, runs int, stdout, stderr io.Writer) int {
	dir, err := os.MkdirTemp("", "switchyard-matrix-")
	if err != nil {
		fmt.Fprintln(stderr, "switchyard bench matrix:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	cells := m.Cells(filter)
	code := 0
	for i, c := range cells {
		p, err := m.Prepare(c, filepath.Join(dir, strconv.Itoa(i)))
		if err != nil {
			fmt.Fprintf(stdout, "%-60s %v\n", c.Name, err)
			code = 1
			continue
		}
		fmt.Fprintf(stdout, "%-60s %2d backends, capacity %6.1f req/s, rate %6.1f, peak %6.1f, mixed %-5v shared prefix %v\n",
			c.Name, c.Size.N, p.Capacity.RequestsPS, p.Rate, p.Peak, p.Mixed, p.SharedPrefix)
	}
	est := m.Estimate(cells, runs, matrixStartup)
	cols := 0
	for _, c := range cells {
		cols += len(m.ColumnsOf(c))
	}
	fmt.Fprintf(stdout, "%d cells, %d columns in all, x %d runs: at least %s\n", len(cells), cols, runs,
		est.Round(time.Minute))
	return code
}

// matrixStartup is what a column spends outside its timeline (the fleet's and the gateway's readiness, the
// drain after the last arrival, stopping), in the matrix's least wall time: about 6 s measured on a protect cell
// of a 2-core machine at load 6.8 (84 s for three 22 s columns); a drain to an overloaded column's timeout
// comes on top.
const matrixStartup = 4 * time.Second

// benchCPU runs "bench overhead -cpu" and writes cpu.json to out.
func benchCPU(ctx context.Context, command string, opt bench.CPUOptions, out, profile string, timeout time.Duration, stdout, stderr io.Writer) int {
	env, code := benchEnv(&out, "bench/out/overhead-cpu", timeout, stderr)
	if code != 0 {
		return code
	}
	opt.Env = env
	if profile != "" {
		abs, err := filepath.Abs(profile)
		if err != nil {
			fmt.Fprintln(stderr, "switchyard bench overhead:", err)
			return 2
		}
		opt.Env.GatewayArgs = []string{"-cpuprofile", abs}
	}
	rounds, sums, err := bench.CPUOverhead(ctx, opt)
	bench.PrintCPU(stdout, rounds, sums)
	if err != nil {
		fmt.Fprintln(stderr, "switchyard bench overhead:", err)
		return 1
	}
	rep := map[string]any{"command": command, "machine": bench.NewReport(command).Machine, "rounds": rounds, "medians": sums}
	data, err := json.MarshalIndent(rep, "", "  ")
	if err == nil {
		err = os.WriteFile(filepath.Join(out, "cpu.json"), append(data, '\n'), 0o644)
	}
	if err != nil {
		fmt.Fprintln(stderr, "switchyard bench overhead:", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(out, "cpu.json"))
	return 0
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// benchEnv makes the output and work directories and finds this binary, which compare and overhead run as
// "switchyard sim" and "switchyard serve".
func benchEnv(out *string, def string, timeout time.Duration, stderr io.Writer) (bench.Env, int) {
	if *out == "" {
		*out = def
	}
	work := filepath.Join(*out, "work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		fmt.Fprintln(stderr, "switchyard bench:", err)
		return bench.Env{}, 1
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintln(stderr, "switchyard bench:", err)
		return bench.Env{}, 1
	}
	return bench.Env{Exe: exe, WorkDir: work, Log: stderr, Timeout: timeout}, 0
}
