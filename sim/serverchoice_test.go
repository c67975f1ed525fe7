//go:build unix

package sim

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// BenchmarkStreamServer measures what one SSE token chunk costs through each candidate server, so the choice of
// net/http for the simulator rests on a figure: one stream, the server writes b.N chunks of a real token chunk's
// size and flushes each (one write per chunk, as the simulator does per step), the client reads them over
// loopback. It reports wall ns per chunk and the process's CPU µs per chunk (server and client together).
//
//	go test -run '^$' -bench StreamServer ./sim/
func BenchmarkStreamServer(b *testing.B) {
	enc := newEncoder(true, "chatcmpl-0123456789abcdef", 1767225600, "sim-model")
	chunk := enc.appendToken(nil, " word", false)

	b.Run("net-http", func(b *testing.B) {
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			n, _ := strconv.Atoi(r.URL.Query().Get("n"))
			w.Header().Set("Content-Type", "text/event-stream")
			rc := http.NewResponseController(w)
			for range n {
				if _, err := w.Write(chunk); err != nil {
					return
				}
				if err := rc.Flush(); err != nil {
					return
				}
			}
		})}
		ln := listenLoopback(b)
		go srv.Serve(ln)
		defer srv.Close()
		streamChunks(b, "http://"+ln.Addr().String(), len(chunk))
	})
	b.Run("fasthttp", func(b *testing.B) {
		srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
			n, _ := strconv.Atoi(string(ctx.QueryArgs().Peek("n")))
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				for range n {
					if _, err := w.Write(chunk); err != nil {
						return
					}
					if err := w.Flush(); err != nil {
						return
					}
				}
			})
		}}
		ln := listenLoopback(b)
		go srv.Serve(ln)
		defer srv.Shutdown()
		streamChunks(b, "http://"+ln.Addr().String(), len(chunk))
	})
}

func listenLoopback(b *testing.B) net.Listener {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	return ln
}

func streamChunks(b *testing.B, url string, chunkLen int) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/?n="+strconv.Itoa(b.N), nil)
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	n, err := io.Copy(io.Discard, bufio.NewReader(resp.Body))
	resp.Body.Close()
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	if err != nil || n != int64(b.N*chunkLen) {
		b.Fatalf("read %d bytes, %v; want %d", n, err, b.N*chunkLen)
	}
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/chunk")
}
