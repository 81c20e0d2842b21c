package worker_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestOutputRemountedReadOnlyRunsNoMoreCommands: the output's ext4 file
// system meets an error mid-run and, mounted errors=remount-ro, refuses
// every write, though access(2) still calls it writable (Linux 6.12 and
// later). The shard whose commit met it fails that attempt; no command
// of the run starts after it, each attempt failing at once with the
// reason, where before every attempt of every shard ran its command to
// the end and failed at its commit. (A command that the slot starts
// while the commit runs aside still runs.)
func TestOutputRemountedReadOnlyRunsNoMoreCommands(t *testing.T) {
	efs := testenv.NewErrorFS(t, 64<<20) // first: unmounted after the worker stops
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}})
	dir := t.TempDir()
	runs, gate := filepath.Join(dir, "runs.log"), filepath.Join(dir, "go")
	// s0001 waits at the gate, so that the error comes while it runs.
	spec := testenv.WriteJob(t, testenv.Job{Shards: 5, Retries: 1, Extra: "retry_delay = \"50ms\"\n",
		Command: []string{"sh", "-c", `echo "$1" >> "$2"; if [ "$1" = s0001 ]; then while [ ! -e "$3" ]; do sleep 0.02; done; fi; echo x > "$4/o"`,
			"sh", "{id}", runs, gate, "{out}"}})
	out := filepath.Join(efs.Dir, "out")
	testenv.SetOutput(t, spec, out)
	env.Submit(spec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		n := countLines(t, runs)
		return n["s0001"] == 1, fmt.Sprintf("commands run: %v", n)
	})
	// s0000 concludes beside s0001's command, its slot freed.
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		r, err := env.Shard("t", "s0000")
		return err == nil && r.State == stream.ShardValidated, fmt.Sprintf("s0000 before the error: %s (%v), want validated", r.State, err)
	})
	efs.Fail()
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := env.WaitState("t", 60*time.Second, stream.RunBlocked)
	if r.Counts.Validated != 1 || r.Counts.Failed != 4 {
		t.Fatalf("counts %+v, want 1 validated and 4 failed", r.Counts)
	}
	b, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	// The slot s0001 freed may start the next command before s0001's
	// commit, which runs aside, meets the error: one more at most.
	if got := strings.Fields(string(b)); len(got) < 2 || !slices.Equal(got[:2], []string{"s0000", "s0001"}) || len(got) > 3 {
		t.Errorf("commands run: %v, want s0000, s0001 and at most one begun during s0001's commit: none after the commit met the read-only file system", got)
	}
	for _, id := range []string{"s0001", "s0002", "s0003", "s0004"} {
		rec, err := env.Shard("t", id)
		if err != nil {
			t.Fatal(err)
		}
		last := rec.Attempts[len(rec.Attempts)-1]
		if rec.State != stream.ShardFailed || !strings.Contains(last.Reason, "the output directory "+out+" cannot be written") ||
			!strings.Contains(last.Reason, "read-only file system") || !strings.Contains(last.Reason, "the command was not run") {
			t.Errorf("shard %s: state %s, last attempt %q; want failed, its command not run for the read-only output", id, rec.State, last.Reason)
		}
	}
	first, err := env.Shard("t", "s0001")
	if err != nil {
		t.Fatal(err)
	}
	if a := first.Attempts[0]; a.Outcome != stream.OutcomeCommit || !strings.Contains(a.Reason, "read-only file system") {
		t.Errorf("s0001's first attempt: outcome %s, reason %q; want its commit refused", a.Outcome, a.Reason)
	}
	log, err := os.ReadFile(filepath.Join(env.Data, "runs", "t", "admission.log"))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(log), "decision=output-read-only"); n != 1 {
		t.Errorf("admission.log has %d output-read-only line(s), want 1:\n%s", n, log)
	}
}

// TestScratchThatRefusesWritesHoldsTheWorkerNotTheShards: the scratch
// directory's ext4 meets an error mid-run and refuses every write, its
// mount still listed rw. The pool's directories, made before, meet
// nothing; the command of the shard then running fails to write {out}.
// That attempt is handed back uncharged, the worker fetches nothing more
// (no shard spends its retries on the broken disk, as each did before),
// and once the file system is checked and mounted again the run
// completes, every shard validated.
func TestScratchThatRefusesWritesHoldsTheWorkerNotTheShards(t *testing.T) {
	efs := testenv.NewErrorFS(t, 64<<20) // first: unmounted after the worker stops
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}, Scratch: efs.Dir})
	dir := t.TempDir()
	runs, gate := filepath.Join(dir, "runs.log"), filepath.Join(dir, "go")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 4, Retries: 1, Extra: "retry_delay = \"50ms\"\n",
		Command: []string{"sh", "-c", `echo "$1" >> "$2"; if [ "$1" = s0001 ]; then while [ ! -e "$3" ]; do sleep 0.02; done; fi; echo x > "$4/o"`,
			"sh", "{id}", runs, gate, "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		n := countLines(t, runs)
		return n["s0001"] == 1, fmt.Sprintf("commands run: %v", n)
	})
	efs.Fail()
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		rec, err := env.Shard("t", "s0001")
		if err != nil || len(rec.Attempts) == 0 {
			return false, fmt.Sprintf("s0001: %v", err)
		}
		a := rec.Attempts[0]
		return rec.State == stream.ShardPending && a.Outcome == stream.OutcomeInterrupted && strings.Contains(a.Reason, "scratch directory "),
			fmt.Sprintf("s0001: %s, first attempt %s %q; want pending, the attempt interrupted by the scratch", rec.State, a.Outcome, a.Reason)
	})
	time.Sleep(time.Second) // what a worker that kept fetching would spend
	if n := countLines(t, runs); len(n) != 2 || n["s0001"] != 1 {
		t.Errorf("commands run while the scratch refused writes: %v, want s0000 and s0001 once", n)
	}
	if r, err := env.Run("t"); err != nil || r.Counts.Failed != 0 {
		t.Fatalf("run while the scratch refuses writes: %+v (%v), want no shard failed", r.Counts, err)
	}
	// The file system cannot be unmounted while the worker holds files
	// there (its staging cache's lock): stopped, as an administrator
	// would, and started again once the disk is checked.
	if err := env.StopWorker("w1"); err != nil {
		t.Fatal(err)
	}
	efs.Repair()
	env.StartWorker("", map[string]int{"cpu": 1})
	r := env.WaitState("t", 60*time.Second, stream.RunComplete)
	if r.Counts.Validated != 4 {
		t.Fatalf("counts %+v, want 4 validated", r.Counts)
	}
}

