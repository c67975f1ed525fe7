package sim

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// BlockTokens is the default KV cache block size in tokens (Config.BlockSize), as vLLM's default --block-size.
const BlockTokens = 16

// BlockBytes is one default KV block in bytes of canonical prompt (BlockTokens tokens of openai.BytesPerToken
// bytes): the gateway hashes the prompt in blocks of the same size, so both sides agree on which prefix blocks
// exist. A backend with another Config.BlockSize hashes at its own granularity (the gateway does not change).
const BlockBytes = 64

// Config is one simulated backend. Start it with Start or StartFleet. Build one with DefaultConfig and change the
// fields you need: Validate rejects values an engine could not have (a zero prefill rate, zero blocks), so the zero
// Config is not valid. The defaults are the CLI's (see "switchyard sim -h").
type Config struct {
	// Name identifies the backend in X-Sim-Backend and in fleet listings. Default "sim".
	Name string
	// Model is the one model name served; requests naming another get 404. Default "sim-model".
	Model string
	// Listen is the TCP address to listen on. Empty means "127.0.0.1:0", a free loopback port (the in-process
	// default, for tests); the CLI's default is 127.0.0.1:8000.
	Listen string
	// Region is informational: it is printed in fleet listings and returned by Backend.Region.
	Region string

	// PrefillTPS is the prefill rate in tokens per second: a step that prefills n tokens takes n/PrefillTPS.
	// Default 10000.
	PrefillTPS float64
	// ITL is the step time of a batch with one decoding sequence. Default 20ms.
	ITL time.Duration
	// ITLPerSeq is added to the step time for each decoding sequence beyond the first. Default 0.1ms.
	ITLPerSeq time.Duration
	// Overhead is the API server's time before a request reaches the engine queue (tokenization and the like):
	// it is added before the first token. Default 10ms.
	Overhead time.Duration
	// MaxNumSeqs caps the sequences running at once (vLLM --max-num-seqs). Default 256.
	MaxNumSeqs int
	// SchedulingPolicy is vLLM's --scheduling-policy: "fcfs" (the default, also "") runs waiting requests in arrival
	// order and preempts the newest running one; "priority" runs them by their request's "priority" (lower
	// first, then arrival) and preempts the running one with the highest value, the latest on a tie
	// (engine.startStep). As vLLM, a request with a priority other than 0 is refused with 400 under fcfs.
	SchedulingPolicy string
	// MaxBatchedTokens caps the tokens scheduled in one step, one per decoding sequence plus the prefill
	// chunks (vLLM --max-num-batched-tokens). Default 4096.
	MaxBatchedTokens int
	// KVBlocks is the number of KV cache blocks of BlockSize tokens; it also bounds a request's context
	// (prompt + max_tokens <= BlockSize*KVBlocks tokens). Default 8192.
	KVBlocks int
	// DefaultMaxTokens is the completion length when a request sets neither max_tokens nor
	// max_completion_tokens. Default 256.
	DefaultMaxTokens int

	// RTT is extra network delay added before the first byte of every response (all endpoints but /sim/control),
	// standing for a far region. Tokens after the first keep their spacing. Default 0.
	RTT time.Duration
	// FailRate is the share of completion requests answered with a 500 before any token, in [0, 1]. It is the
	// baseline that POST /sim/control overrides and {} restores. Default 0.
	FailRate float64
	// EmbeddingDim is the length of the vectors /v1/embeddings and /v2/embed return (a request's "dimensions"
	// may ask for fewer). Default 384, the size of small sentence-embedding models (all-MiniLM-L6-v2,
	// bge-small); at most 16384.
	EmbeddingDim int

	// The engine's physics (see the package doc, "Physics"). Each zero value is today's vLLM V1 engine (the
	// vllm-v1 preset), so a Config without them runs as it always did.

	// Physics is the preset the physics fields were filled from (SetPhysics, the -physics flag, the fleet key
	// physics): PhysicsVLLMV1 and the others. Informational once set: the fields below are what the engine
	// runs. Empty: none.
	Physics string
	// Batching is the batching law: BatchStepped (the zero value too; continuous batching whose step slows
	// with the batch) or BatchSeats (fixed seats that each run at their own pace, slowed by LoadFactor).
	Batching string
	// LoadFactor is, under BatchSeats, the time factor of prefill and decode with MaxNumSeqs sequences in
	// flight; it rises linearly from 1 with one in flight (llm-d-inference-sim's time-factor-under-load). In
	// [1, 100], or 0 meaning 1.
	LoadFactor float64
	// BlockSize is the KV cache block size in tokens (vLLM --block-size, SGLang --page-size): the prefix
	// cache's granularity. In [1, 1024], or 0 meaning BlockTokens (16).
	BlockSize int
	// Eviction is the prefix cache's eviction rule: EvictLRU (the zero value too), EvictRadix or EvictFIFO.
	Eviction string
	// ChunkedPrefill is how prefill shares the engine with decoding: PrefillMixed ("on", the zero value too),
	// PrefillUnmixed or PrefillOff.
	ChunkedPrefill string
	// Jitter is the relative spread of step times: each step's time (under BatchSeats, each interval's) is
	// multiplied by a lognormal factor of mean 1 whose log has standard deviation Jitter, drawn from a
	// generator seeded by Seed and Name, so a run repeats exactly. In [0, 1]; default 0 (no jitter).
	Jitter float64
	// PrefillKnee makes prefill cost grow with context: a prompt token at context c (tokens before it) costs
	// (1 + c/PrefillKnee)/PrefillTPS. 0 (default) keeps prefill linear.
	PrefillKnee int

	// The API surface (see the package doc, "Dialects"), independent of the physics: any physics speaks any
	// dialect.

	// Dialect is the real engine whose surface the backend serves: DialectVLLM (the zero value too; vLLM's
	// metric names, no info endpoint), DialectSGLang (SGLang's metric names, GET /get_server_info and
	// /server_info) or DialectTGI (TGI's metric names, GET /info, and TGI's 429 past MaxConcurrentRequests).
	Dialect string
	// StatesSeats says whether the info endpoint states MaxNumSeqs as a server argument: TGI's /info
	// max_batch_size and SGLang's top-level max_running_requests are null without it, as those engines
	// report a limit they were not given on the command line. SGLang's internal_states always carries the
	// figure it runs with, so under DialectSGLang false changes only the top-level field; under DialectVLLM it
	// changes nothing. DefaultConfig sets it (true); the zero value is false.
	StatesSeats bool
	// MaxConcurrentRequests is TGI's --max-concurrent-requests: under DialectTGI, a request that arrives while
	// this many are held (pending, waiting or running; each input of a pooling request counts) is refused at
	// once with 429 {"error":"Model is overloaded","error_type":"overloaded"}. 0 (the default) enforces no
	// limit, and /info then reports TGI's default, 128. Only TGI has this limit: Validate refuses a value other
	// than 0 under another dialect.
	MaxConcurrentRequests int

	// Seed seeds the generated text (with the canonical prompt, so one request gives the same text on every
	// backend that shares the seed, on every run), the fault draws and the jitter. Default 1.
	Seed uint64
}

