package proxy

import (
	"sync"
)

// orphanSet holds the hedged attempts that lost their race and read on to their first token after their
// exchange moved on (exchange.abandon), so that shutdown can end them: each is bounded by its first-byte timeout
// anyway, but a draining gateway must not wait that long, nor leave them reading. Safe for concurrent use.
type orphanSet struct {
	mu     sync.Mutex
	m      map[*attempt]struct{}
	closed bool
}

// add registers a; it returns false once the set is closed (the gateway is shutting down): kill the attempt
// instead of orphaning it.
func (o *orphanSet) add(a *attempt) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return false
	}
	if o.m == nil {
		o.m = make(map[*attempt]struct{})
	}
	o.m[a] = struct{}{}
	return true
}

// remove forgets a (its goroutine ended it).
func (o *orphanSet) remove(a *attempt) {
	o.mu.Lock()
	delete(o.m, a)
	o.mu.Unlock()
}

// len reports how many orphans read on now.
func (o *orphanSet) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.m)
}

// close refuses new orphans and aborts the live ones with why: their reads fail at once and they end
// themselves, judged as attempts the gateway left, not as the backend's failures.
func (o *orphanSet) close(why error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	for a := range o.m {
		a.wd.kill(a, why)
	}
}
