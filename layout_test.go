package switchyard

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/switchyard/switchyard"

// allowed is the import table of docs/design.md, "The import table": for each internal package, the internal
// packages it may import (directly, in non-test code). A package missing from the table may import nothing
// internal. The document gives the reason for each edge; TestLayoutTableIsTheDesign keeps the two equal.
var allowed = map[string][]string{
	"openai":    nil,
	"metrics":   nil,
	"cache":     {"metrics"},
	"routing":   {"cache", "metrics"},
	"admission": {"metrics"},
	// policy compiles the YAML into proxy.Snapshot, the type the request path reads; proxy reads it through a
	// one-method interface and never imports policy (docs/design.md, "Why policy imports proxy").
	"policy": {"proxy", "routing", "admission", "cache", "metrics"},
	"proxy":  {"openai", "routing", "admission", "cache", "metrics"},
	"sim":    {"openai"},
	"bench":  {"openai", "sim"},
}

// testAllowed lists extra internal imports that test code may use (docs/design.md, "The import table", its
// second table): gateway tests run real simulators in process, and the packages that share state through Redis
// test against a real redis-server found or started by internal/redistest (a test helper that imports nothing
// internal). sim and bench tests get nothing extra: they measure the wire, never gateway internals.
var testAllowed = map[string][]string{
	"proxy":     {"sim", "internal"},
	"policy":    {"sim", "internal"},
	"admission": {"internal"},
	"cache":     {"internal"},
	"routing":   {"internal"},
	// deploy has no code of its own: its tests check the dashboard and the Helm chart against a real gateway
	// (policy, proxy, routing and metrics wired as cmd/switchyard wires them, with sim engines) and the chart's
	// policy against the real parser. cmd cannot be imported, so the tests wire the gateway themselves.
	"deploy": {"metrics", "policy", "proxy", "routing", "sim"},
}

func TestLayout(t *testing.T) {
	out, err := exec.Command("go", "list", "-f",
		"{{.ImportPath}}|{{join .Imports \",\"}}|{{join .TestImports \",\"}}|{{join .XTestImports \",\"}}",
		"./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		parts := strings.Split(line, "|")
		if len(parts) != 4 {
			t.Fatalf("unexpected go list line %q", line)
		}
		pkg := rel(parts[0])
		top, _, _ := strings.Cut(pkg, "/")
		check := func(imports string, extra []string) {
			for _, imp := range strings.Split(imports, ",") {
				if !strings.HasPrefix(imp, module+"/") {
					continue
				}
				dep := rel(imp)
				depTop, _, _ := strings.Cut(dep, "/")
				if depTop == top {
					continue // a package's own subpackages
				}
				if depTop == "cmd" {
					t.Errorf("%s imports %s: nothing may import cmd", pkg, dep)
					continue
				}
				if top == "cmd" || top == "" {
					continue // the binary wires everything; the root holds only repository tests
				}
				if !slices.Contains(allowed[top], depTop) && !slices.Contains(extra, depTop) {
					t.Errorf("%s imports %s, which docs/design.md does not allow (\"The import table\")", pkg, dep)
				}
			}
		}
		check(parts[1], nil)
		check(parts[2]+","+parts[3], testAllowed[top])
	}
}

func rel(importPath string) string {
	if importPath == module {
		return ""
	}
	return strings.TrimPrefix(importPath, module+"/")
}

// designDoc is the design document whose import tables are allowed and testAllowed.
const designDoc = "docs/design.md"

// TestLayoutTableIsTheDesign: the import tables of docs/design.md are allowed and testAllowed, edge for edge,
// and every edge has its reason, so that the rules this test enforces are the ones the repository states.
func TestLayoutTableIsTheDesign(t *testing.T) {
	doc, err := os.ReadFile(designDoc)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string // the variable, as the marker before its table names it
		want map[string][]string
	}{
		{"allowed", allowed},
		{"testAllowed", testAllowed},
	} {
		got, err := parseImportTable(doc, tc.name)
		if err != nil {
			t.Errorf("%s: %v", designDoc, err)
			continue
		}
		for pkg, deps := range got {
			want, ok := tc.want[pkg]
			if !ok {
				t.Errorf("%s lists %s in the %s table; layout_test.go does not", designDoc, pkg, tc.name)
				continue
			}
			for _, d := range deps {
				if !slices.Contains(want, d) {
					t.Errorf("%s lets %s import %s (%s); layout_test.go does not", designDoc, pkg, d, tc.name)
				}
			}
			for _, d := range want {
				if !slices.Contains(deps, d) {
					t.Errorf("layout_test.go lets %s import %s (%s); %s does not", pkg, d, tc.name, designDoc)
				}
			}
		}
		for pkg := range tc.want {
			if _, ok := got[pkg]; !ok {
				t.Errorf("layout_test.go lists %s in %s; %s does not", pkg, tc.name, designDoc)
			}
		}
	}
}

