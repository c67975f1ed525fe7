//go:build unix

package browsertest

import (
	"os/exec"
	"syscall"
)

// sysProcAttr starts chromium in a process group of its own, so that killGroup reaches its helpers.
func sysProcAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

// killGroup kills chromium's process group (chromium itself and every helper it started).
func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
}
