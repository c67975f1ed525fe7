package main

import (
	"fmt"
	"io"
)

// runDemo implements "switchyard demo".
func runDemo(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "switchyard demo: not yet")
	return 2
}