// TestScratchRemovedUnderTheWorkerIsMadeAgain: the worker's scratch
// directories are removed while a command runs (a cleaner of /tmp). The
// command fails to write {out}; that attempt is handed back uncharged, and
// the worker makes new directories instead of handing the removed ones to
// every later attempt, each of which failed the same (the shard BLOCKED
// after its retries).
func TestScratchRemovedUnderTheWorkerIsMadeAgain(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}})
	dir := t.TempDir()
	runs, gate := filepath.Join(dir, "runs.log"), filepath.Join(dir, "go")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Retries: 1, Extra: "retry_delay = \"50ms\"\n",
		Command: []string{"sh", "-c", `echo "$1" >> "$2"; if [ "$1" = s0001 ] && [ ! -e "$3" ]; then while [ ! -e "$3" ]; do sleep 0.02; done; fi; echo x > "$4/o"`,
			"sh", "{id}", runs, gate, "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		n := countLines(t, runs)
		return n["s0001"] == 1, fmt.Sprintf("commands run: %v", n)
	})
	if err := os.RemoveAll(filepath.Join(env.Data, "scratch", "w1", "t")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := env.WaitState("t", 60*time.Second, stream.RunComplete, stream.RunBlocked)
	if r.State != stream.RunComplete || r.Counts.Validated != 3 {
		rec, _ := env.Shard("t", "s0001")
		t.Fatalf("run %s %+v, want COMPLETE with 3 validated; s0001's attempts: %+v", r.State, r.Counts, rec.Attempts)
	}
	rec, err := env.Shard("t", "s0001")
	if err != nil {
		t.Fatal(err)
	}
	if a := rec.Attempts[0]; a.Outcome != stream.OutcomeInterrupted || !strings.Contains(a.Reason, "scratch directory ") {
		t.Errorf("s0001's first attempt: %s %q, want handed back for the scratch", a.Outcome, a.Reason)
	}
}

// TestAttemptLogThatCannotBeMadeIsSaidSo: a command prints, and its log
// file cannot be made (here the attempts directory made immutable, as
// root can; a state directory full or read-only does the same). The
// attempt's record says why (log_lost) where before it had no log and
// read as a command that printed nothing.
func TestAttemptLogThatCannotBeMadeIsSaidSo(t *testing.T) {
	testenv.RequireRoot(t)
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}})
	dir := t.TempDir()
	runs, gate := filepath.Join(dir, "runs.log"), filepath.Join(dir, "go")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 0,
		Command: []string{"sh", "-c", `echo "$1" >> "$2"; if [ "$1" = s0001 ]; then while [ ! -e "$3" ]; do sleep 0.02; done; fi; echo "output of $1"; echo x > "$4/o"`,
			"sh", "{id}", runs, gate, "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		r, err := env.Shard("t", "s0000")
		return err == nil && r.State == stream.ShardValidated && countLines(t, runs)["s0001"] == 1, fmt.Sprintf("s0000 %s (%v), commands %v", r.State, err, countLines(t, runs))
	})
	attempts := filepath.Join(env.Data, "runs", "t", "attempts")
	if out, err := exec.Command("chattr", "+i", attempts).CombinedOutput(); err != nil {
		t.Fatalf("chattr +i %s: %v %s", attempts, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("chattr", "-i", attempts).Run() })
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	first, _ := env.Shard("t", "s0000")
	if a := first.Attempts[0]; a.Log == "" || a.LogLost != "" {
		t.Errorf("s0000's attempt: log %q, log_lost %q; want its log", a.Log, a.LogLost)
	}
	rec, _ := env.Shard("t", "s0001")
	if a := rec.Attempts[0]; a.Log != "" || !strings.Contains(a.LogLost, "operation not permitted") {
		t.Errorf("s0001's attempt: log %q, log_lost %q; want no log and why", a.Log, a.LogLost)
	}
}
