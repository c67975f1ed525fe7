package deploy

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/switchyard/switchyard/policy"
	"github.com/switchyard/switchyard/sim"
)

const chartDir = "helm/switchyard"

// serviceMonitor is the part of the Prometheus Operator's ServiceMonitor (monitoring.coreos.com/v1) the chart
// writes, so that strict decoding still rejects a misspelt field without linking the operator's module.
type serviceMonitor struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		Selector  metav1.LabelSelector `json:"selector"`
		Endpoints []struct {
			Port          string `json:"port"`
			Path          string `json:"path"`
			Interval      string `json:"interval"`
			ScrapeTimeout string `json:"scrapeTimeout"`
		} `json:"endpoints"`
	} `json:"spec"`
}

// rendered is a chart rendering decoded into the Kubernetes types.
type rendered struct {
	deployments map[string]*appsv1.Deployment
	services    map[string]*corev1.Service
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	hpas        []*autoscalingv2.HorizontalPodAutoscaler
	monitors    []*serviceMonitor
}

// render renders the chart with vals over its defaults, as helm install would (release "sy" in namespace
// "llm"), and decodes every document strictly into its Kubernetes type: an unknown field, a misplaced one or an
// unknown kind is an error.
func render(t *testing.T, vals map[string]any) *rendered {
	t.Helper()
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	opts := chartutil.ReleaseOptions{Name: "sy", Namespace: "llm", Revision: 1, IsInstall: true}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: "v1.31.0", Major: "1", Minor: "31"}
	top, err := chartutil.ToRenderValues(chrt, vals, opts, caps)
	if err != nil {
		t.Fatal(err)
	}
	files, err := engine.Engine{Strict: true}.Render(chrt, top)
	if err != nil {
		t.Fatal(err)
	}
	r := &rendered{deployments: map[string]*appsv1.Deployment{}, services: map[string]*corev1.Service{},
		configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !strings.HasSuffix(name, ".yaml") {
			continue // _helpers.tpl, NOTES.txt
		}
		for i, doc := range strings.Split(files[name], "\n---\n") {
			if strings.TrimSpace(stripComments(doc)) == "" {
				continue
			}
			where := fmt.Sprintf("%s#%d", name, i)
			var meta metav1.TypeMeta
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v\n%s", where, err, doc)
			}
			strict := func(v any) {
				if err := yaml.UnmarshalStrict([]byte(doc), v); err != nil {
					t.Fatalf("%s (%s): %v\n%s", where, meta.Kind, err, doc)
				}
			}
			switch meta.APIVersion + " " + meta.Kind {
			case "apps/v1 Deployment":
				d := new(appsv1.Deployment)
				strict(d)
				r.deployments[d.Name] = d
			case "v1 Service":
				s := new(corev1.Service)
				strict(s)
				r.services[s.Name] = s
			case "v1 ConfigMap":
				c := new(corev1.ConfigMap)
				strict(c)
				r.configMaps[c.Name] = c
			case "v1 Secret":
				s := new(corev1.Secret)
				strict(s)
				r.secrets[s.Name] = s
			case "autoscaling/v2 HorizontalPodAutoscaler":
				h := new(autoscalingv2.HorizontalPodAutoscaler)
				strict(h)
				r.hpas = append(r.hpas, h)
			case "monitoring.coreos.com/v1 ServiceMonitor":
				m := new(serviceMonitor)
				strict(m)
				r.monitors = append(r.monitors, m)
			default:
				t.Fatalf("%s: unexpected %s %s", where, meta.APIVersion, meta.Kind)
			}
		}
	}
	return r
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// allOn sets every toggle of the chart, and the API keys through a Secret the chart creates.
func allOn() map[string]any {
	return map[string]any{
		"redis":          map[string]any{"enabled": true},
		"serviceMonitor": map[string]any{"enabled": true},
		"autoscaling":    map[string]any{"enabled": true},
		"apiKeys": map[string]any{
			"values": map[string]any{"default": "sk-default-test", "batch": "sk-batch-test"},
			"keys": []any{
				map[string]any{"name": "default", "priority": "standard"},
				map[string]any{"name": "batch", "priority": "sheddable", "models": []any{"my-model"},
					"limits": map[string]any{"requests_per_minute": 600}},
			},
		},
		"limits": map[string]any{"queue_size": 256},
	}
}