// DefaultConfig returns the CLI's defaults, except that Listen is empty (a free loopback port).
func DefaultConfig() Config {
	return Config{
		Name:             "sim",
		Model:            "sim-model",
		PrefillTPS:       10000,
		ITL:              20 * time.Millisecond,
		ITLPerSeq:        100 * time.Microsecond,
		Overhead:         10 * time.Millisecond,
		MaxNumSeqs:       256,
		SchedulingPolicy: PolicyFCFS,
		MaxBatchedTokens: 4096,
		KVBlocks:         8192,
		DefaultMaxTokens: 256,
		EmbeddingDim:     384,
		StatesSeats:      true,
		Seed:             1,
	}
}

// maxEmbeddingDim bounds Config.EmbeddingDim: a vector of 16384 float32s is 64 KiB, already past any real model.
const maxEmbeddingDim = 16384

// DefaultListen is the CLI's -listen default.
const DefaultListen = "127.0.0.1:8000"

// knob is one tunable of Config, shared by the CLI flags and the fleet file so that both spell, parse and check a
// value the same way. set parses s into c and checks its range; check re-checks a value set from Go.
type knob struct {
	flag  string // CLI flag name, without the dash
	key   string // fleet file key
	bit   uint64 // this knob's bit in a set of knobs named (set by init)
	usage string
	// boolean marks a flag that may stand alone (-states-seats means -states-seats=true).
	boolean bool
	set     func(c *Config, s string) error
	get     func(c *Config) string
	check   func(c *Config) error
}

