package policy

import (
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/switchyard/switchyard/routing"
)

func TestHostedBackendCompiles(t *testing.T) {
	t.Setenv("SWITCHYARD_TEST_AZURE_KEY", "azure-secret")
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	defer srv.Close()
	dir := t.TempDir()
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(filepath.Join(dir, "ca.pem"), caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "policy.yaml")
	src := `backends:
  - name: azure
    url: https://example.openai.azure.com
    engine: openai
    models: [gpt-4o]
    headers: {api-key: "${SWITCHYARD_TEST_AZURE_KEY}", OpenAI-Project: proj-1}
    query: {api-version: "2024-10-21", z: "a b"}
    path: /openai/deployments/{model}/{endpoint}
    ca_file: ca.pem
  - name: byok
    url: https://api.example.com
    engine: openai-hosted
    models: [gpt-4o]
    forward_authorization: true
models: [{name: gpt-4o}]
auth: none
`
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	_, snap, err := Load(file, routing.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	cfg := snap.Backends[0].Config()
	want := []routing.Header{{Name: "OpenAI-Project", Value: "proj-1"}, {Name: "api-key", Value: "azure-secret"}}
	if len(cfg.Headers) != 2 || cfg.Headers[0] != want[0] || cfg.Headers[1] != want[1] {
		t.Errorf("headers %v", cfg.Headers)
	}
	if cfg.Query != "api-version=2024-10-21&z=a+b" {
		t.Errorf("query %q", cfg.Query)
	}
	if got := string(cfg.Path.AppendPath(nil, []byte("/v1/chat/completions"), "gpt-4o")); got != "/openai/deployments/gpt-4o/chat/completions" {
		t.Errorf("path %q", got)
	}
	if cfg.CA == nil || cfg.Engine != routing.EngineOpenAIHosted || cfg.ForwardAuthorization {
		t.Errorf("ca %v engine %q forward %v", cfg.CA, cfg.Engine, cfg.ForwardAuthorization)
	}
	if b := snap.Backends[1].Config(); !b.ForwardAuthorization || b.CA != nil || b.Path != nil || b.Query != "" {
		t.Errorf("byok %+v", b)
	}
}
