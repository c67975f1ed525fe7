package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what report.json holds: one RunReport per target, strategy or column, in the order they ran.
type Report struct {
	Command string       `json:"command"`
	Date    string       `json:"date"`
	Machine Machine      `json:"machine"`
	Runs    []*RunReport `json:"runs"`
	// Overhead is set by "bench overhead": added latency of each proxy against the direct run.
	Overhead []OverheadRow `json:"overhead,omitempty"`
}

// Machine describes where a report was made.
type Machine struct {
	NProc    int    `json:"nproc"`
	CPUModel string `json:"cpu_model"`
	OS       string `json:"os"`
	Go       string `json:"go"`
}

// ThisMachine describes the current machine.
func ThisMachine() Machine {
	m := Machine{NProc: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version(), CPUModel: "unknown"}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

// RunReport summarises one run. Latencies are in milliseconds over the successful, measured (non-warm-up)
// requests: TTFT and ITL over streamed ones, end-to-end over all. Rates divide by the measured window: from the
// end of the warm-up to the later of the end of the schedule and the last response of a measured request.
type RunReport struct {
	Name string `json:"name"`
	// Error is set when the run could not happen (its target did not start); the other fields are then empty.
	Error    string  `json:"error,omitempty"`
	Target   string  `json:"target"`
	Workload string  `json:"workload"`
	Model    string  `json:"model"`
	Seed     uint64  `json:"seed"`
	Rate     float64 `json:"rate"`
	WarmupS  float64 `json:"warmup_s"`
	// Started is the wall-clock time of the timeline's 0 (events and series are offsets from it), to line a run
	// up with logs.
	Started time.Time `json:"started"`
	WindowS float64   `json:"window_s"`
	// Requests is the number of measured requests planned; Sent of them went out; OK succeeded.
	Requests int `json:"requests"`
	Sent     int `json:"sent"`
	// SentAll counts every request sent, warm-up included (what the engines' counters see).
	SentAll int            `json:"sent_all"`
	OK      int            `json:"ok"`
	Status  map[string]int `json:"status"`
	Errors  map[string]int `json:"errors"`
	// ErrorSamples holds the first message of each error kind.
	ErrorSamples map[string]string `json:"error_samples,omitempty"`
	TTFT         Quantiles         `json:"ttft_ms"`
	ITL          Quantiles         `json:"itl_ms"`
	E2E          Quantiles         `json:"e2e_ms"`
	// SendLate is how late requests went out after their scheduled time: the generator's own health.
	SendLate    Quantiles `json:"send_late_ms"`
	SessionWait Quantiles `json:"session_wait_ms"`
	RequestsPS  float64   `json:"requests_per_s"`
	OutputTPS   float64   `json:"output_tokens_per_s"`
	GoodputRPS  float64   `json:"goodput_rps"`
	// SLOAttainment is the share of measured requests that succeeded within the SLO.
	SLOAttainment float64 `json:"slo_attainment"`
	SLO           SLOms   `json:"slo"`
	// Backends counts responses by the backend header.
	Backends map[string]int `json:"backends"`
	// Shed counts 429 and 503 answers by priority header value ("" = none sent) and status.
	Shed map[string]map[string]int `json:"shed"`
	// Priorities breaks the measured requests down by priority class (only when the workload has priorities).
	Priorities map[string]*ClassReport `json:"priorities,omitempty"`
	// Bursts gives, for each burst of the workload in order, the measured requests scheduled inside it (from its
	// first second to its end), all together and by priority class: a spike's own figures, which the whole
	// run's would dilute.
	Bursts []BurstReport `json:"bursts,omitempty"`
	// Pick is how long the oracle's choice of a backend took per request (not part of TTFT); nil without one.
	Pick *Quantiles `json:"pick_ms,omitempty"`
	// PrefixHitRate is the simulators' prefix cache hits/queries over the run (with the warm-up), when scraped.
	PrefixHitRate *float64 `json:"prefix_hit_rate,omitempty"`
	// SessionStay is the share of the measured follow-up turns of multi-turn sessions that the backend of the
	// conversation's previous turn answered (both answered 200 with a backend named): how well routing keeps a
	// conversation with the cache that holds its history. Nil without such turns.
	SessionStay *float64 `json:"session_stay,omitempty"`
	// CachedTokens is the sum of usage.prompt_tokens_details.cached_tokens the answers reported.
	CachedTokens int      `json:"cached_tokens"`
	Pings        int      `json:"pings"`
	Series       []Window `json:"series"`
	// EngineRequests is how many requests the simulated engines finished during the run (every finished_reason,
	// aborts included): with retries and hedges it exceeds the requests sent. Nil when the target is not a
	// simulator fleet.
	EngineRequests *float64      `json:"engine_requests,omitempty"`
	Events         []EventRecord `json:"events,omitempty"`
	// CPU is the CPU time the measured proxy process used during the run ("bench overhead" only).
	CPU *CPUUse `json:"cpu,omitempty"`
	// Cost is what the answers cost at the fleet's prices; nil when the fleet states none (cost.go).
	Cost *CostReport `json:"cost,omitempty"`

	ttft []float64 // sorted, for plots
}

// SLOms is an SLO in milliseconds (0 = not checked).
type SLOms struct {
	TTFT float64 `json:"ttft_ms"`
	ITL  float64 `json:"itl_ms"`
}

// ClassReport is one priority class.
type ClassReport struct {
	Requests int       `json:"requests"`
	OK       int       `json:"ok"`
	Shed     int       `json:"shed"`
	Good     int       `json:"good"`
	TTFT     Quantiles `json:"ttft_ms"`
}

// BurstReport is the requests scheduled inside one burst [At, At+Duration) of the timeline.
type BurstReport struct {
	At         time.Duration `json:"at_ns"`
	Duration   time.Duration `json:"duration_ns"`
	Multiplier float64       `json:"multiplier"`
	// OutputTPS is the output tokens/s the fleet delivered inside the burst's window, by when the tokens
	// arrived (burstTally.deliver): how much of the fleet's capacity served someone while it was overloaded.
	OutputTPS float64     `json:"output_tokens_per_s"`
	All       ClassReport `json:"all"`
	// Classes is by priority class, when the workload has priorities.
	Classes map[string]*ClassReport `json:"classes,omitempty"`
}

// ClassWindow is one priority class within one second of the timeline.
type ClassWindow struct {
	N       int     `json:"n"`
	Errors  int     `json:"errors"`
	TTFTP99 float64 `json:"ttft_p99_ms"`
}

// Window is one second of the timeline, by send time (warm-up included).
type Window struct {
	T       float64 `json:"t_s"`
	N       int     `json:"n"`
	Errors  int     `json:"errors"`
	TTFTP50 float64 `json:"ttft_p50_ms"`
	TTFTP99 float64 `json:"ttft_p99_ms"`
	// Backends counts the window's requests by the backend that answered (X-Switchyard-Backend, else
	// X-Sim-Backend), so a shift of traffic (a slowed backend losing its share) can be timed.
	Backends map[string]int `json:"backends,omitempty"`
	// Classes breaks the window down by priority class, when the workload has priorities.
	Classes map[string]*ClassWindow `json:"classes,omitempty"`
}

// CPUUse is CPU time of a process over a run.
type CPUUse struct {
	Process     string  `json:"process"`
	Seconds     float64 `json:"cpu_s"`
	Per1kReqS   float64 `json:"cpu_s_per_1k_requests"`
	Utilization float64 `json:"cores"`
}

// Summary turns a Result into a RunReport, judging goodput against slo (zero fields unchecked).
func Summary(res *Result, target string, slo SLO) *RunReport {
	w := res.Plan.Workload
	r := &RunReport{
		Name: res.Name, Target: target, Workload: w.Name, Model: w.Model, Seed: w.Seed, Rate: w.Arrival.Rate,
		WarmupS: w.Warmup.Seconds(),
		Started: res.Start.UTC(),
		Status:  map[string]int{}, Errors: map[string]int{}, ErrorSamples: map[string]string{},
		Backends: map[string]int{}, Shed: map[string]map[string]int{},
		SLO:    SLOms{TTFT: ms(slo.TTFT), ITL: ms(slo.ITL)},
		Events: res.Events,
	}
	if len(w.Arrival.Steps) > 0 {
		r.Rate = w.Arrival.Steps[0].Rate
	}
	if len(w.Priorities) > 0 {
		r.Priorities = map[string]*ClassReport{}
		for _, p := range w.Priorities {
			r.Priorities[p.Value] = &ClassReport{}
		}
	}
	var ttft, itl, e2e, late, wait, pick []float64
	classTTFT := map[string][]float64{}
	bursts := newBurstTally(w)
	var good, tokens, turns, stayed int
	lastEnd := w.Span()
	for i := range res.Samples {
		s := &res.Samples[i]
		it := &res.Plan.Items[i]
		if s.Sent {
			r.SentAll++
		}
		bursts.deliver(s) // warm-up requests still streaming in a burst are the fleet's output too
		if it.Warmup {
			continue
		}
		r.Requests++
		cls := r.Priorities[it.Priority]
		if cls != nil {
			cls.Requests++
		}
		if s.Pick > 0 {
			pick = append(pick, ms(s.Pick))
		}
		if s.Sent {
			r.Sent++
			late = append(late, ms(s.Late))
			if it.Kind == KindSession && it.After >= 0 {
				wait = append(wait, ms(s.SessionWait))
			}
			lastEnd = max(lastEnd, s.SendAt+s.E2E)
		}
		if s.Status != 0 {
			r.Status[strconv.Itoa(s.Status)]++
		}
		if s.Status == 429 || s.Status == 503 {
			byStatus := r.Shed[it.Priority]
			if byStatus == nil {
				byStatus = map[string]int{}
				r.Shed[it.Priority] = byStatus
			}
			byStatus[strconv.Itoa(s.Status)]++
			if cls != nil {
				cls.Shed++
			}
		}
		if s.Backend != "" {
			r.Backends[s.Backend]++
			if it.Kind == KindSession && it.After >= 0 && it.After < len(res.Samples) && s.Status == 200 {
				if prev := &res.Samples[it.After]; prev.Status == 200 && prev.Backend != "" {
					turns++
					if prev.Backend == s.Backend {
						stayed++
					}
				}
			}
		}
		r.Pings += s.Pings
		bursts.add(it, s, slo)
		if s.Err != "" {
			r.Errors[s.Err]++
			if _, ok := r.ErrorSamples[s.Err]; !ok {
				r.ErrorSamples[s.Err] = truncate(s.ErrMsg, 300)
			}
			continue
		}
		r.OK++
		r.CachedTokens += s.CachedTokens
		tokens += s.OutputTokens
		e2e = append(e2e, ms(s.E2E))
		first := s.E2E
		if s.Stream && s.ContentEvents > 0 { // an answer without content has no first token
			first = s.TTFT
			ttft = append(ttft, ms(s.TTFT))
			if cls != nil {
				classTTFT[it.Priority] = append(classTTFT[it.Priority], ms(s.TTFT))
			}
			for _, g := range s.ITL {
				itl = append(itl, ms(g))
			}
		}
		if cls != nil {
			cls.OK++
		}
		if meetsSLO(s, first, slo) {
			good++
			if cls != nil {
				cls.Good++
			}
		}
	}
	window := max(lastEnd-w.Warmup, time.Millisecond)
	r.WindowS = window.Seconds()
	r.TTFT, r.ITL, r.E2E = Summarize(ttft), Summarize(itl), Summarize(e2e)
	r.SendLate, r.SessionWait = Summarize(late), Summarize(wait)
	r.ttft = ttft
	r.RequestsPS = float64(r.OK) / r.WindowS
	r.OutputTPS = float64(tokens) / r.WindowS
	r.GoodputRPS = float64(good) / r.WindowS
	if r.Requests > 0 {
		r.SLOAttainment = float64(good) / float64(r.Requests)
	}
	if turns > 0 {
		stay := float64(stayed) / float64(turns)
		r.SessionStay = &stay
	}
	for p, xs := range classTTFT {
		r.Priorities[p].TTFT = Summarize(xs)
	}
	r.Series = series(res)
	r.Bursts = bursts.reports()
	if len(pick) > 0 {
		q := Summarize(pick)
		r.Pick = &q
	}
	return r
}

// burstTally collects the requests of each burst of a workload for BurstReport.
type burstTally struct {
	w       *Workload
	classes []map[string]*ClassReport
	all     []ClassReport
	ttft    []map[string][]float64 // by class, "" for all
	tokens  []float64              // output tokens delivered inside each burst's window (deliver)
}

func newBurstTally(w *Workload) *burstTally {
	t := &burstTally{w: w}
	for range w.Bursts {
		cls := map[string]*ClassReport{}
		for _, p := range w.Priorities {
			cls[p.Value] = &ClassReport{}
		}
		t.classes = append(t.classes, cls)
		t.all = append(t.all, ClassReport{})
		t.ttft = append(t.ttft, map[string][]float64{})
	}
	t.tokens = make([]float64, len(w.Bursts))
	return t
}

// deliver adds a successful answer's output tokens to every burst window they arrived in, by when they
// arrived, not when the request was sent: a stream's tokens at its content events (its first at SendAt+TTFT,
// then one ITL gap after another, OutputTokens spread evenly over ContentEvents), a non-streamed answer's all
// at its last byte. So BurstReport.OutputTPS is the fleet's output while the burst lasts, whatever became of the
// requests sent in it.
func (t *burstTally) deliver(s *Sample) {
	if len(t.w.Bursts) == 0 || s.Err != "" || !s.Sent || s.OutputTokens <= 0 {
		return
	}
	add := func(at time.Duration, n float64) {
		for i, b := range t.w.Bursts {
			if at >= b.At && at < b.At+b.Duration {
				t.tokens[i] += n
			}
		}
	}
	if !s.Stream || s.ContentEvents == 0 || s.TTFT <= 0 {
		add(s.SendAt+s.E2E, float64(s.OutputTokens))
		return
	}
	per := float64(s.OutputTokens) / float64(s.ContentEvents)
	at := s.SendAt + s.TTFT
	add(at, per)
	for _, g := range s.ITL {
		at += g
		add(at, per)
	}
	if rest := s.ContentEvents - 1 - len(s.ITL); rest > 0 { // events past the gaps kept: at the last byte
		add(s.SendAt+s.E2E, per*float64(rest))
	}
}

// add counts a measured item in every burst its scheduled time falls in.
func (t *burstTally) add(it *Item, s *Sample, slo SLO) {
	for i, b := range t.w.Bursts {
		if it.At < b.At || it.At >= b.At+b.Duration {
			continue
		}
		reps := []*ClassReport{&t.all[i]}
		keys := []string{""}
		if c := t.classes[i][it.Priority]; c != nil {
			reps, keys = append(reps, c), append(keys, it.Priority)
		}
		for j, c := range reps {
			c.Requests++
			switch {
			case s.Status == 429 || s.Status == 503:
				c.Shed++
			case s.Err != "":
			default:
				c.OK++
				first := s.E2E
				if s.Stream && s.ContentEvents > 0 {
					first = s.TTFT
					t.ttft[i][keys[j]] = append(t.ttft[i][keys[j]], ms(s.TTFT))
				}
				if meetsSLO(s, first, slo) {
					c.Good++
				}
			}
		}
	}
}

func (t *burstTally) reports() []BurstReport {
	var out []BurstReport
	for i, b := range t.w.Bursts {
		br := BurstReport{At: b.At, Duration: b.Duration, Multiplier: b.Multiplier, All: t.all[i]}
		if b.Duration > 0 {
			br.OutputTPS = t.tokens[i] / b.Duration.Seconds()
		}
		br.All.TTFT = Summarize(t.ttft[i][""])
		if len(t.classes[i]) > 0 {
			br.Classes = t.classes[i]
			for k, c := range br.Classes {
				c.TTFT = Summarize(t.ttft[i][k])
			}
		}
		out = append(out, br)
	}
	return out
}

// meetsSLO: success is assumed; first is the TTFT (the e2e for a non-streamed answer).
func meetsSLO(s *Sample, first time.Duration, slo SLO) bool {
	if slo.TTFT > 0 && first > slo.TTFT {
		return false
	}
	if slo.ITL > 0 && len(s.ITL) > 0 {
		var sum time.Duration
		for _, g := range s.ITL {
			sum += g
		}
		if sum/time.Duration(len(s.ITL)) > slo.ITL {
			return false
		}
	}
	return true
}

// series buckets sent requests by the second they were sent in.
func series(res *Result) []Window {
	span := res.Plan.Workload.Span()
	n := int(span/time.Second) + 1
	ttft := make([][]float64, n)
	errs := make([]int, n)
	count := make([]int, n)
	byBackend := make([]map[string]int, n)
	classed := len(res.Plan.Workload.Priorities) > 0
	classes := make([]map[string]*ClassWindow, n)
	classTTFT := make([]map[string][]float64, n)
	for i := range res.Samples {
		s := &res.Samples[i]
		if !s.Sent {
			continue
		}
		b := min(int(s.SendAt/time.Second), n-1)
		b = max(b, 0)
		count[b]++
		if s.Backend != "" {
			if byBackend[b] == nil {
				byBackend[b] = map[string]int{}
			}
			byBackend[b][s.Backend]++
		}
		var cw *ClassWindow
		if p := res.Plan.Items[i].Priority; classed && p != "" {
			if classes[b] == nil {
				classes[b], classTTFT[b] = map[string]*ClassWindow{}, map[string][]float64{}
			}
			if cw = classes[b][p]; cw == nil {
				cw = &ClassWindow{}
				classes[b][p] = cw
			}
			cw.N++
		}
		switch {
		case s.Err != "":
			errs[b]++
			if cw != nil {
				cw.Errors++
			}
		case s.Stream && s.ContentEvents > 0:
			ttft[b] = append(ttft[b], ms(s.TTFT))
			if cw != nil {
				p := res.Plan.Items[i].Priority
				classTTFT[b][p] = append(classTTFT[b][p], ms(s.TTFT))
			}
		}
	}
	for b := range classes {
		for p, cw := range classes[b] {
			if xs := classTTFT[b][p]; len(xs) > 0 {
				cw.TTFTP99 = Summarize(xs).P99
			}
		}
	}
	out := make([]Window, 0, n)
	for b := range n {
		w := Window{T: float64(b), N: count[b], Errors: errs[b], Backends: byBackend[b], Classes: classes[b]}
		if len(ttft[b]) > 0 {
			q := Summarize(ttft[b])
			w.TTFTP50, w.TTFTP99 = q.P50, q.P99
		}
		out = append(out, w)
	}
	return out
}

// WriteJSON writes rep as indented JSON to dir/report.json, creating dir.
func WriteJSON(dir string, rep *Report) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench: report: %w", err)
	}
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("bench: report: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: report: %w", err)
	}
	return nil
}