var knobs = []knob{
	strKnob("listen", "listen", "TCP address to listen on", func(c *Config) *string { return &c.Listen }, false),
	strKnob("name", "name", "backend name, sent in X-Sim-Backend", func(c *Config) *string { return &c.Name }, true),
	strKnob("region", "region", "region label (informational)", func(c *Config) *string { return &c.Region }, false),
	strKnob("model", "model", "the model name served", func(c *Config) *string { return &c.Model }, true),
	floatKnob("prefill-tps", "prefill_tps", "prefill rate, tokens per second (> 0)",
		func(c *Config) *float64 { return &c.PrefillTPS }, 0, false),
	durKnob("itl", "itl", "step time with one decoding sequence (> 0)",
		func(c *Config) *time.Duration { return &c.ITL }, true),
	durKnob("itl-per-seq", "itl_per_seq", "step time added per decoding sequence beyond the first",
		func(c *Config) *time.Duration { return &c.ITLPerSeq }, false),
	durKnob("overhead", "overhead", "API server time before a request reaches the engine queue",
		func(c *Config) *time.Duration { return &c.Overhead }, false),
	intKnob("max-num-seqs", "max_num_seqs", "most sequences running at once (> 0)",
		func(c *Config) *int { return &c.MaxNumSeqs }),
	{
		flag: "scheduling-policy", key: "scheduling_policy",
		usage: "order of the waiting queue, as vLLM's --scheduling-policy: fcfs or priority (a `policy`)",
		set: func(c *Config, s string) error {
			c.SchedulingPolicy = s
			return checkPolicy(c)
		},
		get:   func(c *Config) string { return c.SchedulingPolicy },
		check: checkPolicy,
	},
	intKnob("max-batched-tokens", "max_batched_tokens", "most tokens scheduled in one step (> 0)",
		func(c *Config) *int { return &c.MaxBatchedTokens }),
	intKnob("kv-blocks", "kv_blocks", "KV cache size in blocks of block-size tokens (> 0)",
		func(c *Config) *int { return &c.KVBlocks }),
	intKnob("default-max-tokens", "default_max_tokens", "completion length when a request sets no max_tokens (> 0)",
		func(c *Config) *int { return &c.DefaultMaxTokens }),
	boundedIntKnob("embedding-dim", "embedding_dim", "length of the vectors the embedding endpoints return",
		func(c *Config) *int { return &c.EmbeddingDim }, maxEmbeddingDim),
	durKnob("rtt", "rtt", "extra network delay before every response's first byte (a far region)",
		func(c *Config) *time.Duration { return &c.RTT }, false),
	floatKnob("fail-rate", "fail_rate", "share of requests answered 500 before any token, in [0,1]",
		func(c *Config) *float64 { return &c.FailRate }, 1, true),
	{
		flag: "physics", key: "physics",
		usage: "engine physics preset, filling the physics knobs not set by name: " + strings.Join(PhysicsPresets(), ", ") +
			" (a `preset`)",
		set: func(c *Config, s string) error { return c.setPhysics(s, 0) },
		get: func(c *Config) string { return c.Physics },
		check: func(c *Config) error {
			if _, ok := presets[c.Physics]; !ok && c.Physics != "" {
				return fmt.Errorf("%q is not one of %s", c.Physics, strings.Join(PhysicsPresets(), ", "))
			}
			return nil
		},
	},
	enumKnob("batching", "batching", "batching law: stepped (continuous batching, a step slows with its batch) or seats",
		func(c *Config) *string { return &c.Batching }, BatchStepped, BatchSeats),
	rangeKnob("load-factor", "load_factor", "under seats, the time factor with max-num-seqs in flight (1 with one; 0 means 1)",
		func(c *Config) *float64 { return &c.LoadFactor }, 1, 100),
	{
		flag: "block-size", key: "block_size",
		usage: "KV cache block size in tokens, the prefix cache's granularity, in [1, 1024] (0: 16) (an `integer`)",
		set: func(c *Config, s string) error {
			v, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("%q is not an integer", s)
			}
			c.BlockSize = v
			return checkBlockSize(c)
		},
		get:   func(c *Config) string { return strconv.Itoa(c.blockSize()) },
		check: checkBlockSize,
	},
	enumKnob("eviction", "eviction", "prefix cache eviction rule: lru (vLLM), radix (SGLang: LRU leaves) or fifo",
		func(c *Config) *string { return &c.Eviction }, EvictLRU, EvictRadix, EvictFIFO),
	enumKnob("chunked-prefill", "chunked_prefill",
		"on (prefill chunks share a step with decodes), unmixed (prefill-only steps of chunks) or off (prefill-only steps of whole prompts)",
		func(c *Config) *string { return &c.ChunkedPrefill }, PrefillMixed, PrefillUnmixed, PrefillOff),
	rangeKnob("jitter", "jitter", "relative spread of step times (sigma of a lognormal factor of mean 1)",
		func(c *Config) *float64 { return &c.Jitter }, 0, 1),
	{
		flag: "prefill-knee", key: "prefill_knee",
		usage: "context length at which a prompt token's prefill costs twice its first token's; 0: linear (an `integer`)",
		set: func(c *Config, s string) error {
			v, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("%q is not an integer", s)
			}
			c.PrefillKnee = v
			return checkKnee(c)
		},
		get:   func(c *Config) string { return strconv.Itoa(c.PrefillKnee) },
		check: checkKnee,
	},
	enumKnob("dialect", "dialect", "API surface: vllm (vLLM's metrics), sglang (SGLang's metrics and /get_server_info) "+
		"or tgi (TGI's metrics, /info and its 429 past max-concurrent-requests)",
		func(c *Config) *string { return &c.Dialect }, DialectVLLM, DialectSGLang, DialectTGI),
	{
		flag: "states-seats", key: "states_seats", boolean: true,
		usage: "whether the info endpoint states max-num-seqs as a server argument (TGI's max_batch_size, " +
			"SGLang's max_running_requests; null when false)",
		set: func(c *Config, s string) error {
			v, err := strconv.ParseBool(s)
			if err != nil {
				return fmt.Errorf("%q is not true or false", s)
			}
			c.StatesSeats = v
			return nil
		},
		get:   func(c *Config) string { return strconv.FormatBool(c.StatesSeats) },
		check: func(*Config) error { return nil },
	},
	{
		flag: "max-concurrent-requests", key: "max_concurrent_requests",
		usage: "under dialect tgi, most requests held at once before a 429 (TGI's --max-concurrent-requests); " +
			"0: no limit (an `integer`)",
		set: func(c *Config, s string) error {
			v, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("%q is not an integer", s)
			}
			c.MaxConcurrentRequests = v
			return checkConcurrentRange(c) // the dialect may come later in the same entry: Validate checks it
		},
		get:   func(c *Config) string { return strconv.Itoa(c.MaxConcurrentRequests) },
		check: checkConcurrent,
	},
	{
		flag: "seed", key: "seed", usage: "seed of the generated text, of fault draws and of the jitter (an unsigned `integer`)",
		set: func(c *Config, s string) error {
			v, err := strconv.ParseUint(s, 0, 64)
			if err != nil {
				return fmt.Errorf("%q is not an unsigned integer", s)
			}
			c.Seed = v
			return nil
		},
		get:   func(c *Config) string { return strconv.FormatUint(c.Seed, 10) },
		check: func(*Config) error { return nil },
	},
}

