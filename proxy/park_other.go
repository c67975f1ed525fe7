//go:build !linux

package proxy

// parker parks streams on Linux only (park_linux.go); elsewhere every stream waits in its goroutine.
type parker struct{}

func getParker() *parker { return nil }

func (p *parker) arm(fd int, added bool, wd *watchdog) bool { return false }

func (p *parker) watch(fd int, wd *watchdog) bool { return false }

func (p *parker) remove(fd int) {}
