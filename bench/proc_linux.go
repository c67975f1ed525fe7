package bench

import "syscall"

// sysProcAttr makes the kernel kill a child when the harness dies, even by SIGKILL, so that no simulator or
// gateway outlives the run that started it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
