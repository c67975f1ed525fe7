package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/proxy"
	"github.com/switchyard/switchyard/routing"
)

// wantLines returns the "# want: " lines of a test file: the exact errors it must produce, as "LINE: path: msg".
func wantLines(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, l := range strings.Split(string(data), "\n") {
		if w, ok := strings.CutPrefix(l, "# want: "); ok {
			want = append(want, w)
		}
	}
	return want
}

// errorLines parses file and returns its errors as "LINE: path: msg", without the file name.
func errorLines(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Parse(file, data)
	if err == nil {
		t.Fatalf("%s parsed without error: %+v", file, c)
	}
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("error is %T, want Errors: %v", err, err)
	}
	var got []string
	for _, e := range es {
		got = append(got, strings.TrimPrefix(e.Error(), file+":"))
	}
	return got
}

// invalidCases are the error kinds, one broken file each in testdata/invalid; the file's "# want:" lines are the
// exact errors it must produce.
var invalidCases = []string{
	// decoding
	"yaml_syntax",             // YAML syntax error, with the parser's line
	"two_documents",           // a second document
	"not_a_mapping",           // the document is not a mapping
	"unknown_field",           // a typo, with a suggestion
	"wrong_type",              // a list where a scalar goes, text where a number goes
	"bad_duration",            // a duration without unit, or not a duration
	"bad_size",                // a byte size that does not parse
	"bad_bool",                // yes is not a YAML 1.2 boolean
	"duplicate_key",           // the same key twice in one mapping
	"non_string_key",          // a complex key; a merge of a non-mapping
	"env_unset",               // ${VAR} unset, without default
	"env_syntax",              // unterminated ${, invalid variable name
	"plaintext_key",           // an API key in plaintext; a sha256 that is not 64 hex digits
	"empty",                   // nothing at all: required sections
	"missing_required",        // required fields
	"invalid_name",            // names with white space
	"duplicate_name",          // duplicate backend, model, and backend model names
	"model_no_backend",        // a model nobody serves
	"unknown_backend",         // a target naming an unknown backend
	"target_model_not_listed", // a target's model not in the backend's list; a duplicate target
	"unknown_strategy",        // a strategy that does not exist
	"unknown_region",          // unknown and invalid regions
	"bad_url",                 // backend URLs: relative, userinfo, query, scheme, /v1, fragment
	"nonpositive_duration",    // zero or negative durations
	"total_below_first_byte",  // timeouts.total < first_byte
	"bad_weight",              // negative weight; weight 0
	"retries_range",           // retries outside 0..10
	"bad_engine",              // unknown engine; engines table errors
	"bad_engine_info",         // engines.*.info paths and field paths
	"bad_hosted",              // hosted backends: owned headers, query, path template, ca_file
	"bad_listen",              // listen not host:port
	"same_listen",             // listen == admin_listen
	"not_supported",           // fields whose behaviour has not landed
	"bad_feature_values",      // invalid values of those fields are reported too
	"bad_priorities",          // only admission's three classes, most important first; a key's unknown class
	"bad_api_keys",            // api_keys: unknown models, limits, duplicate keys and names, a missing key
	"bad_hedge",               // hedge.after missing or past the first-byte timeout; budget outside (0, 100]
	"degrade_cycle",           // degrade_to loops, to itself, to an unknown model
	"region_no_target",        // allowed_regions or the failover order leave a model without a target
	"bad_endpoints",           // unknown or duplicate endpoint groups
	"bad_discover",            // discover: with url, without dns or port, a bad type, interval, name
	// auth (auth.go)
	"no_keys",                    // neither keys nor auth: none
	"auth_api_keys_without_keys", // auth: api_keys with no key
	"auth_none_with_keys",        // auth: none and keys
	"bad_auth",                   // an unknown auth mode, with a suggestion
	"bad_reload",                 // reload not last; a hash too short; an unknown field
}

func TestInvalidFiles(t *testing.T) {
	for _, name := range invalidCases {
		t.Run(name, func(t *testing.T) {
			file := filepath.Join("testdata", "invalid", name+".yaml")
			want := wantLines(t, file)
			if len(want) == 0 {
				t.Fatalf("%s has no # want: lines", file)
			}
			got := errorLines(t, file)
			if !slices.Equal(got, want) {
				t.Errorf("%s errors:\n  got  %s\n  want %s", file, strings.Join(got, "\n       "), strings.Join(want, "\n       "))
			}
		})
	}
}

