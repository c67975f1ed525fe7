// Package switchyard is the root of the Switchyard module: an LLM inference gateway that fronts GPU inference
// backends with an OpenAI-compatible API and routes by measured TTFT, ITL, queue depth and prefix residency.
//
// The code lives in the subpackages (see docs/design.md, "Packages and imports", for the layout and the one-way
// import rules, which layout_test.go enforces); this package holds only repository-level tests.
package switchyard
