package policy

import (
	"time"

	"github.com/switchyard/switchyard/routing"
)

// Config is a decoded, defaulted and validated policy file. Every field says its unit, its default (what an
// absent field means) and its effect; docs/config.md is the same reference for operators. Fields marked "not
// supported yet" are decoded and validated, but a file that sets them is rejected until their behaviour lands
// (see the supported table), so that no setting is ever silently ignored.
//
// A Config is immutable once returned; it is safe to read from any goroutine.
type Config struct {
	// Listen is the client-facing address (host:port) for the OpenAI-compatible API. Default 127.0.0.1:8080.
	// Static: a reload that changes it is ignored with a warning until the process restarts.
	Listen string `yaml:"listen"`
	// AdminListen is the address of the admin server (/metrics, /healthz, /readyz, /debug). Default
	// 127.0.0.1:9090; must differ from Listen. Static.
	AdminListen string `yaml:"admin_listen"`
	// Region is where this gateway runs (e.g. us-east); backends in other regions are remote. Default "local".
	Region string `yaml:"region"`
	// Redis is where replicas share state: a URL (redis://[:password@]host:port/db or rediss://...) or a
	// mapping with the URL and its settings (see the Redis type). Absent or empty keeps all state in process.
	// Static.
	Redis Redis `yaml:"redis"`
	// Engines describes the kinds of inference servers backends run: where each one's Prometheus metrics are and
	// which metric carries each load signal (see the Engine type). The built-in entries (vllm, sglang, tgi,
	// trtllm-serve, triton, nim, llamacpp, openai-hosted: docs/engines.md) are always there; an entry with a
	// built-in's name overrides it field by field, another name adds an engine. Default: the built-ins only.
	Engines map[string]Engine `yaml:"engines"`
	// Backends are the upstream inference servers, in the order they are listed. At least one.
	Backends []Backend `yaml:"backends"`
	// Models are the public model names clients may ask for, and how each is routed. At least one.
	Models []Model `yaml:"models"`
	// Regions holds per-region settings, keyed by region name (the gateway's region or a backend's). Only the
	// entry of the gateway's own Region is used, so that replicas in several regions can share one file. Without
	// an entry for it, every region may take the gateway's traffic: its own region first, all others after it as
	// one last resort. Default: none.
	Regions map[string]Region `yaml:"regions"`
	// Priorities configures how a request gets its priority class, and each class's SLO factor.
	Priorities Priorities `yaml:"priorities"`
	// Auth is how clients authenticate: AuthAPIKeys (every request needs "Authorization: Bearer <key>" with one
	// of APIKeys) or AuthNone (no authentication: any caller may use every model and claim any priority class).
	// Default AuthAPIKeys. Running open needs auth: none written in the file, so that a file cut short before its
	// api_keys (a write caught half way) is an error rather than a gateway without authentication; auth: none
	// with keys is an error too.
	Auth string `yaml:"auth"`
	// APIKeys are the keys the gateway accepts under auth: api_keys (at least one then; none with auth: none),
	// each with its class, models and rate limits.
	APIKeys []APIKey `yaml:"api_keys"`
	// Limits bounds requests and the gateway's own resources.
	Limits Limits `yaml:"limits"`
	// Tracing configures OpenTelemetry traces (see the Tracing type). Default: as the OTEL_* environment says,
	// off without an OTLP endpoint. Static.
	Tracing Tracing `yaml:"tracing"`
	// AccessLog configures the access log (see the AccessLog type). Default: on, every request. Static.
	AccessLog AccessLog `yaml:"access_log"`
	// Objectives configures how requests choose what routing optimises (latency, throughput or cost) and the
	// exchange rate between money and time that the cost objective uses (see the Objectives type).
	Objectives Objectives `yaml:"objectives"`
	// Reload acknowledges, for the reload that reads this file, the changes to authentication that a reload
	// otherwise refuses (see the Reload type and authchange.go). It must be the file's last top-level field.
	// Default: none; ignored when the gateway starts.
	Reload Reload `yaml:"reload"`

	// File is the path the policy was loaded from, as given.
	File string `yaml:"-"`
	// Hash is the hex SHA-256 of the file's bytes; it identifies the policy in /debug/config and in logs.
	Hash string `yaml:"-"`

	lines authLines // where the file set auth, api_keys and reload, for a refused reload's errors (authchange.go)
}

