package bench

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestShippedWorkloadsLoad(t *testing.T) {
	files, err := filepath.Glob("workloads/*.yaml")
	if err != nil || len(files) < 5 {
		t.Fatalf("found %d workloads (%v)", len(files), err)
	}
	for _, want := range []string{"chat-shared-prefix", "multi-turn", "mixed-length", "burst", "priority-overload"} {
		if !contains(files, "workloads/"+want+".yaml") {
			t.Errorf("workload %s is missing", want)
		}
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			w, err := LoadWorkload(f)
			if err != nil {
				t.Fatal(err)
			}
			// A companion workload (beside another on one fleet) names a model of its own.
			if companion := map[string]string{"batch-summaries.yaml": "batch"}[filepath.Base(f)]; companion != "" {
				if w.Name != companion || w.Model == DefaultModel {
					t.Errorf("companion workload: name %q model %q", w.Name, w.Model)
				}
			} else if w.Name != baseName(f) || w.Model != DefaultModel {
				t.Errorf("name %q model %q", w.Name, w.Model)
			}
			// A short slice of the plan must build (bodies included) and be valid JSON.
			short, err := w.Apply(Overrides{Duration: 2 * time.Second, Warmup: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			p, err := NewPlan(short)
			if err != nil {
				t.Fatal(err)
			}
			if len(p.Items) == 0 {
				t.Fatal("empty plan")
			}
			for _, it := range p.Items {
				if !json.Valid(it.Body) {
					t.Fatalf("item %d: invalid JSON body", it.Index)
				}
			}
		})
	}
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func TestWorkloadErrors(t *testing.T) {
	cases := []struct {
		name, yaml string
		line       int
		msg        string
	}{
		{"unknown field", "arrival: {rate: 1}\nprompt: {dist: fixed, value: 1}\noutput: {dist: fixed, value: 1}\nbogus: 3\n", 4, "field bogus not found"},
		{"unknown nested field", "arrival: {rate: 1}\nprompt:\n  dist: fixed\n  value: 1\n  vlaue: 2\noutput: {dist: fixed, value: 1}\n", 5, "field vlaue not found"},
		{"wrong type", "arrival: {rate: fast}\nprompt: {dist: fixed, value: 1}\noutput: {dist: fixed, value: 1}\n", 1, "cannot unmarshal"},
		{"bad duration", "arrival: {rate: 1}\nduration: 10 seconds\nprompt: {dist: fixed, value: 1}\noutput: {dist: fixed, value: 1}\n", 2, "cannot unmarshal"},
		{"syntax", "arrival: {rate: 1\nprompt: x\n", 1, "did not find expected"},
		{"missing rate", "name: x\narrival:\n  process: poisson\nprompt: {dist: fixed, value: 1}\noutput: {dist: fixed, value: 1}\n", 2, "arrival.rate"},
		{"bad dist", "arrival: {rate: 1}\nprompt: {dist: fixed, value: 1}\noutput:\n  dist: zipfian\n", 4, "unknown dist"},
		{"uniform bounds", "arrival: {rate: 1}\nprompt: {dist: uniform, min: 10, max: 5}\noutput: {dist: fixed, value: 1}\n", 2, "uniform needs"},
		{"prefix share", "arrival: {rate: 1}\nprompt: {dist: fixed, value: 1}\noutput: {dist: fixed, value: 1}\nprefix:\n  groups: 2\n  tokens: 10\n  share: 1.5\n", 7, "prefix.share"},
		{"priority weight", "arrival: {rate: 1}\nprompt: {dist: fixed, value: 1}\noutput: {dist: fixed, value: 1}\npriorities:\n  - {value: a, weight: 1}\n  - {value: b, weight: -1}\n", 6, "priorities[1]"},
		{"empty", "", 1, "empty file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseWorkload("bad.yaml", []byte(tc.yaml))
			var fe FileErrors
			if !errors.As(err, &fe) || len(fe) == 0 {
				t.Fatalf("got %v, want FileErrors", err)
			}
			if fe[0].Line != tc.line || fe[0].File != "bad.yaml" || !strings.Contains(fe[0].Msg, tc.msg) {
				t.Fatalf("got %q, want bad.yaml:%d: ...%s...", fe[0].Error(), tc.line, tc.msg)
			}
			if !strings.HasPrefix(err.Error(), "bad.yaml:") {
				t.Fatalf("error %q does not start with FILE:LINE", err)
			}
		})
	}
}