func TestInvalidCasesListEveryFile(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("testdata", "invalid", "*.yaml"))
	var names []string
	for _, f := range files {
		names = append(names, strings.TrimSuffix(filepath.Base(f), ".yaml"))
	}
	if got, want := slices.Sorted(slices.Values(invalidCases)), names; !slices.Equal(got, want) {
		t.Fatalf("invalidCases %v\ndo not match testdata/invalid %v", got, want)
	}
}

func TestErrorsAreSortedByLine(t *testing.T) {
	// Validation finds the model's problems after the decoder found the backend's, though they come first in
	// the file.
	src := "models:\n  - name: m\n    strategy: nope\nbackends:\n  - name: b\n    url: http://h:1\n    models: [m]\n    weight: x\nauth: none\n"
	_, err := Parse("f.yaml", []byte(src))
	want := "f.yaml:3: models[0].strategy: unknown strategy \"nope\" (one of: adaptive, cache_aware, least_request, prefix_hash, random, round_robin)\n" +
		"f.yaml:8: backends[0].weight: expected a finite number, got \"x\""
	if err == nil || err.Error() != want {
		t.Fatalf("err =\n%v\nwant\n%s", err, want)
	}
	for _, name := range invalidCases {
		file := filepath.Join("testdata", "invalid", name+".yaml")
		data, _ := os.ReadFile(file)
		_, err := Parse(file, data)
		var es Errors
		errors.As(err, &es)
		if !slices.IsSortedFunc(es, func(a, b *Error) int { return a.Line - b.Line }) {
			t.Errorf("%s: errors not sorted by line:\n%v", file, err)
		}
	}
}

func TestValidFiles(t *testing.T) {
	t.Setenv("SWITCHYARD_TEST_BACKEND_KEY", "backend-secret")
	files, _ := filepath.Glob(filepath.Join("testdata", "valid", "*.yaml"))
	files = append(files, filepath.Join("..", "config.yaml"))
	if len(files) < 4 {
		t.Fatalf("found only %v", files)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			c, s, err := Load(f, routing.NewRegistry())
			if err != nil {
				t.Fatalf("%v", err)
			}
			if len(s.Models) != len(c.Models) || len(s.Backends) != len(c.Backends) {
				t.Fatalf("snapshot has %d models, %d backends; config %d, %d", len(s.Models), len(s.Backends), len(c.Models), len(c.Backends))
			}
		})
	}
}

