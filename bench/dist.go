package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// Dist is a distribution of positive integers (token counts, turns per session), written in YAML as one of:
//
//	{dist: fixed, value: 200}
//	{dist: uniform, min: 50, max: 500}                      # integers in [min, max], both inclusive
//	{dist: normal, mean: 300, stddev: 50, min: 1, max: 1000}
//	{dist: lognormal, mean: 300, stddev: 200, min: 16, max: 4000}
//
// For normal and lognormal, mean and stddev are those of the resulting values (not of the underlying normal), min
// defaults to 1 and max of 0 means unbounded; a draw outside [min, max] is redrawn up to 16 times and then clamped,
// so the shape inside the bounds is kept. A zero Dist is invalid wherever a length is required.
type Dist struct {
	Kind   string  `yaml:"dist" json:"dist"`
	Value  float64 `yaml:"value" json:"value,omitempty"`
	Min    float64 `yaml:"min" json:"min,omitempty"`
	Max    float64 `yaml:"max" json:"max,omitempty"`
	Mean   float64 `yaml:"mean" json:"mean,omitempty"`
	Stddev float64 `yaml:"stddev" json:"stddev,omitempty"`
}

// Fixed returns the distribution that always yields n.
func Fixed(n int) Dist { return Dist{Kind: "fixed", Value: float64(n)} }

// validate reports what is wrong with d; path names d in the file (e.g. "prompt").
func (d Dist) validate(path string, errs *fieldErrors) {
	switch d.Kind {
	case "":
		errs.add(path, "missing dist (fixed, uniform, normal or lognormal)")
	case "fixed":
		if d.Value < 1 {
			errs.add(path+".value", "fixed value must be >= 1, got %v", d.Value)
		}
	case "uniform":
		if d.Min < 1 || d.Max < d.Min {
			errs.add(path, "uniform needs 1 <= min <= max, got min %v max %v", d.Min, d.Max)
		}
	case "normal", "lognormal":
		if d.Mean <= 0 {
			errs.add(path+".mean", "%s mean must be > 0, got %v", d.Kind, d.Mean)
		}
		if d.Stddev < 0 {
			errs.add(path+".stddev", "%s stddev must be >= 0, got %v", d.Kind, d.Stddev)
		}
		if d.Min < 0 || (d.Max != 0 && d.Max < math.Max(d.Min, 1)) {
			errs.add(path, "%s bounds need 0 <= min <= max (max 0 = unbounded), got min %v max %v", d.Kind, d.Min, d.Max)
		}
	default:
		errs.add(path+".dist", "unknown dist %q (fixed, uniform, normal or lognormal)", d.Kind)
	}
}

// Sample draws one value (>= 1) from d using r. d must be valid.
func (d Dist) Sample(r *rand.Rand) int {
	switch d.Kind {
	case "fixed":
		return int(math.Round(d.Value))
	case "uniform":
		lo, hi := int(math.Ceil(d.Min)), int(math.Floor(d.Max))
		if hi <= lo {
			return lo
		}
		return lo + r.IntN(hi-lo+1)
	}
	lo, hi := math.Max(d.Min, 1), d.Max
	if hi == 0 {
		hi = math.Inf(1)
	}
	var mu, sigma float64
	if d.Kind == "lognormal" {
		// Moments of the lognormal: mean = exp(mu + sigma^2/2), var = (exp(sigma^2)-1) mean^2.
		cv := d.Stddev / d.Mean
		sigma = math.Sqrt(math.Log1p(cv * cv))
		mu = math.Log(d.Mean) - sigma*sigma/2
	}
	var x float64
	for range 16 {
		x = r.NormFloat64()
		if d.Kind == "lognormal" {
			x = math.Exp(mu + sigma*x)
		} else {
			x = d.Mean + d.Stddev*x
		}
		if x >= lo && x <= hi {
			break
		}
	}
	return int(math.Round(math.Min(math.Max(x, lo), hi)))
}

// String is a short human form, e.g. "lognormal(mean 300, sd 200, [16, 4000])".
func (d Dist) String() string {
	switch d.Kind {
	case "fixed":
		return fmt.Sprintf("%g", d.Value)
	case "uniform":
		return fmt.Sprintf("uniform[%g, %g]", d.Min, d.Max)
	}
	return fmt.Sprintf("%s(mean %g, sd %g, [%g, %g])", d.Kind, d.Mean, d.Stddev, math.Max(d.Min, 1), d.Max)
}
