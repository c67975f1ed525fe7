// Package redistest gives tests a real redis-server: the shared one ./scripts/test starts
// (SWITCHYARD_TEST_REDIS=127.0.0.1:PORT), or a private one on a free loopback port for a test that must kill and
// restart it. Tests share the server, so each test works under a key prefix of its own (Prefix) and never flushes.
package redistest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// EnvAddr names the environment variable with the address of the shared test server.
const EnvAddr = "SWITCHYARD_TEST_REDIS"

var (
	sharedOnce sync.Once
	sharedAddr string
	sharedErr  error
)

// Addr returns the address of a Redis server for t: SWITCHYARD_TEST_REDIS when set, else a server this test
// binary starts once (and leaves to the operating system at exit: it runs with --save "" and a temporary
// directory). It fails t with a clear message when neither is possible.
func Addr(t testing.TB) string {
	t.Helper()
	if a := os.Getenv(EnvAddr); a != "" {
		return a
	}
	sharedOnce.Do(func() {
		var s *Server
		s, sharedErr = start("")
		if sharedErr == nil {
			sharedAddr = s.addr
		}
	})
	if sharedErr != nil {
		t.Fatalf("redistest: %v", sharedErr)
	}
	return sharedAddr
}

// Client returns a client of addr for a test, closed at its end. It uses generous timeouts: tests that want the
// gateway's tight ones build their own.
func Client(t testing.TB, addr string) redis.UniversalClient {
	t.Helper()
	c := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: []string{addr}, DisableIdentity: true, MaxRetries: -1,
		DialTimeout: time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redistest: ping %s: %v", addr, err)
	}
	return c
}

// Prefix returns a key prefix no other test uses: "t:<test name>:<random>:".
func Prefix(t testing.TB) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := strings.NewReplacer("/", ".", " ", "_", "{", "(", "}", ")").Replace(t.Name())
	return "t:" + name + ":" + hex.EncodeToString(b[:]) + ":"
}

// Server is a redis-server process of a test's own.
type Server struct {
	addr string
	dir  string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts a private redis-server on a free loopback port, stopped when t ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s, err := start("")
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(func() { s.stop(); _ = os.RemoveAll(s.dir) })
	return s
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return s.addr }

// Kill stops the server with SIGKILL (no clean shutdown) and waits for it to exit.
func (s *Server) Kill(t testing.TB) {
	t.Helper()
	s.stop()
}

// Restart starts the server again on the same port (after Kill).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	var err error
	for range 50 { // the port may linger briefly after the kill
		if err = s.run(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("redistest: restart on %s: %v", s.addr, err)
}

func (s *Server) stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

func start(addr string) (*Server, error) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		return nil, fmt.Errorf("redis-server is not installed and %s is not set: run the tests with ./scripts/test, "+
			"which installs redis-server and starts one", EnvAddr)
	}
	dir, err := os.MkdirTemp("", "redis-test-")
	if err != nil {
		return nil, err
	}
	for range 20 {
		a := addr
		if a == "" {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			a = ln.Addr().String()
			ln.Close()
		}
		s := &Server{addr: a, dir: dir}
		if err = s.run(); err == nil {
			return s, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("could not start redis-server: %w", err)
}

// run starts the process on s.addr and waits until it answers PING.
func (s *Server) run() error {
	_, port, _ := net.SplitHostPort(s.addr)
	var out bytes.Buffer
	cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no",
		"--dir", s.dir, "--logfile", filepath.Join(s.dir, "log-"+port), "--loglevel", "warning")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = sysProcAttr() // on Linux: never outlive the test binary
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "log-"+port))
			return fmt.Errorf("redis-server exited: %s%s", out.String(), log)
		default:
		}
		if c, err := net.DialTimeout("tcp", s.addr, 100*time.Millisecond); err == nil {
			_, _ = c.Write([]byte("PING\r\n"))
			buf := make([]byte, 7)
			_ = c.SetReadDeadline(time.Now().Add(time.Second))
			n, _ := c.Read(buf)
			c.Close()
			if strings.HasPrefix(string(buf[:n]), "+PONG") {
				s.mu.Lock()
				s.cmd, s.done = cmd, done
				s.mu.Unlock()
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-done
	return fmt.Errorf("redis-server on %s did not answer within 5s", s.addr)
}

// Port returns the server's port as a number.
func (s *Server) Port() int {
	_, p, _ := net.SplitHostPort(s.addr)
	n, _ := strconv.Atoi(p)
	return n
}
