package main

import (
	"fmt"
	"io"
)

// runCheck implements "switchyard check".
func runCheck(args []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "switchyard check: not yet")
	return 2
}
