package worker

import (
	"strings"
	"testing"
	"time"
)

// TestSlowFSListsOnlyLongWaitsOldestFirst: the report lists the waits
// past SlowFS, oldest first, at most slowFSListed of them with the count
// of all; a wait that ended is gone.
func TestSlowFSListsOnlyLongWaitsOldestFirst(t *testing.T) {
	w := &Worker{cfg: Config{SlowFS: time.Minute}}
	now := time.Now()
	var ends []func()
	for i := range slowFSListed + 2 {
		key := string(rune('a' + i))
		ends = append(ends, w.fsBegin(key, "in its commit to /o"))
		w.fsWaits[w.fsSeq] = fsWait{key: key, what: "in its commit to /o", since: now.Add(-time.Duration(100-i) * time.Minute)}
	}
	w.fsBegin("fresh", "in its commit to /o")
	// A second delivery of a shard looks at its destination while the
	// first commits: both are listed, and the first's end leaves the
	// second's.
	first := w.fsBegin("a", "in the look at its destination /o/a before its command")
	w.fsWaits[w.fsSeq] = fsWait{key: "a", what: "in the look at its destination /o/a before its command", since: now.Add(-200 * time.Minute)}
	if got, _ := w.slowFS(now); len(got) < 2 || got[0] != "a in the look at its destination /o/a before its command for 3h20m0s" ||
		got[1] != "a in its commit to /o for 1h40m0s" {
		t.Fatalf("two notes of one shard: %q, want both, the older first", got)
	}
	first()
	got, n := w.slowFS(now)
	if n != slowFSListed+2 || len(got) != slowFSListed {
		t.Fatalf("listed %d of %d, want %d of %d: %q", len(got), n, slowFSListed, slowFSListed+2, got)
	}
	if got[0] != "a in its commit to /o for 1h40m0s" || !strings.HasPrefix(got[1], "b ") {
		t.Errorf("not oldest first: %q", got)
	}
	for _, end := range ends {
		end()
	}
	if got, n := w.slowFS(now); n != 0 || len(got) != 0 {
		t.Errorf("after the waits ended: %q (%d)", got, n)
	}
}

// BenchmarkFSNote is what one note of a file-system wait costs a shard
// (four a shard: the looks at the destination and the output directory,
// the commit's two file-system parts).
func BenchmarkFSNote(b *testing.B) {
	w := &Worker{cfg: Config{SlowFS: time.Minute}}
	for b.Loop() {
		w.fsBegin("run.s0001", "in its commit to /data/out")()
	}
}
