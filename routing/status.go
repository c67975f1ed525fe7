package routing

import "time"

// BackendStatus is one backend as /debug/backends shows it: a plain, JSON-ready copy of its live state and of
// the models' current predictions. Durations are in milliseconds, shares in [0, 1].
type BackendStatus struct {
	// Name, Region and Engine are the backend's configuration.
	Name   string `json:"name"`
	Region string `json:"region"`
	Engine string `json:"engine"`
	// Healthy is the backend's health flag (SetHealthy); the proxy adds its breaker state itself.
	Healthy bool `json:"healthy"`
	// Inflight, Prefilling and Decoding are the gateway's own counts of requests; PrefillTokens is the uncached
	// prompt tokens dispatched without a first token yet.
	Inflight int64 `json:"inflight"`
	// PeerInflight is the requests the other gateway replicas have in flight to the backend as routing counts
	// them now: their fresh load reports through Redis brought up to now with their dispatch and end records
	// (turns.go; 0 without reports). Routing counts Inflight + PeerInflight. PeerReported is the reports' own sum,
	// and PeerRunning the requests their records say run there now.
	PeerInflight  int64 `json:"peer_inflight"`
	PeerReported  int64 `json:"peer_reported"`
	PeerRunning   int   `json:"peer_running"`
	Prefilling    int64 `json:"prefilling"`
	PrefillTokens int64 `json:"prefill_tokens"`
	Decoding      int64 `json:"decoding"`
	// QueueDepth, Running and KVUsage are the engine's last scraped values (0 when never scraped, or when the
	// engine does not export them: see Signals).
	QueueDepth float64 `json:"queue_depth"`
	Running    float64 `json:"running"`
	KVUsage    float64 `json:"kv_usage"`
	// TTFTms is the predicted mean TTFT (RTT and any wait for a seat included) of a short prompt (128 uncached
	// tokens) sent now;
	// TTFTp90ms its p90. ITLms is the predicted mean inter-token latency with one more sequence decoding.
	TTFTms    float64 `json:"ttft_ms"`
	TTFTp90ms float64 `json:"ttft_p90_ms"`
	ITLms     float64 `json:"itl_ms"`
	// RTTms is the smoothed round trip (0 until measured).
	RTTms float64 `json:"rtt_ms"`
	// PrefillMsPerKTok is the learned prefill time per 1,000 uncached tokens.
	PrefillMsPerKTok float64 `json:"prefill_ms_per_ktok"`
	// TTFTSamples is how many first tokens trained the TTFT model.
	TTFTSamples int64 `json:"ttft_samples"`
	// PrefixHitRate is the share of prompt tokens served from the engine's prefix cache, smoothed: from the
	// cached_tokens the engine reports when it does, else as the prefix index predicted.
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	// PrefixBlocks and PrefixCapacity are the 64-byte blocks the index believes the backend holds, and its
	// bound (the engine's KV capacity times the calibrated share).
	PrefixBlocks   int `json:"prefix_blocks"`
	PrefixCapacity int `json:"prefix_capacity"`
	// Signals are the load signals the backend's engine exports (its spec's series: running, waiting,
	// kv_usage, kv_capacity, prefix_cache, preemptions, start_time); Lacks are the others, for which routing
	// uses the gateway's own accounting (every signal, for an engine that is not scraped).
	Signals []string `json:"signals"`
	Lacks   []string `json:"lacks"`
	// Missing are signals the engine should export but the last good scrape did not contain (a wrong metric
	// name in the engines table, or an engine version without them); empty before the first scrape.
	Missing []string `json:"missing"`
	// Stale says the engine's metrics are missing, old or the last scrape failed: routing uses the gateway's
	// own accounting only. Always false for engines that are not scraped (openai-hosted).
	Stale bool `json:"stale"`
	// ScrapedAt is when the engine's metrics were last scraped successfully (zero if never).
	ScrapedAt time.Time `json:"scraped_at"`
	// Info is the last read of the engine's info document (InfoSpec), nil for an engine without one.
	Info *InfoStatus `json:"engine_info,omitempty"`
	// Requests and Failures count attempts dispatched to the backend and those it failed.
	Requests uint64 `json:"requests"`
	Failures uint64 `json:"failures"`
	// TTFTModel and ITLModel are what routing learned of the engine (model.go): for TTFT, the fixed cost, what
	// a cached prefix saves per token (the prefill coefficient) and how load slows it (queued and running),
	// each with its standard error, and the recent prediction errors.
	TTFTModel ModelStatus `json:"ttft_model"`
	ITLModel  ModelStatus `json:"itl_model"`
	// QueuedTokens is the prefill the cost counts as queued on the backend now: this replica's, plus what is
	// left of the other replicas' at the learned prefill rate (drain.go); at least the engine's queue in tokens.
	QueuedTokens float64 `json:"queued_tokens"`
	// HitScale is the calibrated share of the predicted prefix hits the engine really had (1: the index is
	// right; below, it overestimates what the engine holds).
	HitScale float64 `json:"hit_scale"`
	// SpecShare is the share of a prefix still being prefilled on the backend (dispatched, no first token yet)
	// that a request sent there finds cached, learned from the engine's cached_tokens (the fleet's until the
	// backend has its own; 0.5 before any), and SpecObserved the observations behind the backend's own.
	SpecShare    float64 `json:"spec_share"`
	SpecObserved int64   `json:"spec_observed"`
	// SeatHoldMs is how long a request holds one of the engine's seats, smoothed over its last requests (its
	// prefill alone, then its decode; the fleet's before any ended there, 0 before any ended anywhere), and SeatWaitMs the wait for a seat a request sent now
	// would have: 0 while a seat is free or the seats are unknown (the proxy's `seats` says where they came from).
	// Both are in TTFTms and in the adaptive cost.
	SeatHoldMs float64 `json:"seat_hold_ms"`
	SeatWaitMs float64 `json:"seat_wait_ms"`
	// Full says every seat is taken and a request waits for one (the engine's scrape, or more requests in
	// flight than seats): the backend counts as saturated.
	Full bool `json:"full"`
	// PeerGroup names the backends taken as replicas of one deployment (engine, models, KV cache size),
	// PeerSeats is the seats those of them that know theirs agree on (0: none, or they disagree), which b uses
	// while it knows none of its own, and PeerFloor the largest batch any of them ran (routing/peerseats.go).
	PeerGroup string `json:"peer_group,omitempty"`
	PeerSeats int    `json:"peer_seats"`
	PeerFloor int    `json:"peer_floor"`
	// SeatProbe is what the Monitor's seat probe found of an engine that states no seats (seatprobe.go), nil
	// before one ended.
	SeatProbe *SeatProbe `json:"seat_probe,omitempty"`
	// SeatProbing says a seat probe runs now: the engine runs some of the gateway's own requests.
	SeatProbing bool `json:"seat_probing,omitempty"`
	// FirstTokensPerS is the backend's rate of first tokens of traffic, smoothed over about 10 s;
	// IdleProbeAfterMs how long it may go without one before the Monitor sends it an idle probe (its fair share
	// of its models' traffic, idleprobe.go; 0 while idle probes are off for it), and IdleProbes how many were
	// sent.
	FirstTokensPerS  float64 `json:"first_tokens_per_s"`
	IdleProbeAfterMs float64 `json:"idle_probe_after_ms"`
	IdleProbes       uint64  `json:"idle_probes"`
}

