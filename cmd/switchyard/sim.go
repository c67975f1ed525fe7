package main

import (
	"fmt"
	"io"
)

// runSim implements "switchyard sim".
func runSim(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "switchyard sim: not yet")
	return 2
}