func TestFullFile(t *testing.T) {
	t.Setenv("SWITCHYARD_TEST_BACKEND_KEY", "backend-secret")
	c, s, err := Load(filepath.Join("testdata", "valid", "full.yaml"), routing.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, got, want any) {
		t.Helper()
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %#v, want %#v", what, got, want)
		}
	}
	check("listen (${VAR:-default})", c.Listen, "127.0.0.1:18080")
	check("redis (${UNSET:-})", c.Redis, Redis{})
	check("backend 0 api_key", c.Backends[0].APIKey.Value(), "backend-secret")
	check("backend 3 api_key ($${ escape)", c.Backends[3].APIKey.Value(), "${NOT_EXPANDED}")
	check("merged engine", c.Backends[1].Engine, "vllm")
	check("merged models", c.Backends[1].Models, []string{"llama-3-8b-instruct", "sim-model"})
	check("own timeouts replace the merged mapping", c.Backends[1].Timeouts, Timeouts{Connect: time.Second, FirstByte: 2 * time.Minute, Idle: 45 * time.Second, Total: time.Hour})
	check("merged connect", c.Backends[0].Timeouts.Connect, 2*time.Second)
	check("inherited timeouts", c.Backends[2].Timeouts, Timeouts{Connect: time.Second, FirstByte: 30 * time.Second, Idle: 45 * time.Second, Total: 10 * time.Minute})
	check("backend region default", c.Backends[0].Region, "us-east")
	check("weight", c.Backends[0].Weight, 2.5)
	check("weight default", c.Backends[1].Weight, 1.0)
	check("retries 0 kept", c.Models[0].Retries, 0)
	check("retries default", c.Models[2].Retries, 2)
	check("strategy default", c.Models[2].Strategy, DefaultStrategy)
	check("derived targets", c.Models[0].Targets, []Target{{"use-1", "sim-model"}, {"use-2", "sim-model"}, {"euw-1", "sim-model"}})
	check("explicit targets", c.Models[1].Targets, []Target{{"use-1", "llama-3-8b-instruct"}, {"use-2", "llama-3-8b-instruct"}})
	check("max_body_bytes", c.Limits.MaxBodyBytes, ByteSize(512<<10))
	check("drain 0 kept", c.Limits.DrainTimeout, time.Duration(0))
	check("shutdown_grace", c.Limits.ShutdownGrace, 2*time.Second)

	check("snapshot region", s.Region, "us-east")
	check("model names in file order", s.ModelNames, []string{"sim-model", "llama-3-8b", "gpt-4o-mini"})
	check("hash", s.Hash, c.Hash)
	b0 := s.Backends[0].Config()
	check("url without trailing slash", b0.URL, "http://127.0.0.1:8001")
	check("api key upstream", b0.APIKey, "backend-secret")
	check("backend 1 url", s.Backends[1].Config().URL, "https://gpu.example.com:8443/prefix")
	m := s.Models["llama-3-8b"]
	check("strategy name", m.StrategyName, "random")
	check("strategy", m.Strategy.(*routing.Regional).Strategy(), routing.Strategy(routing.Random{}))
	check("target model rewrite", m.Targets[0].Model, "llama-3-8b-instruct")
	if m.Targets[1].Backend != s.Backends[1] {
		t.Error("target does not point at the snapshot's backend")
	}
	check("slo", s.Models["sim-model"].SLO.TTFT, time.Second)

	check("max_concurrency", s.Backends[0].Config().MaxConcurrency, 8)
	check("max_concurrency default (adaptive)", s.Backends[1].Config().MaxConcurrency, 0)
	check("hedge, default budget", s.Models["sim-model"].Hedge, proxy.Hedge{After: 250 * time.Millisecond, BudgetPercent: 5})
	check("hedge", s.Models["gpt-4o-mini"].Hedge, proxy.Hedge{After: 2 * time.Second, BudgetPercent: 1.5})
	check("no hedge", s.Models["llama-3-8b"].Hedge, proxy.Hedge{})
	if m.DegradeTo != s.Models["sim-model"] {
		t.Errorf("llama-3-8b degrades to %p, want the snapshot's sim-model %p", m.DegradeTo, s.Models["sim-model"])
	}
	check("priorities", s.Priorities, admission.Priorities{Header: "X-Priority", Default: admission.Standard, SLOFactor: [3]float64{2, 1.5, 0.5}})
	check("queue", s.Queue, proxy.QueueSettings{Size: 64, Timeout: 2 * time.Second})
	for key, want := range map[string]string{"backend-secret": "team-a", "test": "ops"} {
		if k, err := s.Keys.Authenticate([]byte("Bearer " + key)); err != nil || k.Name != want {
			t.Errorf("key %s: %v, %v; want %s", key, k, err, want)
		}
	}
	check("team-a's class", s.Keys.All()[0].Class, admission.Standard)
	if s.Limiter == nil || s.Shedder == nil {
		t.Errorf("limiter %v, shedder %v; want both", s.Limiter, s.Shedder)
	}
}

func TestDefaults(t *testing.T) {
	c, err := Parse("min.yaml", []byte("auth: none\nbackends: [{name: b, url: 'http://h:1', models: [m]}]\nmodels: [{name: m}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Listen: "127.0.0.1:8080", AdminListen: "127.0.0.1:9090", Region: "local", Auth: AuthNone,
		Backends: []Backend{{Name: "b", URL: "http://h:1", Region: "local", Engine: "vllm", Models: []string{"m"}, Weight: 1, Tier: "dedicated",
			Timeouts: Timeouts{Connect: 5 * time.Second, FirstByte: time.Minute, Idle: time.Minute, Total: 30 * time.Minute}}},
		Models: []Model{{Name: "m", Targets: []Target{{"b", "m"}}, Strategy: DefaultStrategy, Retries: 2, Objective: "latency"}},
		Priorities: Priorities{Header: "x-switchyard-priority", Default: "standard", Classes: []PriorityClass{
			{"critical", 2}, {"standard", 1}, {"sheddable", 0.5}}},
		Limits: Limits{MaxBodyBytes: 32 << 20, HeaderReadTimeout: 10 * time.Second, ShutdownGrace: 5 * time.Second, DrainTimeout: time.Minute,
			Timeouts:  Timeouts{Connect: 5 * time.Second, FirstByte: time.Minute, Idle: time.Minute, Total: 30 * time.Minute},
			QueueSize: 1024, QueueTimeout: 10 * time.Second},
		AccessLog:  AccessLog{Sample: 1},
		Objectives: Objectives{Header: "x-switchyard-objective"},
		File:       "min.yaml", Hash: c.Hash,
	}
	c.lines = authLines{} // where the file set auth: not a default
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("defaults:\n got %+v\nwant %+v", c, want)
	}
}

