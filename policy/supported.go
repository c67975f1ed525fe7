package policy

import (
	"maps"
	"slices"
)

// supported is THE table of the schema's fields: path (indices as "[]", map keys as ".*") -> whether the gateway
// implements its behaviour today. A file that sets a field marked false, or a field below one, to anything but an
// empty value (null, "", [], {}) is rejected with "PATH: not supported yet", so that no setting is silently
// ignored. Landing a feature is flipping its line to true; TestSupportedTableCoversSchema keeps the table in step
// with the schema types and TestNotSupportedYet proves every false line is enforced.
var supported = map[string]bool{
	"listen":                  true,
	"admin_listen":            true,
	"region":                  true,
	"redis":                   true,
	"redis.url":               true,
	"redis.mode":              true,
	"redis.key_prefix":        true,
	"redis.timeout":           true,
	"redis.sync_interval":     true,
	"redis.pool_size":         true,
	"redis.breaker_failures":  true,
	"redis.breaker_cool_down": true,

	"engines":                          true,
	"engines.*.metrics_path":           true,
	"engines.*.metrics_port":           true,
	"engines.*.idle_probes":            true,
	"engines.*.continue":               true,
	"engines.*.metrics":                true,
	"engines.*.metrics.running":        true,
	"engines.*.metrics.waiting":        true,
	"engines.*.metrics.kv_usage":       true,
	"engines.*.metrics.kv_blocks":      true,
	"engines.*.metrics.kv_block_size":  true,
	"engines.*.metrics.prefix_hits":    true,
	"engines.*.metrics.prefix_queries": true,
	"engines.*.metrics.preemptions":    true,
	"engines.*.metrics.start_time":     true,
	"engines.*.metrics.max_seqs":       true,
	"engines.*.priority":               true,
	"engines.*.info":                   true,
	"engines.*.info.paths":             true,
	"engines.*.info.max_seqs":          true,
	"engines.*.info.max_inflight":      true,

	"backends":                         true,
	"backends[].name":                  true,
	"backends[].url":                   true,
	"backends[].region":                true,
	"backends[].engine":                true,
	"backends[].models":                true,
	"backends[].api_key":               true,
	"backends[].headers":               true,
	"backends[].query":                 true,
	"backends[].path":                  true,
	"backends[].ca_file":               true,
	"backends[].forward_authorization": true,
	"backends[].weight":                true,
	"backends[].max_concurrency":       true,
	"backends[].max_num_seqs":          true,
	"backends[].tier":                  true,
	"backends[].cost":                  true,
	"backends[].cost.input":            true,
	"backends[].cost.cached_input":     true,
	"backends[].cost.output":           true,
	"backends[].timeouts":              true,
	"backends[].timeouts.connect":      true,
	"backends[].timeouts.first_byte":   true,
	"backends[].timeouts.idle":         true,
	"backends[].timeouts.total":        true,
	"backends[].discover":              true,
	"backends[].discover.dns":          true,
	"backends[].discover.type":         true,
	"backends[].discover.port":         true,
	"backends[].discover.interval":     true,

	"models":                                  true,
	"models[].name":                           true,
	"models[].targets":                        true,
	"models[].targets[].backend":              true,
	"models[].targets[].model":                true,
	"models[].strategy":                       true,
	"models[].slo":                            true,
	"models[].slo.ttft":                       true,
	"models[].slo.itl":                        true,
	"models[].prefix_affinity":                false, // prefix-cache affinity (cache, routing)
	"models[].retries":                        true,
	"models[].hedge":                          true,
	"models[].preempt":                        true,
	"models[].hedge.after":                    true,
	"models[].hedge.budget_percent":           true,
	"models[].degrade_to":                     true,
	"models[].allowed_regions":                true,
	"models[].endpoints":                      true,
	"models[].response_cache":                 true,
	"models[].response_cache.ttl":             true,
	"models[].response_cache.max_entry_bytes": true,
	"models[].response_cache.max_bytes":       true,
	"models[].response_cache.scope":           true,
	"models[].objective":                      true,

	"regions":            true,
	"regions.*.failover": true,

	"priorities":                      true,
	"priorities.header":               true,
	"priorities.default":              true,
	"priorities.classes":              true,
	"priorities.classes[].name":       true,
	"priorities.classes[].slo_factor": true,

	"auth":                                  true,
	"api_keys":                              true,
	"api_keys[].name":                       true,
	"api_keys[].key":                        true,
	"api_keys[].priority":                   true,
	"api_keys[].models":                     true,
	"api_keys[].limits":                     true,
	"api_keys[].limits.requests_per_minute": true,
	"api_keys[].limits.tokens_per_minute":   true,
	"api_keys[].cache_opt_in":               true,
	"api_keys[].budget":                     true,
	"api_keys[].budget.limit":               true,
	"api_keys[].budget.soft_limit":          true,
	"api_keys[].budget.period":              true,
	"api_keys[].objective":                  true,

	"objectives":                    true,
	"objectives.header":             true,
	"objectives.seconds_per_dollar": true,

	"limits":                     true,
	"limits.max_body_bytes":      true,
	"limits.header_read_timeout": true,
	"limits.drain_timeout":       true,
	"limits.shutdown_grace":      true,
	"limits.timeouts":            true,
	"limits.timeouts.connect":    true,
	"limits.timeouts.first_byte": true,
	"limits.timeouts.idle":       true,
	"limits.timeouts.total":      true,
	"limits.queue_size":          true,
	"limits.queue_timeout":       true,
	"limits.shedding":            true,

	"tracing":          true,
	"tracing.enabled":  true,
	"tracing.endpoint": true,
	"tracing.protocol": true,
	"tracing.sample":   true,

	"access_log":         true,
	"access_log.enabled": true,
	"access_log.sample":  true,

	"reload":                         true,
	"reload.allow_auth_changes_from": true,
}

// checkSupported reports every field the file set, to a non-empty value, whose behaviour has not landed yet: the
// outermost one only (api_keys, not also api_keys[0].limits).
func (r *report) checkSupported() {
	var reported []string
	for _, p := range slices.Sorted(maps.Keys(r.fields)) { // a parent sorts before its children
		f := r.fields[p]
		if ok, known := supported[f.pattern]; !known || ok || f.empty {
			continue
		}
		if slices.ContainsFunc(reported, func(q string) bool { return within(p, q) }) {
			continue
		}
		r.errorf(p, "not supported yet")
		reported = append(reported, p)
	}
}
