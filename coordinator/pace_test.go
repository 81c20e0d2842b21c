package coordinator

import (
	"testing"
	"time"
)

// TestPaceFollowsTheLastMinute: a pace says nothing before a few seconds
// have seen shards end, follows the last minute rather than the whole
// run, says nothing once none is left, and starts again when fewer have
// ended than before (failed shards requeued, a new generation).
func TestPaceFollowsTheLastMinute(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	var p Pace
	if _, _, ok := p.Observe(t0, 0, 1000); ok {
		t.Fatal("a pace at the start")
	}
	if _, _, ok := p.Observe(t0.Add(2*time.Second), 20, 980); ok {
		t.Fatal("a pace after 2 s")
	}
	if r, left, ok := p.Observe(t0.Add(10*time.Second), 100, 900); !ok || r != 10 || left != 90*time.Second {
		t.Fatalf("100 in 10 s with 900 left: %v/s, %v left (%v), want 10/s and 1m30s", r, left, ok)
	}
	var r float64
	for s := 11; s <= 130; s++ {
		r, _, _ = p.Observe(t0.Add(time.Duration(s)*time.Second), 100+(s-10), 900-(s-10))
	}
	if r != 1 {
		t.Fatalf("1 a second for two minutes after 10 a second: %v/s, want the last minute's 1", r)
	}
	if _, _, ok := p.Observe(t0.Add(131*time.Second), 1000, 0); ok {
		t.Fatal("a pace with none left")
	}
	// 30 failed shards requeued: 970 ended, fewer than before.
	if _, _, ok := p.Observe(t0.Add(132*time.Second), 970, 30); ok {
		t.Fatal("a pace at once after fewer ended than before")
	}
	if r, _, ok := p.Observe(t0.Add(142*time.Second), 980, 20); !ok || r != 1 {
		t.Fatalf("10 in the 10 s since the requeue: %v/s (%v), want 1/s", r, ok)
	}
}
