package worker

import (
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// TestAttemptIdentityNamesTheAttempt: the identity an orphan is matched by
// comes from the SHARDPOOL_ variables its command was given, the last of
// each as exec would see it; without a run and a shard there is none.
func TestAttemptIdentityNamesTheAttempt(t *testing.T) {
	base := []string{"PATH=/bin", "SHARDPOOL_RUN=r", "SHARDPOOL_SHARD_ID=s1", "SHARDPOOL_FINGERPRINT=f", "SHARDPOOL_ATTEMPT=1"}
	id := attemptIdentity(base)
	if id == 0 {
		t.Fatal("an attempt's environment has no identity")
	}
	for _, other := range [][]string{
		{"SHARDPOOL_RUN=r", "SHARDPOOL_SHARD_ID=s1", "SHARDPOOL_FINGERPRINT=f", "SHARDPOOL_ATTEMPT=2"},
		{"SHARDPOOL_RUN=r", "SHARDPOOL_SHARD_ID=s2", "SHARDPOOL_FINGERPRINT=f", "SHARDPOOL_ATTEMPT=1"},
		append(append([]string{}, base...), "SHARDPOOL_RUN=q"), // the later one counts
	} {
		if attemptIdentity(other) == id {
			t.Errorf("%q has the identity of %q", other, base)
		}
	}
	if got := attemptIdentity(append([]string{"SHARDPOOL_RUN=outer"}, base...)); got != id {
		t.Errorf("an earlier SHARDPOOL_RUN (the worker's own, in a nested run) changed the identity")
	}
	for _, none := range [][]string{nil, {"PATH=/bin"}, {"SHARDPOOL_RUN=r"}, {"SHARDPOOL_SHARD_ID=s1", "SHARDPOOL_ATTEMPT=1"}} {
		if attemptIdentity(none) != 0 {
			t.Errorf("%q names an attempt", none)
		}
	}
}

// TestEndedAttemptsAreForgotten: an attempt's processes are looked for
// for adoptKeep after it ended, then forgotten, oldest first; one running
// again (its validator) is not ended twice.
func TestEndedAttemptsAreForgotten(t *testing.T) {
	a := &adopter{commands: map[int]bool{}, active: map[uint64]int{}, ended: map[uint64]bool{}, killed: map[int]bool{}}
	for _, id := range []uint64{1, 2, 3} {
		a.active[id]++
		a.endLocked(id)
	}
	a.active[2]++ // the validator of attempt 2
	a.endLocked(2)
	if len(a.endedAt) != 3 || len(a.active) != 0 {
		t.Fatalf("ended %v, active %v; want 3 ended once each, none active", a.endedAt, a.active)
	}
	a.endedAt[0].at = time.Now().Add(-2 * adoptKeep)
	a.forgetLocked(time.Now())
	if a.ended[1] || !a.ended[2] || !a.ended[3] || len(a.endedAt) != 2 {
		t.Fatalf("after adoptKeep: ended %v (%d in order); want 2 and 3 only", a.ended, len(a.endedAt))
	}
}

// TestStraysAreMatchedByAttempt: a dead worker's stray is recognised by
// the attempt its environment names (with the worker process that
// started it, workerProcVar, which killStrays requires as well).
func TestStraysAreMatchedByAttempt(t *testing.T) {
	if got := heldIdentity([]string{"SHARDPOOL_RUN=r", "SHARDPOOL_SHARD_ID=s1", "SHARDPOOL_ATTEMPT=2", "SHARDPOOL_OUT=/x"}); got != (heldShard{key: stream.ShardKey("r", "s1"), attempt: 2}).id() {
		t.Errorf("heldIdentity = %q, want the held shard's id", got)
	}
	if got := heldIdentity([]string{"SHARDPOOL_RUN=r", "SHARDPOOL_SHARD_ID=s1"}); got != "" {
		t.Errorf("an environment without an attempt matched %q", got)
	}
	if a, b := workerProc(12, 345), workerProc(12, 346); a == b {
		t.Errorf("two worker processes with one pid and different start times have one identity %q", a)
	}
}

// BenchmarkEndAfterAMinuteOfEnds is what forgetting costs an attempt's
// end once the queue holds a minute of short shards' ends (78,000: 1,300
// shards of /bin/true a second), each end forgetting the oldest. It
// should not grow with the queue: copying the queue down on each end was
// 6% of a 200,000-shard run's CPU.
func BenchmarkEndAfterAMinuteOfEnds(b *testing.B) {
	const queued = 78_000
	a := &adopter{active: map[uint64]int{}, ended: map[uint64]bool{}}
	base := time.Now()
	end := func(id uint64) { // ends are a microsecond apart
		a.ended[id] = true
		a.endedAt = append(a.endedAt, endedAttempt{id, base.Add(time.Duration(id) * time.Microsecond)})
	}
	for id := range uint64(queued) {
		end(id)
	}
	b.ResetTimer()
	for i := range uint64(b.N) {
		end(queued + i)
		a.forgetLocked(base.Add(adoptKeep + time.Duration(i+1)*time.Microsecond)) // attempt i is a minute old
	}
	b.StopTimer()
	if len(a.endedAt) != queued || len(a.ended) != queued || a.endedAt[0].ident != uint64(b.N) {
		b.Fatalf("%d ends queued (%d known), the oldest %d; want %d, the oldest %d", len(a.endedAt), len(a.ended), a.endedAt[0].ident, queued, b.N)
	}
}
