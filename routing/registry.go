package routing

import (
	"sync"
)

// Registry keeps one *Backend per backend identity (name and URL) across policy reloads, so that a reload keeps
// what was learned about the backends that stay.
//
// Concurrency: Sync is serialised by a mutex; it runs only on reload.
type Registry struct {
	mu       sync.Mutex
	backends map[registryKey]*Backend
}

type registryKey struct{ name, url string }

// NewRegistry returns an empty Registry.
func NewRegistry() *Registry {
	return &Registry{backends: make(map[registryKey]*Backend)}
}

// Sync makes the registry hold exactly the backends of cfgs and returns them in the same order. A backend whose
// name and URL match one already held is the same *Backend with its configuration replaced; the others are new.
// Backends no longer listed are forgotten (requests still running on them finish normally).
func (r *Registry) Sync(cfgs []*BackendConfig) []*Backend {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := make(map[registryKey]*Backend, len(cfgs))
	out := make([]*Backend, len(cfgs))
	for i, c := range cfgs {
		k := registryKey{c.Name, c.URL}
		b, ok := r.backends[k]
		if ok {
			b.cfg.Store(c)
		} else {
			b = NewBackend(c)
		}
		next[k] = b
		out[i] = b
	}
	r.backends = next
	return out
}
