package bench

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeResult builds a Result by hand: 10 measured requests 100ms apart after one warm-up request, with known TTFTs.
func fakeResult(t *testing.T, name string, ttftMS float64) *Result {
	w := testWorkload(t, "arrival: {process: fixed, rate: 10}\nwarmup: 150ms\nduration: 1s\nprompt: {dist: fixed, value: 1}\noutput: {dist: fixed, value: 4}\npriorities: [{value: critical, weight: 1}, {value: sheddable, weight: 1}]\n")
	p, err := NewPlan(w)
	if err != nil {
		t.Fatal(err)
	}
	res := &Result{Name: name, Plan: p, Samples: make([]Sample, len(p.Items))}
	for i, it := range p.Items {
		s := Sample{Index: i, Sent: true, Stream: true, Status: 200, SendAt: it.At, Backend: "b" + string(rune('1'+i%2)),
			TTFT: time.Duration(ttftMS*float64(time.Millisecond)) * time.Duration(i+1), OutputTokens: 4, ContentEvents: 4,
			ITL: []time.Duration{10 * time.Millisecond, 10 * time.Millisecond, 40 * time.Millisecond}}
		s.E2E = s.TTFT + 60*time.Millisecond
		if i == 3 {
			s = Sample{Index: i, Sent: true, Stream: true, Status: 503, Err: ErrStatus, ErrMsg: "overloaded", SendAt: it.At}
		}
		res.Samples[i] = s
	}
	res.Events = []EventRecord{{At: 500 * time.Millisecond, Label: "b1 slower"}}
	return res
}

func TestReportJSONShape(t *testing.T) {
	res := fakeResult(t, "direct", 10)
	r := Summary(res, "http://x", SLO{TTFT: 50 * time.Millisecond, ITL: 25 * time.Millisecond})
	rep := NewReport("switchyard bench run ...")
	rep.Runs = []*RunReport{r}
	dir := t.TempDir()
	if err := WriteJSON(dir, rep); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	// Decode generically: this is the stable interface scripts read, so check names and types, not Go structs.
	var doc struct {
		Runs []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal(data, &doc); err != nil || len(doc.Runs) != 1 {
		t.Fatalf("report.json: %v (%d runs)", err, len(doc.Runs))
	}
	run := doc.Runs[0]
	if run["name"] != "direct" {
		t.Errorf("name %v", run["name"])
	}
	for _, k := range []string{"requests", "output_tokens_per_s", "goodput_rps"} {
		if _, ok := run[k].(float64); !ok {
			t.Errorf("%s is %T, want a number", k, run[k])
		}
	}
	for _, k := range []string{"ttft_ms", "itl_ms", "e2e_ms"} {
		m, ok := run[k].(map[string]any)
		if !ok {
			t.Fatalf("%s is %T", k, run[k])
		}
		for _, q := range []string{"p50", "p90", "p99", "p999", "mean"} {
			if _, ok := m[q].(float64); !ok {
				t.Errorf("%s.%s is %T, want a number", k, q, m[q])
			}
		}
	}
	status := run["status"].(map[string]any)
	if status["200"] != 9.0 || status["503"] != 1.0 {
		t.Errorf("status %v", status)
	}
	backends := run["backends"].(map[string]any)
	if backends["b1"].(float64)+backends["b2"].(float64) != 9 {
		t.Errorf("backends %v", backends)
	}
	// Figures: the warm-up request (TTFT 10ms) is excluded; TTFTs 20..110ms without the failed 40ms.
	if r.Requests != 10 || r.OK != 9 || r.TTFT.P50 != 70 || r.TTFT.N != 9 || r.ITL.P50 != 10 || r.ITL.Max != 40 {
		t.Errorf("requests %d ok %d ttft %+v itl %+v", r.Requests, r.OK, r.TTFT, r.ITL)
	}
	// Mean ITL of every request is 20ms <= 25ms; TTFT <= 50ms holds for 20, 30 and 50 (40 failed).
	if want := 3 / r.WindowS; r.GoodputRPS != want {
		t.Errorf("goodput %v, want %v", r.GoodputRPS, want)
	}
	if r.Shed[res.Plan.Items[3].Priority]["503"] != 1 {
		t.Errorf("shed %v", r.Shed)
	}
	var buf bytes.Buffer
	PrintRun(&buf, r)
	PrintCompare(&buf, []*RunReport{r, Summary(fakeResult(t, "gw", 20), "http://y", SLO{})})
	for _, want := range []string{"TTFT ms", "goodput", "(2.00x)", "status 200:9 503:1"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, buf.String())
		}
	}
}

func TestSVGWellFormed(t *testing.T) {
	runs := []*RunReport{
		Summary(fakeResult(t, "round_robin", 10), "a", SLO{}),
		Summary(fakeResult(t, "adaptive <&>", 5), "b", SLO{}),
	}
	cases := []struct {
		file   string
		svg    []byte
		series []string
		events []string
	}{
		{"cdf", TTFTCDFSVG("TTFT & friends", runs), []string{"round_robin (p99 110 ms)", "adaptive <&> (p99 55.0 ms)"}, nil},
		{"timeline", TimelineSVG("timeline", runs, runs[0].Events),
			[]string{"round_robin p50", "round_robin p99", "adaptive <&> p50", "adaptive <&> p99"}, []string{"b1 slower"}},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			series, events, texts := parseSVG(t, tc.svg)
			if strings.Join(series, "|") != strings.Join(tc.series, "|") {
				t.Errorf("series %q, want %q", series, tc.series)
			}
			if strings.Join(events, "|") != strings.Join(tc.events, "|") {
				t.Errorf("events %q, want %q", events, tc.events)
			}
			for _, want := range []string{"(ms, log scale)"} {
				if !strings.Contains(strings.Join(texts, "\n"), want) {
					t.Errorf("no axis label with %q", want)
				}
			}
		})
	}
}

