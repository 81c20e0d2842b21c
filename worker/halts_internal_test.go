package worker

import "testing"

// TestAShardOfARunStoppedByHandIsNotStarted: a shard admitted while its
// run stands halted with its commands stopped is stopped as it is noted
// running, before its command starts (prepareAndRun starts none where
// preempt is closed by a halt); another run's shard is not, nor is the
// run's once a record without the halt has arrived.
func TestAShardOfARunStoppedByHandIsNotStarted(t *testing.T) {
	const why = "stopped: the run was halted by hand (shardpool halt --now, its running commands stopped, by u@h at T)"
	w := &Worker{active: map[string]*running{}, haltedNow: map[string]string{"r": why}}
	entry := func(run, id string) *running {
		r := &running{key: run + "." + id, run: run, id: id, preempt: make(chan struct{})}
		w.addRunning(r)
		return r
	}
	if r := entry("r", "s1"); !isClosed(r.preempt) || !r.halted || r.why != why {
		t.Fatalf("shard of the stopped run: stopped %v, halted %v, why %q; want it stopped for the halt", isClosed(r.preempt), r.halted, r.why)
	}
	if r := entry("q", "s1"); isClosed(r.preempt) {
		t.Fatalf("shard of another run stopped: %q", r.why)
	}
	w.stopRun("r", "") // submitted again: the halt is lifted
	if r := entry("r", "s2"); isClosed(r.preempt) {
		t.Fatalf("shard of the run submitted again stopped: %q", r.why)
	}
}
