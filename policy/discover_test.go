package policy

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/switchyard/switchyard/proxy"
	"github.com/switchyard/switchyard/routing"
)

// fakeResolver answers from maps the test changes; a name it does not hold is NXDOMAIN, and err, when set, is
// every lookup's failure.
type fakeResolver struct {
	mu    sync.Mutex
	hosts map[string][]string
	srv   map[string][]*net.SRV
	err   error
	calls int
}

var _ Resolver = (*fakeResolver)(nil)

func (f *fakeResolver) LookupHost(_ context.Context, host string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	a, ok := f.hosts[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return slices.Clone(a), nil
}

func (f *fakeResolver) LookupSRV(_ context.Context, _, _, name string) (string, []*net.SRV, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.err != nil {
		return "", nil, f.err
	}
	s, ok := f.srv[name]
	if !ok {
		return "", nil, &net.DNSError{Err: "no such host", Name: name, IsNotFound: true}
	}
	return "", s, nil
}

func (f *fakeResolver) set(host string, addrs ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.hosts == nil {
		f.hosts = map[string][]string{}
	}
	if addrs == nil {
		delete(f.hosts, host)
	} else {
		f.hosts[host] = addrs
	}
}

func (f *fakeResolver) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeResolver) lookups() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

const discoverPolicy = `auth: none
backends:
  - {name: static, url: 'http://127.0.0.1:7001', models: [m]}
  - name: vllm
    discover: {dns: vllm.svc, port: 8000}
    models: [m]
    max_concurrency: 4
models:
  - {name: m, strategy: round_robin}
  - name: only-vllm
    targets: [{backend: vllm, model: m}]
`

func backendNames(s *proxy.Snapshot) []string {
	var names []string
	for _, b := range s.Backends {
		names = append(names, b.Name())
	}
	slices.Sort(names)
	return names
}

func sortedTargets(m *proxy.Model) []string { return slices.Sorted(slices.Values(targetNames(m))) }

