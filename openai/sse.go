package openai

import (
	"bytes"
	"errors"
	"io"
	"sync"
)

// Ping is an SSE comment event. Clients ignore it; the gateway writes it to an idle stream so that a client that
// went away is noticed by the failed write (fasthttp cannot report a disconnect otherwise). Do not modify it.
var Ping = []byte(": ping\n\n")

// AppendDone appends the event that ends an OpenAI stream, "data: [DONE]\n\n", to dst.
func AppendDone(dst []byte) []byte { return append(dst, "data: [DONE]\n\n"...) }

// ErrEventTooLarge is returned by EventReader.Next for an event longer than the reader's bound. It is sticky:
// the stream cannot be resynchronised after it.
var ErrEventTooLarge = errors.New("openai: SSE event too large")

// initialEventBuffer is the size of an EventReader's first buffer: a few of the chunks an engine sends (one is
// 150 to 400 bytes). A reader on an open stream holds its buffer while it waits for the next event, so this is
// part of the gateway's memory per open stream (docs/profiling.md); a larger event doubles the buffer, once per
// reader, and a pooled reader keeps what it grew to.
const initialEventBuffer = 1 << 10

// DefaultMaxEventBytes is the event bound NewEventReader uses when given none: 1 MiB, far above any chunk an
// engine sends (a chunk carries a few tokens, or a final usage object).
const DefaultMaxEventBytes = 1 << 20

// An Event is one server-sent event as an EventReader read it. Its slices alias the reader's buffer and are valid
// only until the next call to Next or Reset: copy what must outlive that.
type Event struct {
	// Raw is the event exactly as received, with its terminating blank line (absent only for a final event cut
	// short by the end of the stream). Relaying Raw reproduces the upstream's bytes.
	Raw []byte
	// Data is the value of the event's data field: the data lines' values joined with '\n' (SSE spec), each
	// without the one optional space after "data:". It is nil when the event has no data line (comment-only
	// events, or only other fields such as "event:" or "id:").
	Data []byte
	// Comment reports an event made only of comment lines (": ping").
	Comment bool
}

// An EventReader reads server-sent events (the WHATWG EventSource format) from an upstream stream. It accepts
// LF, CRLF and CR line endings, events split across reads at any byte, several data lines in one event and
// comment lines, and it bounds the size of an event. Blank lines between events are not events and are skipped.
// An event is returned as soon as its blank line has been read, with one exception: when the bytes read so far
// end in a CR, the reader waits for the next byte, which may be the LF of a CRLF (only servers that end lines
// with a lone CR, which no inference engine does, see their events one read late).
// It is not safe for concurrent use; Reset makes it reusable for another stream without allocating.
type EventReader struct {
	r    io.Reader
	max  int
	buf  []byte // buf[start:end] is read and not yet returned
	data []byte // joined data of a multi-line event

	start, end int
	err        error // sticky error from r, or ErrEventTooLarge
	borrowed   bool  // buf is the caller's (ResetBytes): never written, never kept

	peek   Event // the event Ready found, which Next returns next
	peeked bool

	// Scanning state of the event at buf[start:], kept across reads so a slow stream is not rescanned.
	line                   int // offset from start of the first line not yet examined
	nData, nComment, nElse int
	data0                  Span // first data value, offsets from start
}

// NewEventReader returns a reader of the events in r, failing with ErrEventTooLarge on any event longer than
// maxEventBytes (counting its line endings); maxEventBytes <= 0 means DefaultMaxEventBytes, and bounds above
// 1 GiB are lowered to 1 GiB. The reader's buffer starts at initialEventBuffer and grows with the events, up to the
// bound.
func NewEventReader(r io.Reader, maxEventBytes int) *EventReader {
	if maxEventBytes <= 0 {
		maxEventBytes = DefaultMaxEventBytes
	}
	maxEventBytes = min(maxEventBytes, 1<<30)
	return &EventReader{r: r, max: maxEventBytes}
}

// Buffered returns the size of the reader's buffer, which grows with the largest event read since it was made:
// a pool can drop a reader whose buffer grew past what it wants to keep.
func (er *EventReader) Buffered() int { return cap(er.buf) }

// Reset makes er read from r, forgetting any buffered data and error; it keeps its buffers.
func (er *EventReader) Reset(r io.Reader) {
	if er.borrowed {
		er.buf, er.borrowed = nil, false
	}
	er.r = r
	er.start, er.end, er.err = 0, 0, nil
	er.resetEvent()
}

