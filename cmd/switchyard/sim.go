package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/switchyard/switchyard/sim"
)

// runSim implements "switchyard sim": one simulated vLLM backend from flags, or many from a fleet file, until
// SIGINT or SIGTERM.
func runSim(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return runSimContext(ctx, args, stdout, stderr)
}

// runSimContext is runSim until ctx is done. Exit codes: 0 after a clean stop, 2 for bad flags, 1 for a bad fleet
// file or a backend that cannot start.
func runSimContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("switchyard sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfg := sim.DefaultConfig()
	cfg.Listen = sim.DefaultListen
	cfg.RegisterFlags(fs)
	fleetPath := fs.String("fleet", "", "run many backends from this YAML `file`: a list of entries keyed like the "+
		"flags in snake case (name, listen, region, prefill_tps, itl, ...); excludes the other flags")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: switchyard sim [flags] | switchyard sim -fleet FILE")
		fmt.Fprintln(stderr, `A simulated vLLM engine behind the OpenAI API (see docs/design.md, "The simulator and the benchmark").`)
		fmt.Fprintln(stderr, "A request without max_tokens generates -default-max-tokens tokens.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2 // the flag package has printed the error, naming the flag
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "switchyard sim: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	cfgs := []sim.Config{cfg}
	if *fleetPath != "" {
		var others []string
		fs.Visit(func(f *flag.Flag) {
			if f.Name != "fleet" {
				others = append(others, "-"+f.Name)
			}
		})
		if len(others) > 0 {
			fmt.Fprintf(stderr, "switchyard sim: -fleet cannot be combined with %s (set them per entry in the file)\n",
				strings.Join(others, ", "))
			return 2
		}
		var err error
		if cfgs, err = sim.LoadFleet(*fleetPath); err != nil {
			fmt.Fprintln(stderr, err) // "sim: fleet: FILE:LINE: ..."
			return 1
		}
	}
	fleet, err := sim.StartFleet(ctx, cfgs)
	if err != nil {
		fmt.Fprintln(stderr, err) // "sim: NAME: listen: ..."
		return 1
	}
	for _, b := range fleet.Backends() {
		c := b.Config()
		region := ""
		if c.Region != "" {
			region = " region=" + c.Region
		}
		fmt.Fprintf(stdout, "sim: %s listening on %s model=%s%s\n", c.Name, b.URL(), c.Model, region)
	}
	<-ctx.Done()
	if err := fleet.Close(); err != nil {
		fmt.Fprintf(stderr, "switchyard sim: %v\n", err)
		return 1
	}
	return 0
}