// NewReport starts a report for command (the command line that reproduces it).
func NewReport(command string) *Report {
	return &Report{Command: command, Date: time.Now().UTC().Format(time.RFC3339), Machine: ThisMachine()}
}

// PrintRun writes a human-readable table of one run.
func PrintRun(out io.Writer, r *RunReport) {
	fmt.Fprintf(out, "%s -> %s  workload %s, model %s, seed %d, %.1f req/s, %.0fs window after %.0fs warm-up\n",
		r.Name, r.Target, r.Workload, r.Model, r.Seed, r.Rate, r.WindowS, r.WarmupS)
	fmt.Fprintf(out, "requests %d  sent %d  ok %d  status %s  errors %s\n", r.Requests, r.Sent, r.OK,
		counts(r.Status), counts(r.Errors))
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tn\tp50\tp90\tp99\tp99.9\tmean\tmax\t")
	row := func(name string, q Quantiles) {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", name, q.N, f3(q.P50), f3(q.P90), f3(q.P99), f3(q.P999),
			f3(q.Mean), f3(q.Max))
	}
	row("TTFT ms", r.TTFT)
	row("ITL ms", r.ITL)
	row("e2e ms", r.E2E)
	row("send late ms", r.SendLate)
	if r.SessionWait.N > 0 {
		row("session wait ms", r.SessionWait)
	}
	tw.Flush()
	fmt.Fprintf(out, "throughput %.2f req/s, %.1f output tok/s; goodput %.2f req/s (%.1f%% within SLO%s)\n",
		r.RequestsPS, r.OutputTPS, r.GoodputRPS, 100*r.SLOAttainment, sloText(r.SLO))
	if len(r.Backends) > 0 {
		fmt.Fprintf(out, "backends %s\n", counts(r.Backends))
	}
	if len(r.Shed) > 0 {
		fmt.Fprintf(out, "shed %s\n", shedText(r.Shed))
	}
	for _, p := range slices.Sorted(maps.Keys(r.Priorities)) {
		c := r.Priorities[p]
		fmt.Fprintf(out, "priority %-10s requests %d ok %d shed %d good %d  TTFT p50 %s p99 %s ms\n", p, c.Requests,
			c.OK, c.Shed, c.Good, f3(c.TTFT.P50), f3(c.TTFT.P99))
	}
	if r.SessionStay != nil {
		fmt.Fprintf(out, "follow-up turns on their conversation's backend %.1f%%\n", 100**r.SessionStay)
	}
	if r.PrefixHitRate != nil {
		fmt.Fprintf(out, "prefix cache hit rate %.1f%%\n", 100**r.PrefixHitRate)
	}
	if r.CPU != nil {
		fmt.Fprintf(out, "cpu %s: %.2fs, %.3fs per 1k requests (%.2f cores)\n", r.CPU.Process, r.CPU.Seconds,
			r.CPU.Per1kReqS, r.CPU.Utilization)
	}
	for _, e := range r.Events {
		fmt.Fprintf(out, "event at %.1fs: %s%s\n", e.At.Seconds(), e.Label, errSuffix(e.Err))
	}
	for _, k := range slices.Sorted(maps.Keys(r.ErrorSamples)) {
		fmt.Fprintf(out, "first %s: %s\n", k, r.ErrorSamples[k])
	}
	warnLate(out, r)
}

