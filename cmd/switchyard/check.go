package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/switchyard/switchyard/policy"
)

// runCheck implements "switchyard check FILE": it validates a policy file the way serve and a reload would, and
// prints a one-screen summary (exit 0) or every problem as "FILE:LINE: path: message", sorted by line (exit 1).
// Usage errors exit 2.
func runCheck(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: switchyard check FILE")
		fmt.Fprintln(stderr, "Validates a policy file. Exit 0 and a summary if it is valid; 1 with one")
		fmt.Fprintln(stderr, "FILE:LINE: path: message line per problem if not; 2 for usage errors.")
		fmt.Fprintln(stderr, "${VAR} references are expanded from the environment, as serve does.")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	file := fs.Arg(0)
	data, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", file, errors.Unwrap(err))
		return 1
	}
	c, err := policy.Parse(file, data)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	if err := c.WriteSummary(stdout); err != nil {
		fmt.Fprintf(stderr, "switchyard check: %v\n", err)
		return 1
	}
	return 0
}
