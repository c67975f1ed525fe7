package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/switchyard/switchyard/openai"
	"github.com/switchyard/switchyard/routing"
)

// The Responses API is stateful: an engine keeps each response it made (store, the default), and the requests
// that name one later — GET /v1/responses/{id}, DELETE, .../cancel, .../input_items, and a new response with
// previous_response_id — work only on that engine. The gateway remembers where each response it relayed was
// made (homes) and pins those requests to that backend: they may wait for it, never go elsewhere. A response
// the table does not know (made before a restart, through another replica, or evicted) is looked for on the
// candidate backends with GET /v1/responses/{id}; found, it is remembered; found nowhere, the request is a 404
// that says so.

// errResponseNotFound: no backend holds the response a request names.
var errResponseNotFound = errors.New("proxy: response not found")

// responseError is a 404 or 400 about a stored response, in the Responses API's error shape.
type responseError struct {
	status  int
	param   string
	message string
}

func (e *responseError) Error() string { return e.message }
func (e *responseError) Unwrap() error { return errResponseNotFound }

// locateTimeout bounds the search of the backends for a response the table does not know.
const locateTimeout = 2 * time.Second

// locate resolves the stored response a by-id route names: its backend (pinned) and its model (which the
// request's admission and routing use, as if the client had named it).
func (ex *exchange) locate(snap *Snapshot) error {
	id := ex.respID
	if h, ok := ex.s.homes.get(id); ok {
		if b := backendNamed(snap, h.backend); b != nil {
			ex.pin = b
			ex.sum.Model = append(ex.sum.Model[:0:0], h.model...)
			return nil
		}
	}
	// Not known here: ask every backend that serves a model with the Responses API.
	var cands []*routing.Backend
	for _, name := range snap.ModelNames {
		m := snap.Models[name]
		if m == nil || !m.Endpoints.Has(EndpointResponses) {
			continue
		}
		for _, t := range m.Targets {
			cands = appendUnique(cands, t.Backend)
		}
	}
	b := ex.s.findResponse(id, cands)
	if b == nil {
		return &responseError{status: 404, message: fmt.Sprintf("No response with id '%s' is held by any backend of this gateway.", truncate(id, maxEcho))}
	}
	model := modelServedBy(snap, b)
	ex.s.homes.put(id, model, b.Name())
	ex.pin = b
	ex.sum.Model = append(ex.sum.Model[:0:0], model...)
	return nil
}

// pinHome pins a request that continues a stored response to the backend that holds it: a by-id route
// (located already) must be served by one of m's targets, and a new response with previous_response_id goes to
// the backend of that response.
func (ex *exchange) pinHome(m *Model) error {
	if ex.rt.byID {
		if !targets(m, ex.pin) {
			return &responseError{status: 404, message: fmt.Sprintf("No response with id '%s' is held by a backend of model %s.", truncate(ex.respID, maxEcho), m.Name)}
		}
		return nil
	}
	prev := ex.sum.PreviousResponseID
	if ex.endpoint != openai.Responses || len(prev) == 0 {
		return nil
	}
	if h, ok := ex.s.homes.get(prev); ok {
		for _, t := range m.Targets {
			if t.Backend.Name() == h.backend {
				ex.pin = t.Backend
				return nil
			}
		}
		return &responseError{status: 400, param: "previous_response_id", message: fmt.Sprintf(
			"The previous response '%s' is held by backend %s, which does not serve model %s.", truncate(prev, maxEcho), h.backend, m.Name)}
	}
	cands := make([]*routing.Backend, 0, len(m.Targets))
	for _, t := range m.Targets {
		cands = appendUnique(cands, t.Backend)
	}
	b := ex.s.findResponse(prev, cands)
	if b == nil {
		return &responseError{status: 404, param: "previous_response_id", message: fmt.Sprintf(
			"Previous response with id '%s' not found on any backend of model %s.", truncate(prev, maxEcho), m.Name)}
	}
	ex.s.homes.put(prev, m.Name, b.Name())
	ex.pin = b
	return nil
}

// rememberID records where the response an attempt relayed lives, once its backend answered.
func (ex *exchange) rememberID(a *attempt) {
	if ex.endpoint == openai.Responses && len(a.respID) > 0 {
		ex.s.homes.put(a.respID, ex.model.Name, a.name)
	}
}

// rememberWhole records what a whole answer says about stored responses: a background response's id (its
// home), or a deleted one (forgotten).
func (ex *exchange) rememberWhole(body []byte) {
	switch {
	case ex.rt == &routeResponseDelete:
		ex.s.homes.forget(ex.respID)
	case ex.endpoint == openai.Responses && len(body) > 0:
		var v struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(body, &v) == nil && v.ID != "" {
			ex.s.homes.put([]byte(v.ID), ex.model.Name, ex.cur.name)
		}
	}
}

// findResponse asks the backends, all at once, whether they hold the response id (GET /v1/responses/{id}
// answered 200), and returns the first that does, or nil when none does within locateTimeout. The questions
// still out when it returns read a path of their own: id belongs to the exchange, which is reused once the
// request ends.
func (s *Server) findResponse(id []byte, cands []*routing.Backend) *routing.Backend {
	if len(cands) == 0 || len(id) == 0 || len(id) > maxResponseID {
		return nil
	}
	path := append([]byte("/v1/responses/"), id...)
	ctx, cancel := context.WithTimeout(context.Background(), locateTimeout)
	defer cancel()
	found := make(chan *routing.Backend, len(cands))
	var wg sync.WaitGroup
	for _, b := range cands {
		if !b.Healthy() {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if s.holdsResponse(ctx, b, path) {
				found <- b
			}
		}()
	}
	go func() { wg.Wait(); close(found) }()
	select {
	case b := <-found:
		return b
	case <-ctx.Done():
		return nil
	}
}

// holdsResponse asks one backend whether it holds a response: GET path (/v1/responses/{id}) answered 200.
func (s *Server) holdsResponse(ctx context.Context, b *routing.Backend, path []byte) bool {
	cfg := b.Config()
	to := s.timeouts(cfg)
	up, err := s.ups.get(cfg, to.Connect)
	if err != nil {
		return false
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.Header.SetMethod(fasthttp.MethodGet)
	_ = up.prepareRequest(req, cfg, path, "", nil) // upstream.go: the backend's headers, query and credentials
	deadline, _ := ctx.Deadline()
	c, err := up.acquire(time.Now(), deadline)
	if err != nil {
		return false
	}
	_ = c.SetDeadline(deadline)
	err = c.roundTrip(req, resp)
	c.release() // only the status matters: a body left unread closes the connection
	return err == nil && resp.StatusCode() == fasthttp.StatusOK
}

func backendNamed(snap *Snapshot, name string) *routing.Backend {
	for _, b := range snap.Backends {
		if b.Name() == name {
			return b
		}
	}
	return nil
}

// modelServedBy returns the first model (in the policy's order) with the Responses API that b serves.
func modelServedBy(snap *Snapshot, b *routing.Backend) string {
	for _, name := range snap.ModelNames {
		if m := snap.Models[name]; m != nil && m.Endpoints.Has(EndpointResponses) && targets(m, b) {
			return name
		}
	}
	return ""
}

func targets(m *Model, b *routing.Backend) bool {
	for _, t := range m.Targets {
		if t.Backend == b {
			return true
		}
	}
	return false
}

func appendUnique(list []*routing.Backend, b *routing.Backend) []*routing.Backend {
	for _, x := range list {
		if x == b {
			return list
		}
	}
	return append(list, b)
}
