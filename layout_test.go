package switchyard

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/switchyard/switchyard"

// allowed is DESIGN.md section 2's dependency table: for each internal package, the internal packages it may
// import (directly, in non-test code). A package missing from the table may import nothing internal.
var allowed = map[string][]string{
	"openai":    nil,
	"metrics":   nil,
	"cache":     {"metrics"},
	"routing":   {"cache", "metrics"},
	"admission": {"metrics"},
	// policy compiles the YAML into proxy.Snapshot, the type the request path reads; proxy reads it through a
	// one-method interface and never imports policy.
	"policy": {"proxy", "routing", "admission", "cache", "metrics"},
	"proxy":  {"openai", "routing", "admission", "cache", "metrics"},
	"sim":    {"openai"},
	"bench":  {"openai", "sim"},
}

// testAllowed lists extra internal imports that test code may use: gateway tests run real simulators in process,
// and the packages that share state through Redis test against a real redis-server found or started by
// internal/redistest (a test helper that imports nothing internal). sim and bench tests get nothing extra: they
// measure the wire, never gateway internals.
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
					t.Errorf("%s imports %s, which DESIGN.md section 2 does not allow", pkg, dep)
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
