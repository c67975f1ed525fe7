package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/switchyard/switchyard/openai"
)

// Kinds of planned request.
const (
	KindSingle  = "single"  // one independent request, maybe with a shared prefix
	KindSession = "session" // one turn of a multi-turn chat
	KindLongDoc = "longdoc" // a long unique document plus a question
)

// Plan is the whole request sequence of a run, generated in advance from a workload and its seed: the arrival
// times and the exact request bodies. A Plan is immutable once made and may be run against any number of targets.
type Plan struct {
	Workload *Workload
	Items    []Item
}

// Item is one planned request.
type Item struct {
	Index int
	// At is the scheduled send time from the start of the load.
	At time.Duration
	// Warmup items are sent but excluded from reports.
	Warmup bool
	Kind   string
	// Session and Turn identify a session turn (Session -1 for other kinds); After is the index of the item whose
	// answer must arrive before this one is sent (-1: none).
	Session, Turn, After int
	// Group is the shared-prefix group, or -1.
	Group    int
	Stream   bool
	Priority string
	// PromptTokens is the canonical prompt length in tokens (openai.BytesPerToken bytes per token).
	PromptTokens int
	MaxTokens    int
	Endpoint     openai.Endpoint
	Body         []byte
}

// NewPlan draws the arrival times and builds every request of w. The same workload (seed included) always gives
// the same items and byte-identical bodies.
func NewPlan(w *Workload) (*Plan, error) {
	g := newGenerator(w)
	p := &Plan{Workload: w}
	span := w.Span()
	arr := rand.New(rand.NewPCG(w.Seed, 0xa11))
	var t time.Duration
	for {
		rate, next := w.rateAt(t)
		if rate <= 0 {
			if next >= span {
				break
			}
			t = next
			continue
		}
		var gap time.Duration
		if w.Arrival.Process == "fixed" {
			gap = time.Duration(float64(time.Second) / rate)
		} else {
			gap = time.Duration(arr.ExpFloat64() / rate * float64(time.Second))
		}
		if t+gap >= next {
			// The rate changes before the next arrival: restart at the change (exact for Poisson, which is
			// memoryless; a fixed process restarts its spacing at each step).
			t = next
			if t >= span {
				break
			}
			continue
		}
		t += gap
		if t >= span {
			break
		}
		if len(p.Items) >= maxPlanItems {
			return nil, fmt.Errorf("bench: plan: more than %d requests; lower the rate or duration", maxPlanItems)
		}
		it, err := g.item(len(p.Items), t)
		if err != nil {
			return nil, err
		}
		p.Items = append(p.Items, it)
	}
	return p, nil
}

// maxPlanItems bounds a plan's memory (bodies are generated in advance).
const maxPlanItems = 2_000_000

// generator holds the random state of request generation. Prefix and document texts come from their own seeded
// streams, so a group's text does not depend on which requests came before.
type generator struct {
	w        *Workload
	r        *rand.Rand
	zipf     []float64 // cumulative group weights
	prefixes map[int]string
	users    []*session
	nextUser int
	sessions int
}

type session struct {
	id, turns, done int
	group           int
	history         []message
	last            int // item index of the previous turn
}

type message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

func newGenerator(w *Workload) *generator {
	g := &generator{w: w, r: rand.New(rand.NewPCG(w.Seed, 0xb0d1)), prefixes: map[int]string{}}
	if p := w.Prefix; p != nil {
		g.zipf = make([]float64, p.Groups)
		sum := 0.0
		for k := range p.Groups {
			var wt float64
			switch p.Skew {
			case "zipf":
				wt = 1 / math.Pow(float64(k+1), p.ZipfS)
			case "hot":
				wt = (1 - p.HotShare) / float64(max(p.Groups-1, 1))
				if k == 0 {
					wt = p.HotShare
				}
			default:
				wt = 1
			}
			sum += wt
			g.zipf[k] = sum
		}
		for k := range g.zipf {
			g.zipf[k] /= sum
		}
	}
	if s := w.Sessions; s != nil {
		g.users = make([]*session, s.Users)
	}
	return g
}

