package policy

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// Decoding limits. The decoder walks the schema, not the document, so unknown subtrees are never visited; these
// bound what aliases can multiply (a "billion laughs" file) and how deep merge keys and alias cycles can go.
const (
	maxValues = 1 << 18 // values decoded per file, aliases expanded
	maxDepth  = 32      // nesting of values and merge keys
	maxFile   = 16 << 20
)

// decoder fills a Config from a yaml.Node tree, strictly: an unknown field, a value of the wrong kind or a
// duplicate key is an error naming its line and path. It records every path the file sets (report.fields), which
// defaults use to tell "absent" from "zero" and the supported table uses to find fields that are not supported
// yet. It expands ${ENV} in string values only.
type decoder struct {
	*report
	lookup func(string) (string, bool)
	values int
	abort  bool // the document is too large to go on: decoding stops and validation does not run
}

var durationType = reflect.TypeFor[time.Duration]()

// nodeDecoder is implemented by schema types with a YAML form of their own.
type nodeDecoder interface {
	decodeNode(d *decoder, n *yaml.Node, path string)
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// decodeFile parses data as a single YAML document and decodes it into c. Syntax errors stop there; other
// problems are collected in d.report and decoding goes on, so that one run reports them all.
func (d *decoder) decodeFile(data []byte, c *Config) {
	if len(data) > maxFile {
		d.add(0, "", fmt.Sprintf("file is %d bytes; a policy file may have at most %d", len(data), maxFile))
		return
	}
	if line, msg, ok := badText(data); ok {
		d.add(line, "", msg)
		return
	}
	doc, err := parseYAML(data)
	if err != nil {
		d.syntax(err)
		return
	}
	if doc == nil || len(doc.Content) == 0 {
		return // an empty file: validation reports what is missing
	}
	d.value(doc.Content[0], reflect.ValueOf(c).Elem(), "", "", 0)
}

// parseYAML returns the file's only document (nil for an empty file). A second document is an error: an operator
// who pastes two files together would otherwise run on half of them.
func parseYAML(data []byte) (doc *yaml.Node, err error) {
	defer func() {
		// yaml.v3 reports its own failures by panicking and recovering; a panic that escapes it must not take
		// the gateway (or a reload) down.
		if r := recover(); r != nil {
			doc, err = nil, fmt.Errorf("yaml: %v", r)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var first yaml.Node
	if err := dec.Decode(&first); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, err
	}
	var second yaml.Node
	switch err := dec.Decode(&second); {
	case errors.Is(err, io.EOF):
		return &first, nil
	case err != nil:
		return nil, err
	default:
		return nil, &secondDocument{line: second.Line}
	}
}

type secondDocument struct{ line int }

func (e *secondDocument) Error() string { return "second document" }

func (d *decoder) syntax(err error) {
	var sd *secondDocument
	if errors.As(err, &sd) {
		d.add(sd.line, "", "a policy file holds one YAML document; remove the second one (starting with ---)")
		return
	}
	msg := err.Error()
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		line, _ := strconv.Atoi(m[1])
		d.add(line, "", "YAML syntax: "+m[2])
		return
	}
	d.add(0, "", "YAML syntax: "+strings.TrimPrefix(msg, "yaml: "))
}

// badText finds what the YAML reader rejects without a line number (invalid UTF-8, control characters) and
// locates it.
func badText(data []byte) (line int, msg string, ok bool) {
	line = 1
	for i := 0; i < len(data); {
		r, size := utf8.DecodeRune(data[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return line, "invalid UTF-8: a policy file must be UTF-8 text", true
		case r == '\n':
			line++
		case r < 0x20 && r != '\t' && r != '\r', r == 0x7f, r == 0xfffe, r == 0xffff:
			return line, fmt.Sprintf("control character %U is not allowed", r), true
		}
		i += size
	}
	return 0, "", false
}

// resolve follows aliases; nil when the alias chain is broken.
func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode; i++ {
		if i > maxDepth {
			return nil
		}
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		if isNull(n) {
			return "null"
		}
		return fmt.Sprintf("%q", n.Value)
	}
	return "an unexpected YAML node"
}

// value decodes n into v, which lives at path (pattern is the schema path). Problems go to the report; v keeps
// its zero value where n could not be used.
func (d *decoder) value(n *yaml.Node, v reflect.Value, path, pattern string, depth int) {
	n = resolve(n)
	if n == nil {
		d.add(0, path, "broken alias")
		return
	}
	if depth > maxDepth {
		d.add(n.Line, path, "nested too deeply (an alias that contains itself?)")
		return
	}
	if d.abort || !d.count(n, path, 1) {
		return
	}
	if isNull(n) {
		return // null leaves the zero value, and the field counts as absent
	}
	if v.CanAddr() {
		if nd, ok := v.Addr().Interface().(nodeDecoder); ok {
			nd.decodeNode(d, n, path)
			return
		}
	}
	if v.Type() == durationType {
		d.duration(n, v, path)
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		d.structure(n, v, path, pattern, depth)
	case reflect.Slice:
		d.list(n, v, path, pattern, depth)
	case reflect.Map:
		d.dict(n, v, path, pattern, depth)
	case reflect.String:
		if s, ok := d.str(n, path); ok {
			v.SetString(s)
		}
	case reflect.Int:
		if n.Kind != yaml.ScalarNode {
			d.add(n.Line, path, "expected an integer, got "+kindName(n))
			return
		}
		i, err := strconv.ParseInt(strings.ReplaceAll(n.Value, "_", ""), 10, 0)
		if err != nil {
			d.add(n.Line, path, fmt.Sprintf("expected an integer, got %q", n.Value))
			return
		}
		v.SetInt(i)
	case reflect.Float64:
		if n.Kind != yaml.ScalarNode {
			d.add(n.Line, path, "expected a number, got "+kindName(n))
			return
		}
		f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
		if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
			d.add(n.Line, path, fmt.Sprintf("expected a finite number, got %q", n.Value))
			return
		}
		v.SetFloat(f)
	case reflect.Pointer:
		// An optional field whose zero value is not its default (a *bool that defaults to true): a present value
		// is decoded into a new element; an absent one stays nil.
		if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
			v.SetZero()
			return
		}
		e := reflect.New(v.Type().Elem())
		d.value(n, e.Elem(), path, pattern, depth)
		v.Set(e)
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" {
			d.add(n.Line, path, "expected true or false, got "+kindName(n))
			return
		}
		v.SetBool(strings.EqualFold(n.Value, "true"))
	default:
		panic("policy: no decoder for " + v.Type().String()) // a schema type this file does not handle
	}
}

