package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/openai"
)

// Yielding seats (docs/design.md, "Yielding seats"; models[].preempt): a critical request that finds no free
// engine seat asks a sheddable stream to give up its own. The stream's attempt is killed (its engine request
// ends, which frees the seat for the critical request waiting in the queue); the stream's relay then waits in the
// model's queue for a seat of its own and goes on as a continuation of its answer so far (openai.AppendContinuation)
// on whichever backend routing picks, its chunks carrying the first answer's id and its usage counting the answer
// as one (openai.AppendResumed). The client sees a pause, and keep-alive comments during it; no byte of the answer
// is lost or repeated.

// errYield ends the attempt of a stream that yielded its seat to a critical request; it never counts against
// the backend.
var errYield = errors.New("proxy: the stream yielded its engine seat to a critical request")

// errNotResumed ends a stream that yielded its seat and could not go on: the answer so far cannot be continued,
// or no seat came in time.
var errNotResumed = errors.New("proxy: the stream yielded its engine seat and could not be resumed")

// maxYields bounds how often one stream yields. Each yield costs an engine the prefill of the prompt and of the
// answer so far (less what its prefix cache still holds), and in a long overload a stream asked again and again
// would not end; past the bound the stream keeps its seat like a standard one.
const maxYields = 2

// yielders are a model's streams that may yield their seat, and the yields under way. Kept per model name across
// policy reloads (Server.yieldersFor), like the model's queue.
//
// A registered exchange's relay does not change its current attempt until it removes itself (remove, under mu),
// so that preempt may kill that attempt under mu without racing the attempt's end.
type yielders struct {
	mu   sync.Mutex
	live []*exchange // registered streams, in the order they registered
	owed int         // yields asked whose seats are not free yet
	want int         // critical requests waiting in the queue for a seat
}

// status returns the yielders' figures for /debug/models.
func (y *yielders) status() *YieldStatus {
	y.mu.Lock()
	defer y.mu.Unlock()
	return &YieldStatus{Streams: len(y.live), Asked: y.owed, CriticalWaiting: y.want}
}

// drop removes live[i], under mu.
func (y *yielders) drop(i int) {
	n := len(y.live) - 1
	copy(y.live[i:], y.live[i+1:])
	y.live[n] = nil // the removed pointer must not keep a pooled exchange reachable
	y.live = y.live[:n]
}

// yieldersFor returns the yielders of model, made on first use.
func (s *Server) yieldersFor(model string) *yielders {
	if y, ok := s.yields.Load(model); ok {
		return y.(*yielders)
	}
	y, _ := s.yields.LoadOrStore(model, &yielders{})
	return y.(*yielders)
}

// yieldState is the part of an exchange that a stream which may yield its seat keeps (yield.go).
type yieldState struct {
	continuable bool          // the answer is assembled so that it can be continued (Assembler.Partial)
	registered  bool          // in its model's yielders (under their mu)
	yieldAsked  bool          // a critical request asked it to yield (under its model's yielders' mu)
	yields      int           // times it yielded
	yieldID     []byte        // the first answer's id (a raw JSON value), which resumed chunks carry
	yieldGen    int           // output tokens relayed before the current attempt
	yieldBody   []byte        // the client's own body, which every continuation is built from
	resumeSkip  bool          // the resumed attempt's events before its first content are dropped
	yieldBuf    []byte        // a resumed event, rewritten
	resuming    bool          // waiting for a seat to resume: never too late for its objective (exchange.tooLate)
	yieldWait   time.Duration // how long it waited in the queue to resume
	yieldFrom   string        // the backend of the attempt that last yielded: a stream that cannot resume ended there
}

// reset empties y for the next request, keeping its buffers.
func (y *yieldState) reset() {
	*y = yieldState{yieldID: y.yieldID[:0], yieldBody: y.yieldBody[:0], yieldBuf: y.yieldBuf[:0]}
	if cap(y.yieldBody) > maxReqBuf {
		y.yieldBody = nil
	}
}

// mayYield reports whether the committed stream's seat may go to a critical request: a sheddable client's
// stream (or a standard one's, with preempt standard) of one choice, on a model with preempt, from an engine that
// continues answers, whose body a continuation can be built from, that has not yielded maxYields times.
func (ex *exchange) mayYield() bool {
	if ex.rec == nil || ex.rec.yield == nil || !ex.sum.Stream ||
		ex.class != admission.Sheddable && (ex.class != admission.Standard || !ex.rec.m.PreemptAll) ||
		ex.yields >= maxYields || ex.endpoint != openai.Chat && ex.endpoint != openai.Completions ||
		ex.sum.N > 1 || ex.sum.BestOf > 1 || ex.sum.Prompts != 1 || ex.cur == nil {
		return false
	}
	if spec := ex.cur.target.Backend.Config().Spec(); spec == nil || !spec.Continue {
		return false
	}
	body := ex.body
	if ex.yields > 0 {
		body = ex.yieldBody
	}
	var err error
	ex.scratch, err = openai.AppendContinuation(ex.scratch[:0], body, ex.endpoint, nil, 0)
	return err == nil
}