// ResetBytes makes er return the events in b, the whole of a stream, scanning them in place instead of copying
// them into its own buffer (the gateway replays the events it read before an answer's first token this way,
// once per request). b must not change until the next Reset or ResetBytes; er never writes to it. The Event's
// slices alias b.
func (er *EventReader) ResetBytes(b []byte) {
	er.r, er.buf, er.borrowed = nil, b, true
	er.start, er.end, er.err = 0, len(b), io.EOF
	er.resetEvent()
}

func (er *EventReader) resetEvent() {
	er.line, er.nData, er.nComment, er.nElse = 0, 0, 0, 0
	er.peek, er.peeked = Event{}, false
}

// Ready reports whether the next call to Next returns an event without reading from the stream: a whole event
// is buffered. It may scan that event, which Next then returns. The Event Next returned last stays valid, except
// the Data of an event with several data lines (held in a buffer of the reader's own). Ready does not read, so
// it never blocks; at the end of the stream it reports false.
func (er *EventReader) Ready() bool {
	if er.peeked {
		return true
	}
	if er.err != nil && er.err != io.EOF || er.start >= er.end {
		return false
	}
	ev, ok := er.scan()
	if !ok {
		return false
	}
	er.peek, er.peeked = ev, true
	return true
}

// eventBufs holds buffers of the initial size that readers gave back while they wait (Release); a reader that
// needs its first buffer takes one from here.
var eventBufs = sync.Pool{New: func() any { return new([initialEventBuffer]byte) }}

// Release gives the reader's buffer to a pool shared by all readers when it holds no unread bytes, for a caller
// about to wait for its stream without reading (the gateway's parked streams): a waiting reader then holds no
// buffer, and its next read takes one back. Only a buffer of the initial size goes back; a larger one, grown for
// a large event, is kept. The Event that Next returned last must not be used after Release.
func (er *EventReader) Release() {
	if er.borrowed || er.peeked || er.start != er.end || len(er.buf) != initialEventBuffer {
		return
	}
	p := (*[initialEventBuffer]byte)(er.buf)
	er.buf = nil
	er.start, er.end = 0, 0
	er.resetEvent()
	eventBufs.Put(p)
}

// WouldRead reports whether the next call to Next must read from the stream to return anything: no whole event
// is buffered and the stream has neither ended nor failed. A caller that can wait for the stream's readiness
// without a goroutine (the gateway's parked streams) asks it before calling Next.
func (er *EventReader) WouldRead() bool {
	return er.err == nil && !er.Ready()
}

// Next returns the next event. At a clean end of the stream it returns io.EOF. A final event without its blank
// line is returned as an event when it is complete enough to tell: its data is "[DONE]" or a whole JSON value, or
// it has no data; otherwise Next returns it with io.ErrUnexpectedEOF (the stream was cut mid-event). Read errors
// other than io.EOF are returned as they are, and an event over the bound gives ErrEventTooLarge. The Event's
// slices are valid until the next call to Next or Reset. Next does not allocate once its buffer has grown to
// the size of the stream's events.
func (er *EventReader) Next() (Event, error) {
	if er.peeked {
		ev := er.peek
		er.peek, er.peeked = Event{}, false
		return ev, nil
	}
	for stalls := 0; ; {
		if ev, ok := er.scan(); ok {
			return ev, nil
		}
		if er.err != nil {
			if er.err == io.EOF && er.end > er.start {
				return er.final()
			}
			er.start = er.end
			return Event{}, er.err
		}
		if er.end-er.start > er.max {
			er.err = ErrEventTooLarge
			return Event{}, er.err
		}
		if er.start > 0 { // keep the partial event at the front of the buffer
			er.end = copy(er.buf, er.buf[er.start:er.end])
			er.start = 0
		}
		if er.end == len(er.buf) {
			n := max(2*len(er.buf), min(initialEventBuffer, er.max+1))
			n = min(n, er.max+1) // one byte past the bound tells an event is too large
			if n <= len(er.buf) {
				n = len(er.buf) + 1
			}
			if len(er.buf) == 0 && n == initialEventBuffer {
				er.buf = eventBufs.Get().(*[initialEventBuffer]byte)[:]
			} else {
				buf := make([]byte, n)
				copy(buf, er.buf[:er.end])
				er.buf = buf
			}
		}
		n, err := er.r.Read(er.buf[er.end:])
		er.end += n
		if err != nil {
			er.err = err
		} else if n == 0 {
			if stalls++; stalls >= 100 {
				er.err = io.ErrNoProgress
			}
		}
	}
}

