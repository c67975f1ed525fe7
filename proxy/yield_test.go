package proxy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/routing"
)

// sseAnswer is what a streaming client read: every data event, and when each content event arrived.
type sseAnswer struct {
	status  int
	chunks  []map[string]any
	content []time.Time // arrival of each event with content
	done    time.Time   // arrival of [DONE] (zero: none)
	raw     string
}

// streamPost sends body to the gateway's path with hdr and reads its SSE stream to the end.
func streamPost(t *testing.T, url, path, body string, hdr map[string]string) sseAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Error(err)
		return sseAnswer{}
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return sseAnswer{}
	}
	defer resp.Body.Close()
	a := sseAnswer{status: resp.StatusCode}
	var raw bytes.Buffer
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		raw.WriteString(line + "\n")
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			a.done = time.Now()
			continue
		}
		var c map[string]any
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Errorf("chunk %q: %v", data, err)
			continue
		}
		a.chunks = append(a.chunks, c)
		if ch, _ := c["choices"].([]any); len(ch) > 0 {
			choice, _ := ch[0].(map[string]any)
			d, _ := choice["delta"].(map[string]any)
			content, _ := d["content"].(string)
			text, _ := choice["text"].(string) // completions
			if content != "" || text != "" {
				a.content = append(a.content, time.Now())
			}
		}
	}
	a.raw = raw.String()
	return a
}

// yieldSeats is the seats of the yield tests' engine. A stream that yielded resumes by the sheddable rule, past
// twice the seats kept for critical requests, and those are at most half the fleet's: a fleet of a few seats
// keeps them all while critical demand is fresh, so that a yielded stream would wait for its idle timeout.
const yieldSeats = 16

// yieldGateway starts the real gateway in front of a simulated vLLM engine of yieldSeats seats stated in the
// policy (10 ms a token), with preempt on the model as asked ("", "sheddable" or "standard", as models[].preempt),
// and an access log in logs when it is not nil. The shedding curve that refuses sheddable requests as the pool
// saturates is off, so that they can fill the engine.
func yieldGateway(t *testing.T, preempt string, logs *syncBuffer, edit func(*routing.BackendConfig)) *gateway {
	t.Helper()
	snap := seatSnapshot(t, yieldSeats)
	editBackends(snap, func(c *routing.BackendConfig) {
		c.MaxNumSeqs = yieldSeats
		if edit != nil {
			edit(c)
		}
	})
	snap.Models["sim-model"].Preempt = preempt != ""
	snap.Models["sim-model"].PreemptAll = preempt == "standard"
	params := admission.DefaultShedParams()
	params.Curves[admission.Sheddable.Index()] = admission.Curve{} // sheddable streams may fill the engine
	snap.Shedder = admission.NewShedder(params, nil)
	var opts Options
	if logs != nil {
		opts.AccessLog = slog.New(slog.NewJSONHandler(logs, nil))
	}
	return startGateway(t, snap, opts)
}

// sheddableStreams starts yieldSeats sheddable streams of body on path, which take every seat of gw's engine,
// and returns once all are well into their answers; wait waits for their ends.
func sheddableStreams(t *testing.T, gw *gateway, path, body string) (wait func() []sseAnswer) {
	t.Helper()
	return classStreams(t, gw, "sheddable", path, body)
}

// classStreams is sheddableStreams for streams of class.
func classStreams(t *testing.T, gw *gateway, class, path, body string) (wait func() []sseAnswer) {
	t.Helper()
	sheddable := map[string]string{"X-Switchyard-Priority": class}
	var wg sync.WaitGroup
	streams := make([]sseAnswer, yieldSeats)
	for i := range streams {
		wg.Go(func() { streams[i] = streamPost(t, gw.url, path, body, sheddable) })
	}
	waitFor(t, 5*time.Second, func() bool {
		c := gw.s.caps.Get("b0")
		return c != nil && c.Inflight() == yieldSeats
	})
	time.Sleep(200 * time.Millisecond)
	return func() []sseAnswer {
		wg.Wait()
		return streams
	}
}

