package policy

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/routing"
)

// engineFile is a minimal policy with one backend of engine, preceded by engines (a YAML fragment).
func engineFile(engines, engine string) string {
	return engines + "\nbackends: [{name: b, url: 'http://127.0.0.1:1', engine: " + engine + ", models: [m]}]\nmodels: [{name: m}]\nauth: none\n"
}

func TestEngineTable(t *testing.T) {
	for _, tc := range []struct {
		name, engines, engine string
		check                 func(t *testing.T, s *routing.EngineSpec)
	}{
		{"built-in as is", "", "tgi", func(t *testing.T, s *routing.EngineSpec) {
			if s != routing.BuiltinEngine("tgi") {
				t.Fatal("not the built-in spec")
			}
		}},
		{"old openai name", "", "openai", func(t *testing.T, s *routing.EngineSpec) {
			if s.Name != routing.EngineOpenAIHosted || s.Scrapes() || s.IdleProbes {
				t.Fatalf("%+v", s)
			}
		}},
		{"override one field keeps the others", "engines: {nim: {metrics_path: /metrics}}", "nim", func(t *testing.T, s *routing.EngineSpec) {
			nim := routing.BuiltinEngine("nim")
			if s.MetricsPath != "/metrics" || !reflect.DeepEqual(s.Signals, nim.Signals) || !s.IdleProbes {
				t.Fatalf("%+v", s)
			}
		}},
		{"override a signal, remove another", "engines: {vllm: {metrics: {waiting: my_waiting, kv_usage: ''}, idle_probes: false}}", "vllm", func(t *testing.T, s *routing.EngineSpec) {
			if got := s.Signals[routing.SignalWaiting]; len(got) != 1 || got[0].Name != "my_waiting" {
				t.Fatalf("waiting %+v", got)
			}
			if len(s.Signals[routing.SignalKVUsage]) != 0 || s.Exports()&routing.HasKVUsage != 0 {
				t.Fatal("kv_usage was not removed")
			}
			if len(s.Signals[routing.SignalRunning]) != 1 || s.IdleProbes {
				t.Fatalf("running %+v idle %v", s.Signals[routing.SignalRunning], s.IdleProbes)
			}
		}},
		{"priority scheduling turned on", "engines: {vllm: {priority: low_first}}", "vllm", func(t *testing.T, s *routing.EngineSpec) {
			vllm := routing.BuiltinEngine("vllm")
			if v, ok := s.PriorityValue(0); !ok || v != -1 || !reflect.DeepEqual(s.Signals, vllm.Signals) {
				t.Fatalf("priority %v %v, signals kept %v", v, ok, reflect.DeepEqual(s.Signals, vllm.Signals))
			}
		}},
		{"a seat signal", "engines: {sglang: {priority: high_first, metrics: {max_seqs: my_max}}}", "sglang", func(t *testing.T, s *routing.EngineSpec) {
			if v, ok := s.PriorityValue(0); !ok || v != 1 || s.Exports()&routing.HasMaxSeqs == 0 {
				t.Fatalf("priority %v %v, exports %b", v, ok, s.Exports())
			}
		}},
		{"an override keeps the built-in's info document", "engines: {sglang: {priority: high_first}}", "sglang", func(t *testing.T, s *routing.EngineSpec) {
			if b := routing.BuiltinEngine("sglang"); !s.Info.Reads() || !reflect.DeepEqual(s.Info, b.Info) {
				t.Fatalf("info %+v, want the built-in's %+v", s.Info, b.Info)
			}
		}},
		{"an info document of one's own", "engines: {vllm: {info: {paths: [/server_info], max_seqs: [vllm_config.scheduler_config.max_num_seqs]}}}", "vllm", func(t *testing.T, s *routing.EngineSpec) {
			if len(s.Info.Paths) != 1 || len(s.Info.MaxSeqs) != 1 || s.Info.MaxSeqs[0].String() != "vllm_config.scheduler_config.max_num_seqs" ||
				s.Exports()&routing.HasMaxSeqs == 0 || s.Exports()&routing.HasMaxInflight != 0 {
				t.Fatalf("info %+v exports %b", s.Info, s.Exports())
			}
		}},
		{"the info document removed", "engines: {tgi: {info: {paths: []}}}", "tgi", func(t *testing.T, s *routing.EngineSpec) {
			if s.Info.Reads() || s.Exports()&(routing.HasMaxSeqs|routing.HasMaxInflight) != 0 {
				t.Fatalf("info %+v exports %b", s.Info, s.Exports())
			}
		}},
		{"new engine defaults", "engines: {mine: {metrics: {running: r}}}", "mine", func(t *testing.T, s *routing.EngineSpec) {
			if s.MetricsPath != "/metrics" || !s.IdleProbes || s.Exports() != routing.HasRunning {
				t.Fatalf("%+v", s)
			}
		}},
		{"new hosted engine", "engines: {azure: {metrics_path: none}}", "azure", func(t *testing.T, s *routing.EngineSpec) {
			if s.Scrapes() || s.IdleProbes {
				t.Fatalf("%+v", s)
			}
		}},
		{"every form", `engines:
  mine:
    metrics_port: 9100
    metrics:
      waiting: [{name: q, labels: {state: waiting}}, q_old]
      kv_usage: {name: kv, scale: percent}
      kv_blocks: {name: info, value_label: blocks}`, "mine", func(t *testing.T, s *routing.EngineSpec) {
			want := [routing.NumSignals][]routing.Series{
				routing.SignalWaiting:  {{Name: "q", Labels: map[string]string{"state": "waiting"}}, {Name: "q_old"}},
				routing.SignalKVUsage:  {{Name: "kv", Percent: true}},
				routing.SignalKVBlocks: {{Name: "info", ValueLabel: "blocks"}},
			}
			if !reflect.DeepEqual(s.Signals, want) || s.MetricsPort != 9100 {
				t.Fatalf("signals %+v port %d", s.Signals, s.MetricsPort)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, snap, err := loadBytes(t, engineFile(tc.engines, tc.engine))
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, snap.Backends[0].Config().Spec())
		})
	}
}