// statusPromptTokens is the "short prompt" of BackendStatus.TTFTms.
const statusPromptTokens = 128

// Status returns b's current state and predictions. Safe for concurrent use; it takes the latency models'
// mutex once, briefly, to copy their figures.
func (b *Backend) Status() BackendStatus {
	cfg := b.Config()
	now := b.clock.Now()
	l := b.loadAt(now)
	req, tok := b.Prefilling()
	s := BackendStatus{
		Name: cfg.Name, Region: cfg.Region, Engine: cfg.Engine, Healthy: b.Healthy(),
		Inflight: b.LocalInflight(), Prefilling: req, PrefillTokens: tok, Decoding: b.Decoding(),
		RTTms: b.rtt() * 1e3, TTFTSamples: b.ttftCount.Load(), Requests: b.Requests(), Failures: b.Failures(),
		PrefillMsPerKTok: b.lat.pubTTFT[1].load() * 1e3,
	}
	mean := b.lat.ttftMean(statusPromptTokens, l.queuedTok, l.running)
	s.TTFTms = (b.rtt() + l.seatWait + mean) * 1e3
	s.TTFTp90ms = (b.rtt() + l.seatWait + mean*b.lat.ttftSpread.load()) * 1e3
	s.SeatHoldMs, s.SeatWaitMs, s.Full = b.seatHold()*1e3, l.seatWait*1e3, l.full
	s.PeerSeats, s.PeerFloor = b.PeerSeats()
	s.PeerGroup = b.peerGroup()
	s.ITLms = b.lat.itlMean(l.running+1) * 1e3
	if b.usageSeen.Load() {
		s.PrefixHitRate = b.hitRate.load()
	} else {
		s.PrefixHitRate = b.predRate.load()
	}
	if o := b.prefixOwner(); o != nil {
		s.PrefixBlocks, s.PrefixCapacity = o.Len(), o.Capacity()
	}
	spec := cfg.Spec()
	exports := spec.Exports()
	s.Signals, s.Lacks, s.Missing = SignalsOf(exports), SignalsOf(AllSignals&^exports), []string{}
	if e := b.engine.Load(); e != nil {
		s.QueueDepth, s.Running, s.KVUsage, s.ScrapedAt = e.Waiting, e.Running, e.KVUsage, e.At
		s.Missing = SignalsOf(exports &^ e.Has)
	}
	if in := b.info.Load(); in != nil && spec.Info.Reads() {
		cp := *in
		s.Info = &cp
	}
	if p := b.peerLoad(now); p != nil {
		s.PeerInflight, s.PeerReported = l.inflight-b.LocalInflight(), p.Inflight
	}
	s.PeerRunning = b.peerReqs.running()
	s.Stale = spec.Scrapes() && !l.fresh
	s.TTFTModel, s.ITLModel = b.lat.status()
	s.QueuedTokens, s.HitScale = l.queuedTok, b.hitScale.load()
	s.SpecShare, s.SpecObserved = b.specShareNow(), b.spec.n.Load()
	s.SeatProbing = b.seatProbing.Load()
	s.FirstTokensPerS, s.IdleProbes = b.idle.rate.load(), b.idle.probes.Load()
	if d := b.idle.after.Load(); d > 0 && spec.IdleProbes {
		s.IdleProbeAfterMs = float64(d) / 1e6
	}
	if p := b.seatProbe.Load(); p != nil {
		cp := *p
		s.SeatProbe = &cp
	}
	return s
}
