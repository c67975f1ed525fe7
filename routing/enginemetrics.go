package routing

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
	"time"
)

// EngineStats is one scrape of a backend's engine metrics: an immutable snapshot, published on the Backend behind
// an atomic.Pointer and never modified afterwards. Which metric carries each field is the engine's EngineSpec
// (engines.go); a field the engine did not export is absent from Has and left at 0, which its consumers read as
// "unknown" (the gateway's own accounting stands in: Backend.loadAt), never as a measured zero.
type EngineStats struct {
	// Waiting is the number of requests queued in the engine (vllm:num_requests_waiting, sglang:num_queue_reqs),
	// summed over the engine's label sets (data-parallel ranks, models).
	Waiting float64
	// Running is the number of requests in the engine's running batch (vllm:num_requests_running,
	// sglang:num_running_reqs), summed likewise.
	Running float64
	// KVUsage is the share of the KV cache in use, 0 to 1 (vllm:kv_cache_usage_perc, or the older
	// vllm:gpu_cache_usage_perc; sglang:token_usage); the largest over label sets.
	KVUsage float64
	// BlockSize is the engine's KV block size in tokens and NumGPUBlocks its number of KV blocks
	// (vllm:cache_config_info{block_size,num_gpu_blocks}; SGLang's page_size and num_pages, or
	// sglang:max_total_num_tokens as 1-token blocks).
	BlockSize, NumGPUBlocks int
	// Preemptions counts preempted (vLLM) or retracted (SGLang) requests since the engine started.
	Preemptions float64
	// PrefixHits and PrefixQueries count prompt tokens found in and looked up in the engine's prefix cache
	// (vllm:prefix_cache_hits_total/queries_total or the gpu_-prefixed older names; sglang:cached_tokens_total
	// and sglang:prompt_tokens_total).
	PrefixHits, PrefixQueries float64
	// StartTime is the engine process's start (process_start_time_seconds), in Unix seconds.
	StartTime float64
	// MaxSeqs is the most sequences the engine runs at once, as it exports it (SignalMaxSeqs), summed over
	// ranks, or as its info document states it (InfoSpec.MaxSeqs) when its metrics do not.
	MaxSeqs float64
	// MaxSeqsFrom says where MaxSeqs came from: "metrics", or the info document's path (/get_server_info).
	MaxSeqsFrom string
	// MaxInflight is the most requests the engine holds at once, running and queued, before it refuses new
	// ones, as its info document states it (InfoSpec.MaxInflight; TGI's max_concurrent_requests).
	MaxInflight float64
	// MaxInflightFrom is the info document's path MaxInflight came from.
	MaxInflightFrom string
	// Has says which of the fields above were present (HasWaiting | HasRunning | ...).
	Has EngineFields
	// At is when the scrape that produced these values finished.
	At time.Time
	// Stale is set on a copy of the last good snapshot when a later scrape failed.
	Stale bool

	// begun and ended are the gateway's own requests to the backend dispatched in total when the scrape was sent
	// and ended in total when its answer came (Backend.engineOccupancy); sent is when it was sent (turns.go).
	begun, ended uint64
	sent         time.Time
}

// EngineFields is a set of EngineStats fields.
type EngineFields uint16

// The EngineStats fields a scrape may find.
const (
	HasWaiting EngineFields = 1 << iota
	HasRunning
	HasKVUsage
	HasCacheConfig
	HasPreemptions
	HasPrefixCounters
	HasStartTime
	HasMaxSeqs
	HasMaxInflight
)

// Fresh reports whether s may be trusted at now: it exists, its scrape succeeded, and it is at most maxAge old.
func (s *EngineStats) Fresh(now time.Time, maxAge time.Duration) bool {
	return s != nil && !s.Stale && now.Sub(s.At) <= maxAge
}

// errLineTooLong is not an error of the scrape: a longer line is skipped. It exists for the parser's loop.
var errLineTooLong = errors.New("line too long")