// TestChartRenders renders the chart with its defaults and with every toggle on and checks what the gateway and
// Kubernetes will make of it: the ConfigMap's policy parses with the real policy package, with the API keys
// the pod's environment takes from the Secret; the container ports are the policy's listeners; the Service and
// the ServiceMonitor reach them by name; the probes are the admin port's /healthz and /readyz; the grace period
// outlasts preStop plus the drain; the pod runs as non-root; the toggles add exactly their objects.
func TestChartRenders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		vals    map[string]any
		toggled bool
	}{
		{"defaults", nil, false},
		{"all-on", allOn(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.vals)
			const full = "sy-switchyard"
			d, ok := r.deployments[full]
			if !ok {
				t.Fatalf("no Deployment %s among %v", full, keys(r.deployments))
			}
			svc, ok := r.services[full]
			if !ok {
				t.Fatalf("no Service %s", full)
			}
			cm, ok := r.configMaps[full]
			if !ok {
				t.Fatalf("no ConfigMap %s", full)
			}
			pod := d.Spec.Template.Spec
			if len(pod.Containers) != 1 {
				t.Fatalf("%d containers", len(pod.Containers))
			}
			c := pod.Containers[0]

			// The policy, with the keys' variables set as the pod would have them.
			for _, e := range c.Env {
				ref := e.ValueFrom.SecretKeyRef
				if ref == nil {
					t.Fatalf("env %s does not come from a Secret", e.Name)
				}
				text := "sk-from-an-existing-secret"
				if s, ok := r.secrets[ref.Name]; ok {
					text, ok = s.StringData[ref.Key]
					if !ok {
						t.Fatalf("env %s: the Secret %s has no %q", e.Name, ref.Name, ref.Key)
					}
				} else if tc.toggled {
					t.Fatalf("env %s: the chart did not create the Secret %s", e.Name, ref.Name)
				}
				t.Setenv(e.Name, text)
			}
			text, ok := cm.Data["config.yaml"]
			if !ok {
				t.Fatalf("the ConfigMap has no config.yaml: %v", keys(cm.Data))
			}
			if !strings.Contains(text, "${SWITCHYARD_KEY_") {
				t.Errorf("the policy's keys are not ${ENV} references:\n%s", text)
			}
			cfg, err := policy.Parse("config.yaml", []byte(text))
			if err != nil {
				t.Fatalf("the chart's policy does not parse: %v\n%s", err, text)
			}
			if cfg.Auth != policy.AuthAPIKeys || len(cfg.APIKeys) != len(c.Env) {
				t.Errorf("auth %q with %d keys, %d key variables", cfg.Auth, len(cfg.APIKeys), len(c.Env))
			}
			if got := cfg.Limits.DrainTimeout.Seconds(); got != 60 {
				t.Errorf("drain_timeout %vs, want the chart's 60", got)
			}

			// Ports: container = policy listeners; Service targets the container's named ports.
			portOf := map[string]int32{}
			for _, p := range c.Ports {
				portOf[p.Name] = p.ContainerPort
			}
			for name, addr := range map[string]string{"api": cfg.Listen, "admin": cfg.AdminListen} {
				_, port, err := net.SplitHostPort(addr)
				if err != nil {
					t.Fatal(err)
				}
				if n, _ := strconv.Atoi(port); int32(n) != portOf[name] || n == 0 {
					t.Errorf("policy %s listens on %s, the container port %s is %d", name, addr, name, portOf[name])
				}
			}
			for _, sp := range svc.Spec.Ports {
				if sp.TargetPort.Type != intstr.String || portOf[sp.TargetPort.StrVal] == 0 {
					t.Errorf("Service port %s targets %v, not a named container port", sp.Name, sp.TargetPort.String())
				}
				if sp.Port != portOf[sp.TargetPort.StrVal] {
					t.Errorf("Service port %s is %d, the container's %d", sp.Name, sp.Port, portOf[sp.TargetPort.StrVal])
				}
			}
			if !selects(svc.Spec.Selector, d.Spec.Template.Labels) || !selects(d.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
				t.Errorf("selectors %v / %v do not select the pod's labels %v", svc.Spec.Selector, d.Spec.Selector.MatchLabels, d.Spec.Template.Labels)
			}

			// Probes: the admin port's paths.
			for name, want := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
				if want == nil || want.HTTPGet == nil {
					t.Fatalf("no HTTP probe for %s", name)
				}
				if want.HTTPGet.Path != name || want.HTTPGet.Port.String() != "admin" {
					t.Errorf("probe %s:%s, want %s on the admin port", want.HTTPGet.Port.String(), want.HTTPGet.Path, name)
				}
			}

			// Shutdown: preStop, then the drain, inside the grace period.
			if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds < 1 {
				t.Fatalf("no preStop sleep: %+v", c.Lifecycle)
			}
			grace := pod.TerminationGracePeriodSeconds
			if grace == nil || *grace <= c.Lifecycle.PreStop.Sleep.Seconds+int64(cfg.Limits.DrainTimeout.Seconds()) {
				t.Errorf("terminationGracePeriodSeconds %v does not exceed preStop %ds + drain %v", grace, c.Lifecycle.PreStop.Sleep.Seconds, cfg.Limits.DrainTimeout)
			}

			// The policy is mounted as a directory, so that ConfigMap updates reach the watcher.
			mounted := false
			for _, m := range c.VolumeMounts {
				if m.Name == "policy" && m.MountPath == "/etc/switchyard" && m.SubPath == "" {
					mounted = true
				}
			}
			if !mounted || !slices.Contains(c.Args, "/etc/switchyard/config.yaml") {
				t.Errorf("the policy is not mounted as a directory at /etc/switchyard: %+v, args %v", c.VolumeMounts, c.Args)
			}

			// Security and resources.
			ps, cs := pod.SecurityContext, c.SecurityContext
			if ps == nil || ps.RunAsNonRoot == nil || !*ps.RunAsNonRoot || ps.RunAsUser == nil || *ps.RunAsUser == 0 {
				t.Errorf("the pod may run as root: %+v", ps)
			}
			if cs == nil || cs.AllowPrivilegeEscalation == nil || *cs.AllowPrivilegeEscalation || cs.ReadOnlyRootFilesystem == nil || !*cs.ReadOnlyRootFilesystem {
				t.Errorf("container security context %+v", cs)
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v", c.Resources)
			}

			// Toggles.
			redisName := full + "-redis"
			_, redisDep := r.deployments[redisName]
			_, redisSvc := r.services[redisName]
			if redisDep != tc.toggled || redisSvc != tc.toggled || (len(r.hpas) == 1) != tc.toggled || (len(r.monitors) == 1) != tc.toggled {
				t.Errorf("redis %v/%v, hpa %d, servicemonitor %d, want each %v", redisDep, redisSvc, len(r.hpas), len(r.monitors), tc.toggled)
			}
			if !tc.toggled {
				if cfg.Redis.URL.Value() != "" || d.Spec.Replicas == nil {
					t.Errorf("defaults: redis %q, replicas %v", cfg.Redis.URL.Value(), d.Spec.Replicas)
				}
				return
			}
			if want := "redis://" + redisName + ":6379/0"; cfg.Redis.URL.Value() != want {
				t.Errorf("policy redis %q, want the chart's %q", cfg.Redis.URL.Value(), want)
			}
			rs := r.services[redisName]
			if rs.Spec.Ports[0].Port != 6379 || !selects(rs.Spec.Selector, r.deployments[redisName].Spec.Template.Labels) {
				t.Errorf("the Redis Service does not reach the Redis pod on 6379")
			}
			if selects(svc.Spec.Selector, r.deployments[redisName].Spec.Template.Labels) {
				t.Errorf("the gateway's Service also selects the Redis pod")
			}
			if h := r.hpas[0]; h.Spec.ScaleTargetRef.Name != d.Name || h.Spec.ScaleTargetRef.Kind != "Deployment" || d.Spec.Replicas != nil {
				t.Errorf("HPA targets %+v; the Deployment's replicas %v must be left to it", h.Spec.ScaleTargetRef, d.Spec.Replicas)
			}
			sm := r.monitors[0]
			if len(sm.Spec.Endpoints) != 1 || sm.Spec.Endpoints[0].Port != "admin" || sm.Spec.Endpoints[0].Path != "/metrics" ||
				!selects(sm.Spec.Selector.MatchLabels, svc.Labels) {
				t.Errorf("the ServiceMonitor does not scrape the Service's admin port: %+v", sm.Spec)
			}
			if selects(sm.Spec.Selector.MatchLabels, rs.Labels) {
				t.Errorf("the ServiceMonitor also selects the Redis Service")
			}
			if len(cfg.APIKeys) != 2 {
				t.Errorf("%d keys, want 2", len(cfg.APIKeys))
			}
		})
	}
}