func TestOperatorEngineFromYAML(t *testing.T) {
	// An engine the gateway has never heard of, described in the policy: the Monitor scrapes its own path and
	// reads its names, labels and scale.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/stats/prom" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("# TYPE acme_requests gauge\nacme_requests{state=\"running\"} 6\nacme_requests{state=\"queued\"} 3\nacme_kv_pct 25\n"))
	}))
	defer srv.Close()
	src := `engines:
  acme:
    metrics_path: /stats/prom
    idle_probes: false
    metrics:
      running: {name: acme_requests, labels: {state: running}}
      waiting: {name: acme_requests, labels: {state: queued}}
      kv_usage: {name: acme_kv_pct, scale: percent}
backends: [{name: a, url: '` + srv.URL + `', engine: acme, models: [m]}]
models: [{name: m}]
auth: none
`
	reg := routing.NewRegistry()
	c, err := Parse("acme.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	snap, err := c.Compile(reg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	scraped := make(chan error, 16)
	m := routing.NewMonitor(reg, routing.MonitorOptions{IdleProbeAfter: -1, OnScrape: func(_ *routing.Backend, err error) {
		select {
		case scraped <- err:
		default:
		}
	}})
	m.Start()
	defer m.Stop()
	select {
	case err := <-scraped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no scrape")
	}
	b := snap.Backends[0]
	if e := b.Engine(); e.Running != 6 || e.Waiting != 3 || e.KVUsage != 0.25 {
		t.Fatalf("scraped %+v", e)
	}
	st := b.Status()
	if st.Engine != "acme" || strings.Join(st.Signals, ",") != "running,waiting,kv_usage" || len(st.Missing) != 0 {
		t.Fatalf("status engine %q signals %v missing %v", st.Engine, st.Signals, st.Missing)
	}
}
