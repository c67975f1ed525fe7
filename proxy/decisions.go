package proxy

import (
	"errors"
	"math"
	"sync"
	"time"

	"github.com/switchyard/switchyard/admission"
)

// The status page's table of recent routing decisions (GET /debug/decisions) is a fixed ring of the last
// decisionRingSize requests. An exchange notes what routing decided when it dispatches an attempt
// (exchange.prepare: the candidates and their predicted TTFT) and why admission refused it (Server.fail: the
// shed reason); exchange.record, once per finished request, copies the note and the outcome into the ring
// under a mutex held for one copy of a fixed-size record, and feeds the charts' rings (timeseries.go). Nothing
// is allocated per request: names are strings the policy snapshot already holds.
const (
	decisionRingSize = 200
	maxCandidates    = 8 // candidates kept per decision; CandidatesTotal says how many there were
)

// candidate is one backend a pick considered, with the TTFT predicted for it (0: no prediction).
type candidate struct {
	name string
	pred time.Duration
}

// decisionNote is what an exchange learns about its routing and admission before it finishes. It lives in
// the pooled exchange; record consumes and clears it.
type decisionNote struct {
	sentAt   time.Time     // when the last attempt was dispatched
	pred     time.Duration // the chosen backend's predicted TTFT at dispatch (mean, RTT included)
	p90      time.Duration // the strategy's p90 prediction for its choice (routing.Decision.TTFT; adaptive only)
	cached   int32         // prompt tokens the chosen backend was believed to hold
	n, total uint8         // candidates kept in cands, and considered
	cands    [maxCandidates]candidate
	shed     string  // admission.Error.Reason of a refusal; "" when not shed
	cost     float64 // what the request cost (cost.go's charge); 0 until priced
}

// dispatched notes attempt a, just dispatched: the candidates of the pick that chose it (ex.cands, less the
// unhealthy ones, which strategies pass over) with their predicted TTFT. The chosen backend's is the
// prediction its routing accounting made (prefix hit included); the others' are their latency models' for
// this prompt without a prefix hit, since strategies report only the choice's (routing.Decision). A retry or
// a hedge notes its own pick over the earlier one.
func (n *decisionNote) dispatched(ex *exchange, a *attempt) {
	d := ex.rreq.Decision()
	chosen := a.target.Backend
	n.sentAt, n.pred, n.p90, n.cached = a.started, a.acct.PredictedTTFT(), 0, int32(d.CachedTokens)
	if d.Backend == chosen {
		n.p90 = d.TTFT
	}
	n.n, n.total = 0, 0
	for _, t := range ex.cands {
		if !t.Backend.Healthy() && t.Backend != chosen {
			continue
		}
		if n.total < math.MaxUint8 {
			n.total++
		}
		if int(n.n) == maxCandidates {
			continue
		}
		c := candidate{name: t.Backend.Name(), pred: n.pred}
		if t.Backend != chosen {
			c.pred, _ = t.Backend.PredictTTFT(ex.sum.PromptTokens, 0)
		}
		n.cands[n.n] = c
		n.n++
	}
}

// failed notes why the request failed, when admission control shed it: an admission.Error with a reason, as
// switchyard_shed_total counts them (rate limits included).
func (n *decisionNote) failed(err error) {
	if ae, ok := errors.AsType[*admission.Error](err); ok {
		n.shed = ae.Reason
	}
}

// decisionRec is one entry of the ring.
type decisionRec struct {
	arrival                time.Time
	model, asked, strategy string
	backend                string
	class                  admission.Class
	status, attempts       int32
	ttft, observed         time.Duration // from arrival, and from dispatch, to the first token; 0: none
	note                   decisionNote
}

// decisionRing keeps the last decisionRingSize decisions. The zero value is ready to use.
type decisionRing struct {
	mu   sync.Mutex
	next uint64 // entries written so far; the newest is r[(next-1)%decisionRingSize]
	r    [decisionRingSize]decisionRec
}

func (d *decisionRing) push(rec *decisionRec) {
	d.mu.Lock()
	d.r[d.next%decisionRingSize] = *rec
	d.next++
	d.mu.Unlock()
}

