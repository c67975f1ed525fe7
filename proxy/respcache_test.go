package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	oai "github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/redis/go-redis/v9"

	"github.com/switchyard/switchyard/cache"
	"github.com/switchyard/switchyard/internal/redistest"
	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

func cachedGateway(t *testing.T, store cache.Store, onErr func(string, error), urls ...string) *gateway {
	t.Helper()
	snap := snapshotOf(&routing.RoundRobin{}, 2, urls...)
	snap.Models["sim-model"].Cache = &ResponseCache{Store: store, TTL: time.Minute, MaxEntryBytes: 1 << 20,
		Timeout: time.Second, OnError: onErr}
	return startGateway(t, snap, Options{})
}

func chatBody(stream bool, extra string) string {
	s := `{"model":"sim-model","max_tokens":12,"messages":[{"role":"user","content":"Tell me about caches."}]` + extra
	if stream {
		s += `,"stream":true,"stream_options":{"include_usage":true}`
	}
	return s + "}"
}

// TestResponseCacheHitAsJSONAndAsStream: a deterministic answer is kept after the first request (miss) and
// given again without a backend, as the same JSON body, and replayed as a stream an OpenAI SDK reads as the same
// text; sampled requests and "off" bypass it, "on" opts in.
func TestResponseCacheHitAsJSONAndAsStream(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	gw := cachedGateway(t, cache.NewMemoryStore(1<<20, nil), func(op string, err error) { t.Errorf("%s: %v", op, err) }, be.URL())

	first := post(t, gw.url, chatBody(false, `,"temperature":0`), nil)
	if first.code != 200 || first.header.Get(headerCache) != "miss" || first.backend != "b0" {
		t.Fatalf("first: %d %q from %s", first.code, first.header.Get(headerCache), first.backend)
	}
	var hit answer
	waitFor(t, 2*time.Second, func() bool { // the answer is stored off the request path
		hit = post(t, gw.url, chatBody(false, `,"temperature":0`), nil)
		return hit.header.Get(headerCache) == "hit"
	})
	if hit.code != 200 || hit.backend != "cache" || hit.body != first.body {
		t.Fatalf("hit: %d from %s\n got %s\nwant %s", hit.code, hit.backend, hit.body, first.body)
	}
	var whole oai.ChatCompletion
	if err := json.Unmarshal([]byte(first.body), &whole); err != nil {
		t.Fatal(err)
	}

	// The same request streamed (with include_usage) is the same answer, replayed as chunks.
	client := oai.NewClient(option.WithBaseURL(gw.url+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	p := oai.ChatCompletionNewParams{Model: "sim-model", MaxTokens: oai.Int(12), Temperature: oai.Float(0),
		Messages:      []oai.ChatCompletionMessageParamUnion{oai.UserMessage("Tell me about caches.")},
		StreamOptions: oai.ChatCompletionStreamOptionsParam{IncludeUsage: oai.Bool(true)}}
	s := client.Chat.Completions.NewStreaming(context.Background(), p)
	var text strings.Builder
	var usage int64
	finish := ""
	for s.Next() {
		c := s.Current()
		for _, ch := range c.Choices {
			text.WriteString(ch.Delta.Content)
			if ch.FinishReason != "" {
				finish = ch.FinishReason
			}
		}
		usage += c.Usage.TotalTokens
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if text.String() != whole.Choices[0].Message.Content || finish != string(whole.Choices[0].FinishReason) ||
		usage != whole.Usage.TotalTokens {
		t.Fatalf("replayed stream: %q finish %q usage %d; the answer: %q finish %q usage %d", text.String(), finish,
			usage, whole.Choices[0].Message.Content, whole.Choices[0].FinishReason, whole.Usage.TotalTokens)
	}

	for _, tc := range []struct {
		name, extra string
		hdr         map[string]string
		want        string
	}{
		{"sampled", `,"temperature":0.7`, nil, ""},
		{"no temperature", ``, nil, ""},
		{"off", `,"temperature":0`, map[string]string{headerCache: "off"}, ""},
		{"on", `,"temperature":0.7`, map[string]string{headerCache: "on"}, "miss"},
	} {
		if a := post(t, gw.url, chatBody(false, tc.extra), tc.hdr); a.code != 200 || a.header.Get(headerCache) != tc.want || a.backend != "b0" {
			t.Errorf("%s: %d, cache %q from %s; want %q from b0", tc.name, a.code, a.header.Get(headerCache), a.backend, tc.want)
		}
	}
}

// TestResponseCacheKeepsStreamedAnswers: an answer first streamed is kept (assembled as it was relayed) and given
// as JSON to a later non-streaming request.
func TestResponseCacheKeepsStreamedAnswers(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	gw := cachedGateway(t, cache.NewMemoryStore(1<<20, nil), nil, be.URL())
	ctx := context.Background()
	p := chatParams("Stream first, then ask again.", 10)
	p.Temperature = oai.Float(0)
	streamed, err := streamChat(ctx, sdk(gw.url), p)
	if err != nil || streamed == "" {
		t.Fatalf("stream: %q %v", streamed, err)
	}
	var got *oai.ChatCompletion
	waitFor(t, 2*time.Second, func() bool {
		var cached string
		got, cached, err = chatWithCacheHeader(ctx, gw.url, p)
		return err == nil && cached == "hit"
	})
	if got.Choices[0].Message.Content != streamed || got.Model != "sim-model" || got.Usage.CompletionTokens == 0 {
		t.Fatalf("kept answer %q (model %q, usage %+v), streamed %q", got.Choices[0].Message.Content, got.Model, got.Usage, streamed)
	}
}

// chatWithCacheHeader sends a non-streaming chat through the SDK and returns the X-Switchyard-Cache header too.
func chatWithCacheHeader(ctx context.Context, base string, p oai.ChatCompletionNewParams) (*oai.ChatCompletion, string, error) {
	var raw *http.Response
	c := oai.NewClient(option.WithBaseURL(base+"/v1"), option.WithAPIKey("k"), option.WithMaxRetries(0))
	res, err := c.Chat.Completions.New(ctx, p, option.WithResponseInto(&raw))
	if raw == nil {
		return res, "", err
	}
	return res, raw.Header.Get(headerCache), err
}

// TestResponseCacheSharedThroughRedis: an answer one replica kept in Redis is another replica's hit; with
// Redis gone every request is still answered (a miss), and the failures are reported.
func TestResponseCacheSharedThroughRedis(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond })
	c := redistest.Client(t, redistest.Addr(t))
	store := cache.NewRedisStore(c, redistest.Prefix(t))
	noErr := func(op string, err error) { t.Errorf("%s: %v", op, err) }
	gw1, gw2 := cachedGateway(t, store, noErr, be.URL()), cachedGateway(t, store, noErr, be.URL())
	body := chatBody(true, `,"temperature":0`)
	if a := post(t, gw1.url, body, nil); a.code != 200 || a.header.Get(headerCache) != "miss" {
		t.Fatalf("replica 1: %d %q", a.code, a.header.Get(headerCache))
	}
	var hit answer
	waitFor(t, 2*time.Second, func() bool {
		hit = post(t, gw2.url, body, nil)
		return hit.header.Get(headerCache) == "hit"
	})
	if hit.code != 200 || !strings.HasSuffix(hit.body, "data: [DONE]\n\n") || !strings.Contains(hit.body, `"usage"`) {
		t.Fatalf("replica 2's hit: %d %s", hit.code, hit.body)
	}

	dead := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{"127.0.0.1:1"}, MaxRetries: -1, DialerRetries: 1})
	defer dead.Close()
	var errs atomic.Int64
	gw3 := cachedGateway(t, cache.NewRedisStore(dead, "x:"), func(string, error) { errs.Add(1) }, be.URL())
	for range 3 {
		if a := post(t, gw3.url, body, nil); a.code != 200 || a.header.Get(headerCache) != "miss" || a.backend != "b0" {
			t.Fatalf("with Redis down: %d %q from %s", a.code, a.header.Get(headerCache), a.backend)
		}
	}
	waitFor(t, 2*time.Second, func() bool { return errs.Load() >= 3 })
}