// TestSheddableStreamYieldsItsSeat runs the real gateway in front of a simulated vLLM engine whose seats are all
// taken by sheddable streams when a critical request comes: with preempt on the model, one stream yields its seat,
// the critical request's answer begins before either stream ends, and the stream that yielded goes on as a
// continuation, which its client cannot tell from one answer: one id throughout, one role (chat), every token it
// asked for once, and usage that counts them as one answer's. Without preempt the critical request waits for a
// stream to end.
func TestSheddableStreamYieldsItsSeat(t *testing.T) {
	t.Parallel()
	const long = 120 // 1.2 s at 10 ms a token
	chat := fmt.Sprintf(`{"model":"sim-model","max_tokens":%d,"stream":true,`+
		`"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"yield"}]}`, long)
	completions := fmt.Sprintf(`{"model":"sim-model","max_tokens":%d,"stream":true,`+
		`"stream_options":{"include_usage":true},"prompt":"Once upon a time"}`, long)
	for _, tc := range []struct {
		name, path, body string
		preempt, class   string // models[].preempt; the streams' class
		yields           bool
	}{
		{"chat", "/v1/chat/completions", chat, "sheddable", "sheddable", true},
		{"chat without preempt", "/v1/chat/completions", chat, "", "sheddable", false},
		{"completions", "/v1/completions", completions, "sheddable", "sheddable", true},
		{"standard streams", "/v1/chat/completions", chat, "standard", "standard", true},
		{"standard streams, preempt sheddable", "/v1/chat/completions", chat, "sheddable", "standard", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			gw := yieldGateway(t, tc.preempt, &logs, nil)

			wait := classStreams(t, gw, tc.class, tc.path, tc.body)
			st := NewAdmin(gw.s, gw.reg).Models()[0].Yields // /debug/models
			switch want := map[bool]int{true: yieldSeats, false: 0}[tc.yields]; {
			case tc.preempt == "" && st != nil:
				t.Errorf("/debug/models shows yields %+v without preempt", st)
			case tc.preempt != "" && (st == nil || st.Streams != want || st.Asked != 0 || st.CriticalWaiting != 0):
				t.Errorf("/debug/models yields %+v before the critical request, want %d streams", st, want)
			}
			critical := streamPost(t, gw.url, "/v1/chat/completions", seatStreamBody(3), criticalHeader)
			streams := wait()

			if critical.status != 200 || len(critical.content) == 0 {
				t.Fatalf("critical: %d %s", critical.status, critical.raw)
			}
			firstEnd := streams[0].done
			for _, s := range streams[1:] {
				if s.done.Before(firstEnd) {
					firstEnd = s.done
				}
			}
			began := critical.content[0].Before(firstEnd)
			if began != tc.yields {
				t.Errorf("the critical answer began before a %s stream ended: %v, want %v", tc.class, began, tc.yields)
			}
			for i, s := range streams {
				checkOneAnswer(t, fmt.Sprintf("stream %d", i), s, long, tc.path == "/v1/chat/completions")
			}
			want := map[bool]float64{true: 1, false: 0}[tc.yields]
			for _, outcome := range []string{"yielded", "resumed"} {
				if got := counterWith(t, gw, "switchyard_yields_total", "outcome", outcome); got != want {
					t.Errorf("switchyard_yields_total{outcome=%s} = %v, want %v", outcome, got, want)
				}
			}
			if got := counterWith(t, gw, "switchyard_yields_total", "class", tc.class); got != 2*want {
				t.Errorf("switchyard_yields_total{class=%s} = %v, want %v", tc.class, got, 2*want)
			}
			yielded := 0
			for _, l := range logs.lines(t) {
				if l["yields"] == 1.0 && l["class"] == tc.class && l["status"] == 200.0 {
					yielded++
				}
			}
			if int(want) != yielded {
				t.Errorf("%d access log lines of a %s stream say yields=1, want %v:\n%s", yielded, tc.class, want,
					logs.String())
			}
		})
	}
}

// checkOneAnswer checks that a stream reads as one answer of tokens: status 200, [DONE], one id, one role (chat;
// none for completions), tokens content events, and usage that counts tokens of output.
func checkOneAnswer(t *testing.T, what string, s sseAnswer, tokens int, chat bool) {
	t.Helper()
	if s.status != 200 || s.done.IsZero() {
		t.Errorf("%s: status %d, [DONE] %v:\n%s", what, s.status, !s.done.IsZero(), s.raw)
		return
	}
	ids, roles := map[any]bool{}, 0
	var usage map[string]any
	for _, c := range s.chunks {
		ids[c["id"]] = true
		if u, ok := c["usage"].(map[string]any); ok {
			usage = u
		}
		if ch, _ := c["choices"].([]any); len(ch) > 0 {
			if d, _ := ch[0].(map[string]any)["delta"].(map[string]any); d["role"] != nil {
				roles++
			}
		}
	}
	if wantRoles := map[bool]int{true: 1, false: 0}[chat]; len(ids) != 1 || roles != wantRoles {
		t.Errorf("%s: ids %v, %d role deltas; want one of each:\n%s", what, ids, roles, s.raw)
	}
	if len(s.content) != tokens {
		t.Errorf("%s: %d content events, want %d", what, len(s.content), tokens)
	}
	if usage == nil || usage["completion_tokens"] != float64(tokens) ||
		usage["total_tokens"] != usage["prompt_tokens"].(float64)+float64(tokens) {
		t.Errorf("%s: usage %v, want %d completion tokens", what, usage, tokens)
	}
}

