package policy

import (
	"errors"
	"fmt"
	"maps"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"gopkg.in/yaml.v3"
)

// Redis configures the state that gateway replicas share (docs/design.md, "State shared through Redis"): per-key rate
// limits, circuit breakers, prefix ownership hints, load hints and the response cache. The zero value (no URL) keeps
// all state in the process. A file writes it as a URL string (`redis: redis://host:6379/0`) or as a mapping with the
// URL and the settings below. Static: a reload that changes it keeps the one the process started with.
//
// Redis is never on a request's critical path for longer than Timeout: past it (or on any Redis error) the
// request is decided on local state, counted in switchyard_redis_errors_total, and the gateway reconnects by
// itself. After BreakerFailures failures in a row it stops using Redis at all for BreakerCoolDown, then probes
// (docs/config.md, "redis").
type Redis struct {
	// URL is redis://[[user]:password@]host:port/db or rediss://... (TLS). With mode cluster, more seed nodes go
	// in addr query parameters (redis://h1:6379?addr=h2:6379); with mode sentinel the URL names a sentinel and
	// carries master_name (redis://sentinel:26379/0?master_name=mymaster&addr=sentinel2:26379). Write it as
	// ${ENV_VAR} when it holds a password: it is never printed. Required in the mapping form.
	URL Secret `yaml:"url"`
	// Mode is how the URL is read: single (one server), cluster (Redis Cluster) or sentinel (a master found
	// through Redis Sentinel). Default single.
	Mode string `yaml:"mode"`
	// KeyPrefix starts every key and channel the gateway uses, so that several fleets (or other applications)
	// can share one Redis. Default "switchyard:"; no braces (the gateway puts Cluster hash tags after it), no
	// white space, at most 64 bytes.
	KeyPrefix string `yaml:"key_prefix"`
	// Timeout bounds each Redis operation a request waits for (a rate-limit decision, a response-cache
	// lookup); past it the request goes on with the local answer. Default 5ms; in (0, 1s].
	Timeout time.Duration `yaml:"timeout"`
	// SyncInterval is how often each replica publishes its load and prefix hints and reads the others' load and
	// circuit breakers, off the request path. A breaker one replica opens is honoured by the others within
	// about one interval; another replica's load counts for three intervals after its last report. Default
	// 200ms; in [20ms, 1s].
	SyncInterval time.Duration `yaml:"sync_interval"`
	// PoolSize bounds the connections this replica opens to Redis (to each node in mode cluster); two are kept
	// open while idle. An operation that finds every connection busy waits at most max(Timeout, 10ms) for one,
	// then falls back to local state. Default 16; in [4, 1024]. The default is safe on any deployment: the
	// background loops hold at most four at once, a request-path operation holds one for at most Timeout, so 12
	// left for requests carry thousands of operations a second per replica before any waits, and 16 per replica
	// keeps even 500 replicas under Redis's default limit of 10,000 clients. It is also what a Redis that
	// accepts connections but never answers can cost: at most this many connections at once.
	PoolSize int `yaml:"pool_size"`
	// BreakerFailures is how many failed Redis operations in a row (timeouts or connection errors, no success
	// between them, each within 10s of the first) open the gateway's Redis breaker: while it is open no
	// operation touches the network (each falls back to local state at once), after BreakerCoolDown one probe
	// is let through, and its success closes the breaker. An answer from Redis, even an error reply, is a
	// success: the breaker guards against a Redis that does not answer. Default 5; in [1, 1000]. The default is
	// safe on any deployment: a healthy Redis does not miss five operations in a row, and an opening only
	// means local state for one cool-down, which is what every failed operation falls back to anyway.
	BreakerFailures int `yaml:"breaker_failures"`
	// BreakerCoolDown is how long the Redis breaker stays open before it lets one probe through. Default 1s;
	// in [100ms, 1m]. The default is safe on any deployment: a dead or silent Redis then costs at most one
	// operation's wait (and at most one new connection) per second, and a Redis that is back is used again
	// within about a second, as quickly as the shared breakers and load hints refresh anyway.
	BreakerCoolDown time.Duration `yaml:"breaker_cool_down"`
}

// Redis modes, as the policy spells them.
const (
	RedisSingle   = "single"
	RedisCluster  = "cluster"
	RedisSentinel = "sentinel"
)

