package policy

import (
	"fmt"
	"strings"
)

// expand replaces ${NAME} and ${NAME:-default} in a string value with the environment's values: ${NAME} must be
// set (to anything, the empty string included); ${NAME:-default} uses default when NAME is unset or empty, as a
// shell does. $${ is a literal "${"; any other $ is literal. Errors name the variable, never a value: the
// expanded text may be a secret.
func expand(s string, lookup func(string) (string, bool)) (string, error) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		if i > 0 && s[i-1] == '$' { // "$${": an escaped, literal "${"
			b.WriteString(s[:i-1])
			b.WriteString("${")
			s = s[i+2:]
			continue
		}
		b.WriteString(s[:i])
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", fmt.Errorf("unterminated ${: close it with } (write $${ for a literal ${)")
		}
		ref := s[i+2 : i+end]
		s = s[i+end+1:]
		name, def, hasDef := strings.Cut(ref, ":-")
		if !validEnvName(name) {
			return "", fmt.Errorf("invalid environment variable name %q in ${...}: use letters, digits and _", name)
		}
		v, ok := lookup(name)
		switch {
		case hasDef && v == "":
			v = def
		case !ok:
			return "", fmt.Errorf("environment variable %s is not set (use ${%s:-default} for a default)", name, name)
		}
		b.WriteString(v)
	}
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		switch {
		case c == '_', 'A' <= c && c <= 'Z', 'a' <= c && c <= 'z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