// count charges k values to the file's budget; false (and the load fails) when it is exhausted.
func (d *decoder) count(n *yaml.Node, path string, k int) bool {
	if d.values += k; d.values > maxValues {
		d.add(n.Line, path, fmt.Sprintf("too many values: at most %d, aliases expanded", maxValues))
		d.abort = true
		return false
	}
	return true
}

// str decodes a scalar as a string, expanding ${ENV}. Its errors never quote the value: it may be a secret.
func (d *decoder) str(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		d.add(n.Line, path, "expected a string, got "+kindName(n))
		return "", false
	}
	s, err := expand(n.Value, d.lookup)
	if err != nil {
		d.add(n.Line, path, err.Error())
		return "", false
	}
	return s, true
}

func (d *decoder) duration(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode {
		d.add(n.Line, path, "expected a duration such as 500ms or 2s, got "+kindName(n))
		return
	}
	dur, err := time.ParseDuration(n.Value)
	if err != nil {
		d.add(n.Line, path, fmt.Sprintf("expected a duration with a unit (500ms, 2s, 1m), got %q", n.Value))
		return
	}
	v.SetInt(int64(dur))
}

// pair is one key and value of a mapping, merge keys already applied.
type pair struct{ key, value *yaml.Node }

// pairs returns the mapping's entries with "<<" merge keys expanded (the mapping's own keys win over merged
// ones; among merged mappings the first wins), reporting duplicate keys and keys that are not strings.
func (d *decoder) pairs(n *yaml.Node, path string, depth int) []pair {
	if depth > maxDepth {
		d.add(n.Line, path, "merge keys nested too deeply")
		return nil
	}
	var own, merged []pair
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := resolve(n.Content[i]), n.Content[i+1]
		if k == nil || k.Kind != yaml.ScalarNode {
			d.add(n.Content[i].Line, path, "a key must be a string")
			continue
		}
		if k.Value == "<<" && (k.Tag == "" || k.Tag == "!" || k.ShortTag() == "!!merge") {
			for _, m := range d.mergeSources(val, path) {
				if d.abort || !d.count(m, path, len(m.Content)/2) {
					return nil // a merge that multiplies keys is an alias bomb too
				}
				merged = append(merged, d.pairs(m, path, depth+1)...)
			}
			continue
		}
		if first, dup := seen[k.Value]; dup {
			d.add(k.Line, join(path, k.Value), fmt.Sprintf("duplicate key (first set on line %d)", first))
			continue
		}
		seen[k.Value] = k.Line
		own = append(own, pair{k, val})
	}
	for _, p := range merged {
		if _, ok := seen[p.key.Value]; !ok {
			seen[p.key.Value] = p.key.Line
			own = append(own, p)
		}
	}
	return own
}

