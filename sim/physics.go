package sim

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// The batching laws (Config.Batching).
const (
	// BatchStepped is continuous batching in steps: a step lasts ITL + ITLPerSeq*(decoders-1) plus its prefill,
	// so every sequence slows as the batch grows (vLLM, SGLang, TGI).
	BatchStepped = "stepped"
	// BatchSeats is MaxNumSeqs fixed seats, each sequence running at its own pace: prefill of the uncached part
	// at PrefillTPS, then one token per ITL, both times a factor rising linearly from 1 with one sequence in
	// flight to LoadFactor with MaxNumSeqs; requests beyond the seats wait (llm-d-inference-sim).
	BatchSeats = "seats"
)

// How prefill shares the engine with decoding (Config.ChunkedPrefill).
const (
	// PrefillMixed is chunked prefill as vLLM V1 runs it: a step schedules every decoding sequence first, then
	// prefill chunks within MaxBatchedTokens, so a long prompt stretches decode steps but never stops them.
	PrefillMixed = "on"
	// PrefillUnmixed is chunked prefill without mixing (SGLang without --enable-mixed-chunk): a step either
	// prefills chunks within MaxBatchedTokens or decodes, and prefill goes first, so decoding sequences wait
	// while there is prefill to do.
	PrefillUnmixed = "unmixed"
	// PrefillOff is no chunked prefill (vLLM V0's default scheduler, TGI's router): a step that prefills runs
	// whole prompts only (at least one, however long; more while MaxBatchedTokens allows), and decoding
	// sequences wait for it.
	PrefillOff = "off"
)

// The physics presets (Config.Physics, SetPhysics).
const (
	PhysicsVLLMV1 = "vllm-v1"
	PhysicsVLLMV0 = "vllm-v0"
	PhysicsSGLang = "sglang"
	PhysicsTGI    = "tgi"
	PhysicsLLMD   = "llm-d-sim"
)

// defaultCacheTokens is the default KV cache in tokens (8192 blocks of 16): a preset with another block size
// keeps it, so that presets differ in granularity, not in capacity.
const defaultCacheTokens = 8192 * BlockTokens

// preset is one engine's physics. The package doc ("Physics") says which engine each models and where the
// numbers come from.
type preset struct {
	batching, eviction, chunked string
	blockSize, maxBatchedTokens int
	loadFactor, jitter          float64
	knee                        int
}

var presets = map[string]preset{
	PhysicsVLLMV1: {batching: BatchStepped, eviction: EvictLRU, chunked: PrefillMixed, blockSize: 16,
		maxBatchedTokens: 4096, loadFactor: 1},
	PhysicsVLLMV0: {batching: BatchStepped, eviction: EvictLRU, chunked: PrefillOff, blockSize: 16,
		maxBatchedTokens: 4096, loadFactor: 1},
	PhysicsSGLang: {batching: BatchStepped, eviction: EvictRadix, chunked: PrefillUnmixed, blockSize: 1,
		maxBatchedTokens: 8192, loadFactor: 1},
	PhysicsTGI: {batching: BatchStepped, eviction: EvictRadix, chunked: PrefillOff, blockSize: 1,
		maxBatchedTokens: 4096, loadFactor: 1},
	PhysicsLLMD: {batching: BatchSeats, eviction: EvictLRU, chunked: PrefillMixed, blockSize: 16,
		maxBatchedTokens: 4096, loadFactor: 1},
}

// PhysicsPresets returns the preset names, sorted.
func PhysicsPresets() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// knobBit maps a fleet key to its bit in a set of knobs named (filled by init, after knobs).
var knobBit = map[string]uint64{}

func init() {
	for _, k := range knobs {
		knobBit[k.key] = k.bit
	}
}

// SetPhysics fills the physics fields (Batching, LoadFactor, BlockSize, Eviction, ChunkedPrefill, Jitter,
// PrefillKnee), MaxBatchedTokens and KVBlocks (the default cache's tokens in blocks of the preset's size) from
// the named preset, overwriting them: call it first, then change the fields you need. The -physics flag and
// the fleet key physics instead leave alone the knobs set by name, before or after it (and kv_blocks, unless
// named, follows a block_size named after the preset).
func (c *Config) SetPhysics(name string) error {
	if err := c.setPhysics(name, 0); err != nil {
		return fmt.Errorf("sim: config %q: physics: %w", c.Name, err)
	}
	return nil
}

// setPhysics fills the preset's fields but those in named (a set of knobBit).
func (c *Config) setPhysics(name string, named uint64) error {
	p, ok := presets[name]
	if !ok {
		return fmt.Errorf("%q is not one of %s", name, strings.Join(PhysicsPresets(), ", "))
	}
	c.Physics = name
	set := func(key string) bool { return named&knobBit[key] == 0 }
	if set("batching") {
		c.Batching = p.batching
	}
	if set("load_factor") {
		c.LoadFactor = p.loadFactor
	}
	if set("block_size") {
		c.BlockSize = p.blockSize
	}
	if set("kv_blocks") {
		c.KVBlocks = max(defaultCacheTokens/c.blockSize(), 1)
	}
	if set("eviction") {
		c.Eviction = p.eviction
	}
	if set("chunked_prefill") {
		c.ChunkedPrefill = p.chunked
	}
	if set("max_batched_tokens") {
		c.MaxBatchedTokens = p.maxBatchedTokens
	}
	if set("jitter") {
		c.Jitter = p.jitter
	}
	if set("prefill_knee") {
		c.PrefillKnee = p.knee
	}
	return nil
}

// CacheTokens is the KV cache's size in tokens: KVBlocks blocks of BlockSize tokens (bench's capacity estimate
// reads it rather than assuming 16-token blocks).
func (c *Config) CacheTokens() int { return c.maxContextTokens() }

// DecodeInterval is the time between two tokens of each of n sequences decoding together, without prefill,
// jitter or faults, under the batching law: ITL + ITLPerSeq*(n-1) stepped; under seats ITL times the factor
// with n of MaxNumSeqs seats taken.
func (c *Config) DecodeInterval(n int) time.Duration {
	n = max(n, 1)
	if c.Batching != BatchSeats {
		return c.ITL + time.Duration(float64(c.ITLPerSeq)*float64(n-1))
	}
	return time.Duration(float64(c.ITL)*c.loadTimeFactor(n) + 0.5)
}

// loadTimeFactor is BatchSeats' time factor with n sequences in flight: 1 with one, LoadFactor with MaxNumSeqs.
func (c *Config) loadTimeFactor(n int) float64 {
	f := 1.0
	if lf := c.loadFactor(); lf > 1 && c.MaxNumSeqs > 1 {
		f += (lf - 1) * float64(min(max(n, 1), c.MaxNumSeqs)-1) / float64(c.MaxNumSeqs-1)
	}
	return f
}