// add registers ex, whose current attempt is its stream's, as one that may yield. A critical request that
// waits for a seat that no yield under way covers asks it at once: a stream admitted before that request came
// registers only at its first token.
func (y *yielders) add(ex *exchange) {
	y.mu.Lock()
	ex.registered, ex.yieldAsked = true, false
	y.live = append(y.live, ex)
	y.ask(ex.rec)
	y.mu.Unlock()
}

// freed settles a yield: the seat of the stream asked is free.
func (y *yielders) freed() {
	y.mu.Lock()
	y.owed--
	y.mu.Unlock()
}

// enter counts a critical request of rec's model that is about to wait for a seat, and asks a registered stream
// to yield its seat unless the yields under way already cover every critical request waiting: of those that
// yielded least, the most recent (its answer so far, which the continuation prefills again, is the shortest), so
// that a stream resumed after a yield is not the first asked again. leave is called when it stops waiting.
func (y *yielders) enter(rec *modelRec) {
	y.mu.Lock()
	y.want++
	y.ask(rec)
	y.mu.Unlock()
}

// ask asks a registered stream to yield its seat, under mu, unless the yields under way already cover every
// critical request waiting (enter). A standard stream is asked only while it may expect its seat back within its
// class's objective for a first token (modelRec.standardMayYield); a sheddable one whenever.
func (y *yielders) ask(rec *modelRec) {
	if y.owed >= y.want || len(y.live) == 0 {
		return
	}
	i := len(y.live) - 1 // sheddable before standard, then the fewest yields, then the most recent
	for j := i - 1; j >= 0; j-- {
		a, b := y.live[j], y.live[i]
		if a.class < b.class || a.class == b.class && a.yields < b.yields {
			i = j
		}
	}
	v := y.live[i]
	if v.class == admission.Standard && !rec.standardMayYield(y.want-y.owed) {
		return
	}
	y.drop(i)
	v.registered, v.yieldAsked = false, true
	y.owed++
	// v's relay owns v.cur and ends it only after unregister, which waits for mu: the attempt is live here.
	// Its read fails at once (or its park wakes), with errYield.
	v.wd.kill(v.cur, errYield)
}

func (y *yielders) leave() {
	y.mu.Lock()
	y.want--
	y.mu.Unlock()
}

// unregister removes the exchange from its model's yielders before its attempt ends (the stream's end, a yield,
// or an answer that can no longer be continued), and reports whether it was asked to yield: the caller then owes
// the yielders freed once that attempt's seat is free. Without preempt on the model it costs nothing.
func (ex *exchange) unregister() (asked bool) {
	ex.continuable = false
	if ex.rec == nil || ex.rec.yield == nil {
		return false
	}
	y := ex.rec.yield
	y.mu.Lock()
	if ex.registered {
		for i, e := range y.live {
			if e == ex {
				y.drop(i)
				break
			}
		}
	}
	asked = ex.yieldAsked
	ex.registered, ex.yieldAsked = false, false
	y.mu.Unlock()
	return asked
}

// stopYielding keeps the stream's seat: its answer can no longer be continued (a tool call began, say). A yield
// asked of it meanwhile still comes (its attempt was killed), and its resume fails.
func (ex *exchange) stopYielding() {
	if ex.continuable && ex.unregister() {
		ex.yieldAsked = true // the resume (or the end) settles it
	}
}

// waitForSeat waits in the model's queue for a seat (admission.Queue.Wait) until deadline. A critical request
// that must wait (it is queued: admission.Queue.WaitCalling) asks a stream to yield its seat (yielders.enter);
// one that the queue dispatches at once asks nobody. Asked before the queue had offered it a seat, a critical
// request yielded a stream for nearly every critical arrival of a spike, though the reserve held a free seat for
// most of them: one engine of 64 seats saw 48-56 yields in a 10 s spike, none of whose critical requests waited.
func (ex *exchange) waitForSeat(ctx context.Context, deadline time.Time) error {
	y := ex.rec.yield
	if y == nil || ex.class != admission.Critical {
		return ex.rec.queue.Wait(ctx, ex, ex.class, deadline)
	}
	entered := false
	err := ex.rec.queue.WaitCalling(ctx, ex, ex.class, deadline, func() {
		entered = true
		y.enter(ex.rec)
	})
	if entered {
		y.leave()
	}
	return err
}

