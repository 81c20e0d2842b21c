package worker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestFullOutputHoldsTheWorkerNotTheShards: the output's file system
// fills up mid-run. The commit that meets it is handed back uncharged,
// the worker runs no more commands for that output, and the run waits
// RUNNING, its workers' reports saying why; once room is freed it goes
// on by itself to COMPLETE, no shard failed and none of their retries
// spent. Before, each remaining shard ran its command retries+1 times,
// each to fail at its commit, and the run ended BLOCKED.
func TestFullOutputHoldsTheWorkerNotTheShards(t *testing.T) {
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs.log")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 6, Retries: 0,
		Command: []string{"sh", "-c", `echo "$1" >> "$2"; head -c 300000 /dev/zero > "$3/r"`, "sh", "{id}", runs, "{out}"}})
	out := filepath.Join(filepath.Dir(spec), "out")
	testenv.SmallTmpfs(t, out, "4m")
	// Room for no output: 3,900 KiB of the 4 MiB taken.
	filler := filepath.Join(out, "filler")
	if err := os.WriteFile(filler, make([]byte, 3900<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}})
	env.Submit(spec, coordinator.SubmitOptions{})
	b := env.Buckets()
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		rs, _ := b.WorkerReports(context.Background())
		if len(rs) != 1 {
			return false, fmt.Sprintf("reports %+v", rs)
		}
		why := rs[0].Waiting["cpu"]
		return strings.Contains(why, "the output directory "+out+" has no room") && strings.Contains(why, "no space left on device"),
			fmt.Sprintf("waiting %q, want the output directory named as why", why)
	})
	time.Sleep(2 * time.Second) // what a worker that kept running commands would spend
	// The slot s0000 freed may start the next command before s0000's
	// commit, which runs aside, meets the full disk: one more at most.
	if n := countLines(t, runs); n["s0000"] != 1 || len(n) > 2 {
		t.Errorf("commands run while the output had no room: %v, want s0000's and at most one begun during its commit", n)
	}
	r, err := env.Run("t")
	if err != nil || r.State == stream.RunBlocked || r.Counts.Failed != 0 || r.Counts.Validated != 0 {
		t.Fatalf("run while the output has no room: %s %+v (%v), want it waiting, no shard failed", r.State, r.Counts, err)
	}
	// The shard whose commit met the full disk: its attempt is recorded,
	// not charged.
	rec, err := env.Shard("t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != stream.ShardPending || len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeInterrupted ||
		!strings.Contains(rec.Attempts[0].Reason, "no space left on device") || !strings.Contains(rec.Reason, "not the shard's failure") {
		t.Fatalf("s0000: %s %q, attempts %+v; want pending, its one attempt interrupted by the full disk", rec.State, rec.Reason, rec.Attempts)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	r = env.WaitState("t", 60*time.Second, stream.RunComplete)
	if r.Counts.Validated != 6 || r.Counts.Failed != 0 {
		t.Fatalf("counts %+v, want 6 validated", r.Counts)
	}
	n, again := countLines(t, runs), 0
	for _, k := range n {
		again += k - 1
	}
	if len(n) != 6 || n["s0000"] != 2 || again > 2 {
		t.Errorf("commands run: %v, want each shard's once, and again only s0000's and the one begun during its commit", n)
	}
	log, err := os.ReadFile(filepath.Join(env.Data, "admission.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "decision=output-full") || !strings.Contains(string(log), "decision=output-room") {
		t.Errorf("host admission.log:\n%s\nwant the output noted full, then with room", log)
	}
}
