package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/proxy"
	"github.com/switchyard/switchyard/routing"
)

// protectionBase is a valid policy: two backends serving m and small, m routed to both. Cases append to it.
const protectionBase = `backends:
  - {name: a, url: 'http://a:1', models: [m, small]}
  - {name: b, url: 'http://b:1', models: [m]}
models:
  - name: m
  - name: small
`

func sha(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:])
}

// TestProtectionValidation pins every validation error of the protection settings (priorities, api_keys, queue
// limits, hedge, degrade_to, max_concurrency): the exact "FILE:LINE: path: message" and nothing else.
func TestProtectionValidation(t *testing.T) {
	t.Setenv("SWITCHYARD_TEST_KEY", "sk-test")
	for _, tc := range []struct {
		name, src string
		want      string // every error, one per line; "" for a valid file
	}{
		{"classes may set factors of admission's classes", protectionBase +
			"priorities:\n  classes: [{name: critical, slo_factor: 3}, {name: sheddable}]\n", ""},
		{"unknown class in classes", protectionBase +
			"priorities:\n  classes: [{name: gold}]\n",
			`f.yaml:8: priorities.classes[0].name: unknown class "gold" (one of: critical, standard, sheddable)`},
		{"class names are lower case", protectionBase +
			"priorities:\n  classes:\n    - name: Critical\n",
			`f.yaml:9: priorities.classes[0].name: unknown class "Critical" (one of: critical, standard, sheddable)`},
		{"class without a name", protectionBase +
			"priorities:\n  classes:\n    - slo_factor: 2\n",
			`f.yaml:9: priorities.classes[0].name: required`},
		{"duplicate class", protectionBase +
			"priorities:\n  classes:\n    - name: standard\n    - name: standard\n",
			`f.yaml:10: priorities.classes[1].name: duplicate class "standard" (also priorities.classes[0])`},
		{"classes out of order", protectionBase +
			"priorities:\n  classes:\n    - name: sheddable\n    - name: critical\n",
			`f.yaml:10: priorities.classes[1].name: critical is listed after sheddable: list classes most important first (critical, standard, sheddable)`},
		{"slo_factor not positive", protectionBase +
			"priorities:\n  classes:\n    - {name: critical, slo_factor: 0}\n",
			`f.yaml:9: priorities.classes[0].slo_factor: must be positive`},
		{"unknown default class", protectionBase +
			"priorities:\n  default: bulk\n",
			`f.yaml:8: priorities.default: unknown class "bulk" (one of: critical, standard, sheddable)`},
		{"bad header name", protectionBase +
			"priorities:\n  header: 'x priority'\n",
			`f.yaml:8: priorities.header: invalid HTTP header name "x priority"`},
		{"unknown key class", protectionBase +
			"api_keys:\n  - name: k\n    key: sha256:" + sha("k") + "\n    priority: vip\n",
			`f.yaml:10: api_keys[0].priority: unknown class "vip" (one of: critical, standard, sheddable)`},
		{"a key without priority gets the default, reported once", protectionBase +
			"priorities: {default: vip}\napi_keys:\n  - {name: k, key: '${SWITCHYARD_TEST_KEY}'}\n",
			`f.yaml:7: priorities.default: unknown class "vip" (one of: critical, standard, sheddable)`},
		{"env key with a plaintext default", protectionBase +
			"api_keys:\n  - name: k\n    key: ${SWITCHYARD_TEST_KEY:-sk-live-1}\n",
			`f.yaml:9: api_keys[0].key: a default in ${VAR:-default} would write the key in the file in plaintext: give ${VAR} alone, or sha256:<hex>`},
		{"env key with an empty default, unset", protectionBase +
			"api_keys:\n  - name: k\n    key: ${SWITCHYARD_TEST_SURELY_UNSET:-}\n",
			`f.yaml:9: api_keys[0].key: the environment variable holds an empty key`},
		{"tokens_per_minute below one default reservation", protectionBase +
			"api_keys:\n  - name: k\n    key: sha256:" + sha("k") + "\n    limits: {tokens_per_minute: 511}\n",
			`f.yaml:10: api_keys[0].limits.tokens_per_minute: must be 0 (unlimited) or at least 512: a request without max_tokens reserves 512 tokens, and could never pass`},
		{"negative limits", protectionBase +
			"api_keys:\n  - name: k\n    key: sha256:" + sha("k") + "\n    limits:\n      requests_per_minute: -1\n      tokens_per_minute: -1\n",
			"f.yaml:11: api_keys[0].limits.requests_per_minute: must be >= 0 (0: unlimited)\n" +
				"f.yaml:12: api_keys[0].limits.tokens_per_minute: must be >= 0 (0: unlimited)"},
		{"key for an unknown model", protectionBase +
			"api_keys:\n  - name: k\n    key: sha256:" + sha("k") + "\n    models: [m, big]\n",
			`f.yaml:10: api_keys[0].models[1]: unknown model "big"`},
		{"two names, one key", protectionBase +
			"api_keys:\n  - {name: k, key: '${SWITCHYARD_TEST_KEY}'}\n  - {name: j, key: 'sha256:" + sha("sk-test") + "'}\n",
			`f.yaml:9: api_keys[1].key: the same key as api_keys[0]`},
		{"queue_size not positive", protectionBase + "limits: {queue_size: 0}\n",
			`f.yaml:7: limits.queue_size: must be positive`},
		{"queue_timeout not positive", protectionBase + "limits:\n  queue_timeout: -1s\n",
			`f.yaml:8: limits.queue_timeout: must be positive`},
		{"negative max_concurrency", strings.Replace(protectionBase, "models: [m]}", "models: [m], max_concurrency: -2}", 1),
			`f.yaml:3: backends[1].max_concurrency: must be >= 0 (0: adaptive)`},
		{"negative max_num_seqs", strings.Replace(protectionBase, "models: [m]}", "models: [m], max_num_seqs: -1}", 1),
			`f.yaml:3: backends[1].max_num_seqs: must be >= 0 (0: from the engine)`},
		{"unknown priority order", protectionBase + "engines: {vllm: {priority: lowest}}\n",
			`f.yaml:7: engines.vllm.priority: unknown priority order "lowest" (one of: none, low_first, high_first)`},
		{"hedge without after", protectionBase + "    hedge: {budget_percent: 10}\n",
			`f.yaml:7: models[1].hedge.after: required, and must be positive`},
		{"hedge after the first-byte timeout", protectionBase + "    hedge:\n      after: 60s\n",
			`f.yaml:8: models[1].hedge.after: must be shorter than the backends' timeouts.first_byte (1m0s): an attempt that has no first byte by then has failed, and is retried rather than hedged`},
		{"hedge budget out of range", protectionBase + "    hedge:\n      after: 1s\n      budget_percent: 0\n",
			`f.yaml:9: models[1].hedge.budget_percent: must be in (0, 100]`},
		{"preempt as a boolean", protectionBase + "    preempt: true\n",
			`f.yaml:7: models[1].preempt: "true": must be off, sheddable or standard`},
		{"degrade to an unknown model", protectionBase + "    degrade_to: tiny\n",
			`f.yaml:7: models[1].degrade_to: unknown model "tiny"`},
		{"degrade to itself", protectionBase + "    degrade_to: small\n",
			`f.yaml:7: models[1].degrade_to: a model cannot degrade to itself`},
		{"degrade cycle", strings.Replace(protectionBase, "  - name: m\n", "  - name: m\n    degrade_to: small\n", 1) + "    degrade_to: m\n",
			`f.yaml:6: models[0].degrade_to: degrade_to forms a cycle: m -> small -> m`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse("f.yaml", []byte(openAuth(tc.src)))
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Fatalf("errors for\n%s\ngot\n%s\nwant\n%s", tc.src, got, tc.want)
			}
		})
	}
}

