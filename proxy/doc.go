// Package proxy is the request path: the fasthttp client-facing server, per-backend upstream clients, the streaming
// relay that measures TTFT and every inter-token gap, retries before the first byte, and the admin endpoints.
package proxy
