package sim

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// Fleet is a set of simulated backends running in one process, each on its own listener with its own engine.
// It is safe for concurrent use; Close stops every backend.
type Fleet struct {
	backends []*Backend
}

// StartFleet starts one backend per config, in order (see Start). Names must be unique. If any backend fails to
// start, the ones already started are closed and the error names the failing one. The fleet runs until Close is
// called or ctx is done.
//
// For tests, leave Listen empty (or 127.0.0.1:0) and read each backend's URL:
//
//	cfgs := []sim.Config{sim.DefaultConfig(), sim.DefaultConfig()}
//	cfgs[0].Name, cfgs[1].Name = "a", "b"
//	fleet, err := sim.StartFleet(ctx, cfgs)
//	...
//	defer fleet.Close()
//	urls := fleet.URLs() // "http://127.0.0.1:PORT", in cfgs order
func StartFleet(ctx context.Context, cfgs []Config) (*Fleet, error) {
	seen := make(map[string]bool, len(cfgs))
	for _, c := range cfgs {
		if seen[c.Name] {
			return nil, fmt.Errorf("sim: fleet: name %q is used twice", c.Name)
		}
		seen[c.Name] = true
		if err := c.Validate(); err != nil {
			return nil, err
		}
	}
	f := &Fleet{}
	for _, c := range cfgs {
		b, err := Start(ctx, c)
		if err != nil {
			_ = f.Close()
			return nil, err
		}
		f.backends = append(f.backends, b)
	}
	return f, nil
}

// Backends returns the backends in the order of the configs. The slice is the caller's.
func (f *Fleet) Backends() []*Backend { return append([]*Backend(nil), f.backends...) }

// Backend returns the backend named name, or nil.
func (f *Fleet) Backend(name string) *Backend {
	for _, b := range f.backends {
		if b.Name() == name {
			return b
		}
	}
	return nil
}

// URLs returns each backend's base URL, in the order of the configs.
func (f *Fleet) URLs() []string {
	urls := make([]string, len(f.backends))
	for i, b := range f.backends {
		urls[i] = b.URL()
	}
	return urls
}

// Close closes every backend (concurrently) and waits for them; it returns their errors joined.
func (f *Fleet) Close() error {
	errs := make([]error, len(f.backends))
	var wg sync.WaitGroup
	for i, b := range f.backends {
		wg.Go(func() { errs[i] = b.Close() })
	}
	wg.Wait()
	return errors.Join(errs...)
}
