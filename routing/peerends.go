package routing

import (
	"encoding/binary"
	"errors"
	"strconv"
	"strings"
	"time"
)

// The other replicas' requests that ended since their last load report.
//
// docs/design.md, "Load between replicas": a load report is up to an interval old when it is read, and so is an
// engine scrape. A conversation alternating between two replicas sends its next turn through one the moment the
// other's answer ended, and that answer was still counted in both, so an owner with a seat free again looked full
// and the turn moved (multi-turn on 64 engines of 4 seats: through two replicas 56 of adaptive's 71 moves left an
// owner with three requests in it). So a replica announces each ended request that one of its reports counted, on
// the hint stream, within a round trip; the others take it off that report's figure until a report written after
// the end replaces it, and off the engine's scrape when the scrape counted it.
//
// Both corrections err towards counting a request still in flight: an end is announced only for a request every
// report from a sequence number on counted (dispatched before that report began), and taken off a report only
// while the report installed is one of those written before the end; it is taken off a scrape only when the
// request was dispatched a scrape's round trip before the scrape was sent.

// pendingEnd is an ended request this replica announces: to backend name, counted in its load reports first
// through last, ended dur after it was dispatched.
type pendingEnd struct {
	name        string
	first, last uint64
	dur         time.Duration
}

// endNotice is another replica's ended request, kept until a report of that replica written after the end is
// installed (or it is older than a report may be).
type endNotice struct {
	b           *Backend
	first, last uint64
	at          time.Time // when it came
}

// dispatchSeq returns the sequence number of the first load report that surely counts a request dispatched now:
// the next one begun (one begun already may have read the counts before the dispatch).
func (p *Peers) dispatchSeq() uint64 { return p.repBegun.Load() + 1 }

