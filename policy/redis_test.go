package policy

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

const redisBase = "backends: [{name: b, url: 'http://h:1', models: [m]}]\nmodels: [{name: m}]\nauth: none\n"

func TestRedisForms(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       Redis
		addrs      []string
		master     string
		cluster    bool
	}{
		{name: "absent", yaml: "", want: Redis{}},
		{name: "empty string", yaml: `redis: ""`, want: Redis{}},
		{name: "string", yaml: "redis: redis://127.0.0.1:6379/2",
			want:  Redis{URL: "redis://127.0.0.1:6379/2", Mode: "single", KeyPrefix: "switchyard:", Timeout: 5 * time.Millisecond, SyncInterval: 200 * time.Millisecond, PoolSize: 16, BreakerFailures: 5, BreakerCoolDown: time.Second},
			addrs: []string{"127.0.0.1:6379"}},
		{name: "mapping", yaml: "redis: {url: 'redis://:pw@r:6380/0', key_prefix: 'fleet-a:', timeout: 20ms, sync_interval: 100ms, pool_size: 8, breaker_failures: 3, breaker_cool_down: 2s}",
			want: Redis{URL: "redis://:pw@r:6380/0", Mode: "single", KeyPrefix: "fleet-a:", Timeout: 20 * time.Millisecond, SyncInterval: 100 * time.Millisecond,
				PoolSize: 8, BreakerFailures: 3, BreakerCoolDown: 2 * time.Second},
			addrs: []string{"r:6380"}},
		{name: "cluster", yaml: "redis: {url: 'redis://a:7000?addr=b:7001&addr=c:7002', mode: cluster}",
			want:  Redis{URL: "redis://a:7000?addr=b:7001&addr=c:7002", Mode: "cluster", KeyPrefix: "switchyard:", Timeout: 5 * time.Millisecond, SyncInterval: 200 * time.Millisecond, PoolSize: 16, BreakerFailures: 5, BreakerCoolDown: time.Second},
			addrs: []string{"a:7000", "b:7001", "c:7002"}, cluster: true},
		{name: "sentinel", yaml: "redis: {url: 'redis://s1:26379/1?master_name=mymaster&addr=s2:26379', mode: sentinel}",
			want:  Redis{URL: "redis://s1:26379/1?master_name=mymaster&addr=s2:26379", Mode: "sentinel", KeyPrefix: "switchyard:", Timeout: 5 * time.Millisecond, SyncInterval: 200 * time.Millisecond, PoolSize: 16, BreakerFailures: 5, BreakerCoolDown: time.Second},
			addrs: []string{"s1:26379", "s2:26379"}, master: "mymaster"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse("f.yaml", []byte(tc.yaml+"\n"+redisBase))
			if err != nil {
				t.Fatal(err)
			}
			if c.Redis != tc.want {
				t.Fatalf("redis = %+v, want %+v", c.Redis, tc.want)
			}
			if !c.Redis.Enabled() {
				return
			}
			o, err := c.Redis.Options()
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(o.Addrs, ",") != strings.Join(tc.addrs, ",") || o.MasterName != tc.master || o.IsClusterMode != tc.cluster {
				t.Errorf("options: addrs %v master %q cluster %v", o.Addrs, o.MasterName, o.IsClusterMode)
			}
			if o.MaxRetries != -1 || !o.ContextTimeoutEnabled {
				t.Errorf("options must not retry and must honour each call's deadline: %+v", o)
			}
			if o.PoolSize != tc.want.PoolSize || o.MinIdleConns != 2 || o.PipelinePoolSize >= 0 || o.PoolTimeout != max(tc.want.Timeout, 10*time.Millisecond) ||
				o.DialTimeout != time.Second || o.ReadTimeout != time.Second || o.WriteTimeout != time.Second {
				t.Errorf("options must bound the pool and every wait: pool %d, min idle %d, pool timeout %v, dial %v, read %v, write %v",
					o.PoolSize, o.MinIdleConns, o.PoolTimeout, o.DialTimeout, o.ReadTimeout, o.WriteTimeout)
			}
		})
	}
}

func TestRedisErrors(t *testing.T) {
	const secret = "pa55word"
	for _, tc := range []struct{ yaml, want string }{
		{"redis: http://h:1", "f.yaml:1: redis: expected redis://"},
		{"redis: 'redis://:" + secret + "@h:1/x'", "f.yaml:1: redis: expected redis://"},
		{"redis: 'redis://:" + secret + "@h:1?" + secret + "=1'", "f.yaml:1: redis: the URL's query may only hold client_name in mode single"},
		{"redis: [a]", "f.yaml:1: redis: expected a URL (redis://host:port/db) or a mapping"},
		{"redis: {mode: cluster}", "f.yaml:1: redis.url: required when other redis settings are given"},
		{"redis: {url: 'redis://h:1', mode: ring}", `f.yaml:1: redis.mode: unknown mode "ring"`},
		{"redis: {url: 'redis://h:1', mode: sentinel}", "f.yaml:1: redis.url: mode sentinel needs master_name"},
		{"redis: {url: 'redis://h:1', key_prefix: 'a{b}:'}", "f.yaml:1: redis.key_prefix: must not contain braces"},
		{"redis: {url: 'redis://h:1', timeout: 2s}", "f.yaml:1: redis.timeout: must be in (0, 1s]"},
		{"redis: {url: 'redis://h:1', timeout: 0s}", "f.yaml:1: redis.timeout: must be in (0, 1s]"},
		{"redis: {url: 'redis://h:1', sync_interval: 5ms}", "f.yaml:1: redis.sync_interval: must be in [20ms, 1s]"},
		{"redis: {url: 'redis://h:1', ttl: 5s}", `f.yaml:1: redis.ttl: unknown field`},
		{"redis: {url: 'redis://h:1', pool_size: 2}", "f.yaml:1: redis.pool_size: must be in [4, 1024]"},
		{"redis: {url: 'redis://h:1', pool_size: 0}", "f.yaml:1: redis.pool_size: must be in [4, 1024]"},
		{"redis: {url: 'redis://h:1', breaker_failures: 0}", "f.yaml:1: redis.breaker_failures: must be in [1, 1000]"},
		{"redis: {url: 'redis://h:1', breaker_cool_down: 10ms}", "f.yaml:1: redis.breaker_cool_down: must be in [100ms, 1m]"},
		{"redis: {url: 'redis://h:1', breaker_cool_down: 2m}", "f.yaml:1: redis.breaker_cool_down: must be in [100ms, 1m]"},
		{"redis: {breaker_failures: 3}", "f.yaml:1: redis.url: required when other redis settings are given"},
	} {
		_, err := Parse("f.yaml", []byte(tc.yaml+"\n"+redisBase))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%s:\n got %v\nwant %s...", tc.yaml, err, tc.want)
		}
		if err != nil && strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error prints the secret: %v", tc.yaml, err)
		}
	}
}

// TestRedisIsStatic: a reload that changes redis keeps the one the process started with (and warns).
func TestRedisIsStatic(t *testing.T) {
	w := &Watcher{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	old := &Config{Redis: Redis{URL: "redis://a:1", Mode: "single"}}
	c := &Config{Redis: Redis{URL: "redis://b:2", Mode: "single"}}
	w.keepStatic(c, old)
	if c.Redis != old.Redis {
		t.Fatalf("redis changed on reload: %+v", c.Redis)
	}
}
