package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/policy"
)

const (
	repoRoot        = "../.."
	containerConfig = "deploy/container/config.yaml"
)

// containerEnv is every variable the container policy reads; each test sets them all.
var containerEnv = []string{"SWITCHYARD_API_KEY", "SWITCHYARD_BACKEND_URL", "SWITCHYARD_ENGINE", "SWITCHYARD_MODEL", "SWITCHYARD_REGION"}

func parseContainerConfig(t *testing.T, env map[string]string) (*policy.Config, error) {
	t.Helper()
	for _, k := range containerEnv {
		t.Setenv(k, "") // restored at cleanup
		if v, ok := env[k]; ok {
			os.Setenv(k, v)
		} else {
			os.Unsetenv(k)
		}
	}
	path := filepath.Join(repoRoot, containerConfig)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return policy.Parse(path, data)
}

// TestContainerConfig: the image's policy parses with the real policy package, listens on every interface with
// the admin port apart, requires a key from SWITCHYARD_API_KEY (refusing to start without it, never open), takes
// its backend from the environment, and its grace plus drain fit Kubernetes' default termination grace.
func TestContainerConfig(t *testing.T) {
	c, err := parseContainerConfig(t, map[string]string{"SWITCHYARD_API_KEY": "sk-test"})
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	if c.Listen != "0.0.0.0:8080" || c.AdminListen != "0.0.0.0:9090" {
		t.Errorf("listen %s, admin %s; want 0.0.0.0:8080 and 0.0.0.0:9090", c.Listen, c.AdminListen)
	}
	if c.Auth != policy.AuthAPIKeys || len(c.APIKeys) != 1 {
		t.Errorf("auth %s with %d keys; want api_keys with one", c.Auth, len(c.APIKeys))
	}
	if b := c.Backends[0]; b.URL != "http://127.0.0.1:8000" || b.Engine != "vllm" || c.Models[0].Name != "default" {
		t.Errorf("defaults: backend %s (%s), model %s", b.URL, b.Engine, c.Models[0].Name)
	}
	if l := c.Limits; l.ShutdownGrace <= 0 || l.ShutdownGrace+l.DrainTimeout >= 30*time.Second {
		t.Errorf("shutdown_grace %v + drain_timeout %v: want a grace, and both within 30 s", l.ShutdownGrace, l.DrainTimeout)
	}

	c, err = parseContainerConfig(t, map[string]string{"SWITCHYARD_API_KEY": "sk-test",
		"SWITCHYARD_BACKEND_URL": "http://vllm.inference:8000", "SWITCHYARD_ENGINE": "sglang",
		"SWITCHYARD_MODEL": "meta-llama/Llama-3.1-8B-Instruct", "SWITCHYARD_REGION": "eu-west"})
	if err != nil {
		t.Fatalf("parse with the environment set: %v", err)
	}
	if b := c.Backends[0]; b.URL != "http://vllm.inference:8000" || b.Engine != "sglang" || b.Region != "eu-west" ||
		c.Models[0].Name != "meta-llama/Llama-3.1-8B-Instruct" || c.Models[0].Targets[0].Backend != b.Name {
		t.Errorf("from the environment: backend %+v, model %+v", b, c.Models[0])
	}

	for _, env := range []map[string]string{nil, {"SWITCHYARD_API_KEY": ""}} {
		_, err := parseContainerConfig(t, env)
		if err == nil {
			t.Fatalf("env %v: parsed without an API key", env)
		}
		if !strings.Contains(err.Error(), "SWITCHYARD_API_KEY") && !strings.Contains(err.Error(), "empty key") {
			t.Errorf("env %v: the error does not say what is missing:\n%v", env, err)
		}
	}
}

// TestDockerfile: every COPY source from the build context exists, and the image's config is the container
// policy, at the path its CMD serves.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var config, cmd string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		switch strings.ToUpper(f[0]) {
		case "COPY":
			args := f[1:]
			if len(args) > 0 && strings.HasPrefix(args[0], "--from=") {
				continue // from another stage, not the context
			}
			for len(args) > 0 && strings.HasPrefix(args[0], "--") {
				args = args[1:]
			}
			if len(args) < 2 {
				t.Errorf("COPY without source and destination: %q", line)
				continue
			}
			for _, src := range args[:len(args)-1] {
				if _, err := os.Stat(filepath.Join(repoRoot, src)); err != nil {
					t.Errorf("COPY source %s: %v", src, err)
				}
			}
			if args[0] == containerConfig {
				config = args[len(args)-1]
			}
		case "CMD":
			cmd = line
		}
	}
	if config == "" {
		t.Fatalf("the Dockerfile does not COPY %s", containerConfig)
	}
	if !strings.Contains(cmd, `"-config", "`+config+`"`) {
		t.Errorf("CMD %q does not serve %s", cmd, config)
	}
	if bytes.Contains(data, []byte("COPY config.yaml")) {
		t.Error("the image still bakes in the repository's config.yaml, which listens on 127.0.0.1")
	}
}