// mergeSources returns the mappings a "<<" key merges: one mapping, or a list of them.
func (d *decoder) mergeSources(v *yaml.Node, path string) []*yaml.Node {
	v = resolve(v)
	switch {
	case v == nil:
	case v.Kind == yaml.MappingNode:
		return []*yaml.Node{v}
	case v.Kind == yaml.SequenceNode:
		var out []*yaml.Node
		for _, e := range v.Content {
			if e = resolve(e); e != nil && e.Kind == yaml.MappingNode {
				out = append(out, e)
			} else {
				d.add(v.Line, path, "<< merges mappings only")
				return nil
			}
		}
		return out
	}
	d.add(v.Line, path, "<< merges mappings only")
	return nil
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// structure decodes a mapping into a struct by the fields' yaml tags.
func (d *decoder) structure(n *yaml.Node, v reflect.Value, path, pattern string, depth int) {
	if n.Kind != yaml.MappingNode {
		d.add(n.Line, path, "expected a mapping of fields, got "+kindName(n))
		return
	}
	t := v.Type()
	for _, p := range d.pairs(n, path, depth) {
		if d.abort {
			return
		}
		name := p.key.Value
		if path == "" && strings.HasPrefix(name, "x-") {
			continue // an extension field, as in Compose files: a place for anchors, ignored
		}
		fp, fpat := join(path, name), join(pattern, name)
		i := fieldIndex(t, name)
		if i < 0 {
			msg := "unknown field"
			if s := suggest(name, fieldNames(t)); s != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", s)
			}
			d.add(p.key.Line, fp, msg)
			continue
		}
		val := resolve(p.value)
		d.value(p.value, v.Field(i), fp, fpat, depth+1)
		d.record(fp, fpat, p.key.Line, val, v.Field(i))
	}
}

// record remembers that the file set path, on line, to val (decoded into v).
func (d *decoder) record(path, pattern string, line int, val *yaml.Node, v reflect.Value) {
	f := field{pattern: pattern, line: line}
	if val == nil || isNull(val) {
		f.null, f.empty = true, true
	} else {
		switch val.Kind {
		case yaml.SequenceNode, yaml.MappingNode:
			f.empty = len(val.Content) == 0
		case yaml.ScalarNode:
			// false is not empty: prefix_affinity: false asks to turn off what a strategy does by itself.
			f.empty = v.Kind() == reflect.String && v.Len() == 0
		}
	}
	d.fields[path] = f
}

func (d *decoder) list(n *yaml.Node, v reflect.Value, path, pattern string, depth int) {
	if n.Kind != yaml.SequenceNode {
		d.add(n.Line, path, "expected a list, got "+kindName(n))
		return
	}
	if !d.count(n, path, len(n.Content)) {
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, e := range n.Content {
		if d.abort {
			return
		}
		ep, epat := fmt.Sprintf("%s[%d]", path, i), pattern+"[]"
		d.value(e, s.Index(i), ep, epat, depth+1)
		d.record(ep, epat, e.Line, resolve(e), s.Index(i))
	}
	v.Set(s)
}

// dict decodes a mapping with string keys (region names) into a map.
func (d *decoder) dict(n *yaml.Node, v reflect.Value, path, pattern string, depth int) {
	if n.Kind != yaml.MappingNode {
		d.add(n.Line, path, "expected a mapping, got "+kindName(n))
		return
	}
	m := reflect.MakeMap(v.Type())
	for _, p := range d.pairs(n, path, depth) {
		if d.abort {
			return
		}
		kp, kpat := join(path, p.key.Value), join(pattern, "*")
		e := reflect.New(v.Type().Elem()).Elem()
		d.value(p.value, e, kp, kpat, depth+1)
		d.record(kp, kpat, p.key.Line, resolve(p.value), e)
		m.SetMapIndex(reflect.ValueOf(p.key.Value), e)
	}
	v.Set(m)
}

// fieldIndex returns the index of the field of t that the YAML key name sets, or -1. Only tagged fields are
// settable: a field without a yaml tag (state that validation fills in, such as a backend's loaded CA) must not
// be reached by an empty key (the fuzzer found `- &00: 0` doing so).
func fieldIndex(t reflect.Type, name string) int {
	if name == "" {
		return -1
	}
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag == name && tag != "-" && t.Field(i).IsExported() {
			return i
		}
	}
	return -1
}

func fieldNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		if tag, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ","); tag != "" && tag != "-" {
			names = append(names, tag)
		}
	}
	return names
}

// suggest returns the candidate closest to s when it is close enough to be a typo.
func suggest(s string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		if dist := editDistance(strings.ToLower(s), c); dist < bestDist {
			best, bestDist = c, dist
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 64
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// decodeNode reads a size in bytes: an integer, or a number with a unit.
func (b *ByteSize) decodeNode(d *decoder, n *yaml.Node, path string) {
	if n.Kind != yaml.ScalarNode {
		d.add(n.Line, path, "expected a size such as 32MiB, got "+kindName(n))
		return
	}
	size, ok := parseSize(n.Value)
	if !ok {
		d.add(n.Line, path, fmt.Sprintf("expected a size in bytes, or with a unit (512KiB, 32MiB, 1GiB), got %q", n.Value))
		return
	}
	*b = ByteSize(size)
}

func parseSize(s string) (int64, bool) {
	s = strings.TrimSpace(strings.ReplaceAll(s, "_", ""))
	num := strings.TrimRightFunc(s, func(r rune) bool { return r >= 'A' && r <= 'z' })
	unit := strings.TrimSpace(s[len(num):])
	mult := map[string]int64{"": 1, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[unit]
	if mult == 0 {
		return 0, false
	}
	v, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || v > math.MaxInt64/mult || v < math.MinInt64/mult {
		return 0, false
	}
	return v * mult, true
}

// decodeNode reads an API key: ${ENV} (the plaintext comes from the environment and is hashed at once, so it is
// kept nowhere), "sha256:<hex>", or a mapping {sha256: <hex>}. A plaintext key written in the file is refused,
// and so is ${ENV:-default} with a default, which is one: policy files end up in repositories and ConfigMaps.
func (k *KeyHash) decodeNode(d *decoder, n *yaml.Node, path string) {
	const form = "must be ${ENV_VAR} or sha256:<64 hex digits> ({sha256: <hex>}), never a plaintext key"
	var hexText string
	switch {
	case n.Kind == yaml.MappingNode:
		ps := d.pairs(n, path, 0)
		if len(ps) != 1 || ps[0].key.Value != "sha256" || resolve(ps[0].value) == nil || resolve(ps[0].value).Kind != yaml.ScalarNode {
			d.add(n.Line, path, form)
			return
		}
		hexText = resolve(ps[0].value).Value
	case n.Kind != yaml.ScalarNode:
		d.add(n.Line, path, form)
		return
	case strings.HasPrefix(n.Value, "sha256:"):
		hexText = strings.TrimSpace(strings.TrimPrefix(n.Value, "sha256:"))
	case isEnvRef(n.Value):
		if _, def, _ := strings.Cut(n.Value[2:len(n.Value)-1], ":-"); def != "" {
			d.add(n.Line, path, "a default in ${VAR:-default} would write the key in the file in plaintext: give ${VAR} alone, or sha256:<hex>")
			return
		}
		s, err := expand(n.Value, d.lookup)
		if err != nil {
			d.add(n.Line, path, err.Error())
			return
		}
		if s == "" {
			d.add(n.Line, path, "the environment variable holds an empty key")
			return
		}
		*k = sha256.Sum256([]byte(s))
		return
	default:
		d.add(n.Line, path, form)
		return
	}
	raw, err := hex.DecodeString(hexText)
	if err != nil || len(raw) != sha256.Size {
		d.add(n.Line, path, "sha256 must be 64 hex digits (the SHA-256 of the key, e.g. from: printf %s \"$KEY\" | sha256sum)")
		return
	}
	copy(k[:], raw)
}

// isEnvRef reports whether s is exactly one ${NAME} or ${NAME:-default} reference.
func isEnvRef(s string) bool {
	return strings.HasPrefix(s, "${") && strings.HasSuffix(s, "}") && strings.Count(s, "${") == 1 &&
		strings.IndexByte(s, '}') == len(s)-1
}
