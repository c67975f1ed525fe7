// Command switchyard is the single Switchyard binary. It holds wiring only: flags, building the object graph,
// starting and stopping servers, signals. Each subcommand lives in a file of its own name.
package main

import (
	"fmt"
	"io"
	"os"
)

// command is one subcommand: it parses args (without the subcommand name), runs, and returns the exit code.
type command struct {
	name  string
	usage string
	run   func(args []string, stdout, stderr io.Writer) int
}

func commands() []command {
	return []command{
		{"serve", "run the gateway: serve [-config config.yaml]", runServe},
		{"demo", "start a simulated multi-region fleet and a gateway in one process: demo [-listen 127.0.0.1:8080]", runDemo},
		{"sim", "run one simulated vLLM backend, or a fleet: sim [flags] | sim -fleet FILE", runSim},
		{"check", "validate a config file: check FILE", runCheck},
		{"bench", "drive load and report TTFT/ITL/throughput: bench run|compare|overhead [flags]", runBench},
		{"version", "print the build's version, commit, Go version and platform: version", runVersion},
	}
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	if args[0] == "--version" || args[0] == "-version" {
		return runVersion(args[1:], stdout, stderr)
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "switchyard: unknown command %q\n\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: switchyard <command> [flags]")
	fmt.Fprintln(w)
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-7s %s\n", c.name, c.usage)
	}
}
