// Package bench is the open-loop benchmark harness: Poisson arrivals scheduled in advance, workloads from YAML, an
// OpenAI client that timestamps every SSE event, reports of TTFT/ITL/end-to-end distributions and goodput as
// tables, JSON and SVG plots, and side-by-side comparisons of strategies or targets. It talks only HTTP to the
// gateway and simulators it measures.
package bench