func (g *generator) item(index int, at time.Duration) (Item, error) {
	w := g.w
	it := Item{Index: index, At: at, Warmup: at < w.Warmup, Session: -1, After: -1, Group: -1, Endpoint: openai.Chat}
	if w.API == "completions" {
		it.Endpoint = openai.Completions
	}
	// The draws happen in a fixed order for every item, whatever its kind, so that changing one share does not
	// reshuffle every other choice.
	kindU, streamU, prioU := g.r.Float64(), g.r.Float64(), g.r.Float64()
	it.Stream = streamU < *w.Stream
	it.Priority = g.priority(prioU)
	it.MaxTokens = w.Output.Sample(g.r)
	question := words(g.r, w.Prompt.Sample(g.r))

	var msgs []message
	longShare := 0.0
	if w.LongDocs != nil {
		longShare = w.LongDocs.Share
	}
	switch {
	case kindU < longShare:
		it.Kind = KindLongDoc
		doc := words(g.r, w.LongDocs.Tokens.Sample(g.r))
		msgs = []message{{"user", doc + "\n\nQuestion: " + question}}
	case w.Sessions != nil && kindU < longShare+w.Sessions.Share:
		it.Kind = KindSession
		slot := g.nextUser
		g.nextUser = (slot + 1) % len(g.users)
		s := g.users[slot]
		if s == nil || s.done >= s.turns {
			s = &session{id: g.sessions, turns: w.Sessions.Turns.Sample(g.r), group: g.group(), last: -1}
			g.sessions++
			g.users[slot] = s
			if s.group >= 0 {
				s.history = append(s.history, message{"system", g.prefix(s.group)})
			}
		}
		it.Session, it.Turn, it.After, it.Group = s.id, s.done, s.last, s.group
		s.history = append(s.history, message{"user", question})
		msgs = s.history
		// The answer the next turn repeats is generated here, not taken from the target, so that the request
		// sequence is identical whatever the target answers.
		s.history = append(s.history, message{"assistant", words(g.r, it.MaxTokens)})
		s.done++
		s.last = index
	default:
		it.Kind = KindSingle
		it.Group = g.group()
		if it.Group >= 0 {
			msgs = append(msgs, message{"system", g.prefix(it.Group)})
		}
		msgs = append(msgs, message{"user", question})
	}
	var err error
	it.Body, it.PromptTokens, err = g.body(it, msgs)
	return it, err
}

func (g *generator) priority(u float64) string {
	ps := g.w.Priorities
	if len(ps) == 0 {
		return ""
	}
	total := 0.0
	for _, p := range ps {
		total += p.Weight
	}
	u *= total
	for _, p := range ps {
		if u < p.Weight {
			return p.Value
		}
		u -= p.Weight
	}
	return ps[len(ps)-1].Value
}

// group draws a prefix group (or -1 for none) with two draws whatever the outcome.
func (g *generator) group() int {
	shareU, groupU := g.r.Float64(), g.r.Float64()
	p := g.w.Prefix
	if p == nil || shareU >= *p.Share {
		return -1
	}
	for k, c := range g.zipf {
		if groupU < c {
			return k
		}
	}
	return len(g.zipf) - 1
}

func (g *generator) prefix(k int) string {
	s, ok := g.prefixes[k]
	if !ok {
		r := rand.New(rand.NewPCG(g.w.Seed, 0x9f1c_0000+uint64(k)))
		// The canonical prompt of a chat message is "system:" + text + "\n" (8 bytes, 2 tokens): the text is
		// sized so that the whole prefix is Tokens tokens.
		s = words(r, max(g.w.Prefix.Tokens-2, 1))
		g.prefixes[k] = s
	}
	return s
}

type chatBody struct {
	Model         string         `json:"model"`
	Messages      []message      `json:"messages,omitempty"`
	Prompt        string         `json:"prompt,omitempty"`
	MaxTokens     int            `json:"max_tokens"`
	Stream        bool           `json:"stream"`
	StreamOptions *streamOptions `json:"stream_options,omitempty"`
	IgnoreEOS     bool           `json:"ignore_eos,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

func (g *generator) body(it Item, msgs []message) ([]byte, int, error) {
	b := chatBody{Model: g.w.Model, MaxTokens: it.MaxTokens, Stream: it.Stream, IgnoreEOS: g.w.IgnoreEOS}
	if it.Stream {
		b.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	var n int
	if it.Endpoint == openai.Completions {
		var sb strings.Builder
		for i, m := range msgs {
			if i > 0 {
				sb.WriteString("\n")
			}
			sb.WriteString(m.Content)
		}
		b.Prompt = sb.String()
		n = len(b.Prompt)
	} else {
		b.Messages = msgs
		for _, m := range msgs {
			n += len(m.Role) + 1 + len(m.Content) + 1 // openai's canonical form: role ":" text "\n"
		}
	}
	data, err := json.Marshal(b)
	if err != nil {
		return nil, 0, fmt.Errorf("bench: plan: %w", err)
	}
	return data, openai.EstimateTokens(n), nil
}

// vocab is 512 three-letter pseudo-words: with the space after it each is 4 bytes, one token by
// openai.BytesPerToken, so a text of n words is n tokens long.
var vocab = func() []string {
	const cons, vow = "bcdfghklmnprstvz", "aeiou"
	out := make([]string, 0, 512)
	for _, a := range cons {
		for _, b := range vow {
			for _, c := range cons {
				if len(out) < 512 {
					out = append(out, string([]rune{a, b, c}))
				}
			}
		}
	}
	return out
}()

// words returns n pseudo-words separated by spaces, with a trailing space: 4n bytes.
func words(r *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(4 * n)
	for range n {
		b.WriteString(vocab[r.IntN(len(vocab))])
		b.WriteByte(' ')
	}
	return b.String()
}

// Requests counts the items that are not warm-up.
func (p *Plan) Requests() int {
	n := 0
	for i := range p.Items {
		if !p.Items[i].Warmup {
			n++
		}
	}
	return n
}
