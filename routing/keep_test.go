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