// scan looks for the end of the event at buf[start:] in the bytes read so far.
func (er *EventReader) scan() (Event, bool) {
	for {
		ls := er.start + er.line
		rest := er.buf[ls:er.end]
		k := lineEnd(rest)
		if k < 0 {
			return Event{}, false
		}
		term := 1
		if rest[k] == '\r' {
			switch {
			case k+1 < len(rest):
				if rest[k+1] == '\n' {
					term = 2
				}
			case er.err == nil:
				return Event{}, false // a CR last: wait for the byte that tells CR from CRLF
			}
		}
		line := rest[:k]
		er.line += k + term
		if len(line) == 0 {
			if er.nData+er.nComment+er.nElse == 0 {
				er.start += er.line // a blank line between events
				er.line = 0
				continue
			}
			raw := er.buf[er.start : er.start+er.line]
			if len(raw) > er.max {
				er.err = ErrEventTooLarge
				return Event{}, false
			}
			return er.event(raw), true
		}
		er.classify(line, ls-er.start)
	}
}

// lineEnd returns the index of the first CR or LF in b, or -1. Two vectorised searches beat bytes.IndexAny's
// byte loop: CR alone ends a line only for rare servers.
func lineEnd(b []byte) int {
	n := bytes.IndexByte(b, '\n')
	if n < 0 {
		n = len(b)
	}
	if c := bytes.IndexByte(b[:n], '\r'); c >= 0 {
		return c
	}
	if n == len(b) {
		return -1
	}
	return n
}

// classify counts the line at offset off in the current event.
func (er *EventReader) classify(line []byte, off int) {
	if line[0] == ':' {
		er.nComment++
		return
	}
	if v, ok := dataValue(line); ok {
		if er.nData == 0 {
			er.data0 = Span{off + len(line) - len(v), off + len(line)}
		}
		er.nData++
		return
	}
	er.nElse++
}

// dataValue returns the value of a "data" field line.
func dataValue(line []byte) ([]byte, bool) {
	if !bytes.HasPrefix(line, []byte("data")) {
		return nil, false
	}
	v := line[4:]
	switch {
	case len(v) == 0:
		return v, true
	case v[0] != ':':
		return nil, false
	case len(v) > 1 && v[1] == ' ':
		return v[2:], true
	default:
		return v[1:], true
	}
}

// event builds the Event of raw, the current event, and moves past it.
func (er *EventReader) event(raw []byte) Event {
	ev := Event{Raw: raw, Comment: er.nComment > 0 && er.nData == 0 && er.nElse == 0}
	switch {
	case er.nData == 1:
		ev.Data = raw[er.data0.Start:er.data0.End]
	case er.nData > 1:
		er.data = er.data[:0]
		n := 0
		for rest := raw; len(rest) > 0; {
			k := lineEnd(rest)
			if k < 0 {
				k = len(rest)
			}
			if v, ok := dataValue(rest[:k]); ok && k > 0 {
				if n > 0 {
					er.data = append(er.data, '\n')
				}
				er.data = append(er.data, v...)
				n++
			}
			if k < len(rest) && rest[k] == '\r' && k+1 < len(rest) && rest[k+1] == '\n' {
				k++
			}
			rest = rest[min(k+1, len(rest)):]
		}
		ev.Data = er.data
	}
	er.start += len(raw)
	er.resetEvent()
	return ev
}

// final returns the event left at the end of the stream without its blank line.
func (er *EventReader) final() (Event, error) {
	if er.line < er.end-er.start { // an unterminated last line
		ls := er.start + er.line
		er.classify(er.buf[ls:er.end], er.line)
	}
	raw := er.buf[er.start:er.end]
	if len(raw) > er.max {
		er.err = ErrEventTooLarge
		er.start = er.end
		return Event{}, er.err
	}
	if er.nData+er.nComment+er.nElse == 0 {
		er.start = er.end
		return Event{}, io.EOF
	}
	ev := er.event(raw)
	if ev.Data != nil && string(ev.Data) != "[DONE]" && !validJSON(ev.Data) {
		return ev, io.ErrUnexpectedEOF
	}
	return ev, nil
}

// validJSON reports whether b is one whole JSON value.
func validJSON(b []byte) bool {
	sc := scanner{b: b, maxDepth: chunkDepth}
	end, err := sc.skip(0, 0)
	return err == nil && sc.end(end) == nil
}
