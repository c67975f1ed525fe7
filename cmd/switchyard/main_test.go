package main

import (
	"os"
	"testing"
)

// TestMain removes the binary the tests built (buildBinary) once they have all run.
func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		_ = os.RemoveAll(built.dir)
	}
	os.Exit(code)
}
