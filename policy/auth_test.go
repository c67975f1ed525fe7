package policy

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// authBase is a valid policy up to its auth settings, which cases append.
const authBase = `backends:
  - {name: a, url: 'http://a:1', models: [m, n]}
models:
  - name: m
  - name: n
`

// keyA and keyB are the sha256 forms of the keys "a" and "b".
var (
	keyA = "sha256:" + sha("a")
	keyB = "sha256:" + sha("b")
)

func TestAuthValidation(t *testing.T) {
	for _, tc := range []struct {
		name, src string
		auth      string // the mode of a valid file
		want      string // every error, one per line; "" for a valid file
	}{
		{"keys without auth: api_keys", authBase + "api_keys: [{name: k, key: '" + keyA + "'}]\n", AuthAPIKeys, ""},
		{"auth: api_keys with keys", authBase + "auth: api_keys\napi_keys: [{name: k, key: '" + keyA + "'}]\n", AuthAPIKeys, ""},
		{"an empty auth is the default", authBase + "auth: ''\napi_keys: [{name: k, key: '" + keyA + "'}]\n", AuthAPIKeys, ""},
		{"auth: none without keys", authBase + "auth: none\n", AuthNone, ""},
		{"auth: none with an empty list", authBase + "auth: none\napi_keys: []\n", AuthNone, ""},
		{"auth: none first", "auth: none\n" + authBase, AuthNone, ""},
		{"no keys, no auth", authBase,
			"", "f.yaml:1: api_keys: no API keys: list the keys clients must present, or write auth: none to serve without authentication on purpose (any caller may then use every model and claim any priority)"},
		{"an empty list, no auth", authBase + "api_keys: []\n",
			"", "f.yaml:6: api_keys: no API keys: list the keys clients must present, or write auth: none to serve without authentication on purpose (any caller may then use every model and claim any priority)"},
		{"null keys, no auth", authBase + "api_keys:\n",
			"", "f.yaml:6: api_keys: no API keys: list the keys clients must present, or write auth: none to serve without authentication on purpose (any caller may then use every model and claim any priority)"},
		{"auth is a string", authBase + "auth: [none]\n", "", `f.yaml:6: auth: expected a string, got a list`},
		{"auth is lower case", authBase + "auth: None\n", "", `f.yaml:6: auth: unknown auth mode "None" (one of: api_keys, none); did you mean "none"?`},
		{"keys that do not decode say nothing more", authBase + "api_keys: {name: k}\n", "", `f.yaml:6: api_keys: expected a list, got a mapping`},
		{"reload last", authBase + "auth: none\nreload: {allow_auth_changes_from: " + strings.ToUpper(sha("x")) + "}\n", AuthNone, ""},
		{"reload, short hash", authBase + "auth: none\nreload:\n  allow_auth_changes_from: 0123456789ab\n", AuthNone, ""},
		{"an empty reload", authBase + "auth: none\nreload: {}\n", AuthNone, ""},
		{"x- fields may follow reload", authBase + "auth: none\nreload: {}\nx-notes: {a: 1}\n", AuthNone, ""},
		{"reload before api_keys", authBase + "reload: {}\napi_keys: [{name: k, key: '" + keyA + "'}]\n",
			"", "f.yaml:6: reload: must be the last top-level field of the file (api_keys follows it on line 7), so that a file cut short never carries an acknowledgement"},
		{"reload hash not hex", authBase + "auth: none\nreload: {allow_auth_changes_from: 0123456789abcdefg}\n",
			"", `f.yaml:7: reload.allow_auth_changes_from: expected 12 to 64 hex digits of the SHA-256 of the policy in force (as the refused reload's log, switchyard check or sha256sum print it), got "0123456789abcdefg"`},
		{"reload hash too long", authBase + "auth: none\nreload: {allow_auth_changes_from: " + sha("x") + "0}\n",
			"", `f.yaml:7: reload.allow_auth_changes_from: expected 12 to 64 hex digits of the SHA-256 of the policy in force (as the refused reload's log, switchyard check or sha256sum print it), got "` + sha("x") + `0"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("f.yaml", []byte(tc.src))
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Fatalf("errors for\n%s\ngot\n%s\nwant\n%s", tc.src, got, tc.want)
			}
			if err == nil && c.Auth != tc.auth {
				t.Errorf("auth = %q, want %q", c.Auth, tc.auth)
			}
		})
	}
}

// keysPolicy is authBase with keys (YAML list items, each "  - {...}\n") and extra top-level YAML after them.
func keysPolicy(keys, extra string) string {
	return authBase + "api_keys:\n" + keys + extra
}

func TestAuthChanges(t *testing.T) {
	const (
		a       = "  - {name: a, key: 'sha256:ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb', priority: standard, models: [m], limits: {requests_per_minute: 60, tokens_per_minute: 1000}}\n"
		b       = "  - {name: b, key: 'sha256:3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d', priority: sheddable}\n"
		aOpen   = "  - {name: a, key: 'sha256:ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb', priority: standard}\n"
		aNarrow = "  - {name: a, key: 'sha256:ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb', priority: sheddable, models: [m], limits: {requests_per_minute: 30, tokens_per_minute: 512}}\n"
	)
	if keyA != "sha256:ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb" || !strings.Contains(b, keyB) {
		t.Fatal("the keys of the cases are not sha256 of a and b")
	}
	type change struct {
		line    int
		msg     string
		loosens bool
	}
	for _, tc := range []struct {
		name     string
		old, new string
		want     []change
	}{
		{"nothing", keysPolicy(a+b, ""), keysPolicy(a+b, "limits: {queue_size: 9}\n"), nil},
		{"a key added", keysPolicy(a, ""), keysPolicy(a+b, ""), []change{{8, "key b added", false}}},
		{"a key removed", keysPolicy(a+b, ""), keysPolicy(a, ""), []change{{6, "key b removed", true}}},
		{"every key removed, auth: none", keysPolicy(a+b, ""), authBase + "auth: none\n",
			[]change{{6, "auth: none turns authentication off (the policy in force requires keys: a b)", true}}},
		{"authentication turned on", authBase + "auth: none\n", keysPolicy(a, ""),
			[]change{{6, "authentication turned on: keys a", false}}},
		{"no keys either side", authBase + "auth: none\n", authBase + "auth: none\nlimits: {queue_size: 9}\n", nil},
		{"models, limits and priority dropped", keysPolicy(a+b, ""), keysPolicy(aOpen+b, ""), []change{
			{7, "key a: models [m] -> all models", true},
			{7, "key a: requests_per_minute 60 -> unlimited", true},
			{7, "key a: tokens_per_minute 1000 -> unlimited", true},
		}},
		{"narrowed and lowered", keysPolicy(aOpen+b, ""), keysPolicy(aNarrow+b, ""), []change{
			{7, "key a: priority standard -> sheddable", false},
			{7, "key a: models all models -> [m]", false},
			{7, "key a: requests_per_minute unlimited -> 30", false},
			{7, "key a: tokens_per_minute unlimited -> 512", false},
		}},
		{"raised", keysPolicy(aNarrow+b, ""), keysPolicy(a+b, ""), []change{
			{7, "key a: priority sheddable -> standard", true},
			{7, "key a: requests_per_minute 30 -> 60", true},
			{7, "key a: tokens_per_minute 512 -> 1000", true},
		}},
		{"models widened by one", keysPolicy(a, ""), keysPolicy(strings.Replace(a, "[m]", "[m, n]", 1), ""),
			[]change{{7, "key a: models [m] -> [m n]", true}}},
		{"models swapped", keysPolicy(a, ""), keysPolicy(strings.Replace(a, "[m]", "[n]", 1), ""),
			[]change{{7, "key a: models [m] -> [n]", true}}},
		{"priority raised through the default", keysPolicy(b, ""), "priorities: {default: critical}\n" + keysPolicy(strings.Replace(b, ", priority: sheddable", "", 1), ""),
			[]change{{8, "key b: priority sheddable -> critical", true}}},
		{"cache opt-in granted", keysPolicy(b, ""), keysPolicy(strings.Replace(b, "}", ", cache_opt_in: true}", 1), ""),
			[]change{{7, "key b: cache_opt_in false -> true", true}}},
		{"budget raised", keysPolicy(strings.Replace(b, "}", ", budget: {limit: 10}}", 1), ""),
			keysPolicy(strings.Replace(b, "}", ", budget: {limit: 20}}", 1), ""),
			[]change{{7, "key b: budget limit 10 -> 20", true}}},
		{"budget lowered", keysPolicy(strings.Replace(b, "}", ", budget: {limit: 10}}", 1), ""),
			keysPolicy(strings.Replace(b, "}", ", budget: {limit: 5}}", 1), ""),
			[]change{{7, "key b: budget limit 10 -> 5", false}}},
		{"budget removed", keysPolicy(strings.Replace(b, "}", ", budget: {limit: 10}}", 1), ""), keysPolicy(b, ""),
			[]change{{7, "key b: budget limit 10 -> 0", true}}},
		{"cache opt-in withdrawn", keysPolicy(strings.Replace(b, "}", ", cache_opt_in: true}", 1), ""), keysPolicy(b, ""),
			[]change{{7, "key b: cache_opt_in true -> false", false}}},
		{"key replaced", keysPolicy(a, ""), keysPolicy(strings.Replace(a, sha("a"), sha("c"), 1), ""),
			[]change{{7, "key a: key replaced", false}}},
		{"key renamed", keysPolicy(b, ""), keysPolicy(strings.Replace(b, "name: b", "name: c", 1), ""),
			[]change{{7, "key c added", false}, {6, "key b removed", true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old, err := Parse("old.yaml", []byte(tc.old))
			if err != nil {
				t.Fatal(err)
			}
			c, err := Parse("new.yaml", []byte(tc.new))
			if err != nil {
				t.Fatal(err)
			}
			var got []change
			for _, ch := range authChanges(old, c) {
				got = append(got, change{c.lines.line(ch.path), ch.msg, ch.loosens})
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("changes\n got %v\nwant %v", got, tc.want)
			}
			// The reload goes ahead exactly when nothing loosens, or the new file acknowledges the policy in
			// force.
			loosens := slices.ContainsFunc(tc.want, func(ch change) bool { return ch.loosens })
			err = checkAuthReload(old, c, authChanges(old, c))
			if (err != nil) != loosens {
				t.Fatalf("checkAuthReload = %v; loosens %v", err, loosens)
			}
			if !loosens {
				return
			}
			var es Errors
			if !errors.As(err, &es) || !slices.IsSortedFunc(es, func(a, b *Error) int { return a.Line - b.Line }) {
				t.Fatalf("err = %v, want Errors sorted by line", err)
			}
			last := es[len(es)-1].Error()
			wantLast := "new.yaml:" + strconv.Itoa(strings.Count(tc.new, "\n")) + ": reload: to apply these changes, end the file with: reload: {allow_auth_changes_from: " +
				short(old.Hash) + "} (the policy in force)"
			if last != wantLast {
				t.Errorf("last error %q, want %q", last, wantLast)
			}
			for _, ack := range []string{short(old.Hash), strings.ToUpper(old.Hash)} {
				acked, err := Parse("new.yaml", []byte(tc.new+"reload: {allow_auth_changes_from: "+ack+"}\n"))
				if err != nil {
					t.Fatal(err)
				}
				if err := checkAuthReload(old, acked, authChanges(old, acked)); err != nil {
					t.Errorf("acknowledged with %s: %v", ack, err)
				}
			}
			// An acknowledgement of another policy (the new file's own, for one) is no acknowledgement.
			other, _ := Parse("new.yaml", []byte(tc.new+"reload: {allow_auth_changes_from: "+short(c.Hash)+"}\n"))
			err = checkAuthReload(old, other, authChanges(old, other))
			if err == nil || !strings.Contains(err.Error(), "allow_auth_changes_from "+short(c.Hash)+" is not the policy in force") {
				t.Errorf("acknowledging another policy: %v", err)
			}
		})
	}
}

// TestWatcherRefusesLooseningReload: the reload that drops a key is refused (old policy, gauge 0, the log names
// the change and the acknowledgement), the acknowledged one applies, and every applied reload logs its auth
// changes.
func TestWatcherRefusesLooseningReload(t *testing.T) {
	two := keysPolicy("  - {name: a, key: '"+keyA+"'}\n  - {name: b, key: '"+keyB+"', models: [m]}\n", "")
	f := newFixture(t, two, false)
	old := f.w.Snapshot()

	one := keysPolicy("  - {name: a, key: '"+keyA+"'}\n", "")
	writeFile(t, f.path, one)
	err := f.w.Reload()
	if err == nil || f.w.Snapshot() != old || f.w.LastError() == nil {
		t.Fatalf("dropping key b: err %v, snapshot replaced %v", err, f.w.Snapshot() != old)
	}
	if got := gauge(t, f.m.ConfigReloadSuccess); got != 0 {
		t.Errorf("reload success = %v, want 0", got)
	}
	for _, want := range []string{
		f.path + ":6: api_keys: key b removed: a reload may not loosen authentication without an acknowledgement",
		"end the file with: reload: {allow_auth_changes_from: " + short(old.Hash) + "}",
		"the previous policy stays in force",
	} {
		if !strings.Contains(f.logs.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, f.logs.String())
		}
	}

	writeFile(t, f.path, one+"reload: {allow_auth_changes_from: "+short(old.Hash)+"}\n")
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	if s := f.w.Snapshot(); s == old || len(s.Keys.All()) != 1 || gauge(t, f.m.ConfigReloadSuccess) != 1 {
		t.Fatalf("the acknowledged reload did not apply")
	}
	if want := `auth="key b removed"`; !strings.Contains(f.logs.String(), want) {
		t.Errorf("the applied reload's log lacks %s:\n%s", want, f.logs.String())
	}

	// Adding a key and narrowing always apply, and say so; an edit that leaves auth alone says that.
	writeFile(t, f.path, keysPolicy("  - {name: a, key: '"+keyA+"', models: [n]}\n  - {name: c, key: '"+keyB+"'}\n", ""))
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	writeFile(t, f.path, keysPolicy("  - {name: a, key: '"+keyA+"', models: [n]}\n  - {name: c, key: '"+keyB+"'}\n", "limits: {queue_size: 7}\n"))
	if err := f.w.Reload(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`auth="key a: models all models -> [n]; key c added"`, `auth=unchanged`} {
		if !strings.Contains(f.logs.String(), want) {
			t.Errorf("the log lacks %s:\n%s", want, f.logs.String())
		}
	}
	if strings.Contains(f.logs.String(), sha("a")) || strings.Contains(f.logs.String(), sha("b")) {
		t.Error("the log shows a key's hash")
	}
}

// TestTruncatedConfig is the truncation experiment of issue 14: every prefix of the shipped config.yaml, each
// byte length, as a policy file cut short by a write caught half way. Each either fails to parse or runs with
// authentication, and a reload from the whole file to it is refused or keeps every key. Parse only, no servers:
// about 4 s on two shared cores. Under the race detector, ten times slower, it takes every 7th length (and
// the last 64, which cut the final lines).
func TestTruncatedConfig(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "config.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	full, err := Parse("config.yaml", data)
	if err != nil {
		t.Fatal(err)
	}
	if full.Auth != AuthAPIKeys || len(full.APIKeys) == 0 {
		t.Fatalf("config.yaml: auth %s, %d keys; the experiment needs keys", full.Auth, len(full.APIKeys))
	}
	start := time.Now()
	stride := 1
	if raceEnabled {
		stride = 7
	}
	var tried, parsed, applied, keepKeys int
	for n := range len(data) {
		if n%stride != 0 && n < len(data)-64 {
			continue
		}
		tried++
		c, err := Parse("config.yaml", data[:n])
		if err != nil {
			continue
		}
		parsed++
		if c.Auth != full.Auth || len(c.APIKeys) == 0 {
			t.Errorf("the first %d bytes parse with auth %s and %d keys", n, c.Auth, len(c.APIKeys))
			continue
		}
		if checkAuthReload(full, c, authChanges(full, c)) != nil {
			continue // refused
		}
		applied++
		if !slices.Equal(keyNamesOf(c), keyNamesOf(full)) {
			t.Errorf("a reload to the first %d bytes applies with keys %v, not %v", n, keyNamesOf(c), keyNamesOf(full))
			continue
		}
		keepKeys++
	}
	t.Logf("%d prefixes of config.yaml (%d bytes, every %d): %d parse, all with auth %s; a reload to %d of them "+
		"applies, %d keeping every key; %v", tried, len(data), stride, parsed, full.Auth, applied, keepKeys, time.Since(start).Round(time.Millisecond))
}

func keyNamesOf(c *Config) []string {
	var names []string
	for _, k := range c.APIKeys {
		names = append(names, k.Name)
	}
	return names
}
