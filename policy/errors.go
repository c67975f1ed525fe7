package policy

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Error is one problem in a policy file, located by line and by the field path inside the document
// ("models[2].strategy", "backends[0].timeouts.first_byte"). Messages never contain a secret's value.
type Error struct {
	// File is the path of the policy file as it was given to the loader.
	File string
	// Line is the 1-based line of the offending key or value; 0 when the YAML parser could not tell.
	Line int
	// Path is the field's path in the document; empty for problems of the document as a whole (YAML syntax).
	Path string
	// Msg says what is wrong and, where it helps, what would be right.
	Msg string
}

// Error formats e as "FILE:LINE: path: message", the form editors and CI logs link to.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(e.Line))
	}
	b.WriteString(": ")
	if e.Path != "" {
		b.WriteString(e.Path)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem found in one policy file, sorted by line. Loading functions return it (as error)
// when a file is invalid; use errors.As to get at the individual problems.
type Errors []*Error

// Error returns one "FILE:LINE: path: message" line per problem.
func (es Errors) Error() string {
	lines := make([]string, len(es))
	for i, e := range es {
		lines[i] = e.Error()
	}
	return strings.Join(lines, "\n")
}

// sorted returns es ordered by line (stable, so problems on one line keep the order they were found in) without
// exact duplicates.
func (es Errors) sorted() Errors {
	out := slices.Clone(es)
	slices.SortStableFunc(out, func(a, b *Error) int { return a.Line - b.Line })
	return slices.CompactFunc(out, func(a, b *Error) bool { return *a == *b })
}

// report collects the problems of one file while it is decoded and validated. It knows the line of every path the
// file set, so validation can locate a problem by path alone.
type report struct {
	file   string
	fields map[string]field // every path the file set, with its line
	bad    []string         // paths with a decode error: validation says nothing more about them or below them
	errs   Errors
}

// field is what the decoder remembers about one path the file set.
type field struct {
	pattern string // the schema path: indices as "[]", map keys as ".*" (models[].strategy, regions.*.failover)
	line    int    // line of the key (or of the list item)
	null    bool   // the value was null: the field counts as not set
	empty   bool   // the value asks for nothing: null, "", [] or {}
}

func newReport(file string) *report {
	return &report{file: file, fields: make(map[string]field)}
}

// add records a problem at an explicit line and marks path as bad, so validation adds nothing about it.
func (r *report) add(line int, path, msg string) {
	r.errs = append(r.errs, &Error{File: r.file, Line: line, Path: path, Msg: msg})
	if path != "" {
		r.bad = append(r.bad, path)
	}
}

// errorf records a validation problem at path, located at the line the file set path (or its closest parent) on.
// It is silent when the decoder already reported path or one of its parents.
func (r *report) errorf(path, msg string) {
	for _, b := range r.bad {
		if within(path, b) {
			return
		}
	}
	r.errs = append(r.errs, &Error{File: r.file, Line: r.line(path), Path: path, Msg: msg})
}

// line returns the line of path, or of its closest parent the file set; 1 when the file set none of them (a
// required top-level section that is missing).
func (r *report) line(path string) int {
	for p := path; p != ""; p = parent(p) {
		if f, ok := r.fields[p]; ok {
			return f.line
		}
	}
	return 1
}

// set reports whether the file gave path a value (null does not count).
func (r *report) set(path string) bool {
	f, ok := r.fields[path]
	return ok && !f.null
}

var indexRE = regexp.MustCompile(`\[\d+\]`)

// badPattern reports whether the decoder reported a problem at a path of the schema pattern (indices as "[]").
func (r *report) badPattern(pattern string) bool {
	for _, b := range r.bad {
		if indexRE.ReplaceAllString(b, "[]") == pattern {
			return true
		}
	}
	return false
}

// parent returns the path one level up: "a.b[2].c" -> "a.b[2]" -> "a.b" -> "a" -> "".
func parent(p string) string {
	if strings.HasSuffix(p, "]") {
		if i := strings.LastIndexByte(p, '['); i >= 0 {
			return p[:i]
		}
	}
	if i := strings.LastIndexByte(p, '.'); i >= 0 {
		return p[:i]
	}
	return ""
}

// within reports whether path is p or lies below it.
func within(path, p string) bool {
	return path == p || strings.HasPrefix(path, p) && (path[len(p)] == '.' || path[len(p)] == '[')
}
