package policy

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// This file holds the rules that keep a policy file from turning authentication off by accident: the auth mode
// must be explicit to run open (validateAuth), and a reload may tighten authentication but loosen it only with
// an acknowledgement naming the policy it loosens (authChanges, checkAuthReload). A half-written file, which
// the watcher may read while an editor or a tool writes it in place, is valid surprisingly often (cut before
// api_keys, it used to mean "no keys"); these rules make such a file an error or a refused reload.

// validateAuth checks the auth mode against the keys: api_keys needs at least one key, none allows none.
func (r *report) validateAuth(c *Config) {
	switch c.Auth {
	case AuthAPIKeys:
		if len(c.APIKeys) > 0 {
			return
		}
		if r.set("auth") {
			r.errorf("auth", "auth: api_keys needs at least one key in api_keys; to serve without authentication on purpose, write auth: none")
			return
		}
		r.errorf("api_keys", "no API keys: list the keys clients must present, or write auth: none to serve without "+
			"authentication on purpose (any caller may then use every model and claim any priority)")
	case AuthNone:
		if len(c.APIKeys) > 0 {
			r.errorf("auth", "auth: none turns authentication off, but api_keys lists keys: remove auth: none to require them, or remove api_keys to serve without authentication")
		}
	default:
		msg := fmt.Sprintf("unknown auth mode %q (one of: %s, %s)", c.Auth, AuthAPIKeys, AuthNone)
		if s := suggest(c.Auth, []string{AuthAPIKeys, AuthNone}); s != "" {
			msg += fmt.Sprintf("; did you mean %q?", s)
		}
		r.errorf("auth", msg)
	}
}

// Acknowledgement hashes: the short form logs print (short) up to a whole SHA-256.
const (
	minAckDigits = 12
	maxAckDigits = 64
)

// validateReload checks the reload section: it is the file's last top-level field, so that a file cut short
// never carries an acknowledgement (a prefix that holds it holds every other section whole), and its hash is
// hex of a usable length.
func (r *report) validateReload(c *Config) {
	f, ok := r.fields["reload"]
	if !ok {
		return
	}
	for _, p := range slices.Sorted(maps.Keys(r.fields)) {
		if g := r.fields[p]; !strings.ContainsAny(p, ".[") && p != "reload" && g.line > f.line {
			r.errorf("reload", fmt.Sprintf("must be the last top-level field of the file (%s follows it on line %d), so that a file cut short never carries an acknowledgement", p, g.line))
			break
		}
	}
	if h := c.Reload.AllowAuthChangesFrom; r.set("reload.allow_auth_changes_from") && !validAck(h) {
		r.errorf("reload.allow_auth_changes_from", fmt.Sprintf("expected %d to %d hex digits of the SHA-256 of the policy in force (as the refused reload's log, switchyard check or sha256sum print it), got %q",
			minAckDigits, maxAckDigits, h))
	}
}

func validAck(h string) bool {
	if len(h) < minAckDigits || len(h) > maxAckDigits {
		return false
	}
	return !strings.ContainsFunc(h, func(c rune) bool {
		return !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F')
	})
}

// authLines locates, in a valid file, what a refused reload's errors point at.
type authLines struct {
	at  map[string]int // line of auth, reload and api_keys, and of every path below api_keys
	end int            // the file's last line
}

func (r *report) authLines(data []byte) authLines {
	l := authLines{at: map[string]int{}, end: strings.Count(strings.TrimRight(string(data), "\n"), "\n") + 1}
	for p, f := range r.fields {
		if within(p, "auth") || within(p, "api_keys") || within(p, "reload") {
			l.at[p] = f.line
		}
	}
	return l
}

// line returns the line of path or of its closest parent the file set; 1 when the file set none.
func (l authLines) line(path string) int {
	for p := path; p != ""; p = parent(p) {
		if n, ok := l.at[p]; ok {
			return n
		}
	}
	return 1
}

// authChange is one difference in authentication between the policy in force and a new one.
type authChange struct {
	path    string // where the new file makes the change (api_keys[1].models), or where it would be
	msg     string // what changes, by key name: never a key or its hash
	loosens bool   // the change gives some caller more than before: it needs an acknowledgement
}