// Backend is one upstream inference server.
type Backend struct {
	// Name identifies the backend in the X-Switchyard-Backend header, metrics and logs. Required, unique; letters,
	// digits, '.', '_', '-' and ':'.
	Name string `yaml:"name"`
	// URL is the backend's base URL, absolute http or https, without user info, query or fragment, and without
	// the /v1 suffix: request paths such as /v1/chat/completions are appended to it. Required.
	URL string `yaml:"url"`
	// Region is where the backend runs. Default: the gateway's Region.
	Region string `yaml:"region"`
	// Engine is the server software: a name of the engines table (a built-in such as vllm, sglang, tgi,
	// trtllm-serve, triton, nim, llamacpp or openai-hosted, a hosted API with nothing to scrape; openai is
	// accepted for openai-hosted), which decides how its load metrics are scraped. Default vllm.
	Engine string `yaml:"engine"`
	// Models are the model names the backend serves upstream. At least one.
	Models []string `yaml:"models"`
	// APIKey, when set, is sent upstream as "Authorization: Bearer <api_key>" in place of the client's
	// credentials. Write it as ${ENV_VAR}; it is never printed. Default: none.
	APIKey Secret `yaml:"api_key"`
	// Headers are extra headers sent on every request to the backend, and on its scrapes and probes: an API's key
	// header (Azure OpenAI's api-key), an organisation or project header. Values may be ${ENV} secrets: they are
	// never printed. They win over the client's headers of the same name. The gateway's own headers (Host,
	// Content-Length, Transfer-Encoding, Connection and the other hop-by-hop headers, Content-Type,
	// Accept-Encoding, X-Request-Id, X-Forwarded-For, x-switchyard-*) are rejected, and Authorization with
	// api_key or forward_authorization. Default: none.
	Headers map[string]Secret `yaml:"headers"`
	// Query holds query parameters added to every upstream inference URL (Azure OpenAI's api-version). Values
	// may be ${ENV} secrets, never printed. Default: none.
	Query map[string]Secret `yaml:"query"`
	// Path is a path template that replaces the client's path upstream, after the url's own path: {model} is the
	// upstream model name (percent-encoded), {endpoint} the request path after /v1/ (chat/completions), e.g.
	// /openai/deployments/{model}/{endpoint}. It starts with '/', without query or fragment. Default: the
	// client's path (/v1/chat/completions) appended to the url.
	Path string `yaml:"path"`
	// CAFile is a PEM bundle of the certificate authorities the backend's certificate must chain to, in place of
	// the system roots, for the proxy and the metrics scrapes alike: a private CA. Relative to the policy file's
	// directory; read when the policy loads (a changed bundle takes effect with the next reload). Only for https
	// urls. Default: the system roots.
	CAFile string `yaml:"ca_file"`
	// ForwardAuthorization sends the client's own Authorization header upstream (a hosted API where each client
	// has its own key). Not with api_key, which replaces it. With api_keys set, the client's header is its key
	// to the gateway: only forward it to a backend that should see those keys. Default false: the client's
	// credentials are dropped.
	ForwardAuthorization bool `yaml:"forward_authorization"`
	// Weight is the backend's relative share of traffic for the least_request and random strategies (the others
	// ignore it). Default 1; must be > 0 (0, draining, is not supported yet).
	Weight float64 `yaml:"weight"`
	// MaxConcurrency is a fixed cap on the requests in flight through the gateway to the backend (first tries,
	// retries and hedges alike); requests beyond it wait in the gateway queue or go to another backend. 0 means
	// an adaptive cap (admission.CapParams) that keeps the engine's own queue shallow: it starts at the
	// engine's seats when they are known (MaxNumSeqs, or the engine's own figure), else at 8, doubling per
	// scrape while the engine runs all it is sent. Default 0; >= 0.
	MaxConcurrency int `yaml:"max_concurrency"`
	// MaxNumSeqs is the most sequences the engine runs at once (vLLM's --max-num-seqs, SGLang's
	// --max-running-requests, TGI's --max-batch-size): the adaptive cap starts at these seats and keeps the
	// seats held for critical requests from the first request, instead of learning the batch from a queue. An
	// engine that exports its own figure (engines.*.metrics.max_seqs) overrides it. Default 0: the engine's
	// figure, else a fast probe of its running batch. >= 0.
	MaxNumSeqs int `yaml:"max_num_seqs"`
	// Tier is dedicated (capacity this deployment owns and pays for whether used or not: filled first) or
	// overflow (a serverless or hosted endpoint paid per token: used only while every dedicated target of a
	// model is unhealthy or saturated, the cheapest overflow backend first, and left as soon as a dedicated one
	// has room again, with the hysteresis of region failover: routing.Regional). Default dedicated.
	Tier string `yaml:"tier"`
	// Cost is what the backend's tokens cost: it feeds switchyard_cost_dollars_total, the access log, budgets,
	// the order of overflow backends and the cost objective. Default 0 (free).
	Cost Cost `yaml:"cost"`
	// Timeouts bound each attempt sent to the backend. Default: Limits.Timeouts, field by field.
	Timeouts Timeouts `yaml:"timeouts"`
	// Discover, in place of URL, makes the entry a template for every address a DNS name resolves to (a
	// Kubernetes headless Service): one backend per address, named <name>-<ip>:<port>, with the URL
	// http://<ip>:<port> and the entry's other fields, looked up again every interval (discover.go). Models that
	// name the entry are served by all of them. Not with URL. Default: none.
	Discover Discover `yaml:"discover"`

	path *routing.PathTemplate // Path, compiled by validation
	ca   *routing.CABundle     // CAFile's certificates, loaded by validation
}

