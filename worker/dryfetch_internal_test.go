package worker

import (
	"testing"
	"time"
)

// TestDryFetchWaitsLonger: while the queue is dry each fetch's expiry
// doubles from FetchWait up to dryFetchMax, and never falls below a
// FetchWait that is longer.
func TestDryFetchWaitsLonger(t *testing.T) {
	ms := time.Millisecond
	var got []time.Duration
	for last, i := time.Duration(0), 0; i < 6; i++ {
		last = dryFetch(last, 20*ms)
		got = append(got, last)
	}
	want := []time.Duration{20 * ms, 40 * ms, 80 * ms, 160 * ms, 250 * ms, 250 * ms}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("expiries with FetchWait 20ms: got %v, want %v", got, want)
		}
	}
	if d := dryFetch(500*ms, 500*ms); d != 500*ms {
		t.Errorf("FetchWait 500ms: got %v, want 500ms", d)
	}
}

// TestDryFetchDecisionsAreLoggedOnce: a fetch decision goes to
// admission.log every time while shards are queued; while the queue is
// dry, the first, then one a minute or one of another number.
func TestDryFetchDecisionsAreLoggedOnce(t *testing.T) {
	g := &gate{wake: make(chan struct{}, 1)}
	now := time.Now()
	for i, tc := range []struct {
		dry   bool
		k     int
		after time.Duration
		want  bool
	}{
		{false, 2, 0, true},
		{false, 2, time.Millisecond, true},         // shards queued: every one
		{true, 1, time.Millisecond, true},          // the first while dry
		{true, 1, time.Second, false},              // the same again
		{true, 2, time.Second, true},               // another number
		{true, 2, 30 * time.Second, false},         // within the minute
		{true, 2, dryLogEvery + time.Second, true}, // a minute on
		{false, 2, time.Millisecond, true},         // shards again
		{true, 2, time.Millisecond, true},          // dry again: its first
		{true, 2, 2 * time.Millisecond, false},
	} {
		g.setBacklog(!tc.dry)
		now = now.Add(tc.after)
		if got := g.logFetch(tc.k, now); got != tc.want {
			t.Fatalf("step %d (dry %v, fetch %d): logged %v, want %v", i, tc.dry, tc.k, got, tc.want)
		}
	}
}
