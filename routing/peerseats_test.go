package routing

import (
	"testing"
)

// TestSeatsFromPeers: a backend that knows no seats of its own takes those its peers (same engine, models and KV
// cache size) agree on, unless it has run more at once, a peer disagrees, or it is not one of them; its own
// figure always wins; a forgotten backend's figure goes with it.
func TestSeatsFromPeers(t *testing.T) {
	type member struct {
		m      meter
		policy int
		kv     int // KV blocks of 16 tokens (0: not exported)
	}
	floor2 := member{m: meter{2, false}}
	for _, tc := range []struct {
		name      string
		members   []member // b0, b1, ...
		forget    int      // drop this many backends from the end before asking (the registry forgot them)
		ask       int      // which backend to ask
		want      float64
		wantExact bool
		wantFloor int // the group's largest batch, checked when set
	}{
		{name: "a peer measured its seats", members: []member{{m: meter{4, true}}, floor2, floor2}, ask: 1, want: 4,
			wantExact: true},
		{name: "no peer knows", members: []member{floor2, floor2, {m: meter{3, false}}}, ask: 1, want: 2, wantFloor: 3},
		{name: "peers disagree", members: []member{{m: meter{4, true}}, {m: meter{6, true}}, floor2}, ask: 2, want: 2},
		{name: "a peer ran more than the figure", members: []member{{m: meter{4, true}}, {m: meter{5, false}},
			floor2}, ask: 2, want: 2, wantFloor: 5},
		{name: "it ran more than the figure itself", members: []member{{m: meter{4, true}}, floor2,
			{m: meter{5, false}}}, ask: 2, want: 5},
		{name: "peers agree, stated and measured", members: []member{{policy: 4}, {m: meter{4, true}}, floor2},
			ask: 2, want: 4, wantExact: true},
		{name: "its own figure wins", members: []member{{m: meter{4, true}}, {m: meter{8, true}}}, ask: 1, want: 8,
			wantExact: true},
		{name: "another KV cache size is no peer", members: []member{{m: meter{4, true}, kv: 1000},
			{m: meter{2, false}, kv: 2000}}, ask: 1, want: 2},
		{name: "the same KV cache size is", members: []member{{m: meter{4, true}, kv: 1000},
			{m: meter{2, false}, kv: 1000}}, ask: 1, want: 4, wantExact: true},
		{name: "the peer that knew was forgotten", members: []member{floor2, floor2, {m: meter{4, true}}}, forget: 1,
			ask: 1, want: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfgs := local(len(tc.members))
			for i, m := range tc.members {
				cfgs[i].MaxNumSeqs = m.policy
			}
			f := newFleet(t, cfgs...)
			for i, m := range tc.members {
				b := f.targets[i].Backend
				b.SetSeatMeter(m.m)
				st := &EngineStats{At: f.clk.Now()}
				if m.kv > 0 {
					st.Has, st.BlockSize, st.NumGPUBlocks = HasCacheConfig, 16, m.kv
				}
				b.engine.Store(st)
				b.notePeers(st)
			}
			if tc.forget > 0 {
				f.reg.Sync(cfgs[:len(cfgs)-tc.forget])
			}
			b := f.targets[tc.ask].Backend
			got, exact := b.seatsOf(b.Engine(), b.Config())
			if got != tc.want || exact != tc.wantExact {
				t.Fatalf("seats %v (exact %v), want %v (exact %v); peers say %d", got, exact, tc.want, tc.wantExact,
					b.Status().PeerSeats)
			}
			if _, floor := b.PeerSeats(); tc.wantFloor > 0 && floor != tc.wantFloor {
				t.Errorf("the peers' largest batch %d, want %d", floor, tc.wantFloor)
			}
		})
	}
}