// authChanges lists how c changes authentication from old, in the new file's order: the auth mode, then each key
// of c (added, or its key, priority, models, cache_opt_in and limits changed), then the keys c removes. A change
// loosens when it gives some caller more than before: authentication off, a key removed (what a file cut short
// looks like), more models, a higher class, the cache opt-in, higher or no limits.
func authChanges(old, c *Config) []authChange {
	var out []authChange
	switch {
	case old.Auth == AuthAPIKeys && c.Auth == AuthNone:
		return append(out, authChange{"auth", fmt.Sprintf("auth: none turns authentication off (the policy in force requires keys: %s)", keyNames(old.APIKeys)), true})
	case old.Auth == AuthNone && c.Auth == AuthAPIKeys:
		return append(out, authChange{"api_keys", fmt.Sprintf("authentication turned on: keys %s", keyNames(c.APIKeys)), false})
	case c.Auth == AuthNone:
		return nil
	}
	was := make(map[string]*APIKey, len(old.APIKeys))
	for i := range old.APIKeys {
		was[old.APIKeys[i].Name] = &old.APIKeys[i]
	}
	kept := map[string]bool{}
	for i := range c.APIKeys {
		k, p := &c.APIKeys[i], fmt.Sprintf("api_keys[%d]", i)
		o, ok := was[k.Name]
		if !ok {
			out = append(out, authChange{p, fmt.Sprintf("key %s added", k.Name), false})
			continue
		}
		kept[k.Name] = true
		if k.Key != o.Key {
			out = append(out, authChange{p + ".key", fmt.Sprintf("key %s: key replaced", k.Name), false})
		}
		if n, w := classIndex(k.Priority), classIndex(o.Priority); n != w {
			out = append(out, authChange{p + ".priority", fmt.Sprintf("key %s: priority %s -> %s", k.Name, o.Priority, k.Priority), n < w})
		}
		if !slices.Equal(sortedSet(k.Models), sortedSet(o.Models)) {
			out = append(out, authChange{p + ".models", fmt.Sprintf("key %s: models %s -> %s", k.Name, modelList(o.Models), modelList(k.Models)),
				widens(o.Models, k.Models)})
		}
		if k.CacheOptIn != o.CacheOptIn {
			out = append(out, authChange{p + ".cache_opt_in", fmt.Sprintf("key %s: cache_opt_in %v -> %v", k.Name, o.CacheOptIn, k.CacheOptIn), k.CacheOptIn})
		}
		for _, l := range []struct {
			name     string
			old, new int
		}{
			{"requests_per_minute", o.Limits.RequestsPerMinute, k.Limits.RequestsPerMinute},
			{"tokens_per_minute", o.Limits.TokensPerMinute, k.Limits.TokensPerMinute},
		} {
			if l.old != l.new {
				out = append(out, authChange{p + ".limits." + l.name, fmt.Sprintf("key %s: %s %s -> %s", k.Name, l.name, limitText(l.old), limitText(l.new)),
					l.old > 0 && (l.new == 0 || l.new > l.old)})
			}
		}
		for _, l := range []struct {
			name     string
			old, new float64
		}{
			{"limit", o.Budget.Limit, k.Budget.Limit},
			{"soft_limit", o.Budget.SoftLimit, k.Budget.SoftLimit},
		} {
			if l.old != l.new { // a budget raised or removed lets the key spend more: cost.go
				out = append(out, authChange{p + ".budget." + l.name, fmt.Sprintf("key %s: budget %s %v -> %v", k.Name, l.name, l.old, l.new),
					l.old > 0 && (l.new == 0 || l.new > l.old)})
			}
		}
		if o.Budget.Period != k.Budget.Period && (o.Budget.Limit > 0 || o.Budget.SoftLimit > 0) {
			out = append(out, authChange{p + ".budget.period", fmt.Sprintf("key %s: budget period %v -> %v", k.Name, o.Budget.Period, k.Budget.Period),
				k.Budget.Period < o.Budget.Period})
		}
	}
	for _, k := range old.APIKeys {
		if !kept[k.Name] {
			out = append(out, authChange{"api_keys", fmt.Sprintf("key %s removed", k.Name), true})
		}
	}
	return out
}

// widens reports whether a key whose models were old may use a model under new that it could not before (an
// empty list is every model).
func widens(old, new []string) bool {
	if len(old) == 0 {
		return false
	}
	if len(new) == 0 {
		return true
	}
	return slices.ContainsFunc(new, func(m string) bool { return !slices.Contains(old, m) })
}

func sortedSet(models []string) []string {
	return slices.Compact(slices.Sorted(slices.Values(models)))
}

func modelList(models []string) string {
	if len(models) == 0 {
		return "all models"
	}
	return "[" + strings.Join(models, " ") + "]"
}

func limitText(n int) string {
	if n == 0 {
		return "unlimited"
	}
	return strconv.Itoa(n)
}

func keyNames(keys []APIKey) string {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = k.Name
	}
	return strings.Join(names, " ")
}

// authSummary is what a reload changed in authentication, for its log line: "unchanged", or the changes joined
// with "; ".
func authSummary(changes []authChange) string {
	if len(changes) == 0 {
		return "unchanged"
	}
	msgs := make([]string, len(changes))
	for i, ch := range changes {
		msgs[i] = ch.msg
	}
	return strings.Join(msgs, "; ")
}

// checkAuthReload returns, when c loosens authentication from old (in force, with hash old.Hash) without
// acknowledging it, an Errors naming each loosening change at its line and, on the file's last line, the
// acknowledgement that would let it apply; nil when the reload may go ahead.
func checkAuthReload(old, c *Config, changes []authChange) error {
	ack := strings.ToLower(c.Reload.AllowAuthChangesFrom)
	if ack != "" && strings.HasPrefix(old.Hash, ack) {
		return nil
	}
	var es Errors
	for _, ch := range changes {
		if ch.loosens {
			es = append(es, &Error{File: c.File, Line: c.lines.line(ch.path), Path: ch.path,
				Msg: ch.msg + ": a reload may not loosen authentication without an acknowledgement"})
		}
	}
	if len(es) == 0 {
		return nil
	}
	msg := fmt.Sprintf("to apply these changes, end the file with: reload: {allow_auth_changes_from: %s} (the policy in force)", short(old.Hash))
	if ack != "" {
		msg = fmt.Sprintf("allow_auth_changes_from %s is not the policy in force; %s", ack, msg)
	}
	line := c.lines.end
	if n, ok := c.lines.at["reload"]; ok {
		line = n
	}
	es = append(es, &Error{File: c.File, Line: line, Path: "reload", Msg: msg})
	return es.sorted()
}
