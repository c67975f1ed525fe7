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
// an atomic.Pointer and never modified afterwards. Families an engine did not export are absent from Has.
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
	// Has says which of the fields above were present (HasWaiting | HasRunning | ...).
	Has EngineFields
	// At is when the scrape that produced these values finished.
	At time.Time
	// Stale is set on a copy of the last good snapshot when a later scrape failed.
	Stale bool
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
	hasKVNew // vllm:kv_cache_usage_perc seen: it wins over the older gpu_ name
)

// Fresh reports whether s may be trusted at now: it exists, its scrape succeeded, and it is at most maxAge old.
func (s *EngineStats) Fresh(now time.Time, maxAge time.Duration) bool {
	return s != nil && !s.Stale && now.Sub(s.At) <= maxAge
}

// errLineTooLong is not an error of the scrape: a longer line is skipped. It exists for the parser's loop.
var errLineTooLong = errors.New("line too long")

// ParseEngineMetrics reads a Prometheus text exposition (version 0.0.4 or OpenMetrics) from r and fills s with the
// families EngineStats knows, skipping every other line after reading its name: vLLM's histograms are thousands of
// lines and are never parsed into memory. br, when not nil, is reset onto r and reused (the scraper keeps one per
// backend). It returns the first read error other than io.EOF; malformed lines are skipped.
func ParseEngineMetrics(r io.Reader, br *bufio.Reader, s *EngineStats) error {
	if br == nil {
		br = bufio.NewReaderSize(r, 16<<10)
	} else {
		br.Reset(r)
	}
	for {
		line, err := readLine(br)
		if len(line) > 0 && line[0] != '#' {
			parseSample(line, s)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil && err != errLineTooLong {
			return err
		}
	}
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

func parseSample(line []byte, s *EngineStats) {
	end := 0
	for end < len(line) && line[end] != '{' && line[end] != ' ' && line[end] != '\t' {
		end++
	}
	name := line[:end]
	var field EngineFields
	switch string(name) { // compiled to comparisons; no allocation
	case "vllm:num_requests_waiting", "sglang:num_queue_reqs":
		field = HasWaiting
	case "vllm:num_requests_running", "sglang:num_running_reqs":
		field = HasRunning
	case "vllm:kv_cache_usage_perc":
		field = hasKVNew
	case "vllm:gpu_cache_usage_perc", "sglang:token_usage":
		field = HasKVUsage
	case "vllm:cache_config_info", "sglang:cache_config_info", "sglang:max_total_num_tokens":
		field = HasCacheConfig
	case "vllm:num_preemptions_total", "sglang:num_retracted_reqs_total":
		field = HasPreemptions
	case "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total", "sglang:cached_tokens_total":
		field = HasPrefixCounters
	case "vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total", "sglang:prompt_tokens_total":
		field = HasPrefixCounters
	case "process_start_time_seconds":
		field = HasStartTime
	default:
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
	v, ok := parseValue(rest)
	if !ok {
		return
	}
	switch field {
	case HasWaiting:
		s.Waiting += v
	case HasRunning:
		s.Running += v
	case hasKVNew:
		if s.Has&hasKVNew == 0 {
			s.KVUsage = 0
		}
		s.KVUsage = max(s.KVUsage, v)
		s.Has |= HasKVUsage
	case HasKVUsage:
		if s.Has&hasKVNew != 0 {
			return
		}
		s.KVUsage = max(s.KVUsage, v)
	case HasCacheConfig:
		switch string(name) {
		case "vllm:cache_config_info":
			bs, nb := labelInt(labels, "block_size"), labelInt(labels, "num_gpu_blocks")
			if bs <= 0 || nb <= 0 {
				return
			}
			s.BlockSize, s.NumGPUBlocks = bs, s.NumGPUBlocks+nb
		case "sglang:cache_config_info":
			bs, nb := labelInt(labels, "page_size"), labelInt(labels, "num_pages")
			if bs <= 0 || nb <= 0 {
				return
			}
			s.BlockSize, s.NumGPUBlocks = bs, s.NumGPUBlocks+nb
		default: // sglang:max_total_num_tokens, unless cache_config_info said it better
			if s.Has&HasCacheConfig != 0 || v < 1 {
				return
			}
			s.BlockSize, s.NumGPUBlocks = 1, int(v)
		}
	case HasPreemptions:
		s.Preemptions += v
	case HasPrefixCounters:
		switch string(name) {
		case "vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total", "sglang:cached_tokens_total":
			s.PrefixHits += v
		default:
			s.PrefixQueries += v
		}
	case HasStartTime:
		s.StartTime = max(s.StartTime, v)
	}
	s.Has |= field
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

// labelInt returns the integer value of label name in labels (the text between the braces), or -1.
func labelInt(labels []byte, name string) int {
	for len(labels) > 0 {
		labels = bytes.TrimLeft(labels, " \t,")
		eq := bytes.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return -1
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
			return -1
		}
		if string(key) == name {
			v, err := strconv.Atoi(string(val[:n]))
			if err != nil {
				return -1
			}
			return v
		}
		labels = val[n+1:]
	}
	return -1
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
