// Package bench is the open-loop benchmark harness: Poisson arrivals scheduled in advance, workloads from YAML, an
// OpenAI client that timestamps every SSE event, reports of TTFT/ITL/end-to-end distributions and goodput as
// tables, JSON and SVG plots, and side-by-side comparisons of strategies or targets. It talks only HTTP to the
// gateway and simulators it measures.
//
// The pieces, in the order a run uses them:
//
//   - LoadWorkload reads a workload (bench/workloads/README.md has the schema) and NewPlan turns it into a Plan:
//     every arrival time and every request body, generated before the load starts from the workload's seed, so
//     the same seed gives a byte-identical request sequence against every target.
//   - Run sends a Plan open-loop: one scheduler goroutine hands each request to a goroutine of its own at its
//     scheduled time, so a slow target cannot slow its own load, and latencies count from the scheduled time (a
//     late send is measured from its schedule, and its lateness is reported), which keeps coordinated omission
//     from hiding the tail. Client is the harness's own OpenAI client over net/http.
//   - Summary turns a Result into a RunReport (nearest-rank percentiles in milliseconds, goodput against an SLO,
//     status, errors, shed counts by priority, backend shares); PrintRun and PrintCompare print tables;
//     WriteArtifacts writes report.json and the SVG plots (TTFTCDFSVG, TimelineSVG).
//   - Compare runs a Scenario (bench/scenarios/README.md): per column a fresh simulator fleet ("switchyard sim
//     -fleet") and gateway ("switchyard serve -config", generated) as child processes, events posted to the
//     simulators' /sim/control on schedule, prefix hit rates scraped from their /metrics. Overhead measures what
//     the gateway (and nginx or HAProxy, when installed) adds to a simulator's latency, and its CPU time. An
//     "oracle" column has no gateway: an Oracle (a Picker of Run) sends each request to the backend whose
//     /sim/predict answers the lowest TTFT, its prediction time kept out of the latencies.
//   - RunMatrix runs a Matrix (bench/scenarios/README.md, "Matrices"): the cross product of fleets, sizes
//     (ReplicateFleet), seats, workloads, loads and events, each cell a generated scenario whose rates are
//     multiples of its FleetCapacity, run with Compare several times and judged by Judge (the routing or the
//     protect checks); PrintMatrix prints the markdown table, matrix.json holds every run's figures.
//
// Concurrency: a Plan is immutable and may be run any number of times, also concurrently; Run owns every
// goroutine it starts and returns only after they have ended. Every child process (Proc) is stopped by its owner,
// when the context is cancelled, and by the kernel if the harness dies.
package bench
