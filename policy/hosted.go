package policy

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/switchyard/switchyard/routing"
)

// gatewayHeaders are the request headers the gateway sets or governs itself on the way upstream (framing,
// hop-by-hop, its own identification and control headers): a backend's headers may not set them. Lower case.
var gatewayHeaders = map[string]string{
	"host":                "the gateway sets it from the backend's url",
	"content-length":      "the gateway frames the body itself",
	"transfer-encoding":   "the gateway frames the body itself",
	"connection":          "a hop-by-hop header (RFC 9110 section 7.6.1)",
	"keep-alive":          "a hop-by-hop header (RFC 9110 section 7.6.1)",
	"proxy-connection":    "a hop-by-hop header (RFC 9110 section 7.6.1)",
	"te":                  "a hop-by-hop header (RFC 9110 section 7.6.1)",
	"trailer":             "a hop-by-hop header (RFC 9110 section 7.6.1)",
	"upgrade":             "a hop-by-hop header (RFC 9110 section 7.6.1)",
	"proxy-authorization": "a hop-by-hop header (RFC 9110 section 7.6.1)",
	"content-type":        "the gateway always sends application/json",
	"accept-encoding":     "the gateway reads the upstream response uncompressed",
	"x-request-id":        "the gateway sets the request's id",
	"x-forwarded-for":     "the gateway sets the client's address",
}

// validateHosted checks a backend's hosted-API settings (headers, query, path, ca_file, forward_authorization)
// and compiles the path template and the CA bundle into b. Header and query values are never printed.
func (r *report) validateHosted(c *Config, p string, b *Backend) {
	for _, name := range slices.Sorted(maps.Keys(b.Headers)) {
		hp := p + ".headers." + name
		lower := strings.ToLower(name)
		why, owned := gatewayHeaders[lower]
		switch {
		case !headerRE.MatchString(name):
			r.errorf(hp, fmt.Sprintf("invalid HTTP header name %q", name))
		case owned:
			r.errorf(hp, fmt.Sprintf("the gateway owns %s: %s", name, why))
		case strings.HasPrefix(lower, "x-switchyard-"):
			r.errorf(hp, "x-switchyard-* headers are the gateway's own")
		case lower == "authorization" && (b.APIKey != "" || b.ForwardAuthorization):
			r.errorf(hp, "Authorization is already set by api_key or forward_authorization: use one of them")
		case strings.ContainsAny(b.Headers[name].Value(), "\r\n\x00"):
			r.errorf(hp, "the value must not contain CR, LF or NUL")
		}
	}
	for _, k := range slices.Sorted(maps.Keys(b.Query)) {
		qp := p + ".query." + k
		switch {
		case k == "" || strings.ContainsAny(k, "&=#? \t\r\n"):
			r.errorf(qp, fmt.Sprintf("invalid query parameter name %q", k))
		case strings.ContainsFunc(b.Query[k].Value(), func(c rune) bool { return c < 0x20 || c == 0x7f }):
			r.errorf(qp, "the value must not contain control characters")
		}
	}
	if b.Path != "" {
		t, err := routing.ParsePathTemplate(b.Path)
		if err != nil {
			r.errorf(p+".path", err.Error())
		}
		b.path = t
	}
	if b.ForwardAuthorization && b.APIKey != "" {
		r.errorf(p+".forward_authorization", "the backend's api_key replaces the client's Authorization: remove one of them")
	}
	if b.CAFile != "" {
		r.caFile(c, p+".ca_file", b)
	}
}

// caFile loads a backend's CA bundle: a path relative to the policy file's directory, PEM certificates, for an
// https URL.
func (r *report) caFile(c *Config, p string, b *Backend) {
	if u, err := url.Parse(b.URL); err == nil && u.Scheme != "https" {
		r.errorf(p, "only for https backends: the url is not https")
		return
	}
	f := b.CAFile
	if !filepath.IsAbs(f) {
		f = filepath.Join(filepath.Dir(c.File), f)
	}
	// The messages name the file as the policy writes it (relative to the policy's own directory), so they
	// read the same whatever directory the gateway was started from.
	data, err := os.ReadFile(f)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		r.errorf(p, fmt.Sprintf("cannot read the CA bundle %s: %v", b.CAFile, err))
		return
	}
	ca, err := routing.NewCABundle(data)
	if err != nil {
		r.errorf(p, fmt.Sprintf("%s: %v", b.CAFile, err))
		return
	}
	b.ca = ca
}

// upstreamHeaders returns a backend's headers for routing, sorted by name.
func upstreamHeaders(b *Backend) []routing.Header {
	var hs []routing.Header
	for _, name := range slices.Sorted(maps.Keys(b.Headers)) {
		hs = append(hs, routing.Header{Name: name, Value: b.Headers[name].Value()})
	}
	return hs
}

// upstreamQuery returns a backend's query parameters encoded, sorted by name.
func upstreamQuery(b *Backend) string {
	q := url.Values{}
	for k, v := range b.Query {
		q.Set(k, v.Value())
	}
	return q.Encode()
}
