package proxy

import (
	"errors"
)

// chunkDecoder removes HTTP/1.1 chunked transfer coding (RFC 9112, section 7.1) from a body in place, a read at
// a time, so that the bytes read from an upstream socket need no buffer of their own between the socket and the
// SSE reader (docs/design.md, "Upstream connections"). It accepts what real servers send and what the RFC
// allows a recipient to tolerate: chunk extensions (skipped), a bare LF for CRLF, upper- and lower-case hex,
// trailer fields (skipped). It refuses what would desynchronise the stream: a size with no digit or too many
// digits, anything but CRLF (or LF) after a chunk's data, a control byte in a size line.
type chunkDecoder struct {
	state  chunkState
	size   uint64 // the chunk size being read; then the bytes of the chunk's data not yet seen
	digits int    // hex digits of the size so far
	line   int    // bytes of the current size, extension or trailer line, bounded by maxChunkLine
}

type chunkState uint8

const (
	chunkSize      chunkState = iota // the hex digits of a chunk size
	chunkExt                         // after the digits: whitespace or an extension, up to the line end
	chunkSizeLF                      // the LF after the size line's CR
	chunkData                        // the chunk's data
	chunkDataCR                      // the CR (or bare LF) after the data
	chunkDataLF                      // the LF after it
	chunkTrailer                     // the start of a trailer line, or the blank line that ends the body
	chunkTrailerLn                   // inside a trailer line
	chunkEndLF                       // the LF of the final blank line
	chunkDone                        // the body is over
)

// maxChunkLine bounds a size line (with its extensions) and a trailer line. Nothing of either is kept, so the
// bound is not about memory: a line this long is not HTTP from an engine, and ending the stream early tells the
// operator sooner than the idle timeout would.
const maxChunkLine = 4 << 10

// maxChunkDigits bounds the hex digits of a size to what a uint64 holds, as net/http does.
const maxChunkDigits = 16

var errChunked = errors.New("proxy: malformed chunked encoding from the backend")

// done reports whether the body ended (the last chunk and its trailer were read).
func (d *chunkDecoder) done() bool { return d.state == chunkDone }

// reset readies d for another body.
func (d *chunkDecoder) reset() { *d = chunkDecoder{} }

// decode removes the framing from b, which holds the next bytes of the coded body, moving the data to the front
// of b. It returns how many bytes of data b now starts with, and how many bytes of b it consumed: fewer than
// len(b) only when the body ended inside b (the rest is not part of the body). After an error d is unusable.
func (d *chunkDecoder) decode(b []byte) (n, used int, err error) {
	i := 0
	for i < len(b) {
		switch d.state {
		case chunkData:
			m := len(b) - i
			if uint64(m) > d.size {
				m = int(d.size)
			}
			n += copy(b[n:], b[i:i+m])
			i += m
			if d.size -= uint64(m); d.size == 0 {
				d.state = chunkDataCR
			}
			continue
		case chunkDone:
			return n, i, nil
		}
		c := b[i]
		i++
		switch d.state {
		case chunkSize:
			if v, ok := hexValue(c); ok {
				if d.digits++; d.digits > maxChunkDigits {
					return n, i, errChunked
				}
				d.size = d.size<<4 | uint64(v)
				continue
			}
			if d.digits == 0 {
				return n, i, errChunked
			}
			d.state = chunkExt
			if err := d.sizeLineByte(c); err != nil {
				return n, i, err
			}
		case chunkExt:
			if err := d.sizeLineByte(c); err != nil {
				return n, i, err
			}
		case chunkSizeLF:
			if c != '\n' {
				return n, i, errChunked
			}
			d.endSizeLine()
		case chunkDataCR:
			switch c {
			case '\r':
				d.state = chunkDataLF
			case '\n':
				d.state, d.digits, d.size, d.line = chunkSize, 0, 0, 0
			default:
				return n, i, errChunked
			}
		case chunkDataLF:
			if c != '\n' {
				return n, i, errChunked
			}
			d.state, d.digits, d.size, d.line = chunkSize, 0, 0, 0
		case chunkTrailer:
			switch c {
			case '\r':
				d.state = chunkEndLF
			case '\n':
				d.state = chunkDone
			default:
				d.state, d.line = chunkTrailerLn, 1
			}
		case chunkTrailerLn:
			if c == '\n' {
				d.state = chunkTrailer
				continue
			}
			if d.line++; d.line > maxChunkLine {
				return n, i, errChunked
			}
		case chunkEndLF:
			if c != '\n' {
				return n, i, errChunked
			}
			d.state = chunkDone
		}
	}
	return n, i, nil
}

// sizeLineByte takes one byte of a size line after its digits.
func (d *chunkDecoder) sizeLineByte(c byte) error {
	switch {
	case c == '\r':
		d.state = chunkSizeLF
	case c == '\n':
		d.endSizeLine()
	case c < ' ' && c != '\t' || c == 0x7f:
		return errChunked
	default:
		if d.line++; d.line > maxChunkLine {
			return errChunked
		}
	}
	return nil
}

// endSizeLine starts the chunk whose size line just ended: its data, or the trailer after the last chunk.
func (d *chunkDecoder) endSizeLine() {
	d.line = 0
	if d.size == 0 {
		d.state = chunkTrailer
		return
	}
	d.state = chunkData
}

func hexValue(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
