//go:build !linux

package redistest

import "syscall"

// sysProcAttr is nil off Linux: Cleanup stops the server, and a killed test binary leaves it running.
func sysProcAttr() *syscall.SysProcAttr { return nil }