func TestPlanDeterministic(t *testing.T) {
	w, err := LoadWorkload("workloads/multi-turn.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w, _ = w.Apply(Overrides{Duration: 5 * time.Second})
	a, _ := NewPlan(w)
	b, _ := NewPlan(w)
	if len(a.Items) == 0 || len(a.Items) != len(b.Items) {
		t.Fatalf("plans of %d and %d items", len(a.Items), len(b.Items))
	}
	for i := range a.Items {
		if a.Items[i].At != b.Items[i].At || !bytes.Equal(a.Items[i].Body, b.Items[i].Body) {
			t.Fatalf("item %d differs between two plans of the same seed", i)
		}
	}
	w2, _ := w.Apply(Overrides{Seed: 99})
	c, _ := NewPlan(w2)
	if len(c.Items) > 0 && bytes.Equal(a.Items[0].Body, c.Items[0].Body) {
		t.Fatal("another seed gave the same first request")
	}
}

func TestPlanArrivals(t *testing.T) {
	count := func(p *Plan, from, to time.Duration) int {
		n := 0
		for _, it := range p.Items {
			if it.At >= from && it.At < to {
				n++
			}
		}
		return n
	}
	base := "prompt: {dist: fixed, value: 1}\noutput: {dist: fixed, value: 1}\n"
	t.Run("poisson", func(t *testing.T) {
		p, _ := NewPlan(testWorkload(t, base+"arrival: {rate: 100}\nduration: 40s\n"))
		// 4,000 expected; a Poisson count has sd 63, so +-5 sd.
		if n := len(p.Items); n < 3685 || n > 4315 {
			t.Fatalf("%d arrivals, want about 4000", n)
		}
		// Exponential gaps: the coefficient of variation is 1 (a fixed process would give 0).
		var sum, sq float64
		for i := 1; i < len(p.Items); i++ {
			g := (p.Items[i].At - p.Items[i-1].At).Seconds()
			sum += g
			sq += g * g
		}
		n := float64(len(p.Items) - 1)
		mean := sum / n
		cv := math.Sqrt(sq/n-mean*mean) / mean
		if cv < 0.9 || cv > 1.1 {
			t.Fatalf("gap coefficient of variation %.3f, want about 1", cv)
		}
	})
	t.Run("fixed", func(t *testing.T) {
		p, _ := NewPlan(testWorkload(t, base+"arrival: {process: fixed, rate: 10}\nduration: 1s\n"))
		if len(p.Items) != 9 || p.Items[0].At != 100*time.Millisecond || p.Items[8].At != 900*time.Millisecond {
			t.Fatalf("%d items, first at %v", len(p.Items), p.Items[0].At)
		}
	})
	t.Run("burst", func(t *testing.T) {
		p, _ := NewPlan(testWorkload(t, base+"arrival: {process: fixed, rate: 10}\nduration: 10s\nbursts: [{at: 4s, duration: 2s, multiplier: 5}]\n"))
		if a, b := count(p, 0, 4*time.Second), count(p, 4*time.Second, 6*time.Second); a < 39 || a > 40 || b < 99 || b > 100 {
			t.Fatalf("%d arrivals in 4s before the burst, %d in its 2s; want 40 and 100", a, b)
		}
	})
	t.Run("steps and warm-up", func(t *testing.T) {
		w := testWorkload(t, base+"warmup: 1s\narrival:\n  process: fixed\n  steps: [{rate: 10, duration: 2s}, {rate: 40, duration: 2s}]\n")
		if w.Duration != 3*time.Second {
			t.Fatalf("duration %v, want the steps' 4s less the 1s warm-up", w.Duration)
		}
		p, _ := NewPlan(w)
		if a, b := count(p, 0, 2*time.Second), count(p, 2*time.Second, 4*time.Second); a < 19 || a > 20 || b < 79 || b > 80 {
			t.Fatalf("%d then %d arrivals, want 20 then 80", a, b)
		}
		if p.Requests() != len(p.Items)-count(p, 0, time.Second) {
			t.Fatal("warm-up items are not the first second's")
		}
		w2, _ := w.Apply(Overrides{Rate: 20})
		if w2.Arrival.Steps[0].Rate != 20 || w2.Arrival.Steps[1].Rate != 80 {
			t.Fatalf("a -rate override should scale the ladder, got %+v", w2.Arrival.Steps)
		}
	})
}

func TestPlanContent(t *testing.T) {
	t.Run("shared prefix", func(t *testing.T) {
		p, _ := NewPlan(testWorkload(t, `
arrival: {rate: 50}
duration: 4s
prompt: {dist: fixed, value: 30}
output: {dist: fixed, value: 5}
prefix: {groups: 3, tokens: 400, skew: hot, hot_share: 0.8}
`))
		byGroup := map[int]int{}
		for _, it := range p.Items {
			byGroup[it.Group]++
			if it.Group < 0 {
				t.Fatal("share 1 (the default) left a request without a prefix")
			}
			if it.PromptTokens != 400+32 { // prefix (with "system:\n") + "user:" + 30 words + "\n"
				t.Fatalf("prompt tokens %d, want 432", it.PromptTokens)
			}
		}
		if hot := float64(byGroup[0]) / float64(len(p.Items)); hot < 0.7 || hot > 0.9 {
			t.Fatalf("hot group got %.2f of the traffic, want 0.8", hot)
		}
		var bodies = map[int]string{}
		for _, it := range p.Items {
			var b chatBody
			if err := json.Unmarshal(it.Body, &b); err != nil {
				t.Fatal(err)
			}
			if prev, ok := bodies[it.Group]; ok && prev != b.Messages[0].Content {
				t.Fatal("two requests of one group have different system prompts")
			}
			bodies[it.Group] = b.Messages[0].Content
			if b.MaxTokens != 5 || !b.Stream || b.StreamOptions == nil || b.Model != DefaultModel {
				t.Fatalf("body %s", it.Body)
			}
		}
	})
	t.Run("sessions grow", func(t *testing.T) {
		p, _ := NewPlan(testWorkload(t, `
arrival: {process: fixed, rate: 10}
duration: 3s
prompt: {dist: fixed, value: 10}
output: {dist: fixed, value: 7}
sessions: {share: 1, users: 2, turns: {dist: fixed, value: 4}}
`))
		last := map[int]Item{}
		for _, it := range p.Items {
			if it.Kind != KindSession {
				t.Fatalf("item %d is %s", it.Index, it.Kind)
			}
			if prev, ok := last[it.Session]; ok {
				if it.After != prev.Index || it.Turn != prev.Turn+1 {
					t.Fatalf("turn %d of session %d follows item %d, want %d", it.Turn, it.Session, it.After, prev.Index)
				}
				var a, b chatBody
				_ = json.Unmarshal(prev.Body, &a)
				_ = json.Unmarshal(it.Body, &b)
				if len(b.Messages) != len(a.Messages)+2 {
					t.Fatalf("turn has %d messages after %d", len(b.Messages), len(a.Messages))
				}
				for k := range a.Messages {
					if a.Messages[k] != b.Messages[k] {
						t.Fatalf("turn %d does not repeat message %d of the previous turn", it.Turn, k)
					}
				}
				if b.Messages[len(a.Messages)].Role != "assistant" || len(b.Messages[len(a.Messages)].Content) != 4*7 {
					t.Fatal("the previous answer is missing from the history")
				}
			} else if it.After != -1 || it.Turn != 0 {
				t.Fatalf("first turn of session %d waits for %d", it.Session, it.After)
			}
			last[it.Session] = it
			if it.Turn == 3 {
				delete(last, it.Session)
			}
		}
	})
	t.Run("completions and long documents", func(t *testing.T) {
		p, _ := NewPlan(testWorkload(t, `
api: completions
stream: 0
arrival: {rate: 20}
duration: 5s
prompt: {dist: fixed, value: 10}
output: {dist: fixed, value: 5}
long_docs: {share: 0.5, tokens: {dist: fixed, value: 2000}}
priorities: [{value: critical, weight: 1}, {value: sheddable, weight: 1}]
`))
		kinds, prios := map[string]int{}, map[string]int{}
		for _, it := range p.Items {
			kinds[it.Kind]++
			prios[it.Priority]++
			var b chatBody
			_ = json.Unmarshal(it.Body, &b)
			if b.Prompt == "" || b.Stream || it.Endpoint.String() != "/v1/completions" {
				t.Fatalf("body %s", it.Body)
			}
			if it.Kind == KindLongDoc && it.PromptTokens < 2000 {
				t.Fatalf("long document of %d tokens", it.PromptTokens)
			}
		}
		if kinds[KindLongDoc] == 0 || kinds[KindSingle] == 0 || prios["critical"] == 0 || prios["sheddable"] == 0 {
			t.Fatalf("kinds %v priorities %v", kinds, prios)
		}
	})
}

func TestDistSample(t *testing.T) {
	r := newTestRand()
	for _, d := range []Dist{
		{Kind: "uniform", Min: 5, Max: 10},
		{Kind: "normal", Mean: 100, Stddev: 20, Min: 90, Max: 200},
		{Kind: "lognormal", Mean: 300, Stddev: 200, Min: 16, Max: 4000},
	} {
		var errs fieldErrors
		d.validate("d", &errs)
		if len(errs) > 0 {
			t.Fatalf("%v: %v", d, errs)
		}
		sum := 0.0
		const n = 20000
		for range n {
			x := d.Sample(r)
			lo, hi := math.Max(d.Min, 1), d.Max
			if float64(x) < lo || float64(x) > hi {
				t.Fatalf("%v gave %d", d, x)
			}
			sum += float64(x)
		}
		if d.Kind == "lognormal" {
			// The bounds cut little of this lognormal: the mean must stay near the requested one.
			if m := sum / n; m < 270 || m > 330 {
				t.Fatalf("%v: mean %.1f, want about 300", d, m)
			}
		}
	}
}