// notSupportedSnippets sets each field the supported table marks false: the key is the table's path, the value
// says where the YAML line goes in notSupportedBase ("top", "backend", "model", "limits", "key") and the line.
var notSupportedSnippets = map[string][2]string{
	"models[].prefix_affinity": {"model", "prefix_affinity: false"}, // false too: strategies have affinity by themselves
}

// notSupportedBase is a valid file with a place for each snippet.
const notSupportedBase = `backends:
  - name: b
    url: http://h:1
    models: [m, other]
    #backend
models:
  - name: other
  - name: m
    #model
limits:
  #limits
#top
#key
auth: none
`

func TestNotSupportedYet(t *testing.T) {
	var unsupported, snippets []string
	for p, ok := range supported {
		if !ok {
			unsupported = append(unsupported, p)
		}
	}
	for p := range notSupportedSnippets {
		snippets = append(snippets, p)
	}
	slices.Sort(unsupported)
	slices.Sort(snippets)
	if !slices.Equal(unsupported, snippets) {
		t.Fatalf("fields marked unsupported %v\ndo not match the snippets %v", unsupported, snippets)
	}
	for _, p := range unsupported {
		t.Run(p, func(t *testing.T) {
			where, line := notSupportedSnippets[p][0], notSupportedSnippets[p][1]
			if where == "key" {
				line = "api_keys:\n  - name: k\n    key: '${HOME}'\n    " + line
			}
			src := strings.Replace(notSupportedBase, "#"+where, line, 1)
			// The report names the outermost unsupported field: for api_keys[].limits that is api_keys while
			// api_keys itself has not landed.
			pattern := p
			for q := p; q != ""; q = parent(q) {
				if ok, known := supported[q]; known && !ok {
					pattern = q
				}
			}
			path := strings.NewReplacer("models[]", "models[1]", "[]", "[0]").Replace(pattern)
			key := path[strings.LastIndexAny(path, ".]")+1:]
			wantLine := 0
			for i, l := range strings.Split(src, "\n") {
				if strings.HasPrefix(strings.TrimLeft(l, " -"), key+":") {
					wantLine = i + 1
					break
				}
			}
			if pattern == "api_keys" && where == "key" {
				wantLine = strings.Count(src[:strings.Index(src, "api_keys:")], "\n") + 1
			}
			want := fmt.Sprintf("f.yaml:%d: %s: not supported yet", wantLine, path)
			_, err := Parse("f.yaml", []byte(src))
			if err == nil || err.Error() != want {
				t.Fatalf("errors for\n%s\n%v\nwant exactly %q", src, err, want)
			}
		})
	}
}

// schemaPaths lists every field path of the schema, as the supported table spells them.
func schemaPaths(t reflect.Type, prefix string, out *[]string) {
	for i := range t.NumField() {
		tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if tag == "" || tag == "-" {
			continue
		}
		p := join(prefix, tag)
		*out = append(*out, p)
		ft := t.Field(i).Type
		switch {
		case ft.Kind() == reflect.Struct && ft != durationType:
			schemaPaths(ft, p, out)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			schemaPaths(ft.Elem(), p+"[]", out)
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
			schemaPaths(ft.Elem(), p+".*", out)
		}
	}
}

func TestSupportedTableCoversSchema(t *testing.T) {
	var paths []string
	schemaPaths(reflect.TypeFor[Config](), "", &paths)
	slices.Sort(paths)
	var table []string
	for p := range supported {
		table = append(table, p)
	}
	slices.Sort(table)
	if !slices.Equal(paths, table) {
		t.Fatalf("supported table\n%v\ndoes not match the schema\n%v", table, paths)
	}
}

func TestStrategiesAreTheSchemas(t *testing.T) {
	// The schema documents these names (Model.Strategy, docs/config.md); routing must build each of them.
	documented := []string{"adaptive", "cache_aware", "least_request", "prefix_hash", "random", "round_robin"}
	if got := routing.StrategyNames(); !slices.Equal(got, documented) {
		t.Fatalf("routing's strategies %v differ from the documented %v", got, documented)
	}
	if DefaultStrategy != "adaptive" {
		t.Fatalf("DefaultStrategy = %q, want adaptive", DefaultStrategy)
	}
	for _, name := range documented {
		src := fmt.Sprintf("backends: [{name: b, url: 'http://h:1', models: [m]}]\nmodels: [{name: m, strategy: %s}]\nauth: none\n", name)
		_, s, err := loadBytes(t, src)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Models["m"].StrategyName != name || s.Models["m"].Strategy == nil {
			t.Fatalf("%s compiled to %q %T", name, s.Models["m"].StrategyName, s.Models["m"].Strategy)
		}
	}
}

