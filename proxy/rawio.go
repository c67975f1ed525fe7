package proxy

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// The gateway reads and writes its sockets (client connections, linger.go; upstream connections, upstream.go)
// with raw system calls under the netpoller, not through net.Conn's Read and Write
// (docs/design.md, "System calls on the request path"). The difference is the Go
// scheduler's bookkeeping around a system call (entersyscall/exitsyscall), and what it sets off: the first
// system call after the process went idle wakes the runtime's monitor thread (sysmon) from its deep sleep, which
// then polls every 20 µs until the process is idle again, and a P found in a system call at such a poll is handed
// to another thread. A gateway at a moderate load goes idle between most requests, so each request paid about
// one futex wake-up and one or two sleeps of that thread, each a context switch, for system calls that never
// block: on one pinned core that cost more than the gateway's own work per request
// (bench/results/2026-12-02-overhead-cpu.md).
//
// Why it is safe: every socket of a net.Conn is non-blocking, so read(2) and write(2) return at once, with
// EAGAIN when the socket is not ready; then syscall.RawConn waits for readiness on the netpoller, under the
// connection's deadlines, exactly as net.Conn does. A raw system call does not give up its P, which is right for
// a call that does not block. The monitor still runs on its own schedule, woken by timers and by every other
// system call of the process, so preemption of long-running goroutines and the garbage collector are unchanged.
// What differs: errors of the wait (a deadline, a closed connection) are *net.OpError with Op "raw-read" or
// "raw-write" (errors.Is with os.ErrDeadlineExceeded and net.ErrClosed, and Timeout(), hold as before), and the
// race detector does not see the kernel write into a read buffer. It does see the ordering that I/O creates (a
// write to a socket happens before the read of it at the other end, which is how a test's setup happens before
// the handler that serves its request): a race build adds an empty syscall.Write before each write and an empty
// syscall.Read after each read that succeeded, which carry the syscall package's annotations (raceSync).

// rawSocket does one TCP connection's reads and writes as raw system calls. Reads and writes may run
// concurrently with each other (their state is separate), but not with themselves, as for any net.Conn user.
type rawSocket struct {
	rc   syscall.RawConn
	conn *net.TCPConn // for the addresses in errors
	rd   rawOp
	wr   rawOp
	rfn  func(fd uintptr) bool // rd.read bound once, so that a read allocates nothing
	wfn  func(fd uintptr) bool // wr.write bound once
	fd   int                   // the descriptor plus one, once sysfd looked it up; 0 before
}

// sysfd returns the socket's descriptor (-1 if it cannot be had), for the parker (park_linux.go). It is valid
// while the connection is open, which the caller's ownership of it guarantees.
func (s *rawSocket) sysfd() int {
	if s.fd == 0 {
		if err := s.rc.Control(func(fd uintptr) { s.fd = int(fd) + 1 }); err != nil {
			return -1
		}
	}
	return s.fd - 1
}

// ready reports whether init reached the socket raw; if not, the caller uses its connection itself.
func (s *rawSocket) ready() bool { return s.rc != nil }

// rawOp is one direction's operation in progress: the buffer, the bytes done and the system call's error.
type rawOp struct {
	p     []byte
	n     int
	errno syscall.Errno
}

// maxRW bounds one system call's length, as internal/poll does for stream sockets (some kernels fail larger
// ones).
const maxRW = 1 << 30

// init prepares s for c; a socket that cannot be reached raw leaves s unready, and the caller uses c itself.
func (s *rawSocket) init(c *net.TCPConn) {
	rc, err := c.SyscallConn()
	if err != nil {
		return
	}
	s.rc, s.conn = rc, c
	s.rfn, s.wfn = s.rd.read, s.wr.write
}

// Read reads into p as net.Conn.Read does: at least one byte, io.EOF at the end of the stream.
func (s *rawSocket) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if len(p) > maxRW {
		p = p[:maxRW]
	}
	op := &s.rd
	op.p, op.n, op.errno = p, 0, 0
	err := s.rc.Read(s.rfn)
	n, errno := op.n, op.errno
	op.p = nil
	switch {
	case err != nil:
		return 0, err // the deadline passed or the connection was closed
	case errno != 0:
		return 0, s.opError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// Write writes all of p as net.Conn.Write does, waiting for room in the socket's buffer as it must.
func (s *rawSocket) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	op := &s.wr
	op.p, op.n, op.errno = p, 0, 0
	err := s.rc.Write(s.wfn)
	n, errno := op.n, op.errno
	op.p = nil
	switch {
	case err != nil:
		return n, err
	case errno != 0:
		return n, s.opError("write", errno)
	}
	return n, nil
}

func (s *rawSocket) opError(op string, errno syscall.Errno) error {
	return &net.OpError{Op: op, Net: "tcp", Source: s.conn.LocalAddr(), Addr: s.conn.RemoteAddr(),
		Err: os.NewSyscallError(op, errno)}
}

// read is the syscall.RawConn.Read callback: one read(2) into op.p; false (wait for readability) on EAGAIN.
func (op *rawOp) read(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&op.p[0])), uintptr(len(op.p)))
		switch e {
		case 0:
			op.n = int(n)
			raceAcquire(fd)
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			op.errno = e
			return true
		}
	}
}

// write is the syscall.RawConn.Write callback: write(2) until op.p is written; false (wait for room) on EAGAIN.
func (op *rawOp) write(fd uintptr) bool {
	for op.n < len(op.p) {
		chunk := op.p[op.n:]
		if len(chunk) > maxRW {
			chunk = chunk[:maxRW]
		}
		raceRelease(fd)
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&chunk[0])), uintptr(len(chunk)))
		switch e {
		case 0:
			if n == 0 { // a socket never takes nothing without EAGAIN; do not spin on one that does
				op.errno = syscall.EIO
				return true
			}
			op.n += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			op.errno = e
			return true
		}
	}
	return true
}

// raceAcquire, after a read of fd that succeeded, and raceRelease, before a write to it, give the race detector
// the ordering the syscall package's Read and Write annotate: empty reads and writes through it. They compile
// to nothing outside race builds. A read or write of zero bytes returns at once on a socket.
func raceAcquire(fd uintptr) {
	if raceEnabled {
		_, _ = syscall.Read(int(fd), nil)
	}
}

func raceRelease(fd uintptr) {
	if raceEnabled {
		_, _ = syscall.Write(int(fd), nil)
	}
}

// stale reports whether a connection that sat idle in a pool can no longer carry a request: the peer closed it
// (a read would return EOF), reset it, or sent bytes nobody asked for. One recv(2) with MSG_PEEK that does not
// wait and takes nothing from the socket.
func (s *rawSocket) stale() bool {
	var b [1]byte
	var e syscall.Errno
	err := s.rc.Read(func(fd uintptr) bool {
		for {
			_, _, e = syscall.RawSyscall6(syscall.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&b[0])), 1,
				syscall.MSG_PEEK|syscall.MSG_DONTWAIT, 0, 0)
			if e != syscall.EINTR {
				return true
			}
		}
	})
	return err != nil || e != syscall.EAGAIN // only "nothing to read yet" is a live, idle connection
}