// TestYieldersAskTheLeastYielded checks whom a critical request that waits asks for a seat: one stream per
// critical request waiting beyond the yields under way, sheddable streams before standard ones, of those the ones
// that yielded least, the most recent; nobody once every waiting critical request has its yield coming; and a
// stream that registers while a critical request waits unasked is asked at once.
func TestYieldersAskTheLeastYielded(t *testing.T) {
	var y yielders
	rec := &modelRec{yield: &y}
	stream := func(c admission.Class, yields int) *exchange {
		ex := &exchange{wd: &watchdog{}, routed: routed{cur: &attempt{}, class: c, rec: rec}}
		ex.yields = yields
		return ex
	}
	streams := []*exchange{stream(admission.Sheddable, 1), stream(admission.Standard, 0),
		stream(admission.Sheddable, 0), stream(admission.Sheddable, 1)}
	for _, ex := range streams {
		y.add(ex)
	}
	asked := func() []int {
		var out []int
		for i, ex := range streams {
			if ex.yieldAsked {
				out = append(out, i)
			}
		}
		return out
	}
	for step, want := range [][]int{{2}, {2, 3}, {0, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}} {
		y.enter(rec)
		if got := asked(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("after %d critical requests waited, streams asked %v, want %v", step+1, got, want)
		}
	}
	for i, ex := range streams {
		if p := ex.cur.killed.Load(); p == nil || *p != errYield {
			t.Errorf("stream %d's attempt was not killed with errYield", i)
		}
	}
	if y.owed != 4 || y.want != 5 || len(y.live) != 0 {
		t.Errorf("owed %d, want %d, live %d; want 4, 5, 0", y.owed, y.want, len(y.live))
	}
	y.freed() // a seat is free, and its critical request took it
	y.leave()
	y.enter(rec) // another critical request waits: yields fall short of the waiting, but no stream is left to ask
	if y.owed != 3 || y.want != 5 {
		t.Errorf("owed %d, want %d; want 3, 5", y.owed, y.want)
	}
	// A stream that registers now (admitted before those critical requests came, at its first token) is asked
	// at once.
	late := stream(admission.Sheddable, 0)
	y.add(late)
	if p := late.cur.killed.Load(); !late.yieldAsked || p == nil || *p != errYield || y.owed != 4 || len(y.live) != 0 {
		t.Errorf("a stream registered while yields fell short: asked %v, owed %d, live %d; want asked, 4, 0",
			late.yieldAsked, y.owed, len(y.live))
	}
	for range 5 {
		y.leave()
	}
	idle := stream(admission.Sheddable, 0)
	y.add(idle) // no critical request waits: it keeps its seat
	if st := y.status(); idle.yieldAsked || st.Streams != 1 || st.Asked != 4 || st.CriticalWaiting != 0 {
		t.Errorf("a stream registered with no critical request waiting: asked %v, status %+v; want false, "+
			"1 stream, 4 asked, none waiting", idle.yieldAsked, st)
	}
	if idle.unregister(); len(y.live) != 0 {
		t.Errorf("live %d after the stream ended, want 0", len(y.live))
	}
}

