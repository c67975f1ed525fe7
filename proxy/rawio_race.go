//go:build race

package proxy

// raceEnabled: this is a race-detector build (rawio.go).
const raceEnabled = true
