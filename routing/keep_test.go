package routing

import "testing"

// TestKeepOwnerMarginOnlyAgainstLesserHolders: the owner of a prefix keeps it against a candidate that holds less
// of it while the models cannot tell their costs apart (the margin of their measured errors), but against one
// that holds as much only within a near-tie: there is no prefill to save by staying.
func TestKeepOwnerMarginOnlyAgainstLesserHolders(t *testing.T) {
	f := newFleet(t, local(3)...)
	const key = 0xfeed
	// o is the rendezvous winner among the first two; x is the third backend.
	o, other := 0, 1
	if rendezvous(key, f.targets[1].Backend) > rendezvous(key, f.targets[0].Backend) {
		o, other = 1, 0
	}
	x := 2
	mk := func(i, blocks int, cost float64) cand {
		return cand{i: i, blocks: blocks, conf: blocks, cost: cost, pred: cost, spread: 1.3}
	}
	for _, tc := range []struct {
		name string
		cs   []cand
		kept bool
	}{
		{"alone", []cand{mk(o, 10, 0.150), mk(other, 0, 0.150), mk(x, 0, 0.150)}, true},
		// 0.110*1.3 = 0.143 > 0.150/1.3 = 0.115: within the errors.
		{"a lesser holder 27% cheaper", []cand{mk(o, 10, 0.150), mk(other, 4, 0.110), mk(x, 0, 0.200)}, true},
		// 0.080*1.3 = 0.104 < 0.115: beyond them.
		{"a lesser holder half as dear", []cand{mk(o, 10, 0.150), mk(other, 4, 0.080), mk(x, 0, 0.200)}, false},
		// 0.130*1.1 + 0.010 = 0.153 >= 0.150: a near-tie.
		{"an equal holder 13% cheaper", []cand{mk(o, 10, 0.150), mk(other, 10, 0.130), mk(x, 0, 0.200)}, true},
		// 0.110*1.1 + 0.010 = 0.131 < 0.150.
		{"an equal holder 27% cheaper", []cand{mk(o, 10, 0.150), mk(other, 10, 0.110), mk(x, 0, 0.200)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, kept := keepOwner(tc.cs, nearTie{0.1, 0.010}, key, f.targets)
			if kept != tc.kept {
				t.Fatalf("kept %v, want %v", kept, tc.kept)
			}
			if kept && c.i != o {
				t.Fatalf("kept %s, not the owner %s", f.targets[c.i].Backend.Name(), f.targets[o].Backend.Name())
			}
		})
	}
}

// TestKeepTurnWhileItsEngineHasRoom: the backend of a conversation's previous turn, served through another
// replica, keeps the next turn whatever the costs say while it holds the most of the prompt and its engine has a
// seat free; full, or holding less than another candidate, it is left to the costs.
func TestKeepTurnWhileItsEngineHasRoom(t *testing.T) {
	f := newFleet(t, local(3)...)
	prev := f.targets[1].Backend
	mk := func(i, blocks int, cost float64, room bool) cand {
		return cand{i: i, blocks: blocks, conf: blocks, cost: cost, pred: cost, spread: 1.3, room: room}
	}
	remote := func(c cand) cand { c.region = 1; return c }
	for _, tc := range []struct {
		name string
		prev *Backend
		cs   []cand
		kept bool
	}{
		// 0.900 against 0.040: beyond any margin of the models' errors, and kept all the same.
		{"a seat free, dear", prev, []cand{mk(0, 0, 0.040, true), mk(1, 12, 0.900, true), mk(2, 3, 0.200, true)}, true},
		{"every seat taken", prev, []cand{mk(0, 0, 0.040, true), mk(1, 12, 0.900, false), mk(2, 3, 0.200, true)}, false},
		{"another holds more", prev, []cand{mk(0, 14, 0.040, true), mk(1, 12, 0.300, true), mk(2, 0, 0.200, true)}, false},
		{"an equal holder", prev, []cand{mk(0, 12, 0.040, true), mk(1, 12, 0.300, true), mk(2, 0, 0.200, true)}, true},
		{"holds none", prev, []cand{mk(0, 0, 0.040, true), mk(1, 0, 0.300, true), mk(2, 0, 0.200, true)}, false},
		// Not in the best tier: Pick left it out of cs.
		{"not a candidate", prev, []cand{mk(0, 0, 0.040, true), mk(2, 3, 0.200, true)}, false},
		{"no previous turn", nil, []cand{mk(0, 0, 0.040, true), mk(1, 12, 0.900, true)}, false},
		// A conversation that failed over to a second region comes home once a backend there can serve it.
		{"in a failover region", prev, []cand{mk(0, 0, 0.040, true), remote(mk(1, 12, 0.300, true)), mk(2, 3, 0.200, true)}, false},
		{"every candidate remote", prev, []cand{remote(mk(1, 12, 0.300, true)), remote(mk(2, 3, 0.200, true))}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, kept := keepTurn(tc.cs, tc.prev, f.targets)
			if kept != tc.kept {
				t.Fatalf("kept %v, want %v", kept, tc.kept)
			}
			if kept && f.targets[c.i].Backend != prev {
				t.Fatalf("kept %s, not the previous turn's %s", f.targets[c.i].Backend.Name(), prev.Name())
			}
		})
	}
}