// parseState is what one parse remembers beyond EngineStats: which of a signal's series is in use, and the
// values of the signals EngineStats keeps as integers.
type parseState struct {
	alt             [NumSignals]int8 // index of the series in use per signal; -1 before any
	blocks, blockSz float64
}

// ParseMetrics reads a Prometheus text exposition (version 0.0.4 or OpenMetrics) from r and fills s with the
// signals e's series carry, skipping every other line after reading its name: vLLM's histograms are thousands
// of lines and are never parsed into memory. br, when not nil, is reset onto r and reused (the scraper keeps one
// per backend). It returns the first read error other than io.EOF; malformed lines are skipped. It does not
// allocate for lines it skips.
func (e *EngineSpec) ParseMetrics(r io.Reader, br *bufio.Reader, s *EngineStats) error {
	if br == nil {
		br = bufio.NewReaderSize(r, 16<<10)
	} else {
		br.Reset(r)
	}
	var ps parseState
	for i := range ps.alt {
		ps.alt[i] = -1
	}
	defer ps.finish(s)
	for {
		line, err := readLine(br)
		if len(line) > 0 && line[0] != '#' {
			e.parseSample(line, s, &ps)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil && err != errLineTooLong {
			return err
		}
	}
}

// finish sets the capacity fields once every sample is in: blocks of BlockSize tokens (1 when the engine gives
// blocks without a size, i.e. a capacity in tokens).
func (ps *parseState) finish(s *EngineStats) {
	if ps.alt[SignalKVBlocks] < 0 || ps.blocks < 1 {
		return
	}
	size := 1
	if ps.alt[SignalKVBlockSize] >= 0 && ps.blockSz >= 1 {
		size = int(min(ps.blockSz, 1<<30))
	}
	s.BlockSize, s.NumGPUBlocks = size, int(min(ps.blocks, 1<<40))
	s.Has |= HasCacheConfig
}

// readLine returns the next line without its newline; a line longer than the buffer is consumed and its head
// returned with errLineTooLong (no family we keep has such lines).
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		for err == bufio.ErrBufferFull {
			_, err = br.ReadSlice('\n')
		}
		if err == nil || err == io.EOF {
			return nil, errLineTooLong
		}
		return nil, err
	}
	return bytes.TrimRight(line, "\r\n"), err
}

func (e *EngineSpec) parseSample(line []byte, s *EngineStats, ps *parseState) {
	end := 0
	for end < len(line) && line[end] != '{' && line[end] != ' ' && line[end] != '\t' {
		end++
	}
	refs := e.byName[string(line[:end])] // no allocation: the compiler reads the map with the bytes
	if len(refs) == 0 {
		return
	}
	rest := line[end:]
	var labels []byte
	if len(rest) > 0 && rest[0] == '{' {
		i := labelsEnd(rest)
		if i < 0 {
			return
		}
		labels, rest = rest[1:i], rest[i+1:]
	}
	value, valueOK := parseValue(rest)
	for _, ref := range refs {
		sr := ref.s
		if !labelsMatch(labels, sr.Labels) {
			continue
		}
		v, ok := value, valueOK
		if sr.ValueLabel != "" {
			v, ok = labelFloat(labels, sr.ValueLabel)
		}
		if !ok {
			continue
		}
		if sr.Percent {
			v /= 100
		}
		ps.add(s, ref.sig, ref.alt, v)
	}
}

