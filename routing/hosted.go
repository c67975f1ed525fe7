package routing

import (
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// Header is one extra header sent upstream (BackendConfig.Headers). Its value may be a secret: never print it.
type Header struct {
	Name, Value string
}

// CABundle is the set of certificate authorities an https backend's certificate must chain to, in place of the
// system roots. Immutable once built.
type CABundle struct {
	// Pool holds the certificates.
	Pool *x509.CertPool
	// Sum is the SHA-256 of the PEM text: bundles with the same Sum are the same, so connection pools keyed by
	// it survive a reload that keeps the file.
	Sum [32]byte
}

// NewCABundle parses a PEM bundle. It fails when pem holds no certificate.
func NewCABundle(pem []byte) (*CABundle, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("no PEM certificate found")
	}
	return &CABundle{Pool: pool, Sum: sha256.Sum256(pem)}, nil
}

// PathTemplate is an upstream path with placeholders, such as /openai/deployments/{model}/{endpoint}: {model} is
// the upstream model name (path-escaped) and {endpoint} the request path after /v1/ (chat/completions). Build
// one with ParsePathTemplate; it is immutable.
type PathTemplate struct {
	parts []pathPart
	text  string
}

type pathPart struct {
	lit string
	ph  byte // 0: lit is literal text; 'm': {model}; 'e': {endpoint}
}

// ParsePathTemplate parses a path template: it must start with '/', may contain {model} and {endpoint}, and no
// other braces, query or fragment.
func ParsePathTemplate(s string) (*PathTemplate, error) {
	if !strings.HasPrefix(s, "/") {
		return nil, errors.New("must start with /")
	}
	if strings.ContainsAny(s, "?# \t\r\n") {
		return nil, errors.New("must be a path, without query, fragment or white space (give query parameters in query)")
	}
	t := &PathTemplate{text: s}
	for rest := s; rest != ""; {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			t.parts = append(t.parts, pathPart{lit: rest})
			break
		}
		if i > 0 {
			t.parts = append(t.parts, pathPart{lit: rest[:i]})
		}
		rest = rest[i:]
		switch {
		case strings.HasPrefix(rest, "{model}"):
			t.parts = append(t.parts, pathPart{ph: 'm'})
			rest = rest[len("{model}"):]
		case strings.HasPrefix(rest, "{endpoint}"):
			t.parts = append(t.parts, pathPart{ph: 'e'})
			rest = rest[len("{endpoint}"):]
		default:
			end := strings.IndexByte(rest, '}')
			if rest[0] == '}' || end < 0 {
				return nil, errors.New("unbalanced { }: write {model} or {endpoint}")
			}
			return nil, fmt.Errorf("unknown placeholder %s (one of: {model}, {endpoint})", rest[:end+1])
		}
	}
	return t, nil
}

// String returns the template as written.
func (t *PathTemplate) String() string { return t.text }

// AppendPath appends the upstream path of a request for path (the client's, /v1/chat/completions) and model (the
// upstream model name) to dst: t expanded, or path itself when t is nil. It allocates nothing beyond dst's
// growth.
func (t *PathTemplate) AppendPath(dst, path []byte, model string) []byte {
	if t == nil {
		return append(dst, path...)
	}
	endpoint := path
	if len(endpoint) >= 4 && string(endpoint[:4]) == "/v1/" {
		endpoint = endpoint[4:]
	} else {
		for len(endpoint) > 0 && endpoint[0] == '/' {
			endpoint = endpoint[1:]
		}
	}
	for _, p := range t.parts {
		switch p.ph {
		case 'm':
			dst = appendPathEscaped(dst, model)
		case 'e':
			dst = append(dst, endpoint...)
		default:
			dst = append(dst, p.lit...)
		}
	}
	return dst
}

// appendPathEscaped appends s with every byte outside RFC 3986's unreserved set percent-encoded, so a model name
// can hold neither a '/' nor a '?' that would change the upstream URL.
func appendPathEscaped(dst []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~':
			dst = append(dst, c)
		default:
			dst = append(dst, '%', hex[c>>4], hex[c&15])
		}
	}
	return dst
}

// setUpstreamHeaders sets what the gateway sends on every request of its own to the backend (scrapes, probes):
// the backend's extra headers and its API key.
func setUpstreamHeaders(h http.Header, cfg *BackendConfig) {
	for _, x := range cfg.Headers {
		h.Set(x.Name, x.Value)
	}
	if cfg.APIKey != "" {
		h.Set("Authorization", "Bearer "+cfg.APIKey)
	}
}
