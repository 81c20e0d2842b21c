package worker

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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

// TestStraysAreMatchedByAttemptAndAncestry: a dead worker's stray is
// recognised by the attempt its environment names, and left alone when a
// live process of the worker's name is among its ancestors (a live
// worker's own attempt, or its adopted orphan). The process tree is a
// fixture /proc.
func TestStraysAreMatchedByAttemptAndAncestry(t *testing.T) {
	if got := heldIdentity([]string{"SHARDPOOL_RUN=r", "SHARDPOOL_SHARD_ID=s1", "SHARDPOOL_ATTEMPT=2", "SHARDPOOL_OUT=/x"}); got != (heldShard{key: stream.ShardKey("r", "s1"), attempt: 2}).id() {
		t.Errorf("heldIdentity = %q, want the held shard's id", got)
	}
	if got := heldIdentity([]string{"SHARDPOOL_RUN=r", "SHARDPOOL_SHARD_ID=s1"}); got != "" {
		t.Errorf("an environment without an attempt matched %q", got)
	}
	root := t.TempDir()
	proc := func(pid, ppid int, comm string) {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		stat := fmt.Sprintf("%d (%s) S %d %d%s\n", pid, comm, ppid, pid, strings.Repeat(" 0", 22))
		os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644)
		os.WriteFile(filepath.Join(dir, "comm"), []byte(comm+"\n"), 0o644)
	}
	proc(1, 0, "init")
	proc(500, 1, "shardpool") // a live worker
	proc(600, 500, "sh")      // its command
	proc(701, 600, "sleep")   // the command's child
	proc(700, 1, "sleep")     // an orphan re-parented to init
	proc(800, 1, "systemd")   // a user manager, a subreaper
	proc(702, 800, "sleep")   // an orphan re-parented to it
	proc(999, 1, "shardpool") // this process
	for _, c := range []struct {
		pid  int
		want bool
	}{{701, true}, {600, true}, {700, false}, {702, false}} {
		if got := underLiveWorker(root, c.pid, 999, "shardpool"); got != c.want {
			t.Errorf("underLiveWorker(%d) = %v, want %v", c.pid, got, c.want)
		}
	}
}
