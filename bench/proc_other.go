//go:build !linux

package bench

import "syscall"

// sysProcAttr is empty where the kernel cannot tie a child's life to its parent's; Stop and ctx still end it.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