// TestStandardStreamYieldsOnlyIfItMayResumeInTime: a critical request waiting for a seat asks a standard stream
// only if that stream may expect a seat back within its class's TTFT objective (admission.SeatReserve.ResumeWait):
// not at a spike's start whose critical arrivals alone outrun the completions (a sheddable stream is asked
// instead), nor while so many critical requests wait that the completions left to others come too late; once the
// demand falls back, it is asked.
func TestStandardStreamYieldsOnlyIfItMayResumeInTime(t *testing.T) {
	clk := newFakeClock()
	var y yielders
	rec := &modelRec{yield: &y, reserve: admission.NewSeatReserve(clk), resumeBy: time.Second}
	arrive := func(crit, other int) {
		for range crit {
			rec.reserve.Arrive(admission.Critical)
		}
		for range other {
			rec.reserve.Arrive(admission.Standard)
		}
	}
	second := func(crit, other, done int) { // one second of the model's traffic
		arrive(crit, other)
		for range done {
			rec.reserve.Done()
		}
		clk.Advance(time.Second)
	}
	for range 60 {
		second(2, 8, 20) // critical requests a fifth of the arrivals, a tenth of the completions: rho 0.2
	}
	stream := func(c admission.Class) *exchange {
		return &exchange{wd: &watchdog{}, routed: routed{cur: &attempt{}, class: c, rec: rec}}
	}
	std, shed := stream(admission.Standard), stream(admission.Sheddable)
	arrive(50, 200) // a spike's first tenth of a second: every class at many times the completions
	y.add(std)
	y.enter(rec)
	if std.yieldAsked || y.owed != 0 {
		t.Fatalf("spike: a standard stream was asked to yield (owed %d, rho %.2f)", y.owed, rec.reserve.Status(0, 0).Rho)
	}
	y.add(shed) // a sheddable stream that registers meanwhile is asked at once
	if !shed.yieldAsked || std.yieldAsked || y.owed != 1 {
		t.Fatalf("spike: sheddable asked %v, standard asked %v, owed %d; want true, false, 1", shed.yieldAsked,
			std.yieldAsked, y.owed)
	}
	y.freed()
	y.leave()
	for range 61 {
		second(2, 8, 20) // the spike is over, and a minute has passed
	}
	// Twenty critical requests wait when the stream registers: it would wait for twenty completions at the 16 a
	// second left to it.
	std.unregister()
	for range 20 {
		y.enter(rec)
	}
	y.add(std)
	if std.yieldAsked {
		t.Fatalf("twenty critical requests waiting: a standard stream was asked, though its seat would come back "+
			"after %v", func() time.Duration { w, _ := rec.reserve.ResumeWait(20, 0); return w }())
	}
	for range 19 {
		y.leave()
	}
	y.add(stream(admission.Sheddable)) // one of them takes a sheddable stream's seat
	if y.owed != 1 || y.want != 1 {
		t.Fatalf("owed %d, want %d; want 1, 1", y.owed, y.want)
	}
	y.freed()
	y.leave()
	y.enter(rec) // one critical request waits: the stream may expect its seat back in about 60 ms
	if !std.yieldAsked || y.owed != 1 {
		t.Errorf("one critical request waiting after the spike: standard asked %v, owed %d; want true, 1",
			std.yieldAsked, y.owed)
	}
}

// TestCriticalRequestAsksOnlyWhenQueued: a critical request that goes through the queue asks a stream for its seat
// only once it is queued: one the queue dispatches at once (a seat of the reserve was free) asks nobody, one that
// must wait asks one stream, and stops counting as waiting once dispatched.
func TestCriticalRequestAsksOnlyWhenQueued(t *testing.T) {
	var y yielders
	var free atomic.Bool
	q := admission.NewQueue(admission.QueueConfig[*exchange]{Dispatch: func(*exchange) error {
		if free.Load() {
			return nil
		}
		return admission.ErrNoCapacity
	}})
	t.Cleanup(q.Close)
	rec := &modelRec{yield: &y, queue: q}
	stream := &exchange{wd: &watchdog{}, routed: routed{cur: &attempt{}, class: admission.Sheddable, rec: rec}}
	y.add(stream)
	critical := &exchange{routed: routed{class: admission.Critical, rec: rec}}
	deadline := time.Now().Add(10 * time.Second)

	free.Store(true)
	if err := critical.waitForSeat(t.Context(), deadline); err != nil {
		t.Fatal(err)
	}
	if st := y.status(); stream.yieldAsked || st.Asked != 0 || st.CriticalWaiting != 0 {
		t.Fatalf("a critical request dispatched at once: stream asked %v, %+v; want nobody asked", stream.yieldAsked, st)
	}

	free.Store(false)
	done := make(chan error, 1)
	go func() { done <- critical.waitForSeat(t.Context(), deadline) }()
	waitFor(t, 5*time.Second, func() bool { st := y.status(); return st.Asked == 1 && st.CriticalWaiting == 1 })
	free.Store(true)
	q.Signal()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := y.status(); st.CriticalWaiting != 0 || st.Streams != 0 {
		t.Errorf("after the critical request was dispatched: %+v, want none waiting and the stream gone", st)
	}
}