// add folds one sample of signal sig's series alt into s: a more preferred series than the one in use replaces
// it, a less preferred one is ignored.
func (ps *parseState) add(s *EngineStats, sig Signal, alt int, v float64) {
	switch cur := int(ps.alt[sig]); {
	case cur >= 0 && alt > cur:
		return
	case cur < 0 || alt < cur:
		ps.alt[sig] = int8(min(alt, 127))
		ps.reset(s, sig)
	}
	switch sig {
	case SignalRunning:
		s.Running += v
	case SignalWaiting:
		s.Waiting += v
	case SignalKVUsage:
		s.KVUsage = max(s.KVUsage, v)
	case SignalKVBlocks:
		ps.blocks += v
		return // finish sets HasCacheConfig
	case SignalKVBlockSize:
		ps.blockSz = max(ps.blockSz, v)
		return
	case SignalPrefixHits:
		s.PrefixHits += v
	case SignalPrefixQueries:
		s.PrefixQueries += v
	case SignalPreemptions:
		s.Preemptions += v
	case SignalStartTime:
		s.StartTime = max(s.StartTime, v)
	case SignalMaxSeqs:
		s.MaxSeqs += v
	}
	s.Has |= sig.field()
}

// reset clears what a less preferred series of sig contributed.
func (ps *parseState) reset(s *EngineStats, sig Signal) {
	switch sig {
	case SignalRunning:
		s.Running = 0
	case SignalWaiting:
		s.Waiting = 0
	case SignalKVUsage:
		s.KVUsage = 0
	case SignalKVBlocks:
		ps.blocks = 0
	case SignalKVBlockSize:
		ps.blockSz = 0
	case SignalPrefixHits:
		s.PrefixHits = 0
	case SignalPrefixQueries:
		s.PrefixQueries = 0
	case SignalPreemptions:
		s.Preemptions = 0
	case SignalStartTime:
		s.StartTime = 0
	case SignalMaxSeqs:
		s.MaxSeqs = 0
	}
}

// labelsMatch reports whether labels (the text between the braces) has every label of want with its value.
func labelsMatch(labels []byte, want map[string]string) bool {
	for k, v := range want {
		got, ok := labelValue(labels, k)
		if !ok || string(got) != v {
			return false
		}
	}
	return true
}

// labelsEnd returns the index of the '}' that closes the label set starting at b[0] == '{', or -1.
func labelsEnd(b []byte) int {
	inQuote := false
	for i := 1; i < len(b); i++ {
		switch c := b[i]; {
		case inQuote && c == '\\':
			i++
		case c == '"':
			inQuote = !inQuote
		case !inQuote && c == '}':
			return i
		}
	}
	return -1
}

// labelValue returns the raw (still escaped) value of label name in labels (the text between the braces).
func labelValue(labels []byte, name string) ([]byte, bool) {
	for len(labels) > 0 {
		labels = bytes.TrimLeft(labels, " \t,")
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return nil, false
		}
		key := bytes.TrimSpace(labels[:eq])
		val := labels[eq+2:]
		n := 0
		for n < len(val) && val[n] != '"' {
			if val[n] == '\\' {
				n++
			}
			n++
		}
		if n >= len(val) { // no closing quote
			return nil, false
		}
		if string(key) == name {
			return val[:n], true
		}
		labels = val[n+1:]
	}
	return nil, false
}

// labelInt returns the integer value of label name in labels, or -1.
func labelInt(labels []byte, name string) int {
	v, ok := labelValue(labels, name)
	if !ok {
		return -1
	}
	i, err := strconv.Atoi(string(v))
	if err != nil {
		return -1
	}
	return i
}

// labelFloat returns the numeric value of label name in labels.
func labelFloat(labels []byte, name string) (float64, bool) {
	v, ok := labelValue(labels, name)
	if !ok {
		return 0, false
	}
	return parseValue(v)
}

// parseValue parses the sample value that starts rest (after spaces), ignoring a timestamp after it.
func parseValue(rest []byte) (float64, bool) {
	rest = bytes.TrimLeft(rest, " \t")
	end := bytes.IndexAny(rest, " \t")
	if end >= 0 {
		rest = rest[:end]
	}
	if len(rest) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(rest), 64)
	if err != nil || v != v { // NaN says "no value"
		return 0, false
	}
	return v, true
}