// Discover says where a backend template's instances are found in DNS.
type Discover struct {
	// DNS is the name to resolve, such as vllm.inference.svc.cluster.local (a headless Service). Required.
	DNS string `yaml:"dns"`
	// Type is a (the name's A and AAAA records, each served on Port) or srv (its SRV records, each with its
	// target's addresses and its own port). Default a.
	Type string `yaml:"type"`
	// Port is the port the instances serve on. Required with type a, 1..65535; not with srv.
	Port int `yaml:"port"`
	// Interval is how often the name is looked up again. Default 10s; at least 1s.
	Interval time.Duration `yaml:"interval"`
}

// Cost is a backend's price, in a currency of the operator's choice (USD by convention) per million tokens.
type Cost struct {
	// Input is the price of one million prompt tokens. Default 0; >= 0.
	Input float64 `yaml:"input"`
	// CachedInput is the price of one million prompt tokens the engine reported as served from its prefix
	// cache (usage.prompt_tokens_details.cached_tokens), which providers discount. Default Input; >= 0.
	CachedInput float64 `yaml:"cached_input"`
	// Output is the price of one million generated tokens. Default 0; >= 0.
	Output float64 `yaml:"output"`
}

// Timeouts bound one upstream attempt, phase by phase (durations such as 500ms, 5s, 10m). Every field must be
// positive.
type Timeouts struct {
	// Connect bounds dialing the backend (TCP, and TLS for https). Default 5s. A timeout here is retried on
	// another backend.
	Connect time.Duration `yaml:"connect"`
	// FirstByte bounds the wait from sending a request to the first byte of the response: the engine's queue
	// plus prefill. Default 60s. A timeout here has sent nothing to the client and is retried.
	FirstByte time.Duration `yaml:"first_byte"`
	// Idle bounds the silence between two chunks of a streaming response (a stalled decode). Default 60s. A
	// timeout here ends the stream with an error event.
	Idle time.Duration `yaml:"idle"`
	// Total bounds the whole attempt, streaming included; long generations take minutes. Default 30m; must be at
	// least FirstByte.
	Total time.Duration `yaml:"total"`
}