// TestYieldedStreamThroughTheOpenAIClient reads streams that yield their seat with the official OpenAI Go client,
// as an application would: each stream's accumulated answer has every token it asked for, one id, finish reason
// length and the usage of one answer, whichever of them yielded.
func TestYieldedStreamThroughTheOpenAIClient(t *testing.T) {
	t.Parallel()
	gw := yieldGateway(t, "sheddable", nil, nil)
	client := sdk(gw.url)
	ctx := t.Context()

	const long = 120
	params := chatParams("yield through the SDK", long)
	params.StreamOptions = oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}
	var wg sync.WaitGroup
	accs := make([]oai.ChatCompletionAccumulator, yieldSeats)
	ids := make([]map[string]bool, yieldSeats)
	tokens := make([]int, yieldSeats)
	for i := range accs {
		ids[i] = map[string]bool{}
		wg.Go(func() {
			s := client.Chat.Completions.NewStreaming(ctx, params, option.WithHeader("X-Switchyard-Priority", "sheddable"))
			for s.Next() {
				c := s.Current()
				accs[i].AddChunk(c)
				ids[i][c.ID] = true
				if len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
					tokens[i]++
				}
			}
			if err := s.Err(); err != nil {
				t.Errorf("stream %d: %v", i, err)
			}
		})
	}
	waitFor(t, 5*time.Second, func() bool {
		c := gw.s.caps.Get("b0")
		return c != nil && c.Inflight() == yieldSeats
	})
	time.Sleep(200 * time.Millisecond)
	crit, err := client.Chat.Completions.New(ctx, chatParams("urgent", 3), option.WithHeader("X-Switchyard-Priority", "critical"))
	if err != nil || len(crit.Choices) != 1 {
		t.Fatalf("critical: %v %+v", err, crit)
	}
	wg.Wait()
	for i, acc := range accs {
		if len(acc.Choices) != 1 || acc.Choices[0].FinishReason != "length" || tokens[i] != long || len(ids[i]) != 1 ||
			acc.Usage.CompletionTokens != long || acc.Usage.TotalTokens != acc.Usage.PromptTokens+long {
			t.Errorf("stream %d: %d tokens, ids %v, usage %+v, choices %+v", i, tokens[i], ids[i], acc.Usage, acc.Choices)
		}
	}
	if n := counterValue(t, gw.reg, "switchyard_yields_total"); n != 2 {
		t.Errorf("switchyard_yields_total = %v, want 2 (one stream yielded and resumed)", n)
	}
}

// TestYieldedStreamThatCannotResume checks the end of a stream that yielded its seat and got none back within its
// backend's idle timeout: its client is told so in an error event and [DONE], after the tokens it had, and the
// gateway counts it as not resumed.
func TestYieldedStreamThatCannotResume(t *testing.T) {
	t.Parallel()
	gw := yieldGateway(t, "sheddable", nil, func(c *routing.BackendConfig) {
		c.Timeouts.Idle = 300 * time.Millisecond // the other streams hold the seats a resume may take for 1 s
	})

	body := `{"model":"sim-model","max_tokens":120,"stream":true,"messages":[{"role":"user","content":"yield"}]}`
	wait := sheddableStreams(t, gw, "/v1/chat/completions", body)
	if c := streamPost(t, gw.url, "/v1/chat/completions", seatStreamBody(3), criticalHeader); c.status != 200 ||
		c.done.IsZero() {
		t.Fatalf("critical: %d %s", c.status, c.raw)
	}
	streams := wait()

	broken := 0
	for i, s := range streams {
		switch {
		case len(s.content) == 120 && !strings.Contains(s.raw, `"error"`):
		case len(s.content) > 0 && len(s.content) < 120 && strings.Contains(s.raw, "could not resume") && !s.done.IsZero():
			broken++
		default:
			t.Errorf("stream %d: %d tokens:\n%s", i, len(s.content), s.raw)
		}
	}
	if broken != 1 {
		t.Errorf("%d streams ended not resumed, want 1", broken)
	}
	if got := counterWith(t, gw, "switchyard_stream_ends_total", "cause", "not_resumed"); got != 1 {
		t.Errorf("switchyard_stream_ends_total{cause=not_resumed} = %v, want 1", got)
	}
	if got := counterWith(t, gw, "switchyard_stream_ends_total", "backend", "none"); got != 0 {
		t.Errorf("switchyard_stream_ends_total{backend=none} = %v, want 0: the stream that could not resume "+
			"ended on the backend it yielded", got)
	}
	if got := counterWith(t, gw, "switchyard_yields_total", "outcome", "failed"); got != 1 {
		t.Errorf("switchyard_yields_total{outcome=failed} = %v, want 1", got)
	}
}

// seatStreamBody is a streamed chat request for an answer of tokens.
func seatStreamBody(tokens int) string {
	return fmt.Sprintf(`{"model":"sim-model","max_tokens":%d,"stream":true,"messages":[{"role":"user","content":"seat"}]}`,
		tokens)
}
