package policy

import (
	"strings"
	"testing"
)

func TestObserveSections(t *testing.T) {
	const base = "auth: none\nbackends: [{name: b, url: 'http://h:1', models: [m]}]\nmodels: [{name: m}]\n"
	c, err := Parse("p.yaml", []byte(base+"tracing: {enabled: true, endpoint: 'http://collector:4318', protocol: grpc, sample: 0.25}\naccess_log: {enabled: false, sample: 0.1}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if tr := c.Tracing; tr.Enabled == nil || !*tr.Enabled || tr.Endpoint != "http://collector:4318" || tr.Protocol != TracingGRPC ||
		tr.Sample == nil || *tr.Sample != 0.25 {
		t.Errorf("tracing %+v", tr)
	}
	if c.AccessLog.On() || c.AccessLog.Sample != 0.1 {
		t.Errorf("access_log %+v", c.AccessLog)
	}
	c, err = Parse("p.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	if !c.AccessLog.On() || c.AccessLog.Sample != 1 || c.Tracing.Enabled != nil || c.Tracing.Sample != nil {
		t.Errorf("defaults: access_log %+v, tracing %+v", c.AccessLog, c.Tracing)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"tracing: {endpoint: 'collector:4318'}", "tracing.endpoint: expected http://host:port"},
		{"tracing: {endpoint: 'http://u:p@collector:4318'}", "tracing.endpoint: must not carry user info"},
		{"tracing: {protocol: thrift}", `tracing.protocol: unknown protocol "thrift"`},
		{"tracing: {sample: 1.5}", "tracing.sample: must be in [0, 1]"},
		{"access_log: {sample: 0}", "access_log.sample: must be in (0, 1]"},
		{"access_log: {smaple: 0.1}", "access_log.smaple"},
	} {
		_, err := Parse("p.yaml", []byte(base+tc.yaml+"\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.yaml, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), "u:p@") {
			t.Errorf("%s: the error prints the endpoint's credentials: %v", tc.yaml, err)
		}
	}
}