// openAuth returns src, a test policy, with auth: none appended when it lists no api_keys: the policy serves
// without authentication, on purpose. At the end, so that the lines of src keep their numbers.
func openAuth(src string) string {
	if strings.Contains(src, "api_keys") || strings.Contains(src, "\nauth:") || strings.HasPrefix(src, "auth:") {
		return src
	}
	return src + "auth: none\n"
}

// loadBytes parses and compiles src with a fresh registry.
func loadBytes(t *testing.T, src string) (*Config, *proxy.Snapshot, error) {
	t.Helper()
	c, err := Parse("f.yaml", []byte(src))
	if err != nil {
		return nil, nil, err
	}
	s, err := c.Compile(routing.NewRegistry(), nil, nil)
	return c, s, err
}

func TestListenPortZeroTwice(t *testing.T) {
	// Tests run gateways on free ports: port 0 for both servers is not a conflict.
	src := "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nauth: none\nbackends: [{name: b, url: 'http://h:1', models: [m]}]\nmodels: [{name: m}]\n"
	if _, err := Parse("f.yaml", []byte(src)); err != nil {
		t.Fatal(err)
	}
}

func TestEmptyValuesOfUnsupportedFieldsAreAccepted(t *testing.T) {
	if _, _, err := Load(filepath.Join("testdata", "valid", "unsupported_empty.yaml"), routing.NewRegistry()); err != nil {
		t.Fatal(err)
	}
}

