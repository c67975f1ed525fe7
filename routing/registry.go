package routing

import (
	"sync"
	"sync/atomic"

	"github.com/switchyard/switchyard/cache"
	"github.com/switchyard/switchyard/metrics"
)

// Registry keeps one *Backend per backend identity (name and URL) across policy reloads, so that a reload keeps
// what was learned about the backends that stay. It also owns the prefix index the backends share: each backend
// it creates gets a share (a *cache.Owner), and a backend it forgets loses it.
//
// Concurrency: Sync is serialised by a mutex; it runs only on reload. Backends, Index and Status are safe to call
// at any time.
type Registry struct {
	mu       sync.Mutex
	backends map[registryKey]*Backend
	current  atomic.Pointer[[]*Backend]
	watchers map[chan struct{}]struct{}

	clock Clock
	index *cache.Index
	m     *metrics.Gateway
	hints hintCell  // the Peers publishing this registry's confirmed prefixes, if any (hints.go)
	hold  holdTime  // seat hold time over every backend: a backend's own until its first answer ends
	spec  specShare // the share of a prefix being prefilled that a request finds cached, over every backend
	peers seatPeers
	prior priorCal // the TTFT prior calibrated to this fleet (model.go)
}

type registryKey struct{ name, url string }

// RegistryOption configures a Registry.
type RegistryOption func(*Registry)

// WithClock makes the registry's backends read c instead of the system clock (tests use a virtual clock).
func WithClock(c Clock) RegistryOption { return func(r *Registry) { r.clock = c } }

// WithMetrics makes the registry's backends report to m: switchyard_ttft_prediction_error_ratio,
// switchyard_backend_queue_depth and switchyard_backend_inflight (the last two set by the Monitor).
func WithMetrics(m *metrics.Gateway) RegistryOption { return func(r *Registry) { r.m = m } }

// WithIndex makes the registry use ix as its prefix index instead of a new one with default options.
func WithIndex(ix *cache.Index) RegistryOption { return func(r *Registry) { r.index = ix } }

// NewRegistry returns an empty Registry.
func NewRegistry(opts ...RegistryOption) *Registry {
	r := &Registry{backends: make(map[registryKey]*Backend), watchers: make(map[chan struct{}]struct{}),
		clock: SystemClock{}, peers: seatPeers{groups: make(map[peerKey]*seatGroup)}}
	for _, o := range opts {
		o(r)
	}
	if r.index == nil {
		r.index = cache.NewIndex(cache.Options{})
	}
	empty := []*Backend{}
	r.current.Store(&empty)
	return r
}

// Sync makes the registry hold exactly the backends of cfgs and returns them in the same order. A backend whose
// name and URL match one already held is the same *Backend with its configuration replaced; the others are new.
// Backends no longer listed are forgotten (requests still running on them finish normally) and their prefix-index
// entries are dropped.
func (r *Registry) Sync(cfgs []*BackendConfig) []*Backend {
	r.mu.Lock()
	defer r.mu.Unlock()
	next := make(map[registryKey]*Backend, len(cfgs))
	names := make(map[string]bool, len(cfgs))
	out := make([]*Backend, len(cfgs))
	for i, c := range cfgs {
		k := registryKey{c.Name, c.URL}
		b, ok := r.backends[k]
		if ok {
			b.cfg.Store(c)
			b.applyCapacity()
		} else {
			b = r.newBackend(c)
		}
		next[k] = b
		names[c.Name] = true
		out[i] = b
	}
	for k, b := range r.backends {
		if next[k] == b {
			continue
		}
		r.index.Remove(b.owner.Swap(nil))
		r.peers.leave(b)
		if r.m != nil && !names[k.name] {
			r.m.TTFTPredictionError.DeleteLabelValues(k.name)
			r.m.QueueDepth.DeleteLabelValues(k.name)
			r.m.Inflight.DeleteLabelValues(k.name)
		}
	}
	r.backends = next
	cur := append([]*Backend(nil), out...)
	r.current.Store(&cur)
	for w := range r.watchers {
		select {
		case w <- struct{}{}:
		default: // a change is already pending for that watcher
		}
	}
	return out
}

func (r *Registry) newBackend(c *BackendConfig) *Backend {
	b := newBackend(c, r.clock)
	b.hints = &r.hints
	b.fleetHold = &r.hold
	b.fleetSpec = &r.spec
	b.peers = &r.peers
	b.lat.cal = &r.prior
	if o, err := r.index.NewOwner(c.Name, 0); err == nil { // beyond cache.MaxOwners, no prefix affinity
		b.owner.Store(o)
		b.applyCapacity()
	}
	if r.m != nil {
		b.obs.Store(&backendMetrics{
			ttftError:  r.m.TTFTPredictionError.WithLabelValues(c.Name),
			queueDepth: r.m.QueueDepth.WithLabelValues(c.Name),
			inflight:   r.m.Inflight.WithLabelValues(c.Name),
		})
	}
	return b
}

// Backends returns the backends of the last Sync, in its order. The slice is shared: do not modify it.
func (r *Registry) Backends() []*Backend { return *r.current.Load() }

// Index returns the prefix index the registry's backends share.
func (r *Registry) Index() *cache.Index { return r.index }

// Status returns every backend's status (for /debug/backends), in the order of the last Sync.
func (r *Registry) Status() []BackendStatus {
	bs := r.Backends()
	out := make([]BackendStatus, len(bs))
	for i, b := range bs {
		out[i] = b.Status()
	}
	return out
}

// watch returns a channel that receives a value after each Sync (coalesced), and a function to stop watching.
func (r *Registry) watch() (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	r.mu.Lock()
	r.watchers[ch] = struct{}{}
	r.mu.Unlock()
	return ch, func() {
		r.mu.Lock()
		delete(r.watchers, ch)
		r.mu.Unlock()
	}
}