// Redis defaults.
const (
	defaultRedisPrefix   = "switchyard:"
	defaultRedisTimeout  = 5 * time.Millisecond
	defaultRedisInterval = 200 * time.Millisecond
	defaultRedisPoolSize = 16
	defaultRedisFailures = 5
	defaultRedisCoolDown = time.Second
)

// Enabled reports whether the policy shares state through Redis (a URL is set).
func (r Redis) Enabled() bool { return r.URL != "" }

// decodeNode reads the redis field: a URL string, or a mapping of the fields above.
func (r *Redis) decodeNode(d *decoder, n *yaml.Node, path string) {
	if n.Kind == yaml.ScalarNode {
		s, ok := d.str(n, path)
		if ok {
			r.URL = Secret(s)
		}
		return
	}
	if n.Kind != yaml.MappingNode {
		d.add(n.Line, path, "expected a URL (redis://host:port/db) or a mapping {url, mode, key_prefix, timeout, sync_interval, pool_size, breaker_failures, breaker_cool_down}, got "+kindName(n))
		return
	}
	d.structure(n, reflect.ValueOf(r).Elem(), path, "redis", 1)
}

// defaults fills what the file left out, when Redis is enabled at all.
func (rep *report) defaultRedis(r *Redis) {
	if !r.Enabled() {
		return
	}
	if r.Mode == "" {
		r.Mode = RedisSingle
	}
	if r.KeyPrefix == "" && !rep.set("redis.key_prefix") {
		r.KeyPrefix = defaultRedisPrefix
	}
	if !rep.set("redis.timeout") {
		r.Timeout = defaultRedisTimeout
	}
	if !rep.set("redis.sync_interval") {
		r.SyncInterval = defaultRedisInterval
	}
	if !rep.set("redis.pool_size") {
		r.PoolSize = defaultRedisPoolSize
	}
	if !rep.set("redis.breaker_failures") {
		r.BreakerFailures = defaultRedisFailures
	}
	if !rep.set("redis.breaker_cool_down") {
		r.BreakerCoolDown = defaultRedisCoolDown
	}
}

// validateRedis checks the redis section. It never prints the URL: it may carry a password.
func (rep *report) validateRedis(r Redis) {
	if !r.Enabled() {
		for _, f := range []string{"mode", "key_prefix", "timeout", "sync_interval", "pool_size", "breaker_failures", "breaker_cool_down"} {
			if rep.set("redis." + f) {
				rep.errorf("redis.url", "required when other redis settings are given")
				break
			}
		}
		return
	}
	urlPath := "redis"
	if rep.set("redis.url") {
		urlPath = "redis.url"
	}
	switch r.Mode {
	case RedisSingle, RedisCluster, RedisSentinel:
		if _, err := r.Options(); err != nil {
			rep.errorf(urlPath, err.Error())
		}
	default:
		rep.errorf("redis.mode", fmt.Sprintf("unknown mode %q (one of: %s, %s, %s)", r.Mode, RedisCluster, RedisSentinel, RedisSingle))
	}
	switch p := r.KeyPrefix; {
	case len(p) > 64:
		rep.errorf("redis.key_prefix", "at most 64 bytes")
	case strings.ContainsAny(p, "{} \t\r\n"):
		rep.errorf("redis.key_prefix", "must not contain braces (the gateway places Redis Cluster hash tags after it) or white space")
	}
	if r.Timeout <= 0 || r.Timeout > time.Second {
		rep.errorf("redis.timeout", "must be in (0, 1s]: a request never waits longer on Redis")
	}
	if r.SyncInterval < 20*time.Millisecond || r.SyncInterval > time.Second {
		rep.errorf("redis.sync_interval", "must be in [20ms, 1s]")
	}
	if r.PoolSize < 4 || r.PoolSize > 1024 {
		rep.errorf("redis.pool_size", "must be in [4, 1024]: the background sharing holds up to four connections")
	}
	if r.BreakerFailures < 1 || r.BreakerFailures > 1000 {
		rep.errorf("redis.breaker_failures", "must be in [1, 1000]")
	}
	if r.BreakerCoolDown < 100*time.Millisecond || r.BreakerCoolDown > time.Minute {
		rep.errorf("redis.breaker_cool_down", "must be in [100ms, 1m]")
	}
}