func init() {
	for i := range knobs {
		knobs[i].bit = 1 << i
	}
}

// apply sets the knob from s, as a flag or a fleet key does, and adds it to named, the knobs set by name on c:
// a physics preset fills only the knobs not in named, whether they come before or after it.
func (k knob) apply(c *Config, s string, named *uint64) error {
	if k.key == "physics" {
		if err := c.setPhysics(s, *named); err != nil {
			return err
		}
		*named |= k.bit
		return nil
	}
	if err := k.set(c, s); err != nil {
		return err
	}
	*named |= k.bit
	if k.key == "block_size" && *named&knobBit["physics"] != 0 && *named&knobBit["kv_blocks"] == 0 {
		c.KVBlocks = max(defaultCacheTokens/c.blockSize(), 1) // a named preset keeps the cache's tokens
	}
	return nil
}

func checkBlockSize(c *Config) error {
	if c.BlockSize < 0 || c.BlockSize > 1024 {
		return fmt.Errorf("%d must be in [1, 1024]", c.BlockSize)
	}
	return nil
}

func checkConcurrentRange(c *Config) error {
	if c.MaxConcurrentRequests < 0 || c.MaxConcurrentRequests > 1<<30 {
		return fmt.Errorf("%d must be in [0, %d]", c.MaxConcurrentRequests, 1<<30)
	}
	return nil
}