// ended queues the announcement that a request to b, dispatched when dispatchSeq was seq, ended dur after its
// dispatch. It runs on the request path: a request no report counted yet is not announced (nothing to take back);
// otherwise one append under the hint mutex and a wake-up of the publisher, never a wait on Redis.
func (p *Peers) ended(b *Backend, seq uint64, dur time.Duration) {
	last := p.repRead.Load()
	if seq > last {
		return
	}
	p.mu.Lock()
	if len(p.ends) < maxPendingHint {
		p.ends = append(p.ends, pendingEnd{name: b.Name(), first: seq, last: last, dur: dur})
	}
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// encodeEnds appends the ends: per end, the backend name's length (1 byte) and bytes, then first, last and the
// duration in whole milliseconds rounded up, as uvarints.
func encodeEnds(dst []byte, es []pendingEnd) []byte {
	for _, e := range es {
		dst = append(dst, byte(len(e.name)))
		dst = append(dst, e.name...)
		dst = binary.AppendUvarint(dst, e.first)
		dst = binary.AppendUvarint(dst, e.last)
		dst = binary.AppendUvarint(dst, uint64((e.dur+time.Millisecond-1)/time.Millisecond))
	}
	return dst
}

var errBadEnds = errors.New("routing: malformed end notices")

// decodeEnds calls fn for each end in b; it stops at the first malformed one.
func decodeEnds(b []byte, fn func(name string, first, last uint64, dur time.Duration)) error {
	for len(b) > 0 {
		nl := int(b[0])
		if len(b) < 1+nl {
			return errBadEnds
		}
		name := string(b[1 : 1+nl])
		b = b[1+nl:]
		var v [3]uint64
		for i := range v {
			x, n := binary.Uvarint(b)
			if n <= 0 {
				return errBadEnds
			}
			v[i], b = x, b[n:]
		}
		fn(name, v[0], v[1], time.Duration(min(v[2], uint64(time.Hour/time.Millisecond)))*time.Millisecond)
	}
	return nil
}

// reportHeader returns the first entry of a load report: "#<sequence number>@<replica id>". It has no '=', so
// replicas that predate it skip it as a malformed entry.
func reportHeader(seq uint64, id string) string { return "#" + strconv.FormatUint(seq, 10) + "@" + id }

// parseReportHeader splits a report into its header's sequence number and replica id and the rest; ok is false
// for a report without one (from a replica that predates it).
func parseReportHeader(r string) (seq uint64, id, rest string, ok bool) {
	if !strings.HasPrefix(r, "#") {
		return 0, "", r, false
	}
	hdr, rest, _ := strings.Cut(r[1:], ";")
	n, id, found := strings.Cut(hdr, "@")
	seq, err := strconv.ParseUint(n, 10, 64)
	if !found || err != nil {
		return 0, "", rest, false
	}
	return seq, id, rest, true
}

// fresh reports whether a stream entry added at addedMs (Redis time, in ms) is younger than a report may be, by
// the clock offset the load script measured; false while that is not known.
func (p *Peers) fresh(addedMs int64) bool {
	if !p.offsetKnown.Load() {
		return false
	}
	return p.o.Clock.Now().Sub(time.UnixMilli(addedMs-p.offsetMs.Load())) < p.stale
}

// install stores each backend's peer load from the reports just read (sums; seqs: each replica's report sequence
// number), less the requests counted there that ended since (the notices kept), and drops the notices a report
// written after their end now reflects.
func (p *Peers) install(backends []*Backend, sums map[string]*PeerLoad, seqs map[string]uint64, read time.Time) {
	p.endMu.Lock()
	defer p.endMu.Unlock()
	p.installed = seqs
	gone := make(map[*Backend]int64)
	for id, ns := range p.notices {
		s, ok := seqs[id]
		keep := ns[:0]
		for _, n := range ns {
			if !ok || s > n.last || read.Sub(n.at) > p.stale {
				continue
			}
			keep = append(keep, n)
			if s >= n.first {
				gone[n.b]++
			}
		}
		if len(keep) == 0 {
			delete(p.notices, id)
		} else {
			p.notices[id] = keep
		}
	}
	until := read.Add(p.stale)
	for _, be := range backends {
		pl := PeerLoad{At: read, Until: until, gone: gone[be]}
		if s := sums[be.Name()]; s != nil {
			pl.Inflight, pl.PrefillTokens, pl.Decoding = s.Inflight, s.PrefillTokens, s.Decoding
		}
		be.peer.Store(&pl)
	}
}

// applyEnds takes the ended requests replica from announced (payload, encodeEnds) at now off its installed report
// and off the backends' scrapes.
func (p *Peers) applyEnds(from string, payload []byte, now time.Time) {
	backends := p.reg.Backends()
	p.endMu.Lock()
	defer p.endMu.Unlock()
	s := p.installed[from]
	_ = decodeEnds(payload, func(name string, first, last uint64, dur time.Duration) {
		var b *Backend
		for _, be := range backends {
			if be.Name() == name {
				b = be
				break
			}
		}
		if b == nil {
			return
		}
		b.peerEnd(now, dur)
		if s > last || len(p.notices[from]) >= maxPendingHint {
			return // the report installed was written after the end
		}
		p.notices[from] = append(p.notices[from], endNotice{b: b, first: first, last: last, at: now})
		if s >= first {
			if pl := b.peer.Load(); pl != nil {
				c := *pl
				c.gone++
				b.peer.Store(&c)
			}
		}
	})
}

// peerEnd counts another replica's request to b that ended at now, dur after its dispatch, against b's last
// scrape when the scrape counted it: dispatched a scrape's round trip before the scrape was sent (so it had
// reached the engine), ended after the scrape's answer (the notice comes after both).
func (b *Backend) peerEnd(now time.Time, dur time.Duration) {
	e := b.engine.Load()
	if e == nil || e.Stale || e.sent.IsZero() {
		return
	}
	if now.Add(-dur).Before(e.sent.Add(-e.At.Sub(e.sent))) && now.After(e.At) {
		b.peerEnded.Add(1)
	}
}
