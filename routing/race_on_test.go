//go:build race

package routing

// raceEnabled: sync.Pool drops items at random under the race detector, so allocation budgets do not hold.
const raceEnabled = true
