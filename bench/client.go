package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// Error kinds of a failed request (Sample.Err). A request succeeds only with status 200 and a complete answer:
// for a stream, "data: [DONE]" and no error event; for a JSON body, a parseable body without "error".
const (
	ErrStatus     = "status"      // a non-200 status (the code is in Sample.Status)
	ErrEvent      = "error_event" // a "data: {"error":...}" event (or "event: error") in a 200 stream
	ErrIncomplete = "incomplete"  // the stream ended without "data: [DONE]"
	ErrBadBody    = "bad_body"    // a 200 body that is not an OpenAI answer
	ErrTransport  = "transport"   // no response: connection refused, reset, ...
	ErrTimeout    = "timeout"     // the per-request timeout expired
	ErrCanceled   = "canceled"    // the run was stopped (Ctrl-C)
	ErrOverload   = "client_overload"
	ErrPick       = "pick" // the oracle could not choose a backend (every prediction failed); not sent
)

// Sample is what one request measured. Durations count from the request's scheduled time (so a late send shows in
// its latency, the cure for coordinated omission), except for a session turn held back by its previous answer,
// which counts from its release (see Sessions).
type Sample struct {
	Index   int
	Sent    bool
	Stream  bool
	Status  int    // HTTP status; 0 when no response arrived
	Err     string // "" on success, else one of the Err* kinds
	ErrMsg  string
	Backend string // X-Switchyard-Backend, else X-Sim-Backend
	// Late is how long after its scheduled time (or release, for a held session turn) the request was sent.
	Late time.Duration
	// SessionWait is how long a session turn waited past its scheduled time for the previous answer.
	SessionWait time.Duration
	// SendAt is the send time from the start of the load.
	SendAt time.Duration
	// TTFT is the time to the first event carrying content (streams only; 0 when none arrived).
	TTFT time.Duration
	// E2E is the time to the last byte of the response.
	E2E time.Duration
	// ITL holds the gaps between consecutive content events (streams only).
	ITL []time.Duration
	// ContentEvents counts events that carried content; OutputTokens is usage.completion_tokens when the answer
	// reported it, else ContentEvents.
	ContentEvents int
	OutputTokens  int
	CachedTokens  int
	Pings         int
	// Pick is how long choosing the target took (the oracle's predictions), before the send; it is not part of
	// TTFT or E2E. Zero without a Picker.
	Pick time.Duration
}

// Client is the harness's own OpenAI client over plain HTTP/1.1. It is safe for concurrent use; Close releases
// its idle connections.
type Client struct {
	base    string
	hc      *http.Client
	headers http.Header
}

// NewClient returns a client for the OpenAI API at base (e.g. "http://127.0.0.1:8080"), with a transport sized
// for thousands of concurrent streams (no per-host connection cap, a large idle pool, no compression, which would
// hide chunk timing). timeout bounds each request, from send to last byte.
func NewClient(base string, timeout time.Duration, headers http.Header) *Client {
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   8192,
		MaxConnsPerHost:       0,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
		ResponseHeaderTimeout: 0,
		ReadBufferSize:        16 << 10,
		WriteBufferSize:       16 << 10,
	}
	return &Client{base: strings.TrimRight(base, "/"), hc: &http.Client{Transport: tr, Timeout: timeout}, headers: headers}
}

// Close closes idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Do sends it and measures it. origin is the instant latencies count from (the scheduled time, or a session turn's
// release); start is the start of the load. Do never returns an error: failures are recorded in the Sample.
func (c *Client) Do(ctx context.Context, it *Item, start, origin time.Time) Sample {
	return c.DoAt(ctx, c.base, it, start, origin)
}

// DoAt is Do against another base URL than the client's (a per-request pick), on the same connection pool.
func (c *Client) DoAt(ctx context.Context, base string, it *Item, start, origin time.Time) Sample {
	s := Sample{Index: it.Index, Stream: it.Stream, Sent: true}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(base, "/")+it.Endpoint.String(),
		bytes.NewReader(it.Body))
	if err != nil {
		s.Err, s.ErrMsg = ErrTransport, err.Error()
		return s
	}
	for k, v := range c.headers {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	if it.Stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	if it.Priority != "" {
		req.Header.Set(PriorityHeader, it.Priority)
	}
	now := time.Now()
	s.SendAt, s.Late = now.Sub(start), now.Sub(origin)
	resp, err := c.hc.Do(req)
	if err != nil {
		s.E2E = time.Since(origin)
		s.Err, s.ErrMsg = classify(ctx, err), err.Error()
		return s
	}
	defer resp.Body.Close()
	s.Status = resp.StatusCode
	s.Backend = resp.Header.Get("X-Switchyard-Backend")
	if s.Backend == "" {
		s.Backend = resp.Header.Get("X-Sim-Backend")
	}
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		s.E2E = time.Since(origin)
		s.Err, s.ErrMsg = ErrStatus, strings.TrimSpace(string(msg))
		return s
	}
	isSSE := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	switch {
	case it.Stream && !isSSE:
		// A stream was asked for and a whole body came back: there are no token times to measure, and a client
		// SDK reading SSE would fail on it.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		s.E2E = time.Since(origin)
		s.Err, s.ErrMsg = ErrBadBody, "asked for a stream, got Content-Type "+resp.Header.Get("Content-Type")
		return s
	case isSSE:
		err = readStream(resp.Body, origin, &s)
	default:
		err = readJSON(resp.Body, &s)
		s.E2E = time.Since(origin)
	}
	if err != nil && s.Err == "" {
		s.Err, s.ErrMsg = classify(ctx, err), err.Error()
	}
	return s
}