// checkConcurrent also refuses the limit under a dialect other than tgi: only TGI's router has it, and a vLLM
// or SGLang backend answering TGI's 429 would be a surface no real engine serves.
func checkConcurrent(c *Config) error {
	if err := checkConcurrentRange(c); err != nil {
		return err
	}
	if c.MaxConcurrentRequests != 0 && c.Dialect != DialectTGI {
		return fmt.Errorf("%d needs dialect tgi (only TGI's router has this limit; dialect is %q)",
			c.MaxConcurrentRequests, c.dialect())
	}
	return nil
}

func checkKnee(c *Config) error {
	if c.PrefillKnee < 0 || c.PrefillKnee > 1<<30 {
		return fmt.Errorf("%d must be in [0, %d]", c.PrefillKnee, 1<<30)
	}
	return nil
}

// enumKnob accepts one of values, or "" (the zero value, meaning the first of them).
func enumKnob(flagName, key, usage string, field func(*Config) *string, values ...string) knob {
	check := func(c *Config) error {
		if v := *field(c); v != "" && !slices.Contains(values, v) {
			return fmt.Errorf("%q is not one of %s", *field(c), strings.Join(values, ", "))
		}
		return nil
	}
	return knob{
		flag: flagName, key: key, usage: usage + " (a `name`)",
		set: func(c *Config, s string) error {
			*field(c) = s
			return check(c)
		},
		get:   func(c *Config) string { return *field(c) },
		check: check,
	}
}

// rangeKnob checks lo <= v <= hi, or v == 0 (a zero value meaning the default).
func rangeKnob(flagName, key, usage string, field func(*Config) *float64, lo, hi float64) knob {
	check := func(c *Config) error {
		if v := *field(c); v != 0 && !(v >= lo && v <= hi) { // also rejects NaN
			return fmt.Errorf("%v is outside [%v, %v]", v, lo, hi)
		}
		return nil
	}
	return numberKnob(flagName, key, usage, field, check)
}

// The scheduling policies (Config.SchedulingPolicy).
const (
	PolicyFCFS     = "fcfs"
	PolicyPriority = "priority"
)

func checkPolicy(c *Config) error {
	if c.SchedulingPolicy != "" && c.SchedulingPolicy != PolicyFCFS && c.SchedulingPolicy != PolicyPriority {
		return fmt.Errorf("%q is not fcfs or priority", c.SchedulingPolicy)
	}
	return nil
}

func strKnob(flagName, key, usage string, field func(*Config) *string, required bool) knob {
	check := func(c *Config) error {
		if required && *field(c) == "" {
			return errors.New("must not be empty")
		}
		return nil
	}
	return knob{
		flag: flagName, key: key, usage: usage + " (a `string`)",
		set: func(c *Config, s string) error {
			*field(c) = s
			return check(c)
		},
		get:   func(c *Config) string { return *field(c) },
		check: check,
	}
}

// numberKnob is a float64 knob whose value check is check: rangeKnob's and floatKnob's common part.
func numberKnob(flagName, key, usage string, field func(*Config) *float64, check func(*Config) error) knob {
	return knob{
		flag: flagName, key: key, usage: usage + " (a `number`)",
		set: func(c *Config, s string) error {
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return fmt.Errorf("%q is not a number", s)
			}
			*field(c) = v
			return check(c)
		},
		get:   func(c *Config) string { return strconv.FormatFloat(*field(c), 'g', -1, 64) },
		check: check,
	}
}

