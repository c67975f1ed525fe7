package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
)

// A request that a backend answered observes about ten labelled series (TTFT, time per token, durations, tokens,
// the requests counter). Looking a child up in its vector hashes and validates every label value under the
// vector's lock, each time; so the children a successful request needs are resolved once per backend record
// and label combination, and the request follows a pointer. A request that fails or is refused looks its
// series up as before: its labels (the error type, the status) are many and it is rare.

// children are one backend's series for one (operation, asked model, served model): those of a request that
// succeeded (error type "", status 200).
type children struct {
	op, asked, served string // the key; the backend and its provider are the endpoint's

	ttft, tpot               prometheus.Observer
	duration, clientDuration prometheus.Observer
	tokensIn, tokensOut      prometheus.Observer
	requestsOK               prometheus.Counter
}

// childSet is an endpoint's children, resolved on first use. Readers scan an immutable list without a lock;
// a miss builds them under mu and publishes a longer list.
type childSet struct {
	mu   sync.Mutex
	list atomic.Pointer[[]*children]
}

// find returns the children for (op, asked, served) in the published list, or nil.
func (c *childSet) find(op, asked, served string) *children {
	if l := c.list.Load(); l != nil {
		for _, s := range *l {
			if s.op == op && s.asked == asked && s.served == served {
				return s
			}
		}
	}
	return nil
}

// maxChildren bounds the children sets an endpoint keeps. Every key is made of names in the policy (operations are a
// fixed set, models are the policy's), so a real policy stays far below it; past it they are built per
// request rather than kept.
const maxChildren = 64

// backendChildren are one backend's children of the per-backend histograms, resolved with its record.
type backendChildren struct {
	ttft, itl prometheus.Observer
}

func newBackendChildren(m *metrics.Gateway, backend string) backendChildren {
	return backendChildren{ttft: m.BackendTTFT.WithLabelValues(backend), itl: m.BackendITL.WithLabelValues(backend)}
}

// childrenFor returns e's children for (op, asked, served).
func (e *endpoint) childrenFor(m *metrics.Gateway, op, asked, served string) *children {
	if s := e.kids.find(op, asked, served); s != nil {
		return s
	}
	e.kids.mu.Lock()
	defer e.kids.mu.Unlock()
	if s := e.kids.find(op, asked, served); s != nil { // another request built it meanwhile
		return s
	}
	var old []*children
	if l := e.kids.list.Load(); l != nil {
		old = *l
	}
	backend, provider := e.b.Name(), providerOf(e.b)
	s := &children{op: op, asked: asked, served: served,
		ttft:           m.TTFT.WithLabelValues(op, provider, asked, served),
		tpot:           m.TPOT.WithLabelValues(op, provider, asked, served),
		duration:       m.Duration.WithLabelValues(op, provider, asked, served, ""),
		clientDuration: m.ClientDuration.WithLabelValues(op, provider, asked, served, ""),
		tokensIn:       m.Tokens.WithLabelValues(op, provider, asked, served, "input"),
		tokensOut:      m.Tokens.WithLabelValues(op, provider, asked, served, "output"),
		requestsOK:     m.Requests.WithLabelValues(served, backend, codeLabel(200)),
	}
	if len(old) < maxChildren {
		l := append(old[:len(old):len(old)], s)
		e.kids.list.Store(&l)
	}
	return s
}

// childrenOf returns the children of a's backend for the exchange's labels, a.end's. a.end must be set.
func (ex *exchange) childrenOf(a *attempt) *children {
	if ex.sr == nil || ex.srEnd != a.end {
		asked, served := ex.models()
		ex.sr, ex.srEnd = a.end.childrenFor(ex.s.m, ex.operation(), asked, served), a.end
	}
	return ex.sr
}