// TestProbePathsAreReal: the paths the chart probes answer on a real gateway's admin port (200, with a healthy
// engine behind it), and /metrics, the ServiceMonitor's path, serves the gateway's metrics.
func TestProbePathsAreReal(t *testing.T) {
	r := render(t, allOn())
	c := r.deployments["sy-switchyard"].Spec.Template.Spec.Containers[0]
	paths := []string{c.LivenessProbe.HTTPGet.Path, c.ReadinessProbe.HTTPGet.Path, r.monitors[0].Spec.Endpoints[0].Path}
	be := startSim(t, "a", func(c *sim.Config) {})
	gw := startGateway(t, fmtPolicy(be.URL(), be.URL(), be.URL()))
	for _, p := range paths {
		// Probed again and again, as the kubelet and Prometheus do: readiness is 503 "measuring engines" for
		// the moment the gateway takes its first measure of the engine (proxy.Server.Ready).
		deadline := time.Now().Add(15 * time.Second)
		for {
			resp, err := http.Get(gw.admin + p)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("admin %s: %d", p, resp.StatusCode)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// selects reports whether every pair of sel is in labels.
func selects(sel, labels map[string]string) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func TestMain(m *testing.M) {
	// The policy expands ${ENV} references: the tests set the keys' variables themselves.
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "SWITCHYARD_KEY_") {
			name, _, _ := strings.Cut(kv, "=")
			os.Unsetenv(name)
		}
	}
	os.Exit(m.Run())
}
