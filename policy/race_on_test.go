//go:build race

package policy

// raceEnabled: the race detector makes parsing about ten times slower; TestTruncatedConfig samples prefixes then.
const raceEnabled = true
