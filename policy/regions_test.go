package policy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/proxy"
	"github.com/switchyard/switchyard/routing"
)

// threeRegions is a policy with backends in us-east, eu-west and ap-south, all serving m, and a place (#regions,
// #model) for the settings under test.
const threeRegions = `region: us-east
backends:
  - {name: use-1, url: 'http://h:1', models: [m]}
  - {name: euw-1, url: 'http://h:2', region: eu-west, models: [m]}
  - {name: aps-1, url: 'http://h:3', region: ap-south, models: [m]}
models:
  - name: m
    strategy: round_robin
    #model
#regions
auth: none
`

func compileRegions(t *testing.T, model, regions string, prev *proxy.Snapshot) *proxy.Snapshot {
	t.Helper()
	src := strings.NewReplacer("#model", model, "#regions", regions).Replace(threeRegions)
	c, err := Parse("f.yaml", []byte(src))
	if err != nil {
		t.Fatalf("%s\n%v", src, err)
	}
	s, err := c.Compile(routing.NewRegistry(), prev, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func targetNames(m *proxy.Model) []string {
	var names []string
	for _, t := range m.Targets {
		names = append(names, t.Backend.Name())
	}
	return names
}

func TestCompileRegions(t *testing.T) {
	for _, tc := range []struct {
		name, model, regions string
		want                 []string // compiled targets
		downLocal            string   // the backend picked with use-1 unhealthy
	}{
		{"no entry for the gateway's region: every region", "", "", []string{"use-1", "euw-1", "aps-1"}, ""},
		{"the failover order is where traffic may go", "", "regions: {us-east: {failover: [eu-west]}}",
			[]string{"use-1", "euw-1"}, "euw-1"},
		{"the failover order, not the file's", "", "regions: {us-east: {failover: [ap-south, eu-west]}}",
			[]string{"use-1", "euw-1", "aps-1"}, "aps-1"},
		{"an empty failover keeps traffic local", "", "regions: {us-east: {failover: []}}", []string{"use-1"}, ""},
		{"another region's entry is not this gateway's", "", "regions: {eu-west: {failover: [us-east]}}",
			[]string{"use-1", "euw-1", "aps-1"}, ""},
		{"allowed_regions", "allowed_regions: [eu-west, ap-south]", "", []string{"euw-1", "aps-1"}, ""},
		{"allowed_regions and the failover order", "allowed_regions: [us-east, ap-south]",
			"regions: {us-east: {failover: [eu-west, ap-south]}}", []string{"use-1", "aps-1"}, "aps-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := compileRegions(t, tc.model, tc.regions, nil)
			m := s.Models["m"]
			if got := targetNames(m); !slices.Equal(got, tc.want) {
				t.Fatalf("targets %v, want %v", got, tc.want)
			}
			if _, ok := m.Strategy.(*routing.Regional); !ok {
				t.Fatalf("strategy %T, want region tiers", m.Strategy)
			}
			if tc.downLocal == "" {
				return
			}
			m.Targets[0].Backend.SetHealthy(false)
			for range 10 {
				got, err := m.Strategy.Pick(&routing.Request{Model: "m"}, m.Targets)
				if err != nil || got.Backend.Name() != tc.downLocal {
					t.Fatalf("with use-1 down the pick is %v (%v), want %s", got.Backend, err, tc.downLocal)
				}
			}
		})
	}
}

// TestReloadKeepsRegionState: the compiled strategy takes over the previous snapshot's failover state.
func TestReloadKeepsRegionState(t *testing.T) {
	const regions = "regions: {us-east: {failover: [eu-west]}}"
	first := compileRegions(t, "", regions, nil)
	m := first.Models["m"]
	m.Targets[0].Backend.SetHealthy(false)
	if _, err := m.Strategy.Pick(&routing.Request{Model: "m"}, m.Targets); err != nil {
		t.Fatal(err)
	}
	unavailable := func(s *proxy.Snapshot) bool {
		return s.Models["m"].Strategy.(*routing.Regional).Status()[0].Unavailable
	}
	if !unavailable(first) {
		t.Fatal("the pick did not record us-east as unavailable")
	}
	if !unavailable(compileRegions(t, "retries: 1", regions, first)) {
		t.Error("a reload forgot that us-east is unavailable")
	}
	if unavailable(compileRegions(t, "", regions, nil)) {
		t.Error("a first load starts with us-east unavailable")
	}
}

func TestFailoverTooLong(t *testing.T) {
	var b strings.Builder
	b.WriteString("region: r0\nbackends:\n")
	var fo []string
	for i := range routing.MaxFailover + 2 {
		fmt.Fprintf(&b, "  - {name: b%d, url: 'http://h:%d', region: r%d, models: [m]}\n", i, i+1, i)
		if i > 0 {
			fo = append(fo, fmt.Sprint("r", i))
		}
	}
	fmt.Fprintf(&b, "models: [{name: m}]\nregions:\n  r0: {failover: [%s]}\nauth: none\n", strings.Join(fo, ", "))
	_, err := Parse("f.yaml", []byte(b.String()))
	want := fmt.Sprintf("f.yaml:%d: regions.r0.failover: %d regions: at most %d", routing.MaxFailover+7, routing.MaxFailover+1, routing.MaxFailover)
	if err == nil || err.Error() != want {
		t.Fatalf("err = %v, want %s", err, want)
	}
}
