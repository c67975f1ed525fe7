package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/valyala/fasthttp"
)

// Passthrough serves a bare fasthttp reverse proxy on listen in front of upstream (host:port) until ctx ends:
// each request is sent upstream as it came (one keep-alive HostClient) and the answer relayed as it came back,
// with nothing parsed, measured or decided. It is the overhead benchmark's "fasthttp" reference column
// (`switchyard bench passthrough`): the floor of what any gateway built on fasthttp and Go's runtime pays per
// request, so that the gateway's CPU above nginx splits into what the stack costs and what the gateway's own
// work costs (docs/profiling.md).
func Passthrough(ctx context.Context, listen, upstream string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("passthrough: %w", err)
	}
	hc := &fasthttp.HostClient{Addr: upstream, MaxIdleConnDuration: time.Minute}
	srv := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			ctx.Request.Header.Del("Connection")
			if err := hc.Do(&ctx.Request, &ctx.Response); err != nil {
				ctx.Error(err.Error(), fasthttp.StatusBadGateway)
			}
		},
		NoDefaultServerHeader: true,
		NoDefaultDate:         true,
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err = <-done:
	case <-ctx.Done():
		err = srv.Shutdown()
		<-done
	}
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("passthrough: %w", err)
	}
	return nil
}
