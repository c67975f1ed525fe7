//go:build !race

package sim

// raceEnabled is true under the race detector, which slows everything several times: wall-clock timing
// assertions are skipped then (correctness assertions still run).
const raceEnabled = false