func TestExpand(t *testing.T) {
	env := map[string]string{"A": "alpha", "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for _, tc := range []struct{ in, want, err string }{
		{"plain", "plain", ""},
		{"${A}", "alpha", ""},
		{"x-${A}-${A}-y", "x-alpha-alpha-y", ""},
		{"${EMPTY}", "", ""},
		{"${EMPTY:-d}", "d", ""},
		{"${UNSET:-d}", "d", ""},
		{"${UNSET:-}", "", ""},
		{"${UNSET:-a:-b}", "a:-b", ""},
		{"$${A}", "${A}", ""},
		{"$A and $", "$A and $", ""},
		{"${UNSET}", "", "environment variable UNSET is not set (use ${UNSET:-default} for a default)"},
		{"${A", "", "unterminated ${: close it with } (write $${ for a literal ${)"},
		{"${}", "", `invalid environment variable name "" in ${...}: use letters, digits and _`},
		{"${1A}", "", `invalid environment variable name "1A" in ${...}: use letters, digits and _`},
	} {
		got, err := expand(tc.in, lookup)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("expand(%q) err = %v, want %q", tc.in, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("expand(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestSecretsAreNeverPrinted(t *testing.T) {
	const secret = "s3cr3t-VALUE"
	t.Setenv("SWITCHYARD_TEST_SECRET", secret)
	t.Setenv("SWITCHYARD_TEST_SECRET_URL", "http://user:"+secret+"@h:1")
	t.Setenv("SWITCHYARD_TEST_SECRET_QUERY", "http://h:1/?token="+secret)
	t.Setenv("SWITCHYARD_TEST_SECRET_REDIS", "redis://:"+secret+"@")

	valid := "backends:\n  - {name: b, url: 'http://h:1', models: [m], api_key: '${SWITCHYARD_TEST_SECRET}'," +
		" headers: {api-key: '${SWITCHYARD_TEST_SECRET}'}, query: {key: '${SWITCHYARD_TEST_SECRET}'}}\nmodels: [{name: m}]\nauth: none\n"
	c, err := Parse("f.yaml", []byte(valid))
	if err != nil {
		t.Fatal(err)
	}
	var summary strings.Builder
	if err := c.WriteSummary(&summary); err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(c)
	for what, text := range map[string]string{
		"summary": summary.String(), "%v": fmt.Sprintf("%v", c), "%+v": fmt.Sprintf("%+v", *c), "json": string(js),
	} {
		if strings.Contains(text, secret) {
			t.Errorf("%s prints the secret: %s", what, text)
		}
	}

	invalid := `redis: ${SWITCHYARD_TEST_SECRET_REDIS}
backends:
  - {name: b, url: '${SWITCHYARD_TEST_SECRET_URL}', models: [m], api_key: [x]}
  - {name: c, url: '${SWITCHYARD_TEST_SECRET_QUERY}', models: [m]}
models: [{name: m}]
api_keys: [{name: k, key: ` + secret + `}]
`
	_, err = Parse("f.yaml", []byte(invalid))
	if err == nil {
		t.Fatal("invalid file accepted")
	}
	if strings.Contains(err.Error(), secret) || strings.Count(err.Error(), "\n") < 4 {
		t.Fatalf("errors print the secret, or miss problems:\n%v", err)
	}
}

func TestAliasesCannotExplode(t *testing.T) {
	// A "billion laughs": each level multiplies the one before by ten.
	var b strings.Builder
	b.WriteString("x-0: &l0 [a, a, a, a, a, a, a, a, a, a]\n")
	for i := 1; i <= 8; i++ {
		fmt.Fprintf(&b, "x-%d: &l%d [*l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d, *l%d]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	// The schema has no nested lists, so the bomb can only be aimed at lists of backends with model lists.
	b.WriteString("x-m: &m [")
	for i := range 2000 {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "m%d", i)
	}
	b.WriteString("]\nx-b: &b {name: b, url: 'http://h:1', models: *m}\nbackends: [")
	for i := range 1000 {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("*b")
	}
	b.WriteString("]\nmodels: [{name: m0}]\n")
	start := time.Now()
	_, err := Parse("bomb.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "too many values") {
		t.Fatalf("err = %.300v", err)
	}
	if d := time.Since(start); d > time.Minute { // the budget bounds the work; this only catches a runaway
		t.Fatalf("took %v", d)
	}
}

func TestMergeKeysCannotExplode(t *testing.T) {
	var b strings.Builder
	b.WriteString("x-a: &a {")
	for i := range 1000 {
		fmt.Fprintf(&b, "k%d: 1, ", i)
	}
	b.WriteString("name: b}\nbackends:\n  - <<: [")
	for i := range 1000 {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("*a")
	}
	b.WriteString("]\nmodels: [{name: m}]\n")
	start := time.Now()
	_, err := Parse("bomb.yaml", []byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "too many values") {
		t.Fatalf("err = %.300v", err)
	}
	if d := time.Since(start); d > time.Minute { // the budget bounds the work; this only catches a runaway
		t.Fatalf("took %v", d)
	}
}

func TestSelfReferencesAreErrors(t *testing.T) {
	for _, src := range []string{
		"backends: &a [*a]\nmodels: [{name: m}]\n",
		"backends:\n  - &a {name: b, url: 'http://h:1', models: [m], <<: *a}\nmodels: [{name: m}]\n",
		"backends:\n  - &a {name: b, url: 'http://h:1', models: [m], timeouts: *a}\nmodels: [{name: m}]\n",
	} {
		if _, err := Parse("f.yaml", []byte(src)); err == nil {
			t.Errorf("accepted %q", src)
		}
	}
}

func TestCompileKeepsBackendsAndCreated(t *testing.T) {
	reg := routing.NewRegistry()
	src := "auth: none\nbackends:\n  - {name: a, url: 'http://a:1', models: [m]}\n  - {name: b, url: 'http://b:1', models: [m]}\nmodels: [{name: m, strategy: round_robin}, {name: n, strategy: round_robin, targets: [{backend: a, model: m}]}]\n"
	c1, err := Parse("f.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	s1, err := c1.Compile(reg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s1.Models["m"].Strategy == s1.Models["n"].Strategy {
		t.Error("two models share one round_robin instance")
	}
	s1.Models["m"].Created = 12345
	c2, err := Parse("f.yaml", []byte(strings.Replace(src, "http://b:1", "http://b:2", 1)))
	if err != nil {
		t.Fatal(err)
	}
	s2, err := c2.Compile(reg, s1, nil)
	if err != nil {
		t.Fatal(err)
	}
	if s2.Backends[0] != s1.Backends[0] {
		t.Error("backend a (same name and URL) is a new *Backend")
	}
	if s2.Backends[1] == s1.Backends[1] {
		t.Error("backend b (new URL) kept its *Backend")
	}
	if s2.Models["m"].Created != 12345 {
		t.Errorf("created = %d, want the previous snapshot's", s2.Models["m"].Created)
	}
	if s1.Backends[1].Config().URL != "http://b:1" {
		t.Error("compiling changed the old snapshot's forgotten backend")
	}
}