// DecisionEntry is one request of GET /debug/decisions: what routing chose for it, what was predicted and
// what happened. Latencies are in milliseconds, null when not known.
type DecisionEntry struct {
	// Time is when the request arrived.
	Time time.Time `json:"time"`
	// Model is the model that served it; Asked the one the client asked for, when brownout degraded it.
	Model    string `json:"model"`
	Asked    string `json:"asked,omitempty"`
	Strategy string `json:"strategy"`
	Class    string `json:"class"`
	// Backend answered it: "none" when it reached none, "cache" when the response cache answered.
	Backend string `json:"backend"`
	// Candidates are those the last pick considered (at most 8 of CandidatesTotal), each with its predicted
	// TTFT: for the chosen one the prediction made at dispatch, for the others their latency model's for this
	// prompt without a prefix hit.
	Candidates      []CandidateEntry `json:"candidates"`
	CandidatesTotal int              `json:"candidates_total"`
	CachedTokens    int              `json:"cached_tokens"`
	// PredictedTTFTMs is the chosen backend's mean prediction at dispatch, RTT included; PredictedP90Ms the
	// strategy's p90 for its choice (adaptive only). ObservedTTFTMs is dispatch to first token, comparable
	// with both; TTFTMs is arrival to first token (queueing and retries included), what the client saw.
	PredictedTTFTMs jsonMs `json:"predicted_ttft_ms"`
	PredictedP90Ms  jsonMs `json:"predicted_p90_ms"`
	ObservedTTFTMs  jsonMs `json:"observed_ttft_ms"`
	TTFTMs          jsonMs `json:"ttft_ms"`
	Status          int    `json:"status"`
	// Shed is admission control's reason for refusing it (admission.Reason*), "" when it did not.
	Shed     string `json:"shed,omitempty"`
	Attempts int    `json:"attempts"`
	// Cost is what the request cost at the answering backend's price, from the engine's usage; 0 when free or
	// not answered.
	Cost float64 `json:"cost"`
}

// CandidateEntry is one candidate of a DecisionEntry.
type CandidateEntry struct {
	Backend         string `json:"backend"`
	PredictedTTFTMs jsonMs `json:"predicted_ttft_ms"`
}

// recent returns up to limit decisions, newest first.
func (d *decisionRing) recent(limit int) []DecisionEntry {
	limit = min(max(limit, 0), decisionRingSize)
	recs := make([]decisionRec, 0, limit)
	d.mu.Lock()
	for i := uint64(0); i < uint64(limit) && i < d.next; i++ {
		recs = append(recs, d.r[(d.next-1-i)%decisionRingSize])
	}
	d.mu.Unlock()
	out := make([]DecisionEntry, len(recs))
	for i := range recs {
		r := &recs[i]
		e := DecisionEntry{Time: r.arrival, Model: r.model, Asked: r.asked, Strategy: r.strategy, Class: r.class.String(),
			Backend: r.backend, Candidates: make([]CandidateEntry, r.note.n), CandidatesTotal: int(r.note.total),
			CachedTokens: int(r.note.cached), PredictedTTFTMs: ms(r.note.pred), PredictedP90Ms: ms(r.note.p90),
			ObservedTTFTMs: ms(r.observed), TTFTMs: ms(r.ttft), Status: int(r.status), Shed: r.note.shed,
			Attempts: int(r.attempts), Cost: r.note.cost}
		for j, c := range r.note.cands[:r.note.n] {
			e.Candidates[j] = CandidateEntry{Backend: c.name, PredictedTTFTMs: ms(c.pred)}
		}
		out[i] = e
	}
	return out
}

func ms(d time.Duration) jsonMs {
	if d <= 0 {
		return jsonMs(math.NaN())
	}
	return jsonMs(float64(d) / float64(time.Millisecond))
}

// statusRings are the Server's rings behind the status page. The zero value is ready to use; it must not be
// copied.
type statusRings struct {
	ts  timeseries
	dec decisionRing
}

// record is exchange.record's hook: it adds the finished request ex (answered code by backend, at now) to the
// charts' rings and the decisions ring, and clears ex's note.
func (sr *statusRings) record(ex *exchange, code int, backend string, now time.Time) {
	n := &ex.note
	x := sample{sec: now.Unix(), shed: n.shed != "", hasBackend: backend != "none" && backend != "cache"}
	x.err = code >= 500 && !x.shed
	var ttft, observed time.Duration
	if !ex.firstAt.IsZero() {
		ttft = ex.firstAt.Sub(ex.arrival)
		x.ttft = max(ttft, 1)
		if !n.sentAt.IsZero() {
			observed = ex.firstAt.Sub(n.sentAt)
		}
		if ex.tokens > 1 && ex.lastTokenAt.After(ex.firstAt) {
			x.itl = ex.lastTokenAt.Sub(ex.firstAt) / time.Duration(ex.tokens-1)
		}
	}
	sr.ts.observe(backend, &x)
	rec := decisionRec{arrival: ex.arrival, backend: backend, class: ex.class, status: int32(code),
		attempts: int32(ex.attempts), ttft: ttft, observed: observed, note: *n}
	if ex.model != nil {
		rec.model, rec.strategy = ex.model.Name, ex.model.StrategyName
		if ex.asked != nil && ex.asked != ex.model {
			rec.asked = ex.asked.Name
		}
	}
	sr.dec.push(&rec)
	*n = decisionNote{}
}
