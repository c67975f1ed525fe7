package openai

import (
	"bytes"
	"strings"
	"unicode/utf8"
)

// Error types the gateway sends, as OpenAI names them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeRateLimit      = "rate_limit_error"
	TypeServer         = "server_error"
	TypePermission     = "permission_error"
)

// AppendError appends an OpenAI error body to dst:
//
//	{"error":{"message":"...","type":"...","param":null,"code":"..."}}
//
// with message, typ, code and param escaped as JSON strings (invalid UTF-8 becomes U+FFFD). An empty code or
// param is written as null. It does not allocate when dst has room.
func AppendError(dst []byte, message, typ, code string, param string) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = AppendQuoted(dst, message)
	dst = append(dst, `,"type":`...)
	dst = AppendQuoted(dst, typ)
	dst = append(dst, `,"param":`...)
	dst = appendQuotedOrNull(dst, param)
	dst = append(dst, `,"code":`...)
	dst = appendQuotedOrNull(dst, code)
	return append(dst, "}}"...)
}

func appendQuotedOrNull(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, "null"...)
	}
	return AppendQuoted(dst, s)
}

// AppendErrorEvent appends an SSE event carrying an OpenAI error body (param null) to dst:
// "data: {"error":{...}}\n\n". The OpenAI SDKs raise an APIError on it; follow it with AppendDone.
func AppendErrorEvent(dst []byte, message, typ, code string) []byte {
	dst = append(dst, "data: "...)
	dst = AppendError(dst, message, typ, code, "")
	return append(dst, "\n\n"...)
}

// AppendQuoted appends s to dst as a JSON string: quotes, backslash escapes for '"', '\\' and control
// characters, \u2028 and \u2029 escaped (as encoding/json does, for JavaScript), invalid UTF-8 replaced by
// U+FFFD. HTML characters are not escaped.
func AppendQuoted[S ~string | ~[]byte](dst []byte, s S) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c < utf8.RuneSelf {
			i++
			continue
		}
		if c < utf8.RuneSelf {
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		// At most four bytes: the conversion of a []byte uses a buffer on the stack.
		r, size := utf8.DecodeRuneInString(string(s[i:min(i+utf8.UTFMax, len(s))]))
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// maxPlainError bounds the message taken from a plain-text upstream error body.
const maxPlainError = 512

// ParseUpstreamError extracts a message and an error type from an upstream error body, for passing the error on
// in OpenAI shape. It understands the OpenAI shape {"error":{"message","type",...}} (vLLM's too, whose "code" is
// an integer), older vLLM's top-level {"object":"error","message","type","code"}, {"error":"text"} with an
// optional "error_type" (TGI), FastAPI's {"detail":...}, and plain text, trimmed and cut to 512 bytes. typ is the
// upstream's own type (vLLM uses Python exception names such as "BadRequestError"), empty when the body has
// none; the caller picks the OpenAI type from the status. Both strings are new (they do not alias body).
func ParseUpstreamError(body []byte) (message, typ string) {
	body = bytes.TrimSpace(body)
	sc := scanner{b: body, maxDepth: chunkDepth}
	if len(body) > 0 && body[0] == '{' {
		if end, err := sc.skip(0, 0); err == nil && sc.end(end) == nil {
			var f errFields
			f.read(&sc, 0, 1)
			if f.err.Start >= 0 && body[f.err.Start] == '{' {
				var inner errFields
				inner.read(&sc, f.err.Start, 2)
				return inner.text(body, inner.message), inner.text(body, inner.typ)
			}
			if f.err.Start >= 0 && body[f.err.Start] == '"' {
				return f.text(body, f.err), f.text(body, f.errType)
			}
			if f.message.Start >= 0 {
				return f.text(body, f.message), f.text(body, f.typ)
			}
			if f.detail.Start >= 0 {
				if body[f.detail.Start] == '"' {
					return f.text(body, f.detail), ""
				}
				return plainError(body[f.detail.Start:f.detail.End]), ""
			}
		}
	}
	return plainError(body), ""
}

// errFields are the spans of the members of an error object that ParseUpstreamError reads.
type errFields struct {
	err, errType, message, typ, detail Span
}

func (f *errFields) read(sc *scanner, at, depth int) {
	*f = errFields{noSpan, noSpan, noSpan, noSpan, noSpan}
	var buf [maxKeyLen]byte
	i, empty, _ := sc.open(at, depth)
	for !empty {
		raw, flags, j, _ := sc.key(i)
		j = sc.ws(j)
		end, _ := sc.skip(j, depth)
		sp := Span{j, end}
		switch string(keyName(raw, flags, &buf)) {
		case "error":
			f.err = sp
		case "error_type":
			f.errType = sp
		case "message":
			f.message = sp
		case "type":
			f.typ = sp
		case "detail":
			f.detail = sp
		}
		var more bool
		if i, more, _ = sc.next(end, '}'); !more {
			return
		}
	}
}

// text returns the string value at sp, decoded; "" when absent or not a string.
func (f *errFields) text(body []byte, sp Span) string {
	if sp.Start < 0 || body[sp.Start] != '"' {
		return ""
	}
	raw := body[sp.Start+1 : sp.End-1]
	return string(appendUnescaped(nil, raw, strEscaped|strInvalid))
}

func plainError(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > maxPlainError {
		b = b[:maxPlainError]
		for k := 0; k < utf8.UTFMax-1 && len(b) > 0; k++ { // drop a rune the cut split
			if r, size := utf8.DecodeLastRune(b); r != utf8.RuneError || size != 1 {
				break
			}
			b = b[:len(b)-1]
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
