package bench

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// FileError is one problem in a YAML file, printed as "FILE:LINE: message" (LINE is 1-based; 0 when unknown).
type FileError struct {
	File string
	Line int
	Msg  string
}

// Error is "FILE:LINE: message", or "FILE: message" without a line.
func (e *FileError) Error() string {
	if e.Line <= 0 {
		return fmt.Sprintf("%s: %s", e.File, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
}

// FileErrors is every problem found in one file, in file order. Its Error is one "FILE:LINE: message" per line.
type FileErrors []*FileError

// Error is one "FILE:LINE: message" per line.
func (es FileErrors) Error() string {
	var b strings.Builder
	for i, e := range es {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// fieldErrors collects semantic errors by dotted path ("prefix.share", "priorities[2].weight"); they are turned into
// FileErrors with the line of the closest node that exists in the file.
type fieldErrors []fieldError

type fieldError struct{ path, msg string }

func (fe *fieldErrors) add(path, format string, args ...any) {
	*fe = append(*fe, fieldError{path, path + ": " + fmt.Sprintf(format, args...)})
}

var (
	yamlLineErr = regexp.MustCompile(`^line (\d+): (.*)$`)
	yamlSyntax  = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)
)

// decodeStrict decodes data into v with unknown fields as errors, and returns the document node for line lookups.
// Every yaml.v3 error is rewritten as FileErrors.
func decodeStrict(file string, data []byte, v any) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, FileErrors{{File: file, Line: 1, Msg: "empty file"}}
		}
		return nil, yamlErrors(file, err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, yamlErrors(file, err)
	}
	return &doc, nil
}

func yamlErrors(file string, err error) error {
	var te *yaml.TypeError
	if errors.As(err, &te) {
		var out FileErrors
		for _, m := range te.Errors {
			out = append(out, lineError(file, m))
		}
		return out
	}
	return FileErrors{lineError(file, err.Error())}
}

func lineError(file, msg string) *FileError {
	if m := yamlSyntax.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		return &FileError{File: file, Line: n, Msg: m[2]}
	}
	if m := yamlLineErr.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.Atoi(m[1])
		return &FileError{File: file, Line: n, Msg: m[2]}
	}
	return &FileError{File: file, Msg: strings.TrimPrefix(msg, "yaml: ")}
}

// resolve turns semantic errors into FileErrors with lines from doc.
func (fe fieldErrors) resolve(file string, doc *yaml.Node) error {
	if len(fe) == 0 {
		return nil
	}
	out := make(FileErrors, 0, len(fe))
	for _, e := range fe {
		out = append(out, &FileError{File: file, Line: lineOf(doc, e.path), Msg: e.msg})
	}
	return out
}

var pathPart = regexp.MustCompile(`([^.\[\]]+)|\[(\d+)\]`)

// lineOf returns the line of the node at a dotted path such as "columns[1].strategy", or of its deepest existing
// ancestor when the path does not exist in the file (a missing field is reported where its parent is).
func lineOf(doc *yaml.Node, path string) int {
	if doc == nil {
		return 0
	}
	n := doc
	if n.Kind == yaml.DocumentNode && len(n.Content) > 0 {
		n = n.Content[0]
	}
	line := n.Line
	for _, m := range pathPart.FindAllStringSubmatch(path, -1) {
		switch {
		case m[1] != "" && n.Kind == yaml.MappingNode:
			found := false
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == m[1] {
					line, n, found = n.Content[i].Line, n.Content[i+1], true
					break
				}
			}
			if !found {
				return line
			}
		case m[2] != "" && n.Kind == yaml.SequenceNode:
			i, _ := strconv.Atoi(m[2])
			if i >= len(n.Content) {
				return line
			}
			n = n.Content[i]
			line = n.Line
		default:
			return line
		}
	}
	return line
}

// baseName is a file's name without directory and extension.
func baseName(path string) string {
	path = path[strings.LastIndexByte(path, '/')+1:]
	if i := strings.LastIndexByte(path, '.'); i > 0 {
		path = path[:i]
	}
	return path
}
