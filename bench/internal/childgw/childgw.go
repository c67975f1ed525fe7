// Package childgw starts a gateway binary as a child process for the memory benches (bench/hostile,
// bench/streammem), on the harness's own process handling (bench.StartProc, bench.WaitHTTP).
package childgw

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/switchyard/switchyard/bench"
)

// Start writes policy to DIR/config.yaml, starts `bin serve -config` on it with its output in DIR/gateway.log,
// and waits (at most 20 s) until adminURL/healthz answers 200. The child inherits this process's environment.
// On failure the child is stopped and the error carries the end of its log. The caller stops the Proc.
func Start(bin, dir, policy, adminURL string) (*bench.Proc, error) {
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte(policy), 0o600); err != nil {
		return nil, fmt.Errorf("childgw: policy: %w", err)
	}
	p, err := bench.StartProc(context.Background(), "gateway", filepath.Join(dir, "gateway.log"), bin, "serve", "-config", file)
	if err != nil {
		return nil, err
	}
	if err := bench.WaitHTTP(context.Background(), adminURL+"/healthz", 20*time.Second, p); err != nil {
		_ = p.Stop()
		return nil, fmt.Errorf("childgw: %w\n%s", err, p.Tail(4096))
	}
	return p, nil
}