// LateWarning is the send lateness (p99) above which a report warns that the load generator could not keep its
// schedule: the latencies still count from the scheduled times (so the target is not flattered), but part of
// what they show is the harness's own machine.
const LateWarning = 25 * time.Millisecond

func warnLate(out io.Writer, r *RunReport) {
	if r.SendLate.P99 > ms(LateWarning) {
		fmt.Fprintf(out, "warning: %s: the load generator sent requests late (p99 %s ms, max %s ms after schedule): "+
			"this machine is too busy for the tail figures to be trusted\n", r.Name, f3(r.SendLate.P99), f3(r.SendLate.Max))
	}
}

// PrintCompare writes the runs side by side, each with its ratio to the first run.
func PrintCompare(out io.Writer, all []*RunReport) {
	var runs []*RunReport
	for _, r := range all {
		if r.Error != "" {
			fmt.Fprintf(out, "%s: not run: %s\n", r.Name, firstLine(r.Error))
			continue
		}
		runs = append(runs, r)
	}
	if len(runs) == 0 {
		return
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "\t")
	for _, r := range runs {
		fmt.Fprintf(tw, "%s\t", r.Name)
	}
	fmt.Fprintln(tw)
	line := func(name string, v func(*RunReport) float64) {
		fmt.Fprintf(tw, "%s\t", name)
		base := v(runs[0])
		for i, r := range runs {
			x := v(r)
			if i == 0 {
				fmt.Fprintf(tw, "%s\t", f3(x))
			} else {
				fmt.Fprintf(tw, "%s %s\t", f3(x), ratio(x, base))
			}
		}
		fmt.Fprintln(tw)
	}
	quant := func(name string, q func(*RunReport) Quantiles) {
		line(name+" p50", func(r *RunReport) float64 { return q(r).P50 })
		line(name+" p90", func(r *RunReport) float64 { return q(r).P90 })
		line(name+" p99", func(r *RunReport) float64 { return q(r).P99 })
		line(name+" p99.9", func(r *RunReport) float64 { return q(r).P999 })
		line(name+" mean", func(r *RunReport) float64 { return q(r).Mean })
	}
	quant("TTFT ms", func(r *RunReport) Quantiles { return r.TTFT })
	quant("ITL ms", func(r *RunReport) Quantiles { return r.ITL })
	line("e2e ms p50", func(r *RunReport) float64 { return r.E2E.P50 })
	line("e2e ms p99", func(r *RunReport) float64 { return r.E2E.P99 })
	line("requests/s", func(r *RunReport) float64 { return r.RequestsPS })
	line("output tok/s", func(r *RunReport) float64 { return r.OutputTPS })
	line("goodput req/s", func(r *RunReport) float64 { return r.GoodputRPS })
	line("SLO attainment %", func(r *RunReport) float64 { return 100 * r.SLOAttainment })
	line("errors", func(r *RunReport) float64 { return float64(r.Requests - r.OK) })
	line("send late p99 ms", func(r *RunReport) float64 { return r.SendLate.P99 })
	if slices.ContainsFunc(runs, func(r *RunReport) bool { return r.EngineRequests != nil }) {
		line("engine req/request", func(r *RunReport) float64 {
			if r.EngineRequests == nil || r.SentAll == 0 {
				return 0
			}
			return *r.EngineRequests / float64(r.SentAll)
		})
	}
	if slices.ContainsFunc(runs, func(r *RunReport) bool { return r.Cost != nil }) {
		line("cost $/M output tok", func(r *RunReport) float64 {
			if r.Cost == nil {
				return 0
			}
			return r.Cost.PerMOutput
		})
		line("cost $", func(r *RunReport) float64 {
			if r.Cost == nil {
				return 0
			}
			return r.Cost.Dollars
		})
	}
	if slices.ContainsFunc(runs, func(r *RunReport) bool { return r.PrefixHitRate != nil }) {
		line("prefix hit %", func(r *RunReport) float64 {
			if r.PrefixHitRate == nil {
				return 0
			}
			return 100 * *r.PrefixHitRate
		})
	}
	tw.Flush()
	for _, r := range runs {
		fmt.Fprintf(out, "%s: status %s errors %s backends %s", r.Name, counts(r.Status), counts(r.Errors), counts(r.Backends))
		if len(r.Shed) > 0 {
			fmt.Fprintf(out, " shed %s", shedText(r.Shed))
		}
		if r.Cost != nil && r.Cost.Overflow != nil {
			fmt.Fprintf(out, " overflow before/during/after burst %d/%d/%d", r.Cost.Overflow["before_burst"],
				r.Cost.Overflow["burst"], r.Cost.Overflow["after_burst"])
		}
		fmt.Fprintln(out)
		writePhases(out, r)
		for _, p := range slices.Sorted(maps.Keys(r.Priorities)) {
			c := r.Priorities[p]
			fmt.Fprintf(out, "  %-10s requests %d ok %d shed %d good %d TTFT p99 %s ms\n", p, c.Requests, c.OK, c.Shed,
				c.Good, f3(c.TTFT.P99))
		}
	}
	if r := runs[0]; len(r.Events) > 0 {
		for i, e := range r.Events {
			fmt.Fprintf(out, "event at %.1fs: %s%s; UTC", e.At.Seconds(), e.Label, errSuffix(e.Err))
			for _, c := range runs {
				if i < len(c.Events) {
					fmt.Fprintf(out, " %s %s", c.Name, c.Started.Add(c.Events[i].At).Format("15:04:05.000"))
				}
			}
			fmt.Fprintln(out)
		}
	}
	for _, r := range runs {
		warnLate(out, r)
	}
}

