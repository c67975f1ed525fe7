package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/switchyard/switchyard/sim"
)

// Prediction is a simulator's answer to POST /sim/predict: what the backend would do with a request if it
// arrived now, its ground truth computed from its own queues, batch and prefix cache (docs/design.md,
// "The simulator and the benchmark"). The oracle reads it off the wire; the type is the simulator's own, so
// that the two sides cannot drift apart.
type Prediction = sim.Prediction

// Oracle is the matrix's "oracle" column: no gateway; before each request it asks every backend of the fleet
// for its prediction of that request, in parallel, and sends it to the lowest predicted TTFT (a tie goes to the
// most cached tokens, then to the first in fleet order). It is greedy, one request at a time: the best choice
// for each request as it arrives, which is the ceiling a router without foresight can reach, not a schedule
// optimised over the whole run. A backend whose prediction fails (down: 503, an error, no answer in time) is
// not a candidate. Safe for concurrent use.
type Oracle struct {
	backends []FleetBackend
	hc       *http.Client
	timeout  time.Duration
}

var _ Picker = (*Oracle)(nil)

// predictTimeout bounds one round of predictions when the run sets no timeout: a prediction is a computation on
// the simulator's own state, answered in milliseconds; a backend slower than this is treated as unavailable.
const predictTimeout = 5 * time.Second

// NewOracle returns an oracle over backends; timeout bounds each round of predictions (default predictTimeout,
// and never more than it).
func NewOracle(backends []FleetBackend, timeout time.Duration) *Oracle {
	if timeout <= 0 || timeout > predictTimeout {
		timeout = predictTimeout
	}
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &Oracle{backends: backends, hc: &http.Client{Transport: tr}, timeout: timeout}
}

// ErrNoPrediction is Pick's error when no backend answered a prediction.
var ErrNoPrediction = errors.New("bench: oracle: no backend answered /sim/predict")

// Pick returns the base URL of the backend predicted best for it.
func (o *Oracle) Pick(ctx context.Context, it *Item) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	preds := make([]*Prediction, len(o.backends))
	errs := make([]error, len(o.backends))
	done := make(chan int, len(o.backends))
	for i, b := range o.backends {
		go func() {
			preds[i], errs[i] = o.predict(ctx, b.URL, it.Body)
			done <- i
		}()
	}
	for range o.backends {
		<-done
	}
	i := Best(preds)
	if i < 0 {
		return "", fmt.Errorf("%w: %w", ErrNoPrediction, errors.Join(errs...))
	}
	return o.backends[i].URL, nil
}

// Best returns the index of the best prediction (nil entries are not candidates): the lowest TTFT, then the
// most cached tokens, then the lowest index; -1 when there is none.
func Best(preds []*Prediction) int {
	best := -1
	for i, p := range preds {
		if p == nil {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := preds[best]
		if p.TTFTMillis < b.TTFTMillis || (p.TTFTMillis == b.TTFTMillis && p.CachedTokens > b.CachedTokens) {
			best = i
		}
	}
	return best
}

// predict posts body to base's /sim/predict.
func (o *Oracle) predict(ctx context.Context, base string, body []byte) (*Prediction, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/sim/predict", bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("bench: oracle: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := o.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("bench: oracle: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return nil, fmt.Errorf("bench: oracle: %s: %w", base, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("bench: oracle: %s: %d %s", base, resp.StatusCode, bytes.TrimSpace(data))
	}
	var p Prediction
	if err := json.Unmarshal(data, &p); err != nil {
		return nil, fmt.Errorf("bench: oracle: %s: %w", base, err)
	}
	return &p, nil
}
