package bench

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The simulators' (and vLLM's) prefix cache counters, read to compute the prefix hit rate of a run.
const (
	metricPrefixHits    = "vllm:prefix_cache_hits_total"
	metricPrefixQueries = "vllm:prefix_cache_queries_total"
	// metricFinished counts requests an engine finished, for every finished_reason (abort included): the
	// requests that reached the engines, hedges and retries included.
	metricFinished = "vllm:request_success_total"
)

// scrapeCounters fetches a Prometheus text exposition from url and returns the sum over all label sets of each
// named metric that is present.
func scrapeCounters(ctx context.Context, url string, names ...string) (map[string]float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("bench: metrics: %w", err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("bench: metrics: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: metrics: %s: status %d", url, resp.StatusCode)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		for _, n := range names {
			if !strings.HasPrefix(l, n) || len(l) == len(n) || (l[len(n)] != '{' && l[len(n)] != ' ') {
				continue
			}
			rest := l[len(n):]
			if rest[0] == '{' {
				end := strings.LastIndexByte(rest, '}')
				if end < 0 {
					continue
				}
				rest = rest[end+1:]
			}
			fields := strings.Fields(rest)
			if len(fields) == 0 {
				continue
			}
			v, err := strconv.ParseFloat(fields[0], 64)
			if err == nil {
				out[n] += v
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("bench: metrics: %w", err)
	}
	return out, nil
}

// PrefixProbe reads the prefix cache counters of a set of simulators (or vLLM engines) before and after a run.
type PrefixProbe struct {
	urls   []string
	before map[string]float64
}

// StartPrefixProbe scrapes every url (a /metrics endpoint) once. It returns nil, with no error, when none of them
// exposes the prefix cache counters (a gateway or a non-vLLM target), so that callers can skip the hit rate.
func StartPrefixProbe(ctx context.Context, urls []string) *PrefixProbe {
	p := &PrefixProbe{urls: urls}
	sum, ok := p.sum(ctx)
	if !ok {
		return nil
	}
	p.before = sum
	return p
}

func (p *PrefixProbe) sum(ctx context.Context) (map[string]float64, bool) {
	total := map[string]float64{}
	found := false
	for _, u := range p.urls {
		m, err := scrapeCounters(ctx, u, metricPrefixHits, metricPrefixQueries, metricFinished)
		if err != nil {
			continue
		}
		if _, ok := m[metricPrefixQueries]; ok {
			found = true
		}
		for k, v := range m {
			total[k] += v
		}
	}
	return total, found
}

// HitRate scrapes again and returns hits/queries over the interval, or nil when unknown (no queries, or the
// scrape failed).
func (p *PrefixProbe) HitRate(ctx context.Context) *float64 {
	h, _ := p.Finish(ctx)
	return h
}

// Finish scrapes again and returns, over the interval, the prefix hit rate (hits/queries) and the number of
// requests the engines finished (every finished_reason: with hedges and retries, more than the client sent);
// nil when unknown.
func (p *PrefixProbe) Finish(ctx context.Context) (hitRate, engineRequests *float64) {
	if p == nil {
		return nil, nil
	}
	after, ok := p.sum(ctx)
	if !ok {
		return nil, nil
	}
	if n := after[metricFinished] - p.before[metricFinished]; n > 0 {
		engineRequests = &n
	}
	return p.hitRate(after), engineRequests
}

func (p *PrefixProbe) hitRate(after map[string]float64) *float64 {
	q := after[metricPrefixQueries] - p.before[metricPrefixQueries]
	if q <= 0 {
		return nil
	}
	h := (after[metricPrefixHits] - p.before[metricPrefixHits]) / q
	return &h
}
