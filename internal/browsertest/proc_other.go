//go:build !unix

package browsertest

import (
	"os/exec"
	"syscall"
)

// sysProcAttr is nil off Unix: only chromium itself is killed.
func sysProcAttr() *syscall.SysProcAttr { return nil }

func killGroup(cmd *exec.Cmd) error {
	if cmd.Process == nil {
		return nil
	}
	return cmd.Process.Kill()
}
