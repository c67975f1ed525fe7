package policy

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/routing"
)

// FuzzParse feeds arbitrary bytes to the loader: it must never panic, an invalid file must come back as Errors
// sorted by line, each naming the file, and a valid one must compile.
func FuzzParse(f *testing.F) {
	for _, pattern := range []string{"testdata/valid/*.yaml", "testdata/invalid/*.yaml", "../config.yaml"} {
		files, _ := filepath.Glob(pattern)
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte("backends: &a [*a]\n"))
	f.Add([]byte("x: &a {<<: *a}\n"))
	f.Add([]byte("\xff\xfe"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("fuzz.yaml", data)
		if err != nil {
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("error %T is not a non-empty Errors: %v", err, err)
			}
			if !slices.IsSortedFunc(es, func(a, b *Error) int { return a.Line - b.Line }) {
				t.Fatalf("errors not sorted by line:\n%v", err)
			}
			for _, e := range es {
				if !strings.HasPrefix(e.Error(), "fuzz.yaml") || e.Msg == "" {
					t.Fatalf("malformed error %q", e.Error())
				}
			}
			return
		}
		s, err := c.Compile(routing.NewRegistry(), nil, nil)
		if err != nil {
			t.Fatalf("a valid file does not compile: %v", err)
		}
		if len(s.Models) != len(c.Models) || len(s.Backends) != len(c.Backends) {
			t.Fatalf("snapshot does not match config")
		}
	})
}
