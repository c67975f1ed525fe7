package main

import (
	"fmt"
	"io"
)

// runServe implements "switchyard serve".
func runServe(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "switchyard serve: not yet")
	return 2
}
