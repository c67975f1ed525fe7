package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Bucket boundaries, in seconds or tokens. The GenAI ones are the OpenTelemetry semantic conventions' explicit
// boundaries, so dashboards built for any GenAI-instrumented server work unchanged.
var (
	// TTFTBuckets are gen_ai.server.time_to_first_token's boundaries, plus 2 s and 20 s so that common SLO
	// thresholds are bucket edges (a "TTFT < 2 s" query needs le="2").
	TTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.0, 2.5, 5.0, 7.5, 10.0, 20.0}
	// TPOTBuckets are gen_ai.server.time_per_output_token's boundaries.
	TPOTBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5}
	// DurationBuckets are gen_ai.server.request.duration's boundaries.
	DurationBuckets = []float64{0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92}
	// TokenBuckets are gen_ai.client.token.usage's boundaries.
	TokenBuckets = []float64{1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864}
	// OverheadBuckets measure time spent inside the gateway itself: microseconds to tens of milliseconds.
	OverheadBuckets = []float64{0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1}
	// QueueBuckets measure time spent waiting in the gateway's queue.
	QueueBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30}
)

// Gateway holds every metric the gateway exports. Create it once per gateway with New; its fields are safe for
// concurrent use.
//
// Label values are bounded, so that the number of series is fixed by the policy and never by the traffic: each
// series costs memory in the gateway and in every Prometheus that scrapes it, for as long as they run, and a
// label that took a value from a request (a prompt, a key, a client's model string, a response id) would let
// callers create series without end. So models are the policy's public names (a request for a model the
// policy does not serve is recorded with model ""), backends and providers (engine names) come from the policy,
// operations from the gateway's fixed route table, error types and codes from HTTP statuses and the gateway's
// own fixed error kinds. Nothing an engine sends becomes a label either: the model name in its answer is not
// read (the response model is the policy's name of the model that served).
//
// The gen_ai_* metrics carry the OpenTelemetry GenAI semantic conventions' attributes in Prometheus form
// (dots become underscores): gen_ai_operation_name, gen_ai_provider_name, gen_ai_request_model,
// gen_ai_response_model, and error_type on the durations; docs/metrics.md lists them with their values.
type Gateway struct {
	// TTFT is the time from a request's arrival to the first token the client receives (seconds), by GenAI
	// attributes (GenAILabels).
	TTFT *prometheus.HistogramVec
	// TPOT is the time between output tokens the client receives (seconds), one observation per gap, by GenAI
	// attributes (GenAILabels).
	TPOT *prometheus.HistogramVec
	// Duration is the time from arrival to the response's last byte (seconds), by GenAI attributes and
	// error_type (DurationLabels). The status code of every request is in Requests.
	Duration *prometheus.HistogramVec
	// ClientDuration is the gateway's view as a client of the engines: each upstream attempt, retries and
	// hedges included, from sending it to its last byte or its failure (seconds), by GenAI attributes and
	// error_type (DurationLabels).
	ClientDuration *prometheus.HistogramVec
	// Tokens counts tokens by GenAI attributes and gen_ai_token_type (input, output), one observation per
	// request (TokenLabels).
	Tokens *prometheus.HistogramVec
	// BackendTTFT is each backend's time to first token: from sending the attempt that answered to its first
	// token reaching the client (seconds), by backend. The gateway's queue and failed attempts are not in it.
	BackendTTFT *prometheus.HistogramVec
	// BackendITL is each backend's inter-token latency: the gaps between the tokens it streamed to the client
	// (seconds), one observation per gap, by backend.
	BackendITL *prometheus.HistogramVec
	// Requests counts finished requests by model, backend and status code (499: the client left first).
	Requests *prometheus.CounterVec
	// Cost sums what finished requests cost (in the currency of the policy's backends[].cost, dollars by
	// convention), priced from the usage the engine reported at the answering backend's price, by the model
	// that served, backend and API key name ("" without keys).
	Cost *prometheus.CounterVec
	// Inflight is the number of requests in flight to each backend.
	Inflight *prometheus.GaugeVec
	// QueueDepth is each backend's engine queue as last scraped (vllm:num_requests_waiting).
	QueueDepth *prometheus.GaugeVec
	// Retries counts attempts beyond the first, by model and reason.
	Retries *prometheus.CounterVec
	// Overhead is the time the gateway itself spends on a request before it is sent upstream and on relaying
	// the first token (seconds).
	Overhead prometheus.Histogram
	// UpstreamErrors counts failed upstream attempts by backend and kind (connect, timeout, status, stream).
	UpstreamErrors *prometheus.CounterVec
	// ClientDisconnects counts requests whose client left before the end, by phase (waiting, streaming).
	ClientDisconnects *prometheus.CounterVec
	// UpstreamLimits counts upstream attempts ended because the engine's answer passed one of the gateway's
	// bounds, by backend and limit (pre_first_token, event, answer, idle): each is a 502 or an SSE error event.
	UpstreamLimits *prometheus.CounterVec
	// StreamEnds counts committed streams (answers whose headers went to a streaming client) as they end, by
	// the backend that streamed and the cause (complete, client_gone, client_write_timeout,
	// upstream_idle_timeout, upstream_total_timeout, upstream_closed, upstream_reset, upstream_invalid,
	// upstream_error_event, gateway_limit, shutdown, panic): whose failure a broken stream was. The request path
	// resolves its children per backend when a policy snapshot is installed.
	StreamEnds *prometheus.CounterVec
	// Panics counts panics recovered on the request path, by stage (handler, relay, attempt, dispatch): each
	// ended one request with an error and the process kept serving.
	Panics *prometheus.CounterVec
	// TTFTPredictionError is |observed - predicted| / predicted TTFT, by backend.
	TTFTPredictionError *prometheus.HistogramVec
	// PrefixLookups and PrefixHits count prefix-index lookups and those that found a cached prefix, by model.
	PrefixLookups *prometheus.CounterVec
	PrefixHits    *prometheus.CounterVec
	// Shed counts refused requests by reason and priority class.
	Shed *prometheus.CounterVec
	// Hedges counts hedged attempts by outcome (won, lost, cancelled).
	Hedges *prometheus.CounterVec
	// Yields counts streams that yielded their engine seat to a critical request, by model, the stream's class
	// (sheddable, standard) and outcome: yielded (the seat was freed), resumed (the stream went on as a
	// continuation), failed (it could not, and ended with an error event).
	Yields *prometheus.CounterVec
	// BreakerState is each backend's circuit-breaker state: 0 closed, 1 half-open, 2 open.
	BreakerState *prometheus.GaugeVec
	// QueueWait is the time requests waited in the gateway queue, by priority class.
	QueueWait *prometheus.HistogramVec
	// ConfigReloadSuccess is 1 when the last policy load succeeded, 0 when it failed (the old policy stays).
	ConfigReloadSuccess prometheus.Gauge
	// ConfigReloadTime is the Unix time of the last successful policy load.
	ConfigReloadTime prometheus.Gauge
	// QueueLength is the number of requests waiting in a gateway queue, by queue (the model it serves) and
	// priority class.
	QueueLength *prometheus.GaugeVec
	// ConcurrencyLimit is each backend's current cap on requests in flight (static, or adapted to keep the
	// engine's queue shallow).
	ConcurrencyLimit *prometheus.GaugeVec
	// OutlierState is each backend's passive outlier-detection state: 0 serving, 1 probing (half-open),
	// 2 ejected.
	OutlierState *prometheus.GaugeVec
	// OutlierEjections counts ejections by backend and reason (errors, slow).
	OutlierEjections *prometheus.CounterVec
	// Degraded counts requests served by a model's degrade_to model under overload (brownout), by the model
	// asked for and the model that served.
	Degraded *prometheus.CounterVec
	// BudgetDenied counts retries and hedges not attempted because their budget was spent, by kind (retry,
	// hedge).
	BudgetDenied *prometheus.CounterVec
	// RegionSpills counts picks (retries and hedges included) that chose a backend outside the gateway's region,
	// by model, the gateway's region (from) and the backend's region (to). Regions come from the policy.
	RegionSpills *prometheus.CounterVec
	// RegionActiveTier is, per model, the position in the failover order of the first region that takes the
	// model's traffic in full: 0 the gateway's region, 1 its first failover region, and so on.
	RegionActiveTier *prometheus.GaugeVec
	// RegionShare is, per model and region of the failover order, the share of picks the region may take: 1
	// normally, 0 while it is held back after a failure, rising on the return ramp.
	RegionShare *prometheus.GaugeVec
	// RedisErrors counts Redis operations that failed or timed out, by op (ratelimit, breakers, load,
	// prefix_hints, response_cache); each fell back to this replica's local state.
	RedisErrors *prometheus.CounterVec
	// RedisBreakerState is the state of the breaker in front of Redis: 0 closed (Redis is used), 1 half-open
	// (one probe is out), 2 open (every Redis operation falls back to local state at once).
	RedisBreakerState prometheus.Gauge
}