// Model is one public model name and its route.
type Model struct {
	// Name is what clients send as "model". Required, unique, no white space.
	Name string `yaml:"name"`
	// Targets are the backends that serve the model, each with the model name to send upstream. Default: every
	// backend whose models list Name, under the same name.
	Targets []Target `yaml:"targets"`
	// Strategy picks a target for each request: adaptive, round_robin, least_request, random, cache_aware or
	// prefix_hash (routing.NewStrategy builds them). Default DefaultStrategy (adaptive).
	Strategy string `yaml:"strategy"`
	// SLO is the latency the model promises. Default: no objective.
	SLO SLO `yaml:"slo"`
	// PrefixAffinity turns prefix-cache affinity (keeping requests that share a prompt prefix on the backend that
	// holds it) on or off for the model. Default: as the strategy does (adaptive, cache_aware and prefix_hash use
	// the prefix cache). Not supported yet: setting it, to true or false, is an error.
	PrefixAffinity bool `yaml:"prefix_affinity"`
	// Retries is how many other backends a request may try after a failure before its first byte (never after).
	// Default 2; 0 disables retries; at most 10.
	Retries int `yaml:"retries"`
	// Hedge sends a second attempt to another backend when the first has no first byte in time. Default: off.
	Hedge Hedge `yaml:"hedge"`
	// Preempt lets a critical request that finds no free engine seat take one from a running stream of a lower
	// class: the stream's engine request ends, and the stream waits in the gateway (its client gets keep-alive
	// comments) and resumes where it stopped, as a continuation of its answer so far on a backend whose engine
	// continues one (engines.*.continue), with the same id and usage as one answer. Only streamed chat and
	// completions answers of one choice yield, each at most twice. A critical request then waits for no
	// completion, so the seats kept free for critical requests need not be idle when a burst of them comes. off
	// (the default); sheddable: sheddable streams yield; standard: standard streams yield too, when no sheddable
	// one can. See docs/design.md, "Yielding seats".
	Preempt string `yaml:"preempt"`
	// DegradeTo names another model (a smaller or quantized variant) that serves this model's standard and
	// sheddable requests when its backends are saturated (brownout), before any of them is shed; critical
	// requests never degrade. Not the model itself, and no cycles. Default: none.
	DegradeTo string `yaml:"degrade_to"`
	// AllowedRegions restricts the model's traffic to backends in these regions (data residency): its targets
	// elsewhere are dropped when the policy is compiled, and a model left with no target is an error. Default:
	// any region.
	AllowedRegions []string `yaml:"allowed_regions"`
	// Endpoints are the endpoint groups the model serves, by name: chat, completions, embeddings, responses,
	// messages, rerank, score, embed_v2, tokenize (with detokenize), audio, or all. A request to a group not
	// listed is a 404 naming it. Default: chat, completions, embeddings, responses and messages (the
	// generation APIs every engine of the built-in table speaks); the others depend on the model (a reranker,
	// a speech model) and are enabled by name.
	Endpoints []string `yaml:"endpoints"`
	// ResponseCache keeps complete answers to deterministic requests (temperature 0, or a client allowed to
	// send "X-Switchyard-Cache: on") and answers the same request of the same API key (or, with scope model, of
	// any key) again from it, without a backend. Shared by the replicas when redis is set. Default: off (see the
	// ResponseCache type).
	ResponseCache ResponseCache `yaml:"response_cache"`
	// Objective is what routing optimises for the model's requests: latency (the adaptive strategy's
	// predicted time to first token), throughput (adds the predicted decode time: the backend with the most
	// tokens per second per seat) or cost (adds the predicted price at objectives.seconds_per_dollar, among
	// the backends predicted to meet slo.ttft). A key's objective, then the request's objective header, win
	// over it. Only the adaptive strategy reads it. Default latency.
	Objective string `yaml:"objective"`
}

// Target is one way to serve a public model: a backend, and the model name the backend knows it by.
type Target struct {
	// Backend names a backend. Required.
	Backend string `yaml:"backend"`
	// Model is the upstream model name; the request's "model" is rewritten to it. It must be one of the
	// backend's models. Default: the public model name.
	Model string `yaml:"model"`
}

// SLO is a latency objective; a zero field means "no objective".
type SLO struct {
	// TTFT is the time to first token the model promises. Default: none; > 0 when set.
	TTFT time.Duration `yaml:"ttft"`
	// ITL is the inter-token latency the model promises. Default: none; > 0 when set.
	ITL time.Duration `yaml:"itl"`
}

// Hedge configures hedged requests for one model.
type Hedge struct {
	// After is how long an attempt may go without a first byte before a second attempt is raced against it on
	// another backend; the loser is cancelled. Required when hedging is configured; > 0, and shorter than the
	// longest timeouts.first_byte of the model's backends (past it the attempt has failed: a retry, not a hedge).
	After time.Duration `yaml:"after"`
	// BudgetPercent caps hedged attempts as a percentage of the model's requests (each request earns
	// BudgetPercent/100 of a hedge: admission.HedgeBudget). Default 5; in (0, 100].
	BudgetPercent float64 `yaml:"budget_percent"`
}

// Region holds one region's settings.
type Region struct {
	// Failover lists, in order, the regions that take this region's traffic: a region's backends are used only
	// when every backend of this region and of the failover regions before it is unhealthy or saturated, and the
	// traffic comes back gradually once they recover (after 2 s of health, over 4 s: routing.RegionParams).
	// Regions not listed never take it: a gateway in this region does not use their backends, and an empty list
	// keeps its traffic in the region. Each region once, not this region itself, at most 14. Default: none.
	Failover []string `yaml:"failover"`
}

