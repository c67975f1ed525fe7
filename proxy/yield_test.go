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
// policy (10 ms a token), with preempt on the model as asked, and an access log in logs when it is not nil. The
// shedding curve that refuses sheddable requests as the pool saturates is off, so that they can fill the engine.
func yieldGateway(t *testing.T, preempt bool, logs *syncBuffer, edit func(*routing.BackendConfig)) *gateway {
	t.Helper()
	snap := seatSnapshot(t, yieldSeats)
	editBackends(snap, func(c *routing.BackendConfig) {
		c.MaxNumSeqs = yieldSeats
		if edit != nil {
			edit(c)
		}
	})
	snap.Models["sim-model"].Preempt = preempt
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
	sheddable := map[string]string{"X-Switchyard-Priority": "sheddable"}
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
		preempt          bool
	}{
		{"chat", "/v1/chat/completions", chat, true},
		{"chat without preempt", "/v1/chat/completions", chat, false},
		{"completions", "/v1/completions", completions, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var logs syncBuffer
			gw := yieldGateway(t, tc.preempt, &logs, nil)

			wait := sheddableStreams(t, gw, tc.path, tc.body)
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
			if began != tc.preempt {
				t.Errorf("the critical answer began before a sheddable stream ended: %v, want %v", began, tc.preempt)
			}
			resumed := counterValue(t, gw.reg, "switchyard_yields_total")
			for i, s := range streams {
				checkOneAnswer(t, fmt.Sprintf("stream %d", i), s, long, tc.path == "/v1/chat/completions")
			}
			if want := map[bool]float64{true: 2, false: 0}[tc.preempt]; resumed != want {
				t.Errorf("switchyard_yields_total = %v, want %v (yielded and resumed)", resumed, want)
			}
			yielded := 0
			for _, l := range logs.lines(t) {
				if l["yields"] == 1.0 && l["class"] == "sheddable" && l["status"] == 200.0 {
					yielded++
				}
			}
			if want := map[bool]int{true: 1, false: 0}[tc.preempt]; yielded != want {
				t.Errorf("%d access log lines of a sheddable stream say yields=1, want %d:\n%s", yielded, want, logs.String())
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
// critical request waiting beyond the yields under way, of the streams that yielded least the most recent, and
// nobody once every waiting critical request has its yield coming.
func TestYieldersAskTheLeastYielded(t *testing.T) {
	var y yielders
	streams := make([]*exchange, 3)
	for i, yields := range []int{1, 0, 1} {
		streams[i] = &exchange{wd: &watchdog{}, routed: routed{cur: &attempt{}}}
		streams[i].yields = yields
		y.add(streams[i])
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
	for step, want := range [][]int{{1}, {1, 2}, {0, 1, 2}, {0, 1, 2}} {
		y.enter()
		if got := asked(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("after %d critical requests waited, streams asked %v, want %v", step+1, got, want)
		}
	}
	for i, ex := range streams {
		if p := ex.cur.killed.Load(); p == nil || *p != errYield {
			t.Errorf("stream %d's attempt was not killed with errYield", i)
		}
	}
	if y.owed != 3 || y.want != 4 || len(y.live) != 0 {
		t.Errorf("owed %d, want %d, live %d; want 3, 4, 0", y.owed, y.want, len(y.live))
	}
	y.freed() // a seat is free, and its critical request took it
	y.leave()
	y.enter() // another critical request waits: yields fall short of the waiting, but no stream is left to ask
	if y.owed != 2 || y.want != 4 {
		t.Errorf("owed %d, want %d; want 2, 4", y.owed, y.want)
	}
}

// TestYieldedStreamThroughTheOpenAIClient reads streams that yield their seat with the official OpenAI Go client,
// as an application would: each stream's accumulated answer has every token it asked for, one id, finish reason
// length and the usage of one answer, whichever of them yielded.
func TestYieldedStreamThroughTheOpenAIClient(t *testing.T) {
	t.Parallel()
	gw := yieldGateway(t, true, nil, nil)
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
	gw := yieldGateway(t, true, nil, func(c *routing.BackendConfig) {
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
	if got := counterWith(t, gw, "switchyard_yields_total", "outcome", "failed"); got != 1 {
		t.Errorf("switchyard_yields_total{outcome=failed} = %v, want 1", got)
	}
}

// seatStreamBody is a streamed chat request for an answer of tokens.
func seatStreamBody(tokens int) string {
	return fmt.Sprintf(`{"model":"sim-model","max_tokens":%d,"stream":true,"messages":[{"role":"user","content":"seat"}]}`,
		tokens)
}