// parseSVG checks that data is well-formed XML with an <svg> root, and returns the data-name of every series
// group, the data-label of every event and every text.
func parseSVG(t *testing.T, data []byte) (series, events, texts []string) {
	t.Helper()
	dec := xml.NewDecoder(bytes.NewReader(data))
	root := ""
	inText := false
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("not well-formed XML: %v", err)
		}
		switch el := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = el.Name.Local
			}
			attr := map[string]string{}
			for _, a := range el.Attr {
				attr[a.Name.Local] = a.Value
			}
			if el.Name.Local == "g" && attr["class"] == "series" {
				series = append(series, attr["data-name"])
			}
			if el.Name.Local == "g" && attr["class"] == "event" {
				events = append(events, attr["data-label"])
			}
			inText = el.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, string(el))
			}
		case xml.EndElement:
			inText = false
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q", root)
	}
	return series, events, texts
}

// TestBurstOutputByArrival: a burst's OutputTPS counts tokens by when they arrived inside its window, whenever
// their request was sent: a stream sent before the burst delivers into it, one sent inside it may deliver after
// it, a non-streamed answer counts at its last byte, and a failed answer not at all.
func TestBurstOutputByArrival(t *testing.T) {
	w := &Workload{Bursts: []Burst{{At: 10 * time.Second, Duration: 10 * time.Second, Multiplier: 2}}}
	tl := newBurstTally(w)
	sec := time.Second
	// Sent at 8 s, first token at 9 s, then one event a second: events at 9..18 s, 2 tokens each, of which the
	// 9 at 10-18 s fall in [10 s, 20 s).
	gaps := make([]time.Duration, 9)
	for i := range gaps {
		gaps[i] = sec
	}
	tl.deliver(&Sample{Sent: true, Stream: true, SendAt: 8 * sec, TTFT: sec, ITL: gaps, ContentEvents: 10,
		OutputTokens: 20, E2E: 10 * sec})
	// Sent at 19 s: its tokens arrive from 19.5 s, only the first event (0.5 s) inside the window.
	tl.deliver(&Sample{Sent: true, Stream: true, SendAt: 19 * sec, TTFT: sec / 2, ITL: []time.Duration{sec, sec},
		ContentEvents: 3, OutputTokens: 30, E2E: 3 * sec})
	// Not streamed, last byte at 15 s: all 50 tokens; a failed one and a refused one: none.
	tl.deliver(&Sample{Sent: true, SendAt: 12 * sec, E2E: 3 * sec, OutputTokens: 50})
	tl.deliver(&Sample{Sent: true, SendAt: 12 * sec, E2E: 3 * sec, OutputTokens: 50, Err: "stream broke"})
	tl.deliver(&Sample{Sent: true, SendAt: 12 * sec, E2E: time.Millisecond, Status: 503})
	reps := tl.reports()
	if len(reps) != 1 {
		t.Fatalf("%d reports", len(reps))
	}
	want := (9*2 + 10 + 50) / 10.0
	if got := reps[0].OutputTPS; math.Abs(got-want) > 1e-9 {
		t.Errorf("OutputTPS %v, want %v", got, want)
	}
}

// TestSessionStay: the share of follow-up turns answered by the backend of their conversation's previous turn,
// over the turns whose previous turn was answered; a failed turn counts in neither.
func TestSessionStay(t *testing.T) {
	w := testWorkload(t, "arrival: {process: fixed, rate: 20}\nwarmup: 100ms\nduration: 2s\nprompt: {dist: fixed, value: 10}\noutput: {dist: fixed, value: 4}\nsessions: {share: 1, users: 2, turns: {dist: uniform, min: 4, max: 4}}\n")
	p, err := NewPlan(w)
	if err != nil {
		t.Fatal(err)
	}
	res := &Result{Name: "s", Plan: p, Samples: make([]Sample, len(p.Items))}
	want := [2]int{} // stayed, turns
	for i, it := range p.Items {
		s := Sample{Index: i, Sent: true, Stream: true, Status: 200, SendAt: it.At, TTFT: time.Millisecond,
			E2E: 2 * time.Millisecond, Backend: "b0"}
		if it.Turn == 2 {
			s.Backend = "b1" // every third turn moves, the fourth moves back
		}
		if it.Index%7 == 6 {
			s = Sample{Index: i, Sent: true, Status: 503, Err: ErrStatus, SendAt: it.At}
		}
		res.Samples[i] = s
	}
	for i, it := range p.Items {
		if it.Warmup || it.Kind != KindSession || it.After < 0 || res.Samples[i].Status != 200 || res.Samples[it.After].Status != 200 {
			continue
		}
		want[1]++
		if res.Samples[i].Backend == res.Samples[it.After].Backend {
			want[0]++
		}
	}
	if want[1] < 10 || want[0] == want[1] || want[0] == 0 {
		t.Fatalf("the plan gives %d of %d follow-up turns staying: not a test", want[0], want[1])
	}
	r := Summary(res, "http://x", SLO{})
	if r.SessionStay == nil {
		t.Fatalf("no session stay, want %d/%d", want[0], want[1])
	}
	if *r.SessionStay != float64(want[0])/float64(want[1]) {
		t.Fatalf("session stay %.3f, want %d/%d", *r.SessionStay, want[0], want[1])
	}
	if r := Summary(fakeResult(t, "x", 10), "http://x", SLO{}); r.SessionStay != nil {
		t.Errorf("no sessions, stay %v", *r.SessionStay)
	}
}