// Priorities configures priority classes. There are exactly three, most important first: critical (never shed
// on a prediction, only queued), standard and sheddable (gives way first); see admission.Priorities.
//
// A request's class is its API key's priority; the priority header may lower it, never raise it (a critical
// key is the trusted one that may mark each request, any key may demote its batch traffic to sheddable).
// Without API keys a request's class is Default, and the header may name any class.
type Priorities struct {
	// Header is the request header in which a client names a class (critical, standard or sheddable, in any
	// case; another value is ignored). Default x-switchyard-priority.
	Header string `yaml:"header"`
	// Default is the class of a request without a key (when no api_keys are configured) that names none, and
	// the priority of a key that names none. Default standard.
	Default string `yaml:"default"`
	// Classes sets the classes' SLO factors, listed most important first (critical, standard, sheddable); a
	// class not listed keeps its default. Default: critical (slo_factor 2), standard (1), sheddable (0.5).
	Classes []PriorityClass `yaml:"classes"`
}

// PriorityClass is one priority class's settings.
type PriorityClass struct {
	// Name is critical, standard or sheddable. Required, unique.
	Name string `yaml:"name"`
	// SLOFactor multiplies the model's TTFT objective for requests of this class, when shedding on a prediction
	// and when bounding their wait in the queue: below 1 sheds the class earlier, above 1 later. Default: the
	// class's default (critical 2, standard 1, sheddable 0.5); > 0.
	SLOFactor float64 `yaml:"slo_factor"`
}

// APIKey is one client credential and what it may do.
type APIKey struct {
	// Name identifies the key in logs and metrics (never the key itself). Required, unique.
	Name string `yaml:"name"`
	// Key is the credential: ${ENV_VAR} (the plaintext comes from the environment and is hashed at once; no
	// ${ENV_VAR:-default}, which would put a key in the file) or sha256:<64 hex digits> (also written as a
	// mapping {sha256: <hex>}), so neither the file nor the gateway's memory holds the plaintext. Required,
	// unique.
	Key KeyHash `yaml:"key"`
	// Priority is the class of the key's requests and the most they can claim: the priority header may lower it,
	// never raise it. Default: Priorities.Default.
	Priority string `yaml:"priority"`
	// Models restricts the key to these public models. Default: all models.
	Models []string `yaml:"models"`
	// Limits are the key's rate limits. Default: none.
	Limits KeyLimits `yaml:"limits"`
	// CacheOptIn lets the key's requests opt in to the response cache with "X-Switchyard-Cache: on", which
	// caches sampled requests too (ResponseCache); for a key without it the header's "on" is ignored (no error),
	// and only temperature-0 requests are cached. Default false.
	CacheOptIn bool `yaml:"cache_opt_in"`
	// Budget caps what the key's requests may cost per period (see the Budget type). Default: none.
	Budget Budget `yaml:"budget"`
	// Objective is what routing optimises for the key's requests (latency, throughput or cost, as
	// models[].objective), over the model's; the request's objective header wins over it. Default: the
	// model's.
	Objective string `yaml:"objective"`
}

// KeyLimits are per-key rate limits (admission.LocalLimiter: token buckets refilled continuously, holding at
// most one minute's worth, so a full bucket admits a burst of the whole limit); 0 means unlimited. Beyond a
// limit a request gets 429 with Retry-After. Each replica limits on its own. A reload keeps each key's
// buckets (by key name).
type KeyLimits struct {
	// RequestsPerMinute caps the key's requests per minute. Default 0 (unlimited); >= 0.
	RequestsPerMinute int `yaml:"requests_per_minute"`
	// TokensPerMinute caps the key's prompt plus completion tokens per minute. A request reserves its prompt
	// plus max_tokens (512 when unset) at admission and is refunded what it did not use when it ends. Default 0
	// (unlimited); 0 or at least 512, so that a request without max_tokens can pass.
	TokensPerMinute int `yaml:"tokens_per_minute"`
}

// The values of Config.Auth.
const (
	// AuthAPIKeys requires one of the policy's api_keys on every request.
	AuthAPIKeys = "api_keys"
	// AuthNone serves without authentication.
	AuthNone = "none"
)