// errRedisURL is the one message for a URL that does not parse: the parser's own errors may quote the URL.
var errRedisURL = errors.New("expected redis://[[user]:password@]host:port/db or rediss://... (see docs/config.md for cluster and sentinel URLs)")

// Options returns the go-redis options for r: a single-node, Cluster or Sentinel client as Mode says, with the
// gateway's timeouts: no retries (a failed operation falls back to local state at once), the request-path
// budget enforced through each call's context, one-second dial and socket timeouts for the background loops,
// and a pool of PoolSize connections (16 when unset) that no operation waits on for longer than max(Timeout,
// 10ms). Its errors never quote the URL.
func (r Redis) Options() (*redis.UniversalOptions, error) {
	u, err := url.Parse(r.URL.Value())
	if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
		return nil, errRedisURL
	}
	allowed := map[string]bool{"client_name": true}
	switch r.Mode {
	case RedisCluster:
		allowed["addr"] = true
	case RedisSentinel:
		allowed["addr"], allowed["master_name"], allowed["db"] = true, true, true
	}
	for k := range u.Query() {
		if !allowed[k] {
			// The option's name is not quoted either: whatever follows "?" may be a secret pasted in the wrong place.
			return nil, fmt.Errorf("the URL's query may only hold %s in mode %s (the gateway sets its own timeouts and retries)",
				strings.Join(slices.Sorted(maps.Keys(allowed)), ", "), r.Mode)
		}
	}
	var o redis.UniversalOptions
	switch r.Mode {
	case RedisCluster:
		c, err := redis.ParseClusterURL(r.URL.Value())
		if err != nil {
			return nil, fmt.Errorf("%w: %s", errRedisURL, redactedReason(err))
		}
		o = redis.UniversalOptions{Addrs: c.Addrs, Username: c.Username, Password: c.Password, TLSConfig: c.TLSConfig,
			ClientName: c.ClientName, IsClusterMode: true}
	case RedisSentinel:
		f, err := redis.ParseFailoverURL(r.URL.Value())
		if err != nil {
			return nil, fmt.Errorf("%w: %s", errRedisURL, redactedReason(err))
		}
		if f.MasterName == "" {
			return nil, errors.New("mode sentinel needs master_name in the URL's query (?master_name=mymaster)")
		}
		o = redis.UniversalOptions{Addrs: f.SentinelAddrs, MasterName: f.MasterName, DB: f.DB, Username: f.Username,
			Password: f.Password, SentinelUsername: f.SentinelUsername, SentinelPassword: f.SentinelPassword,
			TLSConfig: f.TLSConfig, ClientName: f.ClientName}
	default:
		s, err := redis.ParseURL(r.URL.Value())
		if err != nil {
			return nil, fmt.Errorf("%w: %s", errRedisURL, redactedReason(err))
		}
		o = redis.UniversalOptions{Addrs: []string{s.Addr}, DB: s.DB, Username: s.Username, Password: s.Password,
			TLSConfig: s.TLSConfig, ClientName: s.ClientName}
	}
	o.MaxRetries = -1 // a failed operation falls back to local state; retrying would only add latency
	o.DialerRetries = 1
	o.DialTimeout = time.Second
	o.ReadTimeout = time.Second
	o.WriteTimeout = time.Second
	o.ContextTimeoutEnabled = true // each request-path call carries its own deadline (Timeout)
	o.PoolTimeout = max(r.Timeout, 10*time.Millisecond)
	o.PoolSize = r.PoolSize
	if o.PoolSize <= 0 {
		o.PoolSize = defaultRedisPoolSize
	}
	o.MinIdleConns = min(2, o.PoolSize)
	o.PipelinePoolSize = -1 // pipelines (the prefix hints) share the pool, so PoolSize bounds every connection
	o.DisableIdentity = true
	return &o, nil
}

// redactedReason keeps the kind of a go-redis URL error without its value (which may hold a password).
func redactedReason(err error) string {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "invalid database number"):
		return "invalid database number"
	case strings.Contains(msg, "unexpected option"):
		if i := strings.Index(msg, "unexpected option"); i >= 0 {
			return msg[i:]
		}
	case strings.Contains(msg, "invalid URL path"):
		return "invalid path (expected /db)"
	}
	return "not a valid URL for this mode"
}
