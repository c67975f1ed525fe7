//go:build linux

package proxy

import (
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// parker is the process's one epoll instance for parked streams (hijack.go): a stream waiting for its engine's
// next event registers the engine connection's socket here, for one readiness report (EPOLLONESHOT), and gives
// up its goroutine. The instance's own descriptor is watched by Go's netpoller (os.NewFile on a non-blocking
// descriptor), so no thread blocks in epoll_wait: one goroutine (run) drains the reports whenever the netpoller
// says some are ready, and wakes each stream's watchdog, which starts a goroutine that relays what arrived.
//
// A socket is added to the set at its first park and stays in it, disarmed between parks, until the stream
// that parked it lets the connection go (unpark): the next park re-arms it with one epoll_ctl. The registry maps
// a descriptor to the watchdog of the stream parked on it; a report for a descriptor with no entry (the stream
// was woken by its deadline or an abort first) is dropped.
//
// A hijacked stream's client socket is in the set too, from the hijack to the stream's end (watch), for one
// report of its close, reset or half-close (EPOLLRDHUP; not of readable bytes, which a pipelined request
// brings): its watchdog aborts the stream then (clientClosed), so that no tick has to peek at the client.
type parker struct {
	epfd int
	rc   syscall.RawConn

	mu      sync.Mutex
	waiting map[int32]parkEntry

	events [128]syscall.EpollEvent // run's alone
}

// parkEntry is whom a descriptor's report is for: the stream parked on its engine socket, or the stream whose
// client socket it is.
type parkEntry struct {
	wd     *watchdog
	client bool
}

var (
	parkOnce  sync.Once
	theParker *parker // nil when epoll could not be set up: streams then wait in a goroutine as before
)

// getParker returns the process's parker, made at first use.
func getParker() *parker {
	parkOnce.Do(func() {
		p, err := newParker()
		if err == nil {
			theParker = p
			go p.run()
		}
	})
	return theParker
}

func newParker() (*parker, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		_ = syscall.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), "switchyard-parker")
	rc, err := f.SyscallConn()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return &parker{epfd: fd, rc: rc, waiting: make(map[int32]parkEntry)}, nil
}

// run delivers readiness reports for as long as the process lives.
func (p *parker) run() {
	for {
		if err := p.rc.Read(p.drain); err != nil {
			return // cannot happen: the descriptor is never closed
		}
	}
}

// drain is run's syscall.RawConn.Read callback: it takes every report epoll holds without waiting, wakes the
// streams they are for, and reports false (wait for the netpoller) once epoll holds none.
func (p *parker) drain(fd uintptr) bool {
	for {
		// Raw system calls, as the relay's reads and writes are (rawio.go): neither waits.
		r, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, fd, uintptr(unsafe.Pointer(&p.events[0])),
			uintptr(len(p.events)), 0, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		n := int(r)
		if e != 0 || n <= 0 {
			return false
		}
		for i := range n {
			sock := p.events[i].Fd
			p.mu.Lock()
			e := p.waiting[sock]
			delete(p.waiting, sock)
			p.mu.Unlock()
			switch {
			case e.wd == nil:
			case e.client:
				e.wd.clientClosed()
			default:
				e.wd.wake()
			}
		}
		if n < len(p.events) {
			return false
		}
	}
}

// arm asks for one report when the socket fd has something to read (or was closed or reset), for wd: added to
// the set the first time (added false), re-armed after. It returns false when epoll refused, and the caller
// waits in its goroutine instead.
func (p *parker) arm(fd int, added bool, wd *watchdog) bool {
	op := syscall.EPOLL_CTL_MOD
	if !added {
		op = syscall.EPOLL_CTL_ADD
	}
	return p.add(fd, op, syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLONESHOT, parkEntry{wd: wd})
}

// watch adds a hijacked stream's client socket fd to the set, for one report of its close, reset or half-close,
// for wd. It returns false when epoll refused. The stream's end takes it out again (remove).
func (p *parker) watch(fd int, wd *watchdog) bool {
	return p.add(fd, syscall.EPOLL_CTL_ADD, syscall.EPOLLRDHUP|syscall.EPOLLONESHOT, parkEntry{wd: wd, client: true})
}

// add records e for fd, then asks epoll (op) for events on it; on a refusal it forgets e.
func (p *parker) add(fd, op int, events uint32, e parkEntry) bool {
	key := int32(fd)
	p.mu.Lock()
	p.waiting[key] = e
	p.mu.Unlock()
	ev := syscall.EpollEvent{Events: events, Fd: key}
	if epollCtl(p.epfd, op, fd, &ev) != 0 {
		p.forget(key, e.wd)
		return false
	}
	return true
}

// epollCtl is epoll_ctl(2) as a raw system call (it never blocks).
func epollCtl(epfd, op, fd int, ev *syscall.EpollEvent) syscall.Errno {
	_, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_CTL, uintptr(epfd), uintptr(op), uintptr(fd),
		uintptr(unsafe.Pointer(ev)), 0, 0)
	return e
}

// remove takes the socket fd out of the set and forgets any stream parked on it, before its connection goes
// back to its pool or is closed (so that a report never reaches a stream that does not own the socket, and a
// descriptor number the kernel hands out again starts outside the set).
func (p *parker) remove(fd int) {
	var ev syscall.EpollEvent // ignored by EPOLL_CTL_DEL, but kernels before 2.6.9 wanted one
	_ = epollCtl(p.epfd, syscall.EPOLL_CTL_DEL, fd, &ev)
	p.mu.Lock()
	delete(p.waiting, int32(fd))
	p.mu.Unlock()
}

// forget drops fd's entry if it is wd's.
func (p *parker) forget(key int32, wd *watchdog) {
	p.mu.Lock()
	if p.waiting[key].wd == wd {
		delete(p.waiting, key)
	}
	p.mu.Unlock()
}