// protectionPolicy sets every protection field. The key text of team-a comes from the environment, team-b's
// and ops' as hashes.
const protectionPolicy = `backends:
  - {name: a, url: 'http://a:1', models: [m, small], max_concurrency: 16}
  - {name: b, url: 'http://b:1', models: [m]}
models:
  - name: m
    slo: {ttft: 500ms}
    hedge: {after: 300ms}
    degrade_to: small
    preempt: standard
  - name: small
    hedge: {after: 200ms, budget_percent: 2.5}
    preempt: sheddable
priorities:
  header: x-class
  default: sheddable
  classes: [{name: critical, slo_factor: 4}, {name: standard}]
api_keys:
  - name: team-a
    key: ${SWITCHYARD_TEST_TEAM_A}
    models: [m]
    limits: {requests_per_minute: 2}
  - name: team-b
    key: sha256:%s
    priority: standard
    limits: {tokens_per_minute: 1000}
  - name: ops
    key: {sha256: %s}
    priority: critical
limits:
  queue_size: 7
  queue_timeout: 3s
`

func compileProtection(t *testing.T, reg *routing.Registry, prev *proxy.Snapshot, m *metrics.Gateway, edit func(string) string) *proxy.Snapshot {
	t.Helper()
	src := fmt.Sprintf(protectionPolicy, sha("sk-team-b"), strings.ToUpper(sha("sk-ops")))
	if edit != nil {
		src = edit(src)
	}
	c, err := Parse("f.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile(reg, prev, m)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func bearer(key string) []byte { return []byte("Bearer " + key) }

func TestCompileProtection(t *testing.T) {
	t.Setenv("SWITCHYARD_TEST_TEAM_A", "sk-team-a")
	s := compileProtection(t, routing.NewRegistry(), nil, metrics.New(prometheus.NewRegistry()), nil)

	// Keys: looked up by the hash of the presented key, whichever way the file gave it.
	for _, tc := range []struct {
		key, name string
		class     admission.Class
	}{
		{"sk-team-a", "team-a", admission.Sheddable}, // no priority: priorities.default
		{"sk-team-b", "team-b", admission.Standard},
		{"sk-ops", "ops", admission.Critical},
	} {
		k, err := s.Keys.Authenticate(bearer(tc.key))
		if err != nil || k.Name != tc.name || k.Class != tc.class {
			t.Errorf("Authenticate(%s) = %+v, %v; want %s, class %s", tc.key, k, err, tc.name, tc.class)
		}
	}
	if _, err := s.Keys.Authenticate(bearer("sk-nope")); !errors.Is(err, admission.ErrInvalidKey) {
		t.Errorf("an unknown key: err %v, want ErrInvalidKey", err)
	}
	if names := len(s.Keys.All()); names != 3 {
		t.Errorf("%d keys, want 3", names)
	}
	a, _ := s.Keys.Authenticate(bearer("sk-team-a"))
	if a.Allows("small") || !a.Allows("m") || a.RequestsPerMinute != 2 || a.TokensPerMinute != 0 {
		t.Errorf("team-a = %+v, want models [m], 2 requests/min", a)
	}

	want := admission.Priorities{Header: "x-class", Default: admission.Sheddable, SLOFactor: [3]float64{4, 1, 0.5}}
	if s.Priorities != want {
		t.Errorf("priorities = %+v, want %+v", s.Priorities, want)
	}
	if s.Shedder == nil || s.Shedder.Params().Priorities != want {
		t.Errorf("the shedder does not use the policy's SLO factors: %+v", s.Shedder)
	}
	if _, ok := s.Limiter.(*admission.LocalLimiter); !ok {
		t.Errorf("limiter = %T, want *admission.LocalLimiter", s.Limiter)
	}
	if s.Queue != (proxy.QueueSettings{Size: 7, Timeout: 3 * time.Second}) {
		t.Errorf("queue = %+v", s.Queue)
	}

	m, small := s.Models["m"], s.Models["small"]
	if m.Hedge != (proxy.Hedge{After: 300 * time.Millisecond, BudgetPercent: 5}) {
		t.Errorf("m's hedge = %+v, want 300ms, the default 5%%", m.Hedge)
	}
	if small.Hedge != (proxy.Hedge{After: 200 * time.Millisecond, BudgetPercent: 2.5}) {
		t.Errorf("small's hedge = %+v", small.Hedge)
	}
	if m.DegradeTo != small || small.DegradeTo != nil {
		t.Errorf("DegradeTo: m -> %p, small -> %p; want m -> %p (the snapshot's small), small -> nil", m.DegradeTo, small.DegradeTo, small)
	}
	if !m.Preempt || !m.PreemptAll || !small.Preempt || small.PreemptAll {
		t.Errorf("preempt: m %v/%v, small %v/%v; want standard (true/true) and sheddable (true/false)",
			m.Preempt, m.PreemptAll, small.Preempt, small.PreemptAll)
	}
	if got := []int{s.Backends[0].Config().MaxConcurrency, s.Backends[1].Config().MaxConcurrency}; got[0] != 16 || got[1] != 0 {
		t.Errorf("max_concurrency = %v, want [16 0] (0: adaptive)", got)
	}
}

// TestPriorityHeaderLowersOnly checks the rule docs/config.md states, on compiled snapshots: the header lowers a
// key's class, never raises it; without keys it names any class.
func TestPriorityHeaderLowersOnly(t *testing.T) {
	t.Setenv("SWITCHYARD_TEST_TEAM_A", "sk-team-a")
	s := compileProtection(t, routing.NewRegistry(), nil, nil, nil)
	key := func(k string) *admission.Key {
		key, err := s.Keys.Authenticate(bearer(k))
		if err != nil {
			t.Fatal(err)
		}
		return key
	}
	_, open, err := loadBytes(t, openAuth(protectionBase+"priorities: {default: standard}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		s      *proxy.Snapshot
		key    *admission.Key
		header string
		want   admission.Class
	}{
		{s, key("sk-team-b"), "", admission.Standard},
		{s, key("sk-team-b"), "critical", admission.Standard}, // not raised
		{s, key("sk-team-b"), "sheddable", admission.Sheddable},
		{s, key("sk-ops"), "sheddable", admission.Sheddable},
		{s, key("sk-ops"), "standard", admission.Standard},
		{s, key("sk-ops"), "", admission.Critical},
		{s, key("sk-team-a"), "critical", admission.Sheddable}, // the default class, given to a key, is its ceiling
		{open, nil, "", admission.Standard},
		{open, nil, "critical", admission.Critical}, // no keys: every caller is trusted alike
		{open, nil, "bulk", admission.Standard},     // unknown: ignored
	} {
		if got := tc.s.Priorities.Class(tc.key, []byte(tc.header)); got != tc.want {
			t.Errorf("key %v, header %q: class %s, want %s", tc.key, tc.header, got, tc.want)
		}
	}
}

func TestCompileWithoutKeys(t *testing.T) {
	_, s, err := loadBytes(t, openAuth(protectionBase))
	if err != nil {
		t.Fatal(err)
	}
	if s.Keys != nil || s.Limiter != nil {
		t.Errorf("no api_keys: Keys %v, Limiter %v; want both nil (a nil interface)", s.Keys, s.Limiter)
	}
	if k, err := s.Keys.Authenticate(nil); k != nil || err != nil {
		t.Errorf("Authenticate without keys = %v, %v; want nil, nil", k, err)
	}
	if s.Shedder == nil || s.Priorities != admission.DefaultPriorities() {
		t.Errorf("shedder %v, priorities %+v; want a shedder and admission's defaults", s.Shedder, s.Priorities)
	}
	if s.Queue != (proxy.QueueSettings{Size: 1024, Timeout: 10 * time.Second}) {
		t.Errorf("queue = %+v, want the defaults", s.Queue)
	}
	if m := s.Models["m"]; m.Hedge != (proxy.Hedge{}) || m.DegradeTo != nil {
		t.Errorf("m: hedge %+v, degrade_to %v; want none", m.Hedge, m.DegradeTo)
	}

	// Keys without limits: authentication, and no limiter.
	_, s, err = loadBytes(t, protectionBase+"api_keys: [{name: k, key: 'sha256:"+sha("k")+"'}]\n")
	if err != nil {
		t.Fatal(err)
	}
	if s.Keys == nil || s.Limiter != nil {
		t.Errorf("keys without limits: Keys %v, Limiter %v; want keys and a nil limiter", s.Keys, s.Limiter)
	}
}

// TestReloadKeepsRateLimitBuckets: a request a key made before a reload still counts after it, also when the
// reload changes the key's other settings; a lowered limit applies at once.
func TestReloadKeepsRateLimitBuckets(t *testing.T) {
	t.Setenv("SWITCHYARD_TEST_TEAM_A", "sk-team-a")
	reg := routing.NewRegistry()
	s1 := compileProtection(t, reg, nil, nil, nil)
	a1, _ := s1.Keys.Authenticate(bearer("sk-team-a"))
	if q := s1.Limiter.Take(a1, 10); q.Err != nil || q.Requests.Remaining != 1 {
		t.Fatalf("first request: %+v, want admitted with 1 of 2 left", q)
	}

	// The reload moves team-a to another model list and adds a key.
	s2 := compileProtection(t, reg, s1, nil, func(src string) string {
		src = strings.Replace(src, "    models: [m]\n", "    models: [m, small]\n", 1)
		return strings.Replace(src, "limits:\n  queue_size",
			"  - {name: new, key: 'sha256:"+sha("sk-new")+"', limits: {requests_per_minute: 1}}\nlimits:\n  queue_size", 1)
	})
	if s2.Limiter == s1.Limiter {
		t.Fatal("the reload kept the old limiter object; want a new one sharing the buckets")
	}
	a2, _ := s2.Keys.Authenticate(bearer("sk-team-a"))
	if q := s2.Limiter.Take(a2, 10); q.Err != nil || q.Requests.Remaining != 0 {
		t.Fatalf("second request, after the reload: %+v, want admitted with 0 left (the first still counts)", q)
	}
	if q := s2.Limiter.Take(a2, 10); !errors.Is(q.Err, admission.ErrRateLimitRequests) {
		t.Fatalf("third request: %+v, want ErrRateLimitRequests", q)
	}
	// The old limiter, still used by requests that started before the reload, shares the same buckets.
	if q := s1.Limiter.Take(a1, 10); !errors.Is(q.Err, admission.ErrRateLimitRequests) {
		t.Fatalf("a request on the old snapshot: %+v, want ErrRateLimitRequests", q)
	}
	nk, _ := s2.Keys.Authenticate(bearer("sk-new"))
	if q := s2.Limiter.Take(nk, 10); q.Err != nil {
		t.Fatalf("the new key's first request: %+v", q)
	}

	// team-b used 600 of its 1000 tokens; a reload lowering the limit to 512 keeps the 400 left (a bucket is cut
	// only when it holds more than the new limit).
	b2, _ := s2.Keys.Authenticate(bearer("sk-team-b"))
	if q := s2.Limiter.Take(b2, 600); q.Err != nil {
		t.Fatal(q.Err)
	}
	s3 := compileProtection(t, reg, s2, nil, func(src string) string {
		return strings.Replace(src, "tokens_per_minute: 1000", "tokens_per_minute: 512", 1)
	})
	b3, _ := s3.Keys.Authenticate(bearer("sk-team-b"))
	q := s3.Limiter.Take(b3, 450)
	if !errors.Is(q.Err, admission.ErrRateLimitTokens) || q.Tokens.Limit != 512 || q.Tokens.Remaining > 401 {
		t.Fatalf("after lowering the limit: %+v, want refused, limit 512, about 400 left", q)
	}

	// Removing every limit drops the limiter.
	s4 := compileProtection(t, reg, s3, nil, func(src string) string {
		src = strings.Replace(src, "limits: {requests_per_minute: 2}", "limits: {}", 1)
		return strings.Replace(src, "limits: {tokens_per_minute: 1000}", "limits: {}", 1)
	})
	if s4.Limiter != nil {
		t.Fatalf("no key has limits: limiter %v, want nil", s4.Limiter)
	}
}

// TestWatcherReloadKeepsRateLimitBuckets is the same promise through the watcher, which passes the snapshot in
// force as prev.
func TestWatcherReloadKeepsRateLimitBuckets(t *testing.T) {
	t.Setenv("SWITCHYARD_TEST_WATCH_KEY", "sk-watch")
	text := strings.Replace(policyText("round_robin", "a"), "auth: none\n", "", 1) + "api_keys:\n  - {name: k, key: '${SWITCHYARD_TEST_WATCH_KEY}', limits: {requests_per_minute: 1}}\n"
	f := newFixture(t, text, false)
	s1 := f.w.Snapshot()
	k1, err := s1.Keys.Authenticate(bearer("sk-watch"))
	if err != nil {
		t.Fatal(err)
	}
	if q := s1.Limiter.Take(k1, 1); q.Err != nil {
		t.Fatal(q.Err)
	}
	writeFile(t, f.path, strings.Replace(text, "round_robin", "random", 1))
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	s2 := f.w.Snapshot()
	if s2 == s1 || s2.Models["m"].StrategyName != "random" {
		t.Fatal("the reload did not swap the snapshot")
	}
	k2, _ := s2.Keys.Authenticate(bearer("sk-watch"))
	if q := s2.Limiter.Take(k2, 1); !errors.Is(q.Err, admission.ErrRateLimitRequests) {
		t.Fatalf("after the reload: %+v, want ErrRateLimitRequests (the request before it still counts)", q)
	}
}

func TestSummaryShowsProtection(t *testing.T) {
	t.Setenv("SWITCHYARD_TEST_TEAM_A", "sk-team-a")
	src := fmt.Sprintf(protectionPolicy, sha("sk-team-b"), sha("sk-ops"))
	c, err := Parse("f.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := c.WriteSummary(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, s := range []string{
		"priority  header x-class  default sheddable  slo_factor critical 4 standard 1 sheddable 0.5\n",
		"queue     7 per model  timeout 3s\n",
		"api keys  3: requests need Authorization: Bearer <key>\n",
		"  team-a  sheddable  models m  2 requests/min\n",
		"  team-b  standard   all models  1000 tokens/min\n",
		"  ops     critical   all models  no limits\n",
		"  max_concurrency a 16; the others adaptive\n",
		"  m      strategy adaptive  retries 2  slo ttft 500ms\n         targets a b\n         hedge after 300ms budget 5% degrade_to small\n",
		"  small  strategy adaptive  retries 2\n         targets a\n         hedge after 200ms budget 2.5%\n",
	} {
		if !strings.Contains(out, s) {
			t.Errorf("summary lacks %q:\n%s", s, out)
		}
	}
	for _, secret := range []string{"sk-team-a", sha("sk-team-a"), sha("sk-team-b"), sha("sk-ops"), sha("sk-ops")[:12]} {
		if strings.Contains(out, secret) {
			t.Errorf("summary prints a key or its hash (%s):\n%s", secret, out)
		}
	}
}

// TestSheddingOff: limits.shedding false compiles to no shedder (every request goes straight to a backend).
func TestSheddingOff(t *testing.T) {
	_, s, err := loadBytes(t, openAuth(protectionBase+"limits: {shedding: false}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if s.Shedder != nil {
		t.Error("limits.shedding false still compiled a shedder")
	}
	_, s, err = loadBytes(t, openAuth(protectionBase+"limits: {shedding: true}\n"))
	if err != nil || s.Shedder == nil {
		t.Errorf("limits.shedding true: shedder %v, err %v", s.Shedder, err)
	}
}

// TestSheddingNotABool: a wrong type for limits.shedding is reported with its line.
func TestSheddingNotABool(t *testing.T) {
	_, _, err := loadBytes(t, openAuth(protectionBase+"limits:\n  shedding: maybe\n"))
	if err == nil || !strings.Contains(err.Error(), ":8: limits.shedding: expected true or false") {
		t.Errorf("err = %v", err)
	}
}
