package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/policy"
	"github.com/switchyard/switchyard/proxy"
	"github.com/switchyard/switchyard/routing"
)

// runServe implements "switchyard serve".
func runServe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "config.yaml", "the policy file (YAML); it is reloaded when it changes and on SIGHUP")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", "text", "text or json, for the logs and the access log")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile (pprof) of the whole run to this file; docs/profiling.md")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "switchyard serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	log, err := newLoggerFormat(stderr, *logLevel, *logFormat)
	if err != nil {
		fmt.Fprintf(stderr, "switchyard serve: %v\n", err)
		return 2
	}
	// The access log has a level of its own: -log-level quiets the gateway's messages, not its record of requests.
	access, _ := newLoggerFormat(stderr, "info", *logFormat)
	if *cpuProfile != "" {
		stopProfile, err := startCPUProfile(*cpuProfile)
		if err != nil {
			fmt.Fprintf(stderr, "switchyard serve: %v\n", err)
			return 1
		}
		defer stopProfile()
	}
	ctx, stop := stopOnSignal()
	defer stop()
	if err := serveLogs(ctx, *config, log, access, nil); err != nil {
		fmt.Fprintf(stderr, "switchyard serve: %v\n", err)
		return 1
	}
	return 0
}

// startCPUProfile starts a CPU profile written to path; the returned function ends it and closes the file.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpuprofile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// errTerminated is the cause of a serve context ended by SIGTERM, the signal of an orchestrator (Kubernetes,
// docker stop): serve then keeps serving through limits.shutdown_grace, unready, before it drains. Any other end
// (SIGINT, a test's cancel) drains at once.
var errTerminated = errors.New("terminated")

// stopOnSignal returns a context that ends at the first SIGINT (cause context.Canceled) or SIGTERM (cause
// errTerminated), and the function that releases the signals; its goroutine ends with that call.
func stopOnSignal() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			if s == syscall.SIGTERM {
				cancel(errTerminated)
				return
			}
			cancel(nil)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	}
}

func newLogger(w io.Writer, level string) (*slog.Logger, error) {
	return newLoggerFormat(w, level, "text")
}

// newLoggerFormat returns a logger writing to w at level, in format text (key=value) or json (one object a
// line).
func newLoggerFormat(w io.Writer, level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("-log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("-log-format: %q is neither text nor json", format)
}

// loadShared reads the policy file's redis section and builds the shared state (nil without redis). An invalid
// file is reported as the watcher reports it.
func loadShared(path string, reg *routing.Registry, m *metrics.Gateway, log *slog.Logger) (*sharedState, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("policy: %w", err)
	}
	c, err := policy.Parse(path, data)
	if err != nil {
		var errs policy.Errors
		if errors.As(err, &errs) {
			return nil, fmt.Errorf("invalid policy:\n%w", err)
		}
		return nil, err
	}
	return newSharedState(c.Redis, reg, m, log)
}

// gatewayReady is called once the gateway listens, with its client and admin addresses.
type gatewayReady func(client, admin string)

// serve runs the gateway on the policy file at path until ctx ends, then drains it. It reloads the policy on
// file changes and on SIGHUP. When ctx ends with cause errTerminated, serve first spends limits.shutdown_grace
// unready (/readyz answers 503 "draining") but serving, so that load balancers stop sending before the listener
// closes; then it drains for at most limits.drain_timeout. The access log, when the policy keeps it on, goes to
// log.
func serve(ctx context.Context, path string, log *slog.Logger, ready gatewayReady) error {
	return serveLogs(ctx, path, log, log, ready)
}

