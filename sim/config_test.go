package sim

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Config)
		want   string // "" for valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"zero overhead and rtt", func(c *Config) { c.Overhead, c.RTT, c.ITLPerSeq = 0, 0, 0 }, ""},
		{"zero config", func(c *Config) { *c = Config{} }, "name"},
		{"zero prefill", func(c *Config) { c.PrefillTPS = 0 }, "prefill_tps"},
		{"zero itl", func(c *Config) { c.ITL = 0 }, "itl"},
		{"negative rtt", func(c *Config) { c.RTT = -time.Millisecond }, "rtt"},
		{"fail rate", func(c *Config) { c.FailRate = 2 }, "fail_rate"},
		{"kv blocks", func(c *Config) { c.KVBlocks = 0 }, "kv_blocks"},
		{"batched tokens", func(c *Config) { c.MaxBatchedTokens = -1 }, "max_batched_tokens"},
		{"model", func(c *Config) { c.Model = "" }, "model"},
		{"embedding dim too large", func(c *Config) { c.EmbeddingDim = maxEmbeddingDim + 1 }, "embedding_dim"},
		{"embedding dim zero", func(c *Config) { c.EmbeddingDim = 0 }, "embedding_dim"},
		{"dialects", func(c *Config) { c.Dialect = DialectSGLang; c.StatesSeats = false }, ""},
		{"unknown dialect", func(c *Config) { c.Dialect = "triton" }, "dialect"},
		{"tgi limit", func(c *Config) { c.Dialect, c.MaxConcurrentRequests = DialectTGI, 3 }, ""},
		{"limit without tgi", func(c *Config) { c.MaxConcurrentRequests = 3 }, "max_concurrent_requests"},
		{"negative limit", func(c *Config) { c.Dialect, c.MaxConcurrentRequests = DialectTGI, -1 },
			"max_concurrent_requests"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.change(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("unexpected error %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want+":")):
				t.Errorf("error = %v, want one naming %s", err, tc.want)
			}
		})
	}
}

func TestRegisterFlags(t *testing.T) {
	c := DefaultConfig()
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	err := fs.Parse([]string{"-itl", "5ms", "-itl-per-seq", "0.5ms", "-prefill-tps", "2e4", "-max-num-seqs", "8",
		"-seed", "9", "-region", "r", "-rtt", "40ms", "-fail-rate", "0.5"})
	if err != nil {
		t.Fatal(err)
	}
	if c.ITL != 5*time.Millisecond || c.ITLPerSeq != 500*time.Microsecond || c.PrefillTPS != 20000 ||
		c.MaxNumSeqs != 8 || c.Seed != 9 || c.Region != "r" || c.RTT != 40*time.Millisecond || c.FailRate != 0.5 {
		t.Errorf("parsed %+v", c)
	}
	if got := fs.Lookup("itl").DefValue; got != "20ms" {
		t.Errorf("-itl default shown as %q, want 20ms", got)
	}
	if len(FlagNames()) != len(knobs) {
		t.Error("FlagNames")
	}
	// The dialect knobs: a bare -states-seats is true, and the limit may come before -dialect.
	c = DefaultConfig()
	fs = flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"-states-seats=false", "-max-concurrent-requests", "5", "-dialect", "tgi"}); err != nil {
		t.Fatal(err)
	}
	if c.StatesSeats || c.MaxConcurrentRequests != 5 || c.Dialect != DialectTGI || c.Validate() != nil {
		t.Errorf("dialect flags parsed to states_seats %v, limit %d, dialect %q (valid: %v)", c.StatesSeats,
			c.MaxConcurrentRequests, c.Dialect, c.Validate())
	}
	if err := fs.Parse([]string{"-states-seats"}); err != nil || !c.StatesSeats {
		t.Errorf("bare -states-seats: %v, states_seats %v", err, c.StatesSeats)
	}
	if got := fs.Lookup("states-seats").DefValue; got != "true" {
		t.Errorf("-states-seats default shown as %q, want true", got)
	}
	for _, bad := range [][]string{{"-itl", "0"}, {"-seed", "-1"}, {"-max-batched-tokens", "0"},
		{"-dialect", "triton"}, {"-states-seats=maybe"}, {"-max-concurrent-requests", "-2"}} {
		c := DefaultConfig()
		fs := flag.NewFlagSet("sim", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		c.RegisterFlags(fs)
		name, _, _ := strings.Cut(bad[0], "=")
		if err := fs.Parse(bad); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: error %v, want one naming the flag", bad, err)
		}
	}
}