// parseImportTable reads the Markdown table that follows the line "<!-- layout_test.go: name -->" in doc: a
// header, a separator, then one row per edge, "| `pkg` | `dep` | why |", or "| `pkg` | nothing | why |" for a
// package that imports nothing internal. It returns each package's imports; a package with none maps to nil.
func parseImportTable(doc []byte, name string) (map[string][]string, error) {
	marker := "<!-- layout_test.go: " + name + " -->"
	i := bytes.Index(doc, []byte(marker))
	if i < 0 {
		return nil, fmt.Errorf("no line %q before the table", marker)
	}
	sc := bufio.NewScanner(bytes.NewReader(doc[i+len(marker):]))
	sc.Scan() // the rest of the marker's line
	table := map[string][]string{}
	row := 0
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") {
			break
		}
		row++
		if row <= 2 { // the header and the separator
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			return nil, fmt.Errorf("%s table, row %q: want 3 cells (package, import, why)", name, line)
		}
		pkg, dep, why := strings.TrimSpace(cells[0]), strings.TrimSpace(cells[1]), strings.TrimSpace(cells[2])
		p, ok := backticked(pkg)
		if !ok {
			return nil, fmt.Errorf("%s table, row %q: the package must be in backticks", name, line)
		}
		if why == "" {
			return nil, fmt.Errorf("%s table: %s -> %s has no reason", name, pkg, dep)
		}
		if dep == "nothing" {
			if _, dup := table[p]; !dup {
				table[p] = nil
			}
			continue
		}
		d, ok := backticked(dep)
		if !ok {
			return nil, fmt.Errorf("%s table, row %q: the import must be in backticks, or nothing", name, line)
		}
		if slices.Contains(table[p], d) {
			return nil, fmt.Errorf("%s table: %s -> %s twice", name, p, d)
		}
		table[p] = append(table[p], d)
	}
	if row <= 2 {
		return nil, fmt.Errorf("no table after %q", marker)
	}
	return table, nil
}

func backticked(s string) (string, bool) {
	if len(s) < 3 || s[0] != '`' || s[len(s)-1] != '`' {
		return "", false
	}
	return s[1 : len(s)-1], true
}

// designCitation is how comments and documents cite a section of the design: the document's path, a comma,
// and the section's heading in double quotes.
var designCitation = regexp.MustCompile(`docs/design\.md, "([^"\n]*)("?)`)

// outsideDesign matches a citation of the design document that the team kept outside the repository, in capitals.
var outsideDesign = regexp.MustCompile(`\bDESIGN(\.md| section)`)

// TestDesignSectionsCited: every section of docs/design.md that a file of the repository cites by name exists,
// and no file cites the design document that lived outside the repository.
func TestDesignSectionsCited(t *testing.T) {
	doc, err := os.ReadFile(designDoc)
	if err != nil {
		t.Fatal(err)
	}
	sections := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if h := strings.TrimLeft(line, "#"); len(h) < len(line) && strings.HasPrefix(h, " ") {
			sections[strings.TrimSpace(h)] = true
		}
	}
	err = filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == ".git" {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".md", ".yaml", ".yml", ".sh":
		default:
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if outsideDesign.Match(data) {
			t.Errorf("%s cites the design document that lived outside the repository: cite %s and its section", path, designDoc)
		}
		for _, m := range designCitation.FindAllSubmatch(data, -1) {
			switch {
			case len(m[2]) == 0:
				t.Errorf("%s: the citation %q is cut by a line break: keep a section name on one line", path, m[0])
			case !sections[string(m[1])]:
				t.Errorf("%s cites %s, %q: no such section", path, designDoc, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
