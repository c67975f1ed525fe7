//go:build !linux

package bench

import (
	"errors"
	"syscall"
)

// sysProcAttr is empty where the kernel cannot tie a child's life to its parent's; Stop and ctx still end it.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

// PinProcess is not supported here: benchmarks that need it say so.
func PinProcess(cpu int) error { return errors.New("bench: pin: CPU affinity needs Linux") }