// serveLogs is serve with the access log on a logger of its own.
func serveLogs(ctx context.Context, path string, log, access *slog.Logger, ready gatewayReady) error {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	backends := routing.NewRegistry(routing.WithMetrics(m))
	// The redis section is static: read it before the watcher compiles the first snapshot, which wraps its rate
	// limiter in the shared one.
	shared, err := loadShared(path, backends, m, log)
	if err != nil {
		return err
	}
	w, err := policy.NewWatcher(path, backends, m, log, policy.WithShared(shared.shared()))
	if err != nil {
		shared.stop()
		var errs policy.Errors
		if errors.As(err, &errs) {
			return fmt.Errorf("invalid policy:\n%w", err)
		}
		return err
	}
	cfg := w.Config()
	// Tracing and the access log are static, like redis: built once from the file the gateway starts with.
	tp, err := newTracing(ctx, cfg.Tracing, os.Getenv, log)
	if err != nil {
		shared.stop()
		return err
	}
	defer shutdownTracing(tp, log) // after the drain: the last requests' spans go too
	opts := proxy.Options{
		MaxBodyBytes:   int(cfg.Limits.MaxBodyBytes),
		HeaderTimeout:  cfg.Limits.HeaderReadTimeout,
		Metrics:        m,
		Logger:         log,
		SharedBreakers: shared.sharedBreakers(),
	}
	if tp != nil {
		opts.Tracer = tp.Tracer(proxy.TracerName)
	}
	if cfg.AccessLog.On() {
		opts.AccessLog, opts.AccessLogSample = access, cfg.AccessLog.Sample
	}
	srv, err := proxy.New(w, opts)
	if err != nil {
		shared.stop()
		return err
	}
	shared.start()
	defer shared.stop()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	aln, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		ln.Close()
		return fmt.Errorf("admin listen: %w", err)
	}
	admin := proxy.NewAdmin(srv, reg)
	adminSrv := &http.Server{Handler: admin, ReadHeaderTimeout: 10 * time.Second}

	monitor := routing.NewMonitor(backends, routing.MonitorOptions{OnBack: srv.EngineBack})
	monitor.Start()
	defer monitor.Stop()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 3)
	go func() { errc <- w.Run(runCtx) }()
	go func() { errc <- srv.Serve(ln) }()
	go func() {
		if err := adminSrv.Serve(aln); !errors.Is(err, http.ErrServerClosed) {
			errc <- fmt.Errorf("admin: %w", err)
			return
		}
		errc <- nil
	}()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	log.Info("switchyard listening", "api", "http://"+ln.Addr().String()+"/v1", "admin", "http://"+aln.Addr().String(),
		"config", path, "policy", w.Snapshot().Hash[:12], "auth", cfg.Auth)
	if cfg.Auth == policy.AuthNone {
		log.Warn("serving without authentication (auth: none): any caller may use every model and claim any priority", "config", path)
	}
	if ready != nil {
		ready(ln.Addr().String(), aln.Addr().String())
	}
	var runErr error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-hup:
			_ = w.Reload() // the watcher logs the outcome, each error with its line
		case err := <-errc:
			if err != nil {
				runErr = err
				break loop
			}
		}
	}
	if grace := w.Config().Limits.ShutdownGrace; runErr == nil && grace > 0 && errors.Is(context.Cause(ctx), errTerminated) {
		srv.BeginDrain()
		log.Info("terminated: unready, serving until the grace ends", "grace", grace)
		t := time.NewTimer(grace)
	wait:
		for {
			select {
			case <-t.C:
				break wait
			case err := <-errc: // nil: the watcher, whose context has ended
				if err != nil { // a server failed: nothing left to wait for
					t.Stop()
					runErr = err
					break wait
				}
			}
		}
	}
	drain := w.Config().Limits.DrainTimeout
	log.Info("draining", "timeout", drain)
	dctx, dcancel := context.WithTimeout(context.Background(), drain)
	defer dcancel()
	if err := srv.Shutdown(dctx); err != nil {
		log.Warn("drain", "err", err)
	}
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer scancel()
	_ = adminSrv.Shutdown(sctx)
	cancel()
	log.Info("stopped")
	return runErr
}
