package routing

import "testing"

// TestAbandonTeachesTheWait: an attempt abandoned without a first token long after its prediction raises the
// backend's TTFT prediction, as a timeout does, without counting a failure.
func TestAbandonTeachesTheWait(t *testing.T) {
	clk := newFakeClock()
	b := newBackend(&BackendConfig{Name: "a", URL: "http://a"}, clk)
	r := &Request{Model: "m", PromptTokens: 100}
	before, _ := b.PredictTTFT(100, 0)
	for range 20 {
		a := b.Dispatch(r)
		clk.Advance(20 * before)
		a.Abandon()
	}
	after, _ := b.PredictTTFT(100, 0)
	if after < 3*before {
		t.Errorf("prediction %v after 20 abandoned waits of %v; before %v", after, 20*before, before)
	}
	if b.Failures() != 0 || b.Inflight() != 0 {
		t.Errorf("failures %d inflight %d, want 0 and 0", b.Failures(), b.Inflight())
	}
}
