// Package childgw runs a gateway binary as a child process for the memory benches (bench/hostile,
// bench/streammem): a free loopback port, the child started on a policy file and waited for until healthy, its
// resident memory read from /proc, and a stop that interrupts it and kills it if it does not exit.
package childgw

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// FreePort returns a TCP port free on 127.0.0.1 now.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("childgw: free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// RSS reads a /proc/PID/status field in KiB (VmRSS, VmHWM); -1 when it cannot.
func RSS(pid int, field string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return -1
}

// Gateway is a running child gateway.
type Gateway struct {
	// PID is the child's process id; Log the file its output goes to.
	PID int
	Log string
	cmd *exec.Cmd
}

// Start writes policy to DIR/config.yaml, starts `bin serve -config` on it with env added to this process's
// environment, its output in DIR/gateway.log, and waits (at most 20 s) until adminURL/healthz answers 200. On
// failure the child is stopped and the error carries its log.
func Start(bin, dir, policy, adminURL string, env ...string) (*Gateway, error) {
	file := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(file, []byte(policy), 0o600); err != nil {
		return nil, fmt.Errorf("childgw: policy: %w", err)
	}
	logf, err := os.Create(filepath.Join(dir, "gateway.log"))
	if err != nil {
		return nil, fmt.Errorf("childgw: log: %w", err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(bin, "serve", "-config", file)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("childgw: start %s: %w", bin, err)
	}
	g := &Gateway{PID: cmd.Process.Pid, Log: logf.Name(), cmd: cmd}
	if err := waitReady(adminURL + "/healthz"); err != nil {
		g.Stop()
		log, _ := os.ReadFile(g.Log)
		return nil, fmt.Errorf("childgw: %w\n%s", err, log)
	}
	return g, nil
}

// Stop interrupts the child and waits for it, killing it after 10 s.
func (g *Gateway) Stop() {
	_ = g.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = g.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = g.cmd.Process.Kill()
		<-done
	}
}

func waitReady(url string) error {
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return errors.New("the gateway did not become healthy in 20 s")
}
