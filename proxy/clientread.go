package proxy

import (
	"errors"
	"io"
	"sync"
)

// A client connection holds no read buffer while it waits: neither between keep-alive requests nor while its
// stream is relayed, which is most of a stream's life (issue 16's memory per open stream). fasthttp's
// ReduceMemoryUsage (server.go) gives its 16 KiB bufio.Reader back to the pool once a request is read, and
// waits for the next request with a 1-byte read of the connection before it takes one again. Served as a plain
// socket read, that 1-byte read costs a system call per keep-alive request: the byte, then the rest of the
// request, where a buffered reader reads both at once.
//
// So the connection serves a 1-byte read itself: it waits for the socket to be readable without any buffer
// (syscall.RawConn.Read, under the connection's deadlines), then reads what arrived into a pooled buffer of
// fasthttp's read buffer size, hands over the first byte and keeps the rest for fasthttp's next read, which
// takes it without a system call; the buffer goes back to the pool once it is empty. The system calls per
// request are the same as without ReduceMemoryUsage, and the 16 KiB are held for the microseconds between the
// two reads instead of for the life of the connection.

// clientReadBuffer is fasthttp's read buffer size for client connections (server.go), which is also the bound
// on a request's headers, and the size of the buffer a 1-byte read fills.
const clientReadBuffer = 16 << 10

// clientWriteBuffer is fasthttp's write buffer for client connections (server.go). A streamed answer that is not
// hijacked (hijack.go) holds it for as long as it is open (fasthttp writes each event through it), so it is part
// of the memory per open stream
// (docs/profiling.md), while it only ever needs the response headers and one event, or one burst of them, to
// go out in one write: 2 KiB takes the headers and any event an engine sends (150 to 400 bytes) with room to
// spare. A larger write goes out as it is (bufio writes what does not fit straight through), so nothing is cut
// or delayed; what costs one more system call is an answer (a burst, a non-streamed body) that with its
// headers passes 2 KiB, against fasthttp's default of 4 KiB.
const clientWriteBuffer = 2 << 10

// errNoWait is a read of a connection told not to wait (lingerConn.noWait) that found nothing held.
var errNoWait = errors.New("proxy: nothing read ahead")

var clientReadBufs = sync.Pool{New: func() any { return new([clientReadBuffer]byte) }}

// clientRead is a client connection's read-ahead state. It is used only by the connection's reader (fasthttp's
// server goroutine for it), never concurrently.
type clientRead struct {
	fill func(fd uintptr) bool // c.fillAhead, bound once per connection so that a read allocates nothing
	buf  *[clientReadBuffer]byte
	r, w int // buf[r:w] was read from the socket and not yet returned
}

// initRead prepares c's socket for raw reads and writes (rawio.go); a connection whose socket cannot be reached
// raw reads and writes as a plain socket, without read-ahead.
func (c *lingerConn) initRead() {
	c.sock.init(c.TCPConn)
	c.rd.fill = c.fillAhead
}

// Read returns what the read-ahead holds, else reads the socket: a 1-byte read through the read-ahead, any other
// straight into p.
func (c *lingerConn) Read(p []byte) (int, error) {
	rd := &c.rd
	if rd.buf != nil {
		n := copy(p, rd.buf[rd.r:rd.w])
		rd.r += n
		if rd.r == rd.w {
			clientReadBufs.Put(rd.buf)
			rd.buf = nil
		}
		return n, nil
	}
	if c.noWait {
		return 0, errNoWait
	}
	if !c.sock.ready() {
		return c.TCPConn.Read(p)
	}
	if len(p) != 1 {
		return c.sock.Read(p)
	}
	// The 1-byte read: wait for readability with no buffer held, then read what arrived into a pooled one.
	if err := c.sock.rc.Read(rd.fill); err != nil {
		if rd.buf != nil { // cannot happen: fillAhead keeps a buffer only when it reports done
			clientReadBufs.Put(rd.buf)
			rd.buf = nil
		}
		return 0, err // the deadline passed or the connection was closed
	}
	switch op := &c.sock.rd; { // the last fill's result
	case op.errno != 0:
		return 0, c.sock.opError("read", op.errno)
	case op.n == 0:
		return 0, io.EOF
	}
	p[0] = rd.buf[0]
	if n := c.sock.rd.n; n == 1 {
		clientReadBufs.Put(rd.buf)
		rd.buf = nil
	} else {
		rd.r, rd.w = 1, n
	}
	return 1, nil
}

// fillAhead is the syscall.RawConn.Read callback: it reads what the socket holds into a pooled buffer (one raw
// read, rawio.go), and reports false (wait for readability) with the buffer given back when there is nothing yet.
func (c *lingerConn) fillAhead(fd uintptr) bool {
	rd, op := &c.rd, &c.sock.rd
	buf := clientReadBufs.Get().(*[clientReadBuffer]byte)
	op.p, op.n, op.errno = buf[:], 0, 0
	done := op.read(fd)
	op.p = nil
	if !done || op.errno != 0 || op.n == 0 { // nothing yet, an error, or the end of the stream
		clientReadBufs.Put(buf)
		return done
	}
	rd.buf = buf
	return true
}

// Write writes p to the socket with raw system calls (rawio.go).
func (c *lingerConn) Write(p []byte) (int, error) {
	if !c.sock.ready() {
		return c.TCPConn.Write(p)
	}
	return c.sock.Write(p)
}
