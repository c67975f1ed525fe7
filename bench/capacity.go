package bench

import (
	"fmt"
	"math"
	"os"

	"github.com/switchyard/switchyard/sim"
)

// Capacity is the rate a fleet saturates at under a workload, computed from the fleet file's parameters and the
// workload's plan (never measured, never typed by hand), so that a matrix can state its loads and spikes as
// multiples of it on any fleet size and any seat count.
type Capacity struct {
	// PromptTokens and OutputTokens are the mean prompt (shared prefix, session history and long documents
	// included) and max_tokens over the workload's plan.
	PromptTokens float64 `json:"prompt_tokens"`
	OutputTokens float64 `json:"output_tokens"`
	// PerBackend is each backend's saturation rate in requests/s, in fleet order; RequestsPS is their sum and
	// OutputTPS the output tokens/s at that rate.
	PerBackend []float64 `json:"per_backend_rps"`
	RequestsPS float64   `json:"requests_per_s"`
	OutputTPS  float64   `json:"output_tokens_per_s"`
	// SeatShare is the least share of the saturated fleet's decoded tokens/s that one sequence fewer takes
	// away, over its backends (each at S and S-1 sequences: the decode interval grows with the batch, so a
	// sequence fewer costs a backend a little less than 1/S of its tokens): what a fleet with a seat free
	// delivers at most, 1 - SeatShare of its saturated output (ProtectFeasibility).
	SeatShare float64 `json:"seat_share"`
}

// FleetCapacity computes Capacity for the fleet file at path under w.
//
// The model is the simulator's (sim/engine.go, engine.startStep; sim/seats.go). A saturated backend holds S
// sequences, S = min(MaxNumSeqs, CacheTokens / (P+O)) (the seats, or the KV cache when it fills first), and d is
// the interval between two tokens of each of S decoding sequences (sim.Config.DecodeInterval: ITL +
// ITLPerSeq*(S-1) stepped, ITL times the load factor under seats). A request costs p = Pe/PrefillTPS of prefill,
// Pe the prompt's tokens weighted by the prefill knee (sim.Config.PrefillKnee: Pe = P + P^2/(2*knee), 0 = linear).
//
// Stepped batching (every chunked-prefill mode: prefill chunks add their time to the step, or take steps of
// their own; either way the engine spends it alone): at rate L the engine spends L*p of each second on prefill
// and the rest decoding, which must make L*O tokens, so
//
//	L*O = S * (1 - L*p) / d   =>   L = S / (O*d + S*p).
//
// Seats: each seat runs its own sequence, its prefill then its tokens, beside the others, so a seat serves one
// request per p + O*d (p also slowed by the load factor at S seats) and L = S / (p*f + O*d).
//
// P counts the whole prompt as uncached: this is the capacity without prefix reuse, the floor that a router
// which keeps prefixes cached raises (so a shared-prefix workload at 0.6 of it is a heavy load for round
// robin and a lighter one for a cache-following router). The API overhead and RTT delay the first token but use
// no engine time, so they do not enter; neither does jitter, whose mean is 1.
func FleetCapacity(path string, w *Workload) (Capacity, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Capacity{}, fmt.Errorf("bench: capacity: %w", err)
	}
	cfgs, err := sim.ParseFleet(path, data)
	if err != nil {
		return Capacity{}, fmt.Errorf("bench: capacity: %w", err)
	}
	plan, err := NewPlan(w)
	if err != nil {
		return Capacity{}, fmt.Errorf("bench: capacity: %w", err)
	}
	var c Capacity
	for _, it := range plan.Items {
		c.PromptTokens += float64(it.PromptTokens)
		c.OutputTokens += float64(it.MaxTokens)
	}
	if n := float64(len(plan.Items)); n > 0 {
		c.PromptTokens /= n
		c.OutputTokens /= n
	}
	if c.OutputTokens <= 0 {
		return Capacity{}, fmt.Errorf("bench: capacity: workload %s plans no requests", w.Name)
	}
	full, least := 0.0, math.Inf(1)
	for _, cfg := range cfgs {
		l := backendRate(cfg, c.PromptTokens, c.OutputTokens)
		c.PerBackend = append(c.PerBackend, l)
		c.RequestsPS += l
		s := backendSeats(cfg, c.PromptTokens, c.OutputTokens)
		tps := s / cfg.DecodeInterval(int(s)).Seconds()
		full += tps
		fewer := 0.0
		if s > 1 {
			fewer = (s - 1) / cfg.DecodeInterval(int(s)-1).Seconds()
		}
		least = min(least, tps-fewer)
	}
	c.OutputTPS = c.RequestsPS * c.OutputTokens
	if full > 0 {
		c.SeatShare = least / full
	}
	return c, nil
}

// backendSeats is the sequences S a saturated backend holds: its seats, or fewer when its KV cache fills first.
func backendSeats(cfg sim.Config, p, o float64) float64 {
	s := float64(cfg.MaxNumSeqs)
	if kv := math.Floor(float64(cfg.CacheTokens()) / (p + o)); kv < s {
		s = max(kv, 1)
	}
	return s
}

// backendRate is FleetCapacity's L for one backend.
func backendRate(cfg sim.Config, p, o float64) float64 {
	s := backendSeats(cfg, p, o)
	pe := p
	if k := float64(cfg.PrefillKnee); k > 0 {
		pe += p * p / (2 * k)
	}
	prefill := pe / cfg.PrefillTPS
	d := cfg.DecodeInterval(int(s)).Seconds()
	if cfg.Batching == sim.BatchSeats {
		f := d / cfg.ITL.Seconds() // the load factor at S seats: prefill slows as decoding does
		return s / (prefill*f + o*d)
	}
	return s / (o*d + s*prefill)
}
