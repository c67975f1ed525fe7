package main

import (
	"fmt"
	"io"
)

// runBench implements "switchyard bench".
func runBench(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "switchyard bench: not yet")
	return 2
}
