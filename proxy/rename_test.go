package proxy

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/routing"
	"github.com/switchyard/switchyard/sim"
)

// TestRelayRenamesModel: a route that sends public model "sim-model" to an upstream serving "upstream-llama"
// gives the client the name it asked for, in every chunk of a stream and in an assembled body, and changes
// nothing else.
func TestRelayRenamesModel(t *testing.T) {
	t.Parallel()
	be := startSim(t, "a", func(c *sim.Config) { c.ITL = time.Millisecond; c.Model = "upstream-llama" })
	snap := snapshotOf(&routing.RoundRobin{}, 2, be.URL())
	for i := range snap.Models["sim-model"].Targets {
		snap.Models["sim-model"].Targets[i].Model = "upstream-llama"
	}
	gw := startGateway(t, snap, Options{})
	const msgs = `"max_tokens":12,"messages":[{"role":"user","content":"say \"model\":\"upstream-llama\""}]`
	for _, tc := range []struct {
		name, opts string
	}{
		{"stream", `"stream":true,`},
		{"stream with usage", `"stream":true,"stream_options":{"include_usage":true},`},
		{"assembled", ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, want := rawPost(t, be.URL(), "/v1/chat/completions", []byte(`{"model":"upstream-llama",`+tc.opts+msgs+`}`), nil)
			resp, got := rawPost(t, gw.url, "/v1/chat/completions", []byte(`{"model":"sim-model",`+tc.opts+msgs+`}`), nil)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, got)
			}
			if bytes.Contains(got, []byte("upstream-llama")) {
				t.Errorf("the upstream name reached the client: %s", got)
			}
			renamed := strings.ReplaceAll(string(want), `"model":"upstream-llama"`, `"model":"sim-model"`)
			if tc.opts != "" {
				if m := maskIDs(got); m != maskIDs([]byte(renamed)) {
					t.Errorf("stream differs from the backend's, renamed:\n got %s\nwant %s", m, maskIDs([]byte(renamed)))
				}
				return
			}
			var body struct{ Model string }
			if err := json.Unmarshal(got, &body); err != nil || body.Model != "sim-model" {
				t.Errorf("model %q (%v) in %s", body.Model, err, got)
			}
		})
	}
}
