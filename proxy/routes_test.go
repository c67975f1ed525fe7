package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/switchyard/switchyard/routing"
)

// seen is what a pass-through backend received.
type seen struct {
	method, path, contentType string
	body                      []byte
	model                     string // the model field of the JSON body or the form
}

// passBackend is an engine that answers the pass-through endpoints: a JSON echo of what it received, an error
// of its own for a body asking for one, and an SSE stream for a form with stream=true.
type passBackend struct {
	*httptest.Server
	mu   sync.Mutex
	last seen
}

func newPassBackend(t *testing.T) *passBackend {
	pb := &passBackend{}
	pb.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s := seen{method: r.Method, path: r.URL.Path, contentType: r.Header.Get("Content-Type"), body: body}
		stream := false
		if strings.HasPrefix(s.contentType, "multipart/form-data") {
			r.Body = io.NopCloser(bytes.NewReader(body))
			if err := r.ParseMultipartForm(1 << 20); err == nil {
				s.model = r.FormValue("model")
				stream = r.FormValue("stream") == "true"
			}
		} else {
			var v struct {
				Model string `json:"model"`
			}
			_ = json.Unmarshal(body, &v)
			s.model = v.Model
		}
		pb.mu.Lock()
		pb.last = s
		pb.mu.Unlock()
		switch {
		case bytes.Contains(body, []byte("please fail")):
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnprocessableEntity)
			_, _ = io.WriteString(w, `{"detail":[{"loc":["body","query"],"msg":"engine says no"}],"x":1}`)
		case stream:
			w.Header().Set("Content-Type", "text/event-stream")
			for _, tok := range []string{"hel", "lo"} {
				_, _ = io.WriteString(w, `data: {"object":"transcription.chunk","model":"`+s.model+`","choices":[{"delta":{"content":"`+tok+`"}}]}`+"\n\n")
				w.(http.Flusher).Flush()
			}
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"model":"`+s.model+`","path":"`+s.path+`","results":[{"index":0,"relevance_score":0.5}],"x_unknown":{"kept": [1, 2]}}`)
		}
	}))
	t.Cleanup(pb.Close)
	return pb
}

func (pb *passBackend) seen() seen {
	pb.mu.Lock()
	defer pb.mu.Unlock()
	return pb.last
}

func form(t *testing.T, fields map[string]string) (string, []byte) {
	t.Helper()
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	fw, err := w.CreateFormFile("file", "a.wav")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = fw.Write([]byte("RIFF\x00\x01binary audio\xff"))
	for k, v := range fields {
		_ = w.WriteField(k, v)
	}
	_ = w.Close()
	return w.FormDataContentType(), buf.Bytes()
}

// TestPassThroughRoutes: every pass-through endpoint reaches the backend by its path, with the client's body
// (the model renamed to the upstream name), and the answer comes back as the engine sent it.
func TestPassThroughRoutes(t *testing.T) {
	t.Parallel()
	pb := newPassBackend(t)
	snap := snapshotOf(&routing.RoundRobin{}, 1, pb.URL)
	m := snap.Models["sim-model"]
	m.Endpoints = AllEndpoints
	m.Targets[0].Model = "engine-name" // the engine knows the model by another name
	snap.Backends[0].Config().Models = []string{"engine-name"}
	gw := startGateway(t, snap, Options{})

	for _, path := range []string{"/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score", "/v2/embed",
		"/tokenize", "/detokenize", "/v1/audio/speech", "/v1/messages/count_tokens"} {
		t.Run(path, func(t *testing.T) {
			body := `{"query":"model","model" : "sim-model","documents":["a","b"],"top_n":1}`
			resp, got := rawPost(t, gw.url, path, []byte(body), nil)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, got)
			}
			s := pb.seen()
			if s.path != path || s.method != "POST" || s.model != "engine-name" {
				t.Errorf("backend saw %s %s model %q, want POST %s model engine-name", s.method, s.path, s.model, path)
			}
			if want := strings.Replace(body, `"sim-model"`, `"engine-name"`, 1); string(s.body) != want {
				t.Errorf("backend body %s, want %s", s.body, want)
			}
			want := `{"model":"sim-model","path":"` + path + `","results":[{"index":0,"relevance_score":0.5}],"x_unknown":{"kept": [1, 2]}}`
			if string(got) != want {
				t.Errorf("answer %s, want %s", got, want)
			}
			if resp.Header.Get("X-Switchyard-Backend") != "b0" {
				t.Errorf("X-Switchyard-Backend = %q", resp.Header.Get("X-Switchyard-Backend"))
			}
		})
	}

	t.Run("engine error intact", func(t *testing.T) {
		resp, got := rawPost(t, gw.url, "/v1/rerank", []byte(`{"model":"sim-model","query":"please fail"}`), nil)
		if resp.StatusCode != 422 || resp.Header.Get("Content-Type") != "application/problem+json" ||
			string(got) != `{"detail":[{"loc":["body","query"],"msg":"engine says no"}],"x":1}` {
			t.Errorf("%d %q %s, want the engine's 422 as it sent it", resp.StatusCode, resp.Header.Get("Content-Type"), got)
		}
	})

	t.Run("audio form", func(t *testing.T) {
		ct, body := form(t, map[string]string{"model": "sim-model", "language": "en"})
		resp, got := rawPost(t, gw.url, "/v1/audio/transcriptions", body, map[string]string{"Content-Type": ct})
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, got)
		}
		s := pb.seen()
		if s.model != "engine-name" || s.contentType != ct || !bytes.Contains(s.body, []byte("binary audio\xff")) {
			t.Errorf("backend saw model %q content type %q body %q", s.model, s.contentType, s.body)
		}
	})

	t.Run("audio stream", func(t *testing.T) {
		ct, body := form(t, map[string]string{"model": "sim-model", "stream": "true"})
		resp, got := rawPost(t, gw.url, "/v1/audio/transcriptions", body, map[string]string{"Content-Type": ct})
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%d %q %s", resp.StatusCode, resp.Header.Get("Content-Type"), got)
		}
		want := `data: {"object":"transcription.chunk","model":"sim-model","choices":[{"delta":{"content":"hel"}}]}` + "\n\n" +
			`data: {"object":"transcription.chunk","model":"sim-model","choices":[{"delta":{"content":"lo"}}]}` + "\n\n" +
			"data: [DONE]\n\n"
		if string(got) != want {
			t.Errorf("stream\n%s\nwant\n%s", got, want)
		}
	})

	t.Run("a form where JSON goes", func(t *testing.T) {
		ct, body := form(t, map[string]string{"model": "sim-model"})
		resp, got := rawPost(t, gw.url, "/v1/rerank", body, map[string]string{"Content-Type": ct})
		if resp.StatusCode != 400 {
			t.Errorf("%d %s, want 400", resp.StatusCode, got)
		}
	})
}

// TestEndpointNotEnabled: a model that does not list a group answers 404 naming the endpoint and the group,
// without reaching a backend; an unknown path is a 404 naming it.
func TestEndpointNotEnabled(t *testing.T) {
	t.Parallel()
	pb := newPassBackend(t)
	gw := startGateway(t, snapshotOf(&routing.RoundRobin{}, 1, pb.URL), Options{}) // default endpoints
	resp, got := rawPost(t, gw.url, "/v1/rerank", []byte(`{"model":"sim-model","query":"q"}`), nil)
	if resp.StatusCode != 404 || !bytes.Contains(got, []byte(`/v1/rerank is not enabled for the model sim-model`)) ||
		!bytes.Contains(got, []byte("rerank")) {
		t.Errorf("not enabled: %d %s", resp.StatusCode, got)
	}
	if s := pb.seen(); s.path != "" {
		t.Errorf("the backend was reached: %+v", s)
	}
	resp, got = rawPost(t, gw.url, "/v1/nothing/here", []byte(`{}`), nil)
	if resp.StatusCode != 404 || !bytes.Contains(got, []byte("/v1/nothing/here")) {
		t.Errorf("unknown path: %d %s", resp.StatusCode, got)
	}
	long := "/v1/" + strings.Repeat("x", 10000)
	resp, got = rawPost(t, gw.url, long, []byte(`{}`), nil)
	if resp.StatusCode != 404 || len(got) > 1024 {
		t.Errorf("a long unknown path: %d, %d bytes of answer, want 404 with the path cut short", resp.StatusCode, len(got))
	}
	resp, got = rawPost(t, gw.url, "/v1/rerank", []byte(`{"query":"no model"}`), nil)
	if resp.StatusCode != 400 || !bytes.Contains(got, []byte(`"param":"model"`)) {
		t.Errorf("no model: %d %s", resp.StatusCode, got)
	}
}