func ratio(x, base float64) string {
	if base == 0 {
		if x == 0 {
			return "(=)"
		}
		return "(-)"
	}
	return fmt.Sprintf("(%.2fx)", x/base)
}

// f3 prints a number with 3 significant digits (at least one decimal below 100).
func f3(x float64) string {
	switch ax := abs(x); {
	case ax == 0:
		return "0"
	case ax >= 100:
		return strconv.FormatFloat(x, 'f', 0, 64)
	case ax >= 10:
		return strconv.FormatFloat(x, 'f', 1, 64)
	case ax >= 1:
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "-"
	}
	keys := slices.SortedFunc(maps.Keys(m), func(a, b string) int { return cmp.Or(cmp.Compare(m[b], m[a]), cmp.Compare(a, b)) })
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s:%d", k, m[k])
	}
	return strings.Join(parts, " ")
}

func shedText(m map[string]map[string]int) string {
	var parts []string
	for _, p := range slices.Sorted(maps.Keys(m)) {
		name := p
		if name == "" {
			name = "(none)"
		}
		parts = append(parts, name+"{"+counts(m[p])+"}")
	}
	return strings.Join(parts, " ")
}

func sloText(s SLOms) string {
	var parts []string
	if s.TTFT > 0 {
		parts = append(parts, fmt.Sprintf("TTFT <= %gms", s.TTFT))
	}
	if s.ITL > 0 {
		parts = append(parts, fmt.Sprintf("ITL <= %gms", s.ITL))
	}
	if len(parts) == 0 {
		return ", no SLO set"
	}
	return " " + strings.Join(parts, ", ")
}

