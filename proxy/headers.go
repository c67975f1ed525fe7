package proxy

import (
	"bytes"
	"encoding/hex"
	"math/rand/v2"

	"github.com/valyala/fasthttp"
)

// Response headers the gateway adds.
const (
	headerBackend   = "X-Switchyard-Backend"
	headerRequestID = "X-Request-Id"
)

// copyRequestHeaders copies the client's end-to-end headers onto the upstream request. It drops hop-by-hop
// headers (RFC 9110 section 7.6.1) and those the Connection header names, the gateway's own x-switchyard-*
// control headers, and everything the gateway sets itself (Host, Content-Length, Accept-Encoding, X-Request-Id).
// The client's Authorization is kept in dst for upstream.prepareRequest, which removes it unless the backend
// forwards it (forward_authorization): dst must not be sent anywhere without going through prepareRequest.
func copyRequestHeaders(dst *fasthttp.RequestHeader, src *fasthttp.RequestHeader) {
	// Every Connection header counts: a second one's list names hop-by-hop headers as much as the first's.
	connection := src.PeekAll(fasthttp.HeaderConnection)
	for k, v := range src.All() {
		if dropRequestHeader(k) || listedIn(connection, k) {
			if len(k) == 13 && bytes.EqualFold(k, []byte(fasthttp.HeaderAuthorization)) {
				dst.SetBytesKV(k, v)
			}
			continue
		}
		dst.AddBytesKV(k, v) // Add: a header the client repeated reaches the engine repeated
	}
}

func dropRequestHeader(k []byte) bool {
	if len(k) >= 13 && bytes.EqualFold(k[:13], []byte("X-Switchyard-")) {
		return true
	}
	switch len(k) {
	case 2:
		return bytes.EqualFold(k, []byte("TE"))
	case 4:
		return bytes.EqualFold(k, []byte("Host"))
	case 6:
		return bytes.EqualFold(k, []byte("Cookie"))
	case 7:
		return bytes.EqualFold(k, []byte("Upgrade")) || bytes.EqualFold(k, []byte("Trailer"))
	case 10:
		return bytes.EqualFold(k, []byte("Connection")) || bytes.EqualFold(k, []byte("Keep-Alive"))
	case 12:
		return bytes.EqualFold(k, []byte("X-Request-Id"))
	case 13:
		return bytes.EqualFold(k, []byte("Authorization"))
	case 14:
		return bytes.EqualFold(k, []byte("Content-Length"))
	case 15:
		return bytes.EqualFold(k, []byte("Accept-Encoding")) || bytes.EqualFold(k, []byte("X-Forwarded-For"))
	case 17:
		return bytes.EqualFold(k, []byte("Transfer-Encoding"))
	case 18:
		return bytes.EqualFold(k, []byte("Proxy-Authenticate"))
	case 19:
		return bytes.EqualFold(k, []byte("Proxy-Authorization"))
	}
	return false
}

// headerListed reports whether the comma-separated list names k.
func headerListed(list, k []byte) bool {
	for len(list) > 0 {
		var item []byte
		if i := bytes.IndexByte(list, ','); i >= 0 {
			item, list = list[:i], list[i+1:]
		} else {
			item, list = list, nil
		}
		if bytes.EqualFold(bytes.TrimSpace(item), k) {
			return true
		}
	}
	return false
}

// appendRequestID appends the client's X-Request-Id if it is a sane token ([A-Za-z0-9._:-], 1 to 128 bytes),
// else a new random 128-bit hex ID. Request IDs need uniqueness, not secrecy, so a fast PRNG is enough.
func appendRequestID(dst, client []byte) []byte {
	if validRequestID(client) {
		return append(dst, client...)
	}
	var b [16]byte
	for i := 0; i < len(b); i += 8 {
		x := rand.Uint64()
		for j := range 8 {
			b[i+j] = byte(x >> (8 * j))
		}
	}
	return hex.AppendEncode(dst, b[:])
}

func validRequestID(id []byte) bool {
	if len(id) == 0 || len(id) > 128 {
		return false
	}
	for _, c := range id {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == ':', c == '-':
		default:
			return false
		}
	}
	return true
}

// listedIn reports whether any of the Connection header values lists k.
func listedIn(connection [][]byte, k []byte) bool {
	for _, c := range connection {
		if len(c) > 0 && headerListed(c, k) {
			return true
		}
	}
	return false
}