// Reload holds the acknowledgements a reload needs to loosen authentication: turning it off (auth: none),
// removing a key, widening a key's models, raising or removing its limits or its budget (or shortening its
// budget's period), raising its priority, turning on its cache_opt_in. Such a reload is refused unless the new file names the policy it loosens, so that a half-written
// file cannot do it, and an acknowledgement cannot outlive the change it was written for: once the reload
// applies, the policy in force is the new file, whose hash the file cannot contain. Tightening (adding keys,
// narrowing models, lowering limits) never needs one. Only reloads look at it: at start there is nothing to
// loosen.
type Reload struct {
	// AllowAuthChangesFrom is the SHA-256 of the policy file in force (hex, 12 to 64 digits: the short form logs,
	// switchyard check and /debug/config print, or all of sha256sum's output) whose authentication this file may
	// loosen. The log of a refused reload prints the line to write. Default: none.
	AllowAuthChangesFrom string `yaml:"allow_auth_changes_from"`
}

// Limits bounds requests and the gateway's own resources.
type Limits struct {
	// MaxBodyBytes is the largest request body accepted (413 above it), in bytes; also written with a unit:
	// 512KiB, 32MiB, 1GiB. Default 32MiB. Static.
	MaxBodyBytes ByteSize `yaml:"max_body_bytes"`
	// HeaderReadTimeout bounds reading a request's headers and body from the client (slowloris protection).
	// Default 10s; > 0. Static.
	HeaderReadTimeout time.Duration `yaml:"header_read_timeout"`
	// ShutdownGrace is how long the gateway, told to stop by SIGTERM, answers /readyz with 503 "draining" while it
	// goes on serving, before it closes its listener and drains: the time a load balancer (Kubernetes removing
	// the pod from a Service's endpoints) needs to stop sending. SIGINT skips it. Default 5s; 0 closes at once.
	ShutdownGrace time.Duration `yaml:"shutdown_grace"`
	// DrainTimeout is how long in-flight requests may run after the gateway is told to stop before their streams
	// are ended with an error event. Default 60s; 0 stops at once.
	DrainTimeout time.Duration `yaml:"drain_timeout"`
	// Timeouts are the defaults for every backend's timeouts.
	Timeouts Timeouts `yaml:"timeouts"`
	// QueueSize caps the requests waiting in each model's gateway queue for a backend with free capacity;
	// beyond it the newest waiter of the least important class below the arrival is refused (503), or else the
	// arrival. Default 1024; > 0.
	QueueSize int `yaml:"queue_size"`
	// QueueTimeout bounds a request's wait in the gateway queue (503 after it). A model's SLO shortens it for
	// standard (2x its objective) and sheddable (1x) requests, which would be shed anyway past that. Default
	// 10s; > 0.
	QueueTimeout time.Duration `yaml:"queue_timeout"`
	// Shedding turns admission control on or off: on, requests are admitted, queued or shed before any prefill is
	// spent (the class's SLO, the fleet's saturation, the concurrency caps); off, every request goes straight to
	// a backend, as through a plain proxy (API keys and rate limits still apply). Off is for comparisons and
	// emergencies, not production. Default true.
	Shedding *bool `yaml:"shedding"`
}

// Secret is a string that must not be printed: fmt and encoding/json show it as "[redacted]" (or "" when empty).
// Value returns the real text.
type Secret string

// Value returns the secret's text.
func (s Secret) Value() string { return string(s) }

// String implements fmt.Stringer without revealing the secret.
func (s Secret) String() string {
	if s == "" {
		return ""
	}
	return "[redacted]"
}

// MarshalJSON shows the secret as "[redacted]", so /debug output cannot leak it.
func (s Secret) MarshalJSON() ([]byte, error) { return []byte(`"` + s.String() + `"`), nil }

// KeyHash is the SHA-256 of an API key. The gateway compares hashes of what clients send with it, so the
// plaintext is needed neither in the file nor in memory.
type KeyHash [32]byte

// String implements fmt.Stringer without revealing the hash (it identifies the key).
func (KeyHash) String() string { return "[redacted]" }

// MarshalJSON shows the hash as "[redacted]".
func (KeyHash) MarshalJSON() ([]byte, error) { return []byte(`"[redacted]"`), nil }

// ByteSize is a size in bytes. A policy file writes it as an integer or with a unit (KiB, MiB, GiB, KB, MB, GB).
type ByteSize int64
