package openai

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestAppendError(t *testing.T) {
	got := string(AppendError([]byte("x"), "bad \"model\"\n\x01é\u2028", TypeInvalidRequest, "model_not_found", "model"))
	want := `x{"error":{"message":"bad \"model\"\n\u0001é\u2028","type":"invalid_request_error","param":"model","code":"model_not_found"}}`
	if got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	got = string(AppendError(nil, "overloaded", TypeServer, "", ""))
	if want := `{"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}`; got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	got = string(AppendErrorEvent(nil, "upstream timed out", TypeServer, "upstream_timeout"))
	if want := "data: {\"error\":{\"message\":\"upstream timed out\",\"type\":\"server_error\",\"param\":null,\"code\":\"upstream_timeout\"}}\n\n"; got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if got := string(AppendDone([]byte("x"))); got != "xdata: [DONE]\n\n" {
		t.Errorf("AppendDone: %q", got)
	}
	if string(Ping) != ": ping\n\n" {
		t.Errorf("Ping: %q", Ping)
	}
	dst := make([]byte, 0, 256)
	if n := testing.AllocsPerRun(100, func() { AppendError(dst, "m\n", "t", "c", "p") }); n != 0 {
		t.Errorf("AppendError: %v allocs", n)
	}
}

func FuzzAppendQuoted(f *testing.F) {
	f.Add("plain")
	f.Add("\"\\\n\r\t\x00\x1f\x7f é \u2028\u2029 \xff\xc3")
	f.Fuzz(func(t *testing.T, s string) {
		q := AppendQuoted(nil, s)
		var back string
		if err := json.Unmarshal(q, &back); err != nil {
			t.Fatalf("%q -> %s: %v", s, q, err)
		}
		if want := strings.ToValidUTF8(s, "\uFFFD"); back != want && back != decodeLikeJSON(s) {
			t.Fatalf("%q -> %s -> %q", s, q, back)
		}
		if qb := AppendQuoted(nil, []byte(s)); string(qb) != string(q) {
			t.Fatalf("string and []byte differ: %s %s", q, qb)
		}
	})
}

// decodeLikeJSON replaces each invalid byte with U+FFFD, as encoding/json does (strings.ToValidUTF8 replaces runs).
func decodeLikeJSON(s string) string {
	b, _ := json.Marshal(s)
	var out string
	json.Unmarshal(b, &out)
	return out
}

func TestParseUpstreamError(t *testing.T) {
	tests := []struct{ body, msg, typ string }{
		{`{"error":{"message":"Invalid model","type":"invalid_request_error","param":"model","code":"model_not_found"}}`, "Invalid model", "invalid_request_error"},
		{`{"error":{"message":"The model \u0060x\u0060 does not exist.","type":"NotFoundError","param":null,"code":404}}`, "The model `x` does not exist.", "NotFoundError"},
		{`{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}`, "too long", "BadRequestError"},
		{`{"error":"Model is overloaded","error_type":"overloaded"}`, "Model is overloaded", "overloaded"},
		{`{"detail":"Not Found"}`, "Not Found", ""},
		{`{"detail":[{"loc":["body","model"],"msg":"field required"}]}`, `[{"loc":["body","model"],"msg":"field required"}]`, ""},
		{"  upstream connect error or disconnect/reset before headers\n", "upstream connect error or disconnect/reset before headers", ""},
		{`<html>502 Bad Gateway</html>`, "<html>502 Bad Gateway</html>", ""},
		{``, "", ""},
		{`{"unrelated":1}`, `{"unrelated":1}`, ""},
		{"bad \xff bytes", "bad \uFFFD bytes", ""},
	}
	for _, tc := range tests {
		msg, typ := ParseUpstreamError([]byte(tc.body))
		if msg != tc.msg || typ != tc.typ {
			t.Errorf("ParseUpstreamError(%s) = %q, %q; want %q, %q", tc.body, msg, typ, tc.msg, tc.typ)
		}
	}
	long := strings.Repeat("é", 400)
	if msg, _ := ParseUpstreamError([]byte(long)); len(msg) > maxPlainError || !strings.HasPrefix(long, msg) {
		t.Errorf("long plain body: %d bytes, prefix %v", len(msg), strings.HasPrefix(long, msg))
	}
}
