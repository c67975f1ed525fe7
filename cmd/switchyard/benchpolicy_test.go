package main

import (
	"testing"

	"github.com/switchyard/switchyard/bench"
	"github.com/switchyard/switchyard/policy"
)

// TestBenchGatewayPolicyLoads: the policy bench writes for each column's gateway is one the real policy package
// accepts (bench's own tests run a stand-in gateway, which would not notice a rule the policy added).
func TestBenchGatewayPolicyLoads(t *testing.T) {
	for _, tc := range []struct {
		name    string
		gateway map[string]any
	}{
		{"plain", nil},
		{"with limits", map[string]any{"limits": map[string]any{"drain_timeout": "2s"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := bench.GatewayConfig(bench.GatewaySpec{Listen: "127.0.0.1:2", AdminListen: "127.0.0.1:3", Model: "m",
				Strategy: "adaptive", Backends: []bench.FleetBackend{{Name: "b", URL: "http://127.0.0.1:9", Model: "m"}},
				Gateway: tc.gateway})
			if err != nil {
				t.Fatal(err)
			}
			c, err := policy.Parse("bench-gateway.yaml", cfg)
			if err != nil {
				t.Fatalf("%v\n%s", err, cfg)
			}
			if c.Limits.ShutdownGrace != 0 {
				t.Errorf("shutdown_grace %v: every bench column would wait for it", c.Limits.ShutdownGrace)
			}
		})
	}
}