func errSuffix(e string) string {
	if e == "" {
		return ""
	}
	return " (failed: " + e + ")"
}

// phaseGrace is how long after an event the phases table starts a new phase, so that "how did traffic move
// within a few seconds of the event" reads directly off the table.
const phaseGrace = 5 * time.Second

// writePhases prints, for a run with scenario events, each backend's share of the requests sent in each phase:
// between events, with a phase boundary phaseGrace after each event too.
func writePhases(out io.Writer, r *RunReport) {
	if len(r.Events) == 0 || len(r.Series) == 0 {
		return
	}
	end := r.Series[len(r.Series)-1].T + 1
	cuts := []float64{0, end}
	for _, e := range r.Events {
		for _, at := range []float64{e.At.Seconds(), (e.At + phaseGrace).Seconds()} {
			if at > 0 && at < end {
				cuts = append(cuts, at)
			}
		}
	}
	slices.Sort(cuts)
	cuts = slices.Compact(cuts)
	fmt.Fprintf(out, "  share by phase (send time):")
	for i := 0; i+1 < len(cuts); i++ {
		from, to := cuts[i], cuts[i+1]
		byBackend := map[string]int{}
		total := 0
		for _, w := range r.Series {
			if w.T >= from && w.T < to {
				for b, n := range w.Backends {
					byBackend[b] += n
					total += n
				}
			}
		}
		fmt.Fprintf(out, " [%.1fs,%.1fs)", from, to)
		if total == 0 {
			fmt.Fprintf(out, " -")
			continue
		}
		for _, b := range slices.Sorted(maps.Keys(byBackend)) {
			fmt.Fprintf(out, " %s %.0f%%", b, 100*float64(byBackend[b])/float64(total))
		}
		fmt.Fprintf(out, ";")
	}
	fmt.Fprintln(out)
}