// TestDiscoverExpandsTemplates: a template becomes one backend per address, named after it, with its fields and
// the address's URL; models that name it (by targets or by its models) get every instance. Without addresses it
// stands for no backend, and a model it alone served has no target.
func TestDiscoverExpandsTemplates(t *testing.T) {
	c, err := Parse("d.yaml", []byte(discoverPolicy))
	if err != nil {
		t.Fatal(err)
	}
	if d := c.Backends[1].Discover; d.Type != DiscoverA || d.Interval != 10*time.Second {
		t.Errorf("discover defaults: %+v", d)
	}
	s, err := c.compile(routing.NewRegistry(), nil, nil, map[string][]string{"vllm": {"10.0.0.1:8000", "[fd00::1]:8000"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"static", "vllm-10.0.0.1:8000", "vllm-[fd00::1]:8000"}
	if got := backendNames(s); !slices.Equal(got, want) {
		t.Fatalf("backends %v, want %v", got, want)
	}
	for _, b := range s.Backends {
		cfg := b.Config()
		switch cfg.Name {
		case "vllm-10.0.0.1:8000":
			if cfg.URL != "http://10.0.0.1:8000" || cfg.MaxConcurrency != 4 {
				t.Errorf("%s: url %s, max_concurrency %d", cfg.Name, cfg.URL, cfg.MaxConcurrency)
			}
		case "vllm-[fd00::1]:8000":
			if cfg.URL != "http://[fd00::1]:8000" {
				t.Errorf("%s: url %s", cfg.Name, cfg.URL)
			}
		}
	}
	if got := sortedTargets(s.Models["m"]); !slices.Equal(got, want) {
		t.Errorf("m's targets %v, want %v", got, want)
	}
	if got := sortedTargets(s.Models["only-vllm"]); !slices.Equal(got, want[1:]) {
		t.Errorf("only-vllm's targets %v, want %v", got, want[1:])
	}

	s, err = c.Compile(routing.NewRegistry(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := backendNames(s); !slices.Equal(got, []string{"static"}) {
		t.Errorf("without addresses: backends %v", got)
	}
	if n := len(s.Models["only-vllm"].Targets); n != 0 {
		t.Errorf("without addresses: only-vllm has %d targets", n)
	}
}

func TestLookup(t *testing.T) {
	timeout := &net.DNSError{Err: "i/o timeout", Name: "vllm.svc", IsTimeout: true}
	res := &fakeResolver{
		hosts: map[string][]string{
			"vllm.svc":   {"10.0.0.2", "10.0.0.1", "10.0.0.2"},
			"pod-a.svc":  {"10.0.1.1"},
			"pod-b.svc.": {"unused"}, // SRV targets are looked up without their final dot
			"pod-b.svc":  {"10.0.1.2", "fd00::2"},
		},
		srv: map[string][]*net.SRV{
			"_http._tcp.vllm.svc": {
				{Target: "pod-a.svc.", Port: 8000}, {Target: "pod-b.svc.", Port: 8001},
				{Target: "10.0.1.3", Port: 8002}, {Target: "gone.svc.", Port: 8003},
			},
		},
	}
	for _, tc := range []struct {
		name    string
		d       Discover
		err     error
		want    []string
		wantErr bool
	}{
		{"a: sorted, each once, with the port", Discover{DNS: "vllm.svc", Type: DiscoverA, Port: 8000}, nil,
			[]string{"10.0.0.1:8000", "10.0.0.2:8000"}, false},
		{"srv: each target's addresses with its port", Discover{DNS: "_http._tcp.vllm.svc", Type: DiscoverSRV}, nil,
			[]string{"10.0.1.1:8000", "10.0.1.2:8001", "10.0.1.3:8002", "[fd00::2]:8001"}, false},
		{"nxdomain is an empty answer", Discover{DNS: "none.svc", Type: DiscoverA, Port: 1}, nil, nil, false},
		{"a failure is an error", Discover{DNS: "vllm.svc", Type: DiscoverA, Port: 1}, timeout, nil, true},
		{"srv failure", Discover{DNS: "_http._tcp.vllm.svc", Type: DiscoverSRV}, timeout, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res.fail(tc.err)
			tc.d.Interval = time.Second
			got, err := lookup(context.Background(), res, tc.d)
			if (err != nil) != tc.wantErr || !slices.Equal(got, tc.want) {
				t.Errorf("lookup: %v, %v; want %v (error %v)", got, err, tc.want, tc.wantErr)
			}
			if err != nil && !errors.Is(err, timeout) {
				t.Errorf("error %v does not wrap the resolver's", err)
			}
		})
	}
}

// discoverFixture is a watcher on discoverPolicy (interval 10 s) with a fake resolver, its discovery loop
// running; call it inside a synctest bubble.
func discoverFixture(t *testing.T, res *fakeResolver) (*Watcher, *syncBuffer, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(discoverPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	w, err := NewWatcher(path, routing.NewRegistry(), nil, slog.New(slog.NewTextHandler(logs, nil)), WithResolver(res))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.discover(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return w, logs, path
}

// TestDiscoveryFollowsDNS walks the discovery rules on a virtual clock: instances join and leave with the answer
// and those that stay keep their state; a failing lookup keeps them however long it lasts, logged once; an empty
// answer keeps them for three intervals, then drops them.
func TestDiscoveryFollowsDNS(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		res := &fakeResolver{}
		res.set("vllm.svc", "10.0.0.1", "10.0.0.2")
		w, logs, _ := discoverFixture(t, res)
		names := func() []string { return backendNames(w.Snapshot()) }
		step := func() { // one interval
			time.Sleep(10*time.Second + time.Millisecond)
			synctest.Wait()
		}
		if got, want := names(), []string{"static", "vllm-10.0.0.1:8000", "vllm-10.0.0.2:8000"}; !slices.Equal(got, want) {
			t.Fatalf("at start: %v, want %v", got, want)
		}
		kept := backendNamed(w.Snapshot(), "vllm-10.0.0.1:8000")
		kept.ObserveRTT(40 * time.Millisecond) // something learned, which a backend that stays must keep

		res.set("vllm.svc", "10.0.0.1", "10.0.0.3")
		step()
		if got, want := names(), []string{"static", "vllm-10.0.0.1:8000", "vllm-10.0.0.3:8000"}; !slices.Equal(got, want) {
			t.Fatalf("after a scale event: %v, want %v", got, want)
		}
		if b := backendNamed(w.Snapshot(), "vllm-10.0.0.1:8000"); b != kept || b.RTT() == 0 {
			t.Errorf("the instance that stayed is a new backend, or forgot its RTT")
		}
		if got := sortedTargets(w.Snapshot().Models["only-vllm"]); !slices.Equal(got, []string{"vllm-10.0.0.1:8000", "vllm-10.0.0.3:8000"}) {
			t.Errorf("only-vllm's targets %v", got)
		}

		res.fail(&net.DNSError{Err: "server misbehaving", Name: "vllm.svc", IsTemporary: true})
		for range 10 {
			step()
		}
		if got := names(); len(got) != 3 {
			t.Errorf("after 10 failed lookups: %v, want the instances kept", got)
		}
		if n := strings.Count(logs.String(), "backend discovery failed"); n != 1 {
			t.Errorf("the failure is logged %d times, want once", n)
		}
		res.fail(nil)
		step()
		if !strings.Contains(logs.String(), "backend discovery recovered") {
			t.Error("the recovery is not logged")
		}

		res.set("vllm.svc") // NXDOMAIN: the Service has no ready pod
		step()
		step()
		if got := names(); len(got) != 3 {
			t.Errorf("two intervals into an empty answer: %v, want the instances kept", got)
		}
		res.set("vllm.svc", "10.0.0.1", "10.0.0.3") // a blip: back before the hold ends
		step()
		if b := backendNamed(w.Snapshot(), "vllm-10.0.0.1:8000"); b != kept {
			t.Error("an empty blip replaced the instances")
		}
		res.set("vllm.svc")
		step() // the first empty answer
		step()
		step()
		if got := names(); len(got) != 3 {
			t.Errorf("two intervals after the first empty answer: %v, want the instances kept", got)
		}
		step() // three intervals after it: the hold is over
		if got := names(); !slices.Equal(got, []string{"static"}) {
			t.Errorf("three intervals into an empty answer: %v, want only static", got)
		}
		if n := len(w.Snapshot().Models["only-vllm"].Targets); n != 0 {
			t.Errorf("only-vllm has %d targets, want none", n)
		}
		if n := strings.Count(logs.String(), "found no address for too long"); n != 1 {
			t.Errorf("the drop is logged %d times, want once", n)
		}

		res.set("vllm.svc", "10.0.0.4") // scaled up from zero
		step()
		if got := names(); !slices.Equal(got, []string{"static", "vllm-10.0.0.4:8000"}) {
			t.Errorf("after scaling up from zero: %v", got)
		}
	})
}

// TestReloadKeepsDiscovery: a reload that keeps a template's discover section keeps its addresses without a
// lookup (and its instances' state); one that changes it looks the new name up at once.
func TestReloadKeepsDiscovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		res := &fakeResolver{}
		res.set("vllm.svc", "10.0.0.1")
		res.set("other.svc", "10.0.9.9")
		w, _, path := discoverFixture(t, res)
		kept := backendNamed(w.Snapshot(), "vllm-10.0.0.1:8000")
		before := res.lookups()

		writeFile(t, path, strings.Replace(discoverPolicy, "strategy: round_robin", "strategy: least_request", 1))
		if err := w.Reload(); err != nil {
			t.Fatal(err)
		}
		if n := res.lookups() - before; n != 0 {
			t.Errorf("a reload that keeps the discover section made %d lookups", n)
		}
		if b := backendNamed(w.Snapshot(), "vllm-10.0.0.1:8000"); b != kept {
			t.Error("a reload replaced the discovered instance")
		}

		writeFile(t, path, strings.Replace(discoverPolicy, "dns: vllm.svc", "dns: other.svc", 1))
		if err := w.Reload(); err != nil {
			t.Fatal(err)
		}
		if got := backendNames(w.Snapshot()); !slices.Equal(got, []string{"static", "vllm-10.0.9.9:8000"}) {
			t.Errorf("after changing dns: %v", got)
		}
		synctest.Wait() // the loop, woken, has nothing due yet
		if n := res.lookups() - before; n != 1 {
			t.Errorf("changing dns made %d lookups, want 1", n)
		}
	})
}
