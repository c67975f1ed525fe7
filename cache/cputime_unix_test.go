//go:build unix

package cache

import (
	"syscall"
	"testing"
	"time"
)

// processCPU returns the CPU time (user + system) the process has used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU adds a cpu-ns/op metric to b: on a machine shared with other work, wall-clock ns/op measures the
// machine's load as much as the code, while the process's CPU time per op does not.
func reportCPU(b *testing.B, start time.Duration) {
	if n := b.N; n > 0 && start > 0 {
		b.ReportMetric(float64(processCPU()-start)/float64(n), "cpu-ns/op")
	}
}
