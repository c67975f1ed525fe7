package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Proc is a child process the harness started (a simulator fleet, a gateway, nginx, HAProxy). Its output goes to a
// log file. The harness owns it: Stop ends it, and it also dies with its parent (see sysProcAttr), so that neither
// Ctrl-C nor a failed test leaves one behind. Stop is safe to call more than once, and from several goroutines.
type Proc struct {
	Name string
	Log  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
}

// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
const stopGrace = 5 * time.Second

// StartProc starts argv with its output appended to logPath. The process is also stopped when ctx is done.
func StartProc(ctx context.Context, name, logPath string, argv ...string) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("bench: %s: %w", name, err)
	}
	defer f.Close() // the child has its own copy
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: %s: start %s: %w", name, argv[0], err)
	}
	p := &Proc{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	go func() {
		select {
		case <-ctx.Done():
			p.Stop()
		case <-p.done:
		}
	}()
	return p, nil
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Stop sends SIGTERM, waits up to stopGrace, then SIGKILL, and waits for the exit. It returns the exit error of a
// process that had already exited on its own, and nil for one it stopped.
func (p *Proc) Stop() error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(stopGrace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return nil
}

// StatusKiB reads a field of /proc/PID/status in KiB (VmRSS, VmHWM); -1 when it cannot (the process is gone,
// or the system has no /proc).
func (p *Proc) StatusKiB(field string) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.Pid()))
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

// Tail returns the last n bytes of the process's log, for error messages.
func (p *Proc) Tail(n int) string {
	data, err := os.ReadFile(p.Log)
	if err != nil {
		return ""
	}
	if len(data) > n {
		data = data[len(data)-n:]
	}
	return strings.TrimSpace(string(data))
}

// CPUTime returns the user+system CPU time the running process has used, from /proc/PID/stat.
func (p *Proc) CPUTime() (time.Duration, error) { return procCPUTime(p.Pid()) }

// clockTicks is USER_HZ, the unit of /proc/PID/stat times: 100 on every Linux ABI Go supports.
const clockTicks = 100

func procCPUTime(pid int) (time.Duration, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("bench: cpu: %w", err)
	}
	// The command name (field 2) may contain spaces and parentheses: fields are counted after the last ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("bench: cpu: malformed /proc stat")
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, errors.New("bench: cpu: short /proc stat")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14, utime
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15, stime
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("bench: cpu: %w", err)
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("bench: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreePorts returns n distinct loopback TCP ports that were free a moment ago: it holds each listener open
// until all are chosen, so the kernel cannot hand out one port twice (FreePort called n times can, and a fleet
// of 64 simulators then fails to start).
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("bench: free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// onFreePorts calls start, which picks free ports and starts a child on them, up to three times while the child
// fails because one of its ports was taken, and returns what the last call returned. A port is free when
// FreePort(s) picks it and taken again by the time the child binds it when any other process on the machine (a
// test of another package, a client's outgoing connection, which draws from the same ephemeral range) gets it in
// between: rare, and a fresh pick is the cure.
func onFreePorts[T any](start func() (*Proc, T, error)) (p *Proc, v T, err error) {
	for range 3 {
		if p, v, err = start(); err == nil || !portTaken(err) {
			break
		}
	}
	return p, v, err
}

// portTaken reports whether err (a child's exit, which carries the end of its log) says a port it binds was in
// use: Go ("address already in use") and redis-server ("Address already in use") say it alike.
func portTaken(err error) bool {
	return strings.Contains(strings.ToLower(err.Error()), "address already in use")
}

// WaitHTTP polls url until it answers 200, the timeout passes, ctx is done or p (when not nil) exits.
func WaitHTTP(ctx context.Context, url string, timeout time.Duration, p *Proc) error {
	return waitFor(ctx, timeout, p, url, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
}

// WaitMeasured polls a Switchyard gateway's /debug/backends (admin the admin base URL) until it has scraped
// every backend whose engine it scrapes and runs no seat probe: the engines then run none of the gateway's own
// requests, whose completions (cancelled, so finished as aborts) would count in a run's engine requests.
func WaitMeasured(ctx context.Context, admin string, timeout time.Duration, p *Proc) error {
	return waitFor(ctx, timeout, p, admin+"/debug/backends", func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, admin+"/debug/backends", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		var backends []struct {
			Name        string    `json:"name"`
			Signals     []string  `json:"signals"`
			ScrapedAt   time.Time `json:"scraped_at"`
			SeatProbing bool      `json:"seat_probing"`
		}
		if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&backends); err != nil {
			return err
		}
		for _, b := range backends {
			switch {
			case len(b.Signals) > 0 && b.ScrapedAt.IsZero():
				return fmt.Errorf("%s not scraped yet", b.Name)
			case b.SeatProbing:
				return fmt.Errorf("%s: a seat probe runs", b.Name)
			}
		}
		return nil
	})
}

// WaitTCP polls addr until it accepts a connection (for proxies that have no health endpoint).
func WaitTCP(ctx context.Context, addr string, timeout time.Duration, p *Proc) error {
	return waitFor(ctx, timeout, p, addr, func(ctx context.Context) error {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	})
}

func waitFor(ctx context.Context, timeout time.Duration, p *Proc, what string, try func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var done <-chan struct{}
	if p != nil {
		done = p.Done()
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		tctx, tcancel := context.WithTimeout(ctx, time.Second)
		last = try(tctx)
		tcancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("bench: %s not ready after %v: %w", what, timeout, last)
		case <-done:
			return fmt.Errorf("bench: %s exited before %s was ready: %v\n%s", p.Name, what, p.err, p.Tail(2000))
		case <-tick.C:
		}
	}
}