// New creates the gateway's metrics and registers them, with the Go runtime and process collectors, on reg.
func New(reg prometheus.Registerer) *Gateway {
	m := &Gateway{
		TTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gen_ai_server_time_to_first_token_seconds",
			Help:    "Time from request arrival to the first output token sent to the client.",
			Buckets: TTFTBuckets,
		}, GenAILabels),
		TPOT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gen_ai_server_time_per_output_token_seconds",
			Help:    "Time between consecutive output tokens sent to the client, one observation per gap.",
			Buckets: TPOTBuckets,
		}, GenAILabels),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gen_ai_server_request_duration_seconds",
			Help:    "Time from request arrival to the last byte of the response; error_type is the HTTP status of a failed request.",
			Buckets: DurationBuckets,
		}, DurationLabels),
		ClientDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gen_ai_client_operation_duration_seconds",
			Help:    "Each upstream attempt, from sending it to the engine to its last byte or failure; error_type says how it failed.",
			Buckets: DurationBuckets,
		}, DurationLabels),
		Tokens: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gen_ai_client_token_usage",
			Help:    "Tokens per request, by type (input, output), from the usage the backend reported.",
			Buckets: TokenBuckets,
		}, TokenLabels),
		BackendTTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_backend_time_to_first_token_seconds",
			Help:    "Time from sending the attempt that answered to its first token reaching the client, per backend.",
			Buckets: TTFTBuckets,
		}, []string{"backend"}),
		BackendITL: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_backend_inter_token_latency_seconds",
			Help:    "Time between consecutive tokens a backend streamed to the client, one observation per gap, per backend.",
			Buckets: TPOTBuckets,
		}, []string{"backend"}),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_requests_total",
			Help: "Finished requests by model, backend and HTTP status (499: the client left first).",
		}, []string{"model", "backend", "code"}),
		Cost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_cost_dollars_total",
			Help: "What finished requests cost, from the engine's usage at the backend's price, by model, backend and API key.",
		}, []string{"model", "backend", "key"}),
		Inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_backend_inflight",
			Help: "Requests in flight to each backend.",
		}, []string{"backend"}),
		QueueDepth: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_backend_queue_depth",
			Help: "Each backend's engine queue (requests waiting) as last scraped.",
		}, []string{"backend"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_retries_total",
			Help: "Upstream attempts beyond the first, by model and reason.",
		}, []string{"model", "reason"}),
		Overhead: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "switchyard_overhead_seconds",
			Help:    "Time spent inside the gateway on a request: parsing, routing and sending it upstream.",
			Buckets: OverheadBuckets,
		}),
		UpstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_upstream_errors_total",
			Help: "Failed upstream attempts by backend and kind (connect, timeout, status, stream).",
		}, []string{"backend", "kind"}),
		ClientDisconnects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_client_disconnects_total",
			Help: "Requests whose client left before the end, by phase.",
		}, []string{"phase"}),
		UpstreamLimits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_upstream_limit_exceeded_total",
			Help: "Upstream attempts ended because the answer passed a bound of the gateway, by backend and limit.",
		}, []string{"backend", "limit"}),
		StreamEnds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_stream_ends_total",
			Help: "Committed streams by backend and how they ended (complete, or whose timeout or failure ended them).",
		}, []string{"backend", "cause"}),
		Panics: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_panics_total",
			Help: "Panics recovered on the request path, by stage; each ended one request with an error.",
		}, []string{"stage"}),
		TTFTPredictionError: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_ttft_prediction_error_ratio",
			Help:    "|observed - predicted| / predicted time to first token, per backend.",
			Buckets: []float64{0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 2, 5, 10},
		}, []string{"backend"}),
		PrefixLookups: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_prefix_cache_lookups_total",
			Help: "Prefix-index lookups, by model.",
		}, []string{"model"}),
		PrefixHits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_prefix_cache_hits_total",
			Help: "Prefix-index lookups that found a backend holding at least one leading block, by model.",
		}, []string{"model"}),
		Shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_shed_total",
			Help: "Refused requests by reason and priority class.",
		}, []string{"reason", "priority"}),
		Hedges: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_hedges_total",
			Help: "Hedged attempts by outcome.",
		}, []string{"outcome"}),
		Yields: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_yields_total",
			Help: "Streams that yielded their engine seat to a critical request, by model, class and outcome.",
		}, []string{"model", "class", "outcome"}),
		BreakerState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_breaker_state",
			Help: "Circuit-breaker state per backend: 0 closed, 1 half-open, 2 open.",
		}, []string{"backend"}),
		QueueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_queue_wait_seconds",
			Help:    "Time requests waited in the gateway queue, by priority class.",
			Buckets: QueueBuckets,
		}, []string{"priority"}),
		ConfigReloadSuccess: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_config_reload_success",
			Help: "1 if the last policy load succeeded, 0 if it failed and the previous policy is still in force.",
		}),
		ConfigReloadTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_config_reload_success_timestamp_seconds",
			Help: "Unix time of the last successful policy load.",
		}),
		QueueLength: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_queue_length",
			Help: "Requests waiting in the gateway queue, by queue and priority class.",
		}, []string{"queue", "priority"}),
		ConcurrencyLimit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_backend_concurrency_limit",
			Help: "Each backend's current cap on requests in flight (static or adaptive).",
		}, []string{"backend"}),
		OutlierState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_outlier_state",
			Help: "Passive outlier detection per backend: 0 serving, 1 probing, 2 ejected.",
		}, []string{"backend"}),
		OutlierEjections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_outlier_ejections_total",
			Help: "Backends ejected by passive outlier detection, by backend and reason.",
		}, []string{"backend", "reason"}),
		Degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_degraded_total",
			Help: "Requests served by a degraded model variant under overload (brownout), by model and degraded model.",
		}, []string{"model", "degrade_to"}),
		BudgetDenied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_budget_denied_total",
			Help: "Retries and hedges not attempted because their budget was spent, by kind.",
		}, []string{"kind"}),
		RegionSpills: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_region_spill_total",
			Help: "Picks that chose a backend outside the gateway's region, by model, gateway region and backend region.",
		}, []string{"model", "from", "to"}),
		RegionActiveTier: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_region_active_tier",
			Help: "Position in the failover order of the region taking the model's traffic: 0 the gateway's own.",
		}, []string{"model"}),
		RegionShare: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "switchyard_region_share",
			Help: "Share of picks a region may take: 1 normally, 0 held back after a failure, rising on the return ramp.",
		}, []string{"model", "region"}),
		RedisErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_redis_errors_total",
			Help: "Redis operations that failed or timed out, by operation; each fell back to local state.",
		}, []string{"op"}),
		RedisBreakerState: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_redis_breaker_state",
			Help: "State of the breaker in front of Redis: 0 closed, 1 half-open (probing), 2 open (local state only).",
		}),
	}
	reg.MustRegister(
		m.TTFT, m.TPOT, m.Duration, m.ClientDuration, m.Tokens, m.BackendTTFT, m.BackendITL, m.Requests, m.Cost, m.Inflight, m.QueueDepth, m.Retries, m.Overhead,
		m.UpstreamErrors, m.ClientDisconnects, m.UpstreamLimits, m.StreamEnds, m.Panics, m.TTFTPredictionError, m.PrefixLookups, m.PrefixHits, m.Shed,
		m.Hedges, m.Yields, m.BreakerState, m.QueueWait, m.ConfigReloadSuccess, m.ConfigReloadTime,
		m.QueueLength, m.ConcurrencyLimit, m.OutlierState, m.OutlierEjections, m.Degraded, m.BudgetDenied,
		m.RegionSpills, m.RegionActiveTier, m.RegionShare, m.RedisErrors, m.RedisBreakerState,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}
