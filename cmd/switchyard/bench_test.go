package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestBenchUsage(t *testing.T) {
	cases := []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: switchyard bench"},
		{[]string{"frobnicate"}, 2, `unknown subcommand "frobnicate"`},
		{[]string{"run"}, 2, "-target and -workload are required"},
		{[]string{"run", "-target", "http://127.0.0.1:1", "-workload", "nope.yaml"}, 2, "nope.yaml"},
		{[]string{"compare"}, 2, "-scenario is required"},
		{[]string{"run", "-bogus"}, 2, "flag provided but not defined"},
		{[]string{"matrix"}, 2, "-matrix is required"},
		{[]string{"matrix", "-matrix", "../../bench/matrix/protect.yaml", "-cells", "("}, 2, "-cells"},
		{[]string{"help"}, 0, "compare"},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var out, errb bytes.Buffer
			code := runBench(tc.args, &out, &errb)
			if code != tc.code || !strings.Contains(out.String()+errb.String(), tc.want) {
				t.Fatalf("exit %d, output %q %q; want exit %d with %q", code, out.String(), errb.String(), tc.code, tc.want)
			}
		})
	}
}

// The shipped matrices expand, every cell's rate follows from its capacity and stays under max_rate, and the
// least wall time is printed.
func TestBenchMatrixList(t *testing.T) {
	for _, tc := range []struct {
		file  string
		cells int
	}{{"protect.yaml", 18}, {"routing.yaml", 104}} {
		t.Run(tc.file, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := runBench([]string{"matrix", "-matrix", "../../bench/matrix/" + tc.file, "-list"}, &out, &errb)
			if code != 0 {
				t.Fatalf("exit %d:\n%s%s", code, out.String(), errb.String())
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != tc.cells+1 || !strings.Contains(lines[len(lines)-1], fmt.Sprintf("%d cells, ", tc.cells)) ||
				!strings.Contains(lines[len(lines)-1], "at least") {
				t.Fatalf("listing:\n%s", out.String())
			}
			for _, l := range lines[:tc.cells] {
				if !strings.Contains(l, "capacity") || strings.Contains(l, "rate    0.0") {
					t.Errorf("cell line %q", l)
				}
			}
		})
	}
}

func TestBenchRunBadWorkloadLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "w.yaml")
	if err := os.WriteFile(path, []byte("arrival: {rate: 1}\nprompt: {dist: fixed, value: 1}\noutput: {dist: fixed, value: 1}\ncolour: red\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	if code := runBench([]string{"run", "-target", "http://127.0.0.1:1", "-workload", path}, &out, &errb); code != 2 {
		t.Fatalf("exit %d", code)
	}
	if want := path + ":4: field colour not found"; !strings.Contains(errb.String(), want) {
		t.Fatalf("stderr %q, want %q", errb.String(), want)
	}
}

// TestBenchRun drives "bench run" against a tiny OpenAI stream server and checks the report.json contract.
func TestBenchRun(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Sim-Backend", "one")
		for range 3 {
			fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer ts.Close()
	dir := t.TempDir()
	wl := filepath.Join(dir, "w.yaml")
	if err := os.WriteFile(wl, []byte("arrival: {process: fixed, rate: 20}\nduration: 1s\nprompt: {dist: fixed, value: 4}\noutput: {dist: fixed, value: 3}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	var stdout, stderr bytes.Buffer
	code := runBench([]string{"run", "-target", ts.URL, "-workload", wl, "-rate", "10", "-seed", "3", "-out", out}, &stdout, &stderr)
	if code != 0 {
		t.Fatalf("exit %d: %s %s", code, stdout.String(), stderr.String())
	}
	data, err := os.ReadFile(filepath.Join(out, "report.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Runs []struct {
			Name     string         `json:"name"`
			Requests int            `json:"requests"`
			Status   map[string]int `json:"status"`
			Seed     int            `json:"seed"`
			Backends map[string]int `json:"backends"`
			TTFT     map[string]any `json:"ttft_ms"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(data, &rep); err != nil || len(rep.Runs) != 1 {
		t.Fatalf("report.json: %v", err)
	}
	r := rep.Runs[0]
	if r.Requests != 9 || r.Status["200"] != 9 || r.Seed != 3 || r.Backends["one"] != 9 || r.TTFT["p99"] == nil {
		t.Fatalf("report %+v", r)
	}
	for _, f := range []string{"ttft-cdf.svg", "ttft-timeline.svg"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
}