// floatKnob checks v > 0, or 0 <= v <= max when max > 0 (bounded is then true).
func floatKnob(flagName, key, usage string, field func(*Config) *float64, max float64, bounded bool) knob {
	check := func(c *Config) error {
		v := *field(c)
		if bounded {
			if !(v >= 0 && v <= max) { // also rejects NaN
				return fmt.Errorf("%v is outside [0, %v]", v, max)
			}
			return nil
		}
		if !(v > 0) || v > 1e15 {
			return fmt.Errorf("%v must be > 0", v)
		}
		return nil
	}
	return numberKnob(flagName, key, usage, field, check)
}

func durKnob(flagName, key, usage string, field func(*Config) *time.Duration, positive bool) knob {
	check := func(c *Config) error {
		v := *field(c)
		switch {
		case positive && v <= 0:
			return fmt.Errorf("%v must be > 0", v)
		case v < 0:
			return fmt.Errorf("%v must not be negative", v)
		}
		return nil
	}
	return knob{
		flag: flagName, key: key, usage: usage + " (a `duration`)",
		set: func(c *Config, s string) error {
			v, err := time.ParseDuration(s)
			if err != nil {
				return fmt.Errorf("%q is not a duration (like 20ms)", s)
			}
			*field(c) = v
			return check(c)
		},
		get:   func(c *Config) string { return field(c).String() },
		check: check,
	}
}

func intKnob(flagName, key, usage string, field func(*Config) *int) knob {
	return boundedIntKnob(flagName, key, usage, field, 1<<30)
}

// boundedIntKnob checks 1 <= v <= max.
func boundedIntKnob(flagName, key, usage string, field func(*Config) *int, max int) knob {
	check := func(c *Config) error {
		if v := *field(c); v <= 0 || v > max {
			return fmt.Errorf("%d must be in [1, %d]", v, max)
		}
		return nil
	}
	return knob{
		flag: flagName, key: key, usage: usage + " (an `integer`)",
		set: func(c *Config, s string) error {
			v, err := strconv.Atoi(s)
			if err != nil {
				return fmt.Errorf("%q is not an integer", s)
			}
			*field(c) = v
			return check(c)
		},
		get:   func(c *Config) string { return strconv.Itoa(*field(c)) },
		check: check,
	}
}

// Validate reports the first field that no engine could have, naming it by its fleet-file key
// (`sim: config: prefill_tps: 0 must be > 0`).
func (c *Config) Validate() error {
	for _, k := range knobs {
		if err := k.check(c); err != nil {
			return fmt.Errorf("sim: config %q: %s: %w", c.Name, k.key, err)
		}
	}
	return nil
}

// maxContextTokens is the longest prompt + completion a backend accepts: what fits in its KV cache.
func (c *Config) maxContextTokens() int { return c.KVBlocks * c.blockSize() }

// blockSize is BlockSize, 0 meaning BlockTokens.
func (c *Config) blockSize() int {
	if c.BlockSize == 0 {
		return BlockTokens
	}
	return c.BlockSize
}

// loadFactor is LoadFactor, 0 meaning 1.
func (c *Config) loadFactor() float64 { return max(c.LoadFactor, 1) }

// RegisterFlags defines one flag per Config field on fs ("-prefill-tps", "-itl", ...), each bound to c: parsing
// fs sets the fields, and a value out of range fails fs.Parse with an error that names the flag. The defaults
// shown are c's values at the time of the call.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	named := new(uint64) // shared by the flags, so -physics leaves the knobs named on the command line alone
	for _, k := range knobs {
		fs.Var(&knobValue{c: c, k: k, named: named}, k.flag, k.usage)
	}
}

// FlagNames returns the names (without the dash) of the flags RegisterFlags defines.
func FlagNames() []string {
	names := make([]string, len(knobs))
	for i, k := range knobs {
		names[i] = k.flag
	}
	return names
}

type knobValue struct {
	c     *Config
	k     knob
	named *uint64
}

func (v *knobValue) String() string {
	if v == nil || v.c == nil {
		return ""
	}
	return v.k.get(v.c)
}

func (v *knobValue) Set(s string) error { return v.k.apply(v.c, s, v.named) }

// IsBoolFlag lets a boolean knob's flag stand alone (the flag package's boolFlag).
func (v *knobValue) IsBoolFlag() bool { return v.k.boolean }
