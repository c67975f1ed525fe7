package sim

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Bounds of an audio upload: OpenAI's 25 MB file limit, and a few KiB for each other form field.
const (
	maxAudioBytes = 25 << 20
	maxFormValue  = 4 << 10
)

// audioBytesPerSecond is the duration the simulator assumes for an upload: 16 kHz 16-bit mono PCM, whatever the
// container. A second of audio is 50 encoder tokens (Whisper's 1,500 per 30 s window) and 2.5 words of
// transcript (a speaking pace).
const audioBytesPerSecond = 32000

// audioRequest is the form of a transcription or translation.
type audioRequest struct {
	file           []byte
	model          string
	responseFormat string
	stream         bool
}

// parseAudioForm reads r's multipart/form-data body (at most maxAudioBytes of file and maxFormValue of each
// other field, without temporary files): file (required), model, response_format ("json" default, or
// "text"), stream; other fields (language, prompt, temperature) are accepted and ignored.
func parseAudioForm(w http.ResponseWriter, r *http.Request) (audioRequest, error) {
	var req audioRequest
	r.Body = http.MaxBytesReader(w, r.Body, maxAudioBytes+1<<20)
	mr, err := r.MultipartReader()
	if err != nil {
		return req, errorf(http.StatusBadRequest, "audio: want a multipart/form-data body: %v", err)
	}
	sawFile := false
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return req, audioReadError(err)
		}
		name := part.FormName()
		if name == "file" {
			req.file, err = io.ReadAll(io.LimitReader(part, maxAudioBytes+1))
			if err != nil {
				return req, audioReadError(err)
			}
			if len(req.file) > maxAudioBytes {
				return req, errorf(http.StatusRequestEntityTooLarge, "file: larger than %d bytes", maxAudioBytes)
			}
			sawFile = true
			continue
		}
		v, err := io.ReadAll(io.LimitReader(part, maxFormValue+1))
		if err != nil {
			return req, audioReadError(err)
		}
		if len(v) > maxFormValue {
			return req, errorf(http.StatusBadRequest, "%s: longer than %d bytes", name, maxFormValue)
		}
		switch name {
		case "model":
			req.model = string(v)
		case "response_format":
			req.responseFormat = string(v)
		case "stream":
			if req.stream, err = strconv.ParseBool(string(v)); err != nil {
				return req, errorf(http.StatusBadRequest, "stream: %q is not a boolean", v)
			}
		}
	}
	switch {
	case !sawFile:
		return req, errorf(http.StatusBadRequest, "Field required: file")
	case len(req.file) == 0:
		return req, errorf(http.StatusBadRequest, "file: empty")
	}
	switch req.responseFormat {
	case "", "json", "text":
	default:
		return req, errorf(http.StatusBadRequest,
			`response_format: %q is not served by the simulator (want "json" or "text")`, req.responseFormat)
	}
	return req, nil
}

func audioReadError(err error) error {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return errorf(http.StatusRequestEntityTooLarge, "Request body larger than %d bytes.", tooBig.Limit)
	}
	return errorf(http.StatusBadRequest, "audio: reading the form: %v", err)
}

// serveAudio answers POST /v1/audio/transcriptions and /v1/audio/translations (multipart/form-data, see
// parseAudioForm). The upload's length gives its duration (see audioBytesPerSecond); the engine prefills 50
// tokens a second (not prefix-cached, as vLLM's encoder-decoder models are not) and generates 2.5 words a
// second, each word one token chosen by a hash of the file's bytes, ending with finish_reason "stop". The
// answer is {"text":..} (a transcription adds "usage":{"type":"duration","seconds":S}), or the bare text for
// response_format "text"; with stream=true, vLLM's chunks:
//
//	data: {"id":"trsc-..","object":"transcription.chunk","created":..,"model":..,"choices":[{"delta":
//	{"content":"word"},"finish_reason":null,"stop_reason":null}]}
//
// (the last with finish_reason "stop"; "translation.chunk" and "trsl-" for a translation), then data: [DONE].
func (b *Backend) serveAudio(w http.ResponseWriter, r *http.Request, translate bool) {
	if !b.allowPost(w, r, writeError) {
		return
	}
	req, err := parseAudioForm(w, r)
	if err != nil {
		answerError(w, writeError, err)
		return
	}
	if !b.checkModel(w, req.model, writeError) {
		return
	}
	seconds := (len(req.file) + audioBytesPerSecond - 1) / audioBytesPerSecond
	promptTokens, n := 50*seconds, max(seconds*5/2, 1)
	if err := b.checkContext(promptTokens, n); err != nil {
		answerError(w, writeError, err)
		return
	}
	if !b.drawFail(w, writeError) {
		return
	}
	s := newSeq(promptTokens, n, nil)
	s.stop = true
	faults := b.eng.getFaults()
	s.stalled = faults.StallRate > 0 && b.failDraw(faults.StallRate)
	if err := b.eng.submit(s); err != nil {
		writeSubmitError(w, err, writeError)
		return
	}
	tag, object, prefix := uint64(0x7472736331), "transcription.chunk", "trsc-"
	if translate {
		tag, object, prefix = 0x7472736c31, "translation.chunk", "trsl-"
	}
	seed := textSeed(b.cfg.Seed^tag, req.file)
	if req.stream {
		ev := &audioEvents{seed: seed, n: n}
		ev.prefix = fmt.Appendf(nil, `data: {"id":%s,"object":"%s","created":%d,"model":%s,"choices":[{"delta":{"content":"`,
			jsonString(prefix+b.requestID(r)), object, time.Now().Unix(), jsonString(b.cfg.Model))
		b.relay(w, r, s, nil, ev)
		return
	}
	switch b.waitSeq(r.Context().Done(), s) {
	case waitKilled:
		panic(http.ErrAbortHandler)
	case waitLeft:
		return
	}
	text := appendWords(make([]byte, 0, 8*n), seed, 0, n)
	if req.responseFormat == "text" {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write(text)
		return
	}
	out := append(make([]byte, 0, len(text)+64), `{"text":"`...)
	out = append(out, text...)
	out = append(out, '"')
	if !translate {
		out = append(out, `,"usage":{"type":"duration","seconds":`...)
		out = strconv.AppendInt(out, int64(seconds), 10)
		out = append(out, '}')
	}
	out = append(out, "}\n"...)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(out)
}

// audioEvents renders a transcription or translation stream (see serveAudio).
type audioEvents struct {
	prefix []byte // the chunk up to the delta's content
	seed   uint64
	n      int
}

func (e *audioEvents) appendTokens(dst []byte, from, to int) []byte {
	for i := from; i < to; i++ {
		dst = append(dst, e.prefix...)
		dst = append(dst, word(e.seed, i)...)
		if i+1 == e.n {
			dst = append(dst, `"},"finish_reason":"stop","stop_reason":null}]}`+"\n\n"...)
		} else {
			dst = append(dst, `"},"finish_reason":null,"stop_reason":null}]}`+"\n\n"...)
		}
	}
	return dst
}

func (e *audioEvents) appendEnd(dst []byte) []byte { return append(dst, doneEvent...) }