// resumeYielded goes on with a stream whose attempt yielded its seat (errYield): it ends that attempt (its seat goes to
// the critical request that asked), waits in the model's queue for a seat under its own class's rules (sheddable:
// behind critical and standard requests, and only past twice the seats kept for critical ones; standard: behind
// critical requests, past the seats kept for them), ahead of the requests of its class that have not started
// (admission.Queue.WaitAhead), for at most the backend's idle timeout, and sends the request again as a continuation of
// the answer so far. Resumed by a standard request's rules, a sheddable stream would take a seat that a standard
// request arriving after it needs: the critical request's seat would come out of the standard class's share. The new
// attempt's events then follow the old ones'. It returns the error that ends the stream when it cannot go on.
func (ex *exchange) resumeYielded() error {
	if err := ex.flush(); err != nil {
		return err
	}
	old := ex.cur
	idle := old.to.Idle
	model, class := ex.model.Name, ex.class.String()
	id, text, ok := ex.asm.Partial()
	var err error
	if ok {
		if ex.yields == 0 {
			ex.yieldBody = append(ex.yieldBody[:0], ex.body...)
			ex.yieldID = append(ex.yieldID[:0], id...)
		}
		ex.scratch, err = openai.AppendContinuation(ex.scratch[:0], ex.yieldBody, ex.endpoint, text, ex.tokens)
	}
	ex.cur, ex.yieldFrom = nil, old.name
	asked := ex.unregister() // (removed already by the critical request that asked)
	ex.endAttempt(old, errYield)
	if asked {
		ex.rec.yield.freed()
	}
	ex.s.m.Yields.WithLabelValues(model, class, "yielded").Inc()
	if !ok || err != nil {
		ex.s.m.Yields.WithLabelValues(model, class, "failed").Inc()
		return fmt.Errorf("%w: the answer so far cannot be continued", errNotResumed)
	}
	ex.yields++
	ex.yieldGen = ex.tokens
	if err := ex.continueWith(ex.scratch, idle); err != nil {
		ex.s.m.Yields.WithLabelValues(model, class, "failed").Inc()
		if why := ex.cancelled(); why != nil {
			return why
		}
		return fmt.Errorf("%w: %w", errNotResumed, err)
	}
	ex.s.m.Yields.WithLabelValues(model, class, "resumed").Inc()
	ex.resumeSkip = true
	ex.replay.ResetBytes(ex.cur.pending)
	ex.replaying = true
	if ex.mayYield() {
		ex.rec.yield.add(ex)
	}
	return nil
}

// continueWith makes body the request and runs it as a new attempt once a seat is free (at most wait from now).
func (ex *exchange) continueWith(body []byte, wait time.Duration) error {
	ex.body = append(ex.reqBuf(ex.body), body...)
	if err := ex.parse(); err != nil {
		return err
	}
	ex.rreq.Reset()
	ex.rreq.Model = ex.model.Name
	ex.rreq.PromptTokens = ex.sum.PromptTokens
	ex.rreq.MaxTokens = ex.sum.MaxTokens
	ex.rreq.Prompt = ex.sum.Prompt
	ex.rreq.PrevTurn = ex.sum.PrevTurn
	ex.rreq.ITLSLO = ex.model.SLO.ITL
	ex.routeObjective()
	ex.upFor, ex.upBody = "", ex.upBody[:0] // prepare builds the continuation's upstream body
	ex.deadlineSet = false
	clear(ex.tried)
	ex.tried = ex.tried[:0]

	a := newAttempt(ex.s, ex.wd)
	ex.resuming = true
	err := ex.pick(a, true)
	if errors.Is(err, errNoCapacity) {
		ex.queued = a
		ctx, cancel := ex.wd.queueContext()
		enqueued := ex.s.clock.Now()
		err = ex.rec.queue.WaitAhead(ctx, ex, ex.class, enqueued.Add(wait))
		ex.yieldWait += ex.s.clock.Now().Sub(enqueued)
		cancel()
		ex.queued = nil
	}
	ex.resuming = false
	if err != nil {
		a.free()
		return err
	}
	ex.cur = a
	return ex.runFrom(nil)
}

// resumedEvent returns the event raw (data its subslice) of a resumed attempt as part of the first answer:
// with that answer's id, and its usage counting the tokens before the resume as output (openai.AppendResumed).
func (ex *exchange) resumedEvent(raw, data []byte) ([]byte, []byte) {
	off := cap(raw) - cap(data)
	if len(data) == 0 || off < 0 || off > len(raw)-len(data) {
		return raw, data
	}
	tail := len(raw) - off - len(data)
	ex.yieldBuf = openai.AppendResumed(ex.yieldBuf[:0], raw, data, ex.yieldID, ex.yieldGen)
	return ex.yieldBuf, ex.yieldBuf[off : len(ex.yieldBuf)-tail]
}
