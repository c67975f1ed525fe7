package bench

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"unsafe"
)

// sysProcAttr makes the kernel kill a child when the harness dies, even by SIGKILL, so that no simulator or
// gateway outlives the run that started it.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// PinProcess binds every thread of this process to cpu (threads started later inherit the mask of the thread
// that starts them), so that a benchmark's load generator stays off the core of the process it measures.
func PinProcess(cpu int) error {
	var mask [16]uint64
	if cpu < 0 || cpu >= len(mask)*64 {
		return fmt.Errorf("bench: pin: cpu %d out of range", cpu)
	}
	mask[cpu/64] = 1 << (cpu % 64)
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("bench: pin: %w", err)
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		_, _, errno := syscall.RawSyscall(syscall.SYS_SCHED_SETAFFINITY, uintptr(tid), unsafe.Sizeof(mask), uintptr(unsafe.Pointer(&mask)))
		if errno != 0 && errno != syscall.ESRCH { // ESRCH: the thread has exited since the listing
			return fmt.Errorf("bench: pin: thread %d: %w", tid, errno)
		}
	}
	return nil
}