func classify(ctx context.Context, err error) string {
	var ne net.Error
	switch {
	case errors.Is(ctx.Err(), context.Canceled):
		return ErrCanceled
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return ErrTimeout
	}
	return ErrTransport
}

// chunk is the part of a streamed chunk or a full answer that the harness reads.
type chunk struct {
	Choices []struct {
		Delta struct {
			Content          string `json:"content"`
			ReasoningContent string `json:"reasoning_content"`
		} `json:"delta"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

func (ch *chunk) hasContent() bool {
	for _, c := range ch.Choices {
		if c.Delta.Content != "" || c.Delta.ReasoningContent != "" || c.Text != "" || c.Message.Content != "" {
			return true
		}
	}
	return false
}

func (ch *chunk) errorText() string {
	if len(ch.Error) == 0 || string(ch.Error) == "null" {
		return ""
	}
	return string(ch.Error)
}

// readStream reads an SSE body, timestamping each event as its last line is read. Comments (": ping") are counted
// and otherwise ignored. It fills s and returns only read errors.
func readStream(body io.Reader, origin time.Time, s *Sample) error {
	br := bufio.NewReaderSize(body, 32<<10)
	var (
		data     []byte
		hasData  bool
		isError  bool
		done     bool
		last     time.Time
		usageOut = -1
		line     []byte
	)
	dispatch := func(at time.Time) {
		defer func() { data, hasData, isError = data[:0], false, false }()
		if !hasData {
			return
		}
		if bytes.Equal(data, []byte("[DONE]")) {
			done = true
			return
		}
		var ch chunk
		if err := json.Unmarshal(data, &ch); err != nil {
			if isError {
				s.Err, s.ErrMsg = ErrEvent, string(data)
				return
			}
			if s.Err == "" {
				s.Err, s.ErrMsg = ErrBadBody, "unparseable event: "+truncate(string(data), 200)
			}
			return
		}
		if e := ch.errorText(); e != "" || isError {
			if s.Err == "" || s.Err == ErrBadBody {
				s.Err, s.ErrMsg = ErrEvent, truncate(string(data), 500)
			}
			return
		}
		if ch.Usage != nil {
			usageOut = ch.Usage.CompletionTokens
			if d := ch.Usage.PromptTokensDetails; d != nil {
				s.CachedTokens = d.CachedTokens
			}
		}
		if ch.hasContent() {
			if s.ContentEvents == 0 {
				s.TTFT = at.Sub(origin)
			} else {
				s.ITL = append(s.ITL, at.Sub(last))
			}
			last = at
			s.ContentEvents++
		}
	}
	var readErr error
	for {
		frag, err := br.ReadSlice('\n')
		at := time.Now()
		if err == bufio.ErrBufferFull {
			line = append(line, frag...)
			continue
		}
		if len(line) > 0 {
			frag = append(line, frag...)
			line = line[:0]
		}
		if len(frag) > 0 {
			s.E2E = at.Sub(origin)
		}
		l := bytes.TrimRight(frag, "\r\n")
		switch {
		case len(l) == 0 && len(frag) > 0:
			dispatch(at)
		case len(l) == 0:
		case l[0] == ':':
			if bytes.Contains(l, []byte("ping")) {
				s.Pings++
			}
		case bytes.HasPrefix(l, []byte("data:")):
			v := bytes.TrimPrefix(l[5:], []byte(" "))
			if hasData {
				data = append(data, '\n')
			}
			data, hasData = append(data, v...), true
		case bytes.HasPrefix(l, []byte("event:")):
			isError = string(bytes.TrimSpace(l[6:])) == "error"
		}
		if err != nil {
			dispatch(at) // an event not closed by a blank line still counts
			if err != io.EOF {
				readErr = err
			}
			break
		}
	}
	s.OutputTokens = s.ContentEvents
	if usageOut >= 0 {
		s.OutputTokens = usageOut
	}
	if readErr != nil {
		return readErr
	}
	if !done && s.Err == "" {
		s.Err, s.ErrMsg = ErrIncomplete, "stream ended without data: [DONE]"
	}
	return nil
}

// readJSON reads a non-streaming answer.
func readJSON(body io.Reader, s *Sample) error {
	data, err := io.ReadAll(body)
	if err != nil {
		return err
	}
	var ch chunk
	if err := json.Unmarshal(data, &ch); err != nil {
		s.Err, s.ErrMsg = ErrBadBody, truncate(string(data), 200)
		return nil
	}
	if e := ch.errorText(); e != "" {
		s.Err, s.ErrMsg = ErrEvent, truncate(e, 500)
		return nil
	}
	if !ch.hasContent() && ch.Usage == nil {
		s.Err, s.ErrMsg = ErrBadBody, "no choices: "+truncate(string(data), 200)
		return nil
	}
	if ch.hasContent() {
		s.ContentEvents = 1
	}
	if ch.Usage != nil {
		s.OutputTokens = ch.Usage.CompletionTokens
		if d := ch.Usage.PromptTokensDetails; d != nil {
			s.CachedTokens = d.CachedTokens
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
