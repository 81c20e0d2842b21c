package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestHaltStopsARunByHand: a run halted by hand starts no more shards:
// its queued messages are gone, the one running ends as it would and is
// validated, and the run is BLOCKED saying who halted it and how to go
// on. Halting it again changes nothing; submitting it again queues the
// held shards and it completes. A COMPLETE run has nothing to halt, and
// an unknown one is not found.
func TestHaltStopsARunByHand(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}})
	ctx := context.Background()
	gate := testenv.NewGate(t)
	spec := testenv.WriteJob(t, testenv.Job{Name: "h", Shards: 4, Retries: 0, Command: gate.ThenCopy()})
	env.Submit(spec, coordinator.SubmitOptions{Resume: "shardpool submit " + spec})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, err := env.Run("h")
		return err == nil && r.Counts.Running == 1 && r.Counts.Pending == 3, fmt.Sprintf("run record %+v (%v), want 1 running and 3 pending", r.Counts, err)
	})

	h, err := coordinator.Halt(ctx, env.JS, "h", "tester@here", false)
	if err != nil {
		t.Fatal(err)
	}
	if h.Already != "" || h.State != stream.RunBlocked || h.Held != 3 || h.Running != 1 || h.Resume != "shardpool submit "+spec ||
		!strings.Contains(h.Reason, "halted by hand (shardpool halt, by tester@here") || !strings.Contains(h.Reason, "To go on: shardpool submit "+spec) {
		t.Fatalf("halt: %+v, want BLOCKED with 3 held, 1 running, who halted it and the command that goes on", h)
	}
	if fp, err := env.Buckets().RunFootprint(ctx, "h"); err != nil || fp.Queued != 0 {
		t.Fatalf("after the halt %d message(s) of the run queued (%v), want none", fp.Queued, err)
	}
	again, err := coordinator.Halt(ctx, env.JS, "h", "someone@else", false)
	if err != nil || !strings.Contains(again.Already, "tester@here") {
		t.Fatalf("halt again: %+v (%v), want the halt in place named, nothing changed", again, err)
	}

	// The running shard ends as it would; nothing else starts.
	gate.Open()
	var r stream.RunRecord
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, err = env.Run("h")
		return err == nil && r.Counts.Validated == 1 && r.Counts.Running == 0,
			fmt.Sprintf("run record %+v (%v), want the running shard validated", r.Counts, err)
	})
	time.Sleep(time.Second) // a worker that would fetch has had its chance
	if r, err = env.Run("h"); err != nil || r.State != stream.RunBlocked || r.Counts.Validated != 1 || r.Counts.Pending != 3 ||
		!strings.Contains(r.Reason, "halted by hand") || r.HaltedBy != "tester@here" {
		t.Fatalf("halted run: %s %+v %q by %q (%v), want BLOCKED by hand with 3 pending", r.State, r.Counts, r.Reason, r.HaltedBy, err)
	}

	res := env.Submit(spec, coordinator.SubmitOptions{})
	if !strings.Contains(res.Unhalted, "halted by hand") || res.UnhaltedBy != "tester@here" || res.Restored != 3 {
		t.Fatalf("submitted again: unhalted %q by %q, %d restored; want the halt by hand lifted and the 3 held shards queued", res.Unhalted, res.UnhaltedBy, res.Restored)
	}
	env.WaitState("h", 30*time.Second, stream.RunComplete)
	if r, err = env.Run("h"); err != nil || r.Halted != "" || r.HaltedBy != "" {
		t.Fatalf("completed run still says halted: %q by %q (%v)", r.Halted, r.HaltedBy, err)
	}

	if _, err := coordinator.Halt(ctx, env.JS, "h", "tester@here", false); !errors.Is(err, coordinator.ErrNothingToHalt) || !strings.Contains(err.Error(), "COMPLETE") {
		t.Fatalf("halt a COMPLETE run: %v, want ErrNothingToHalt naming the state", err)
	}
	if _, err := coordinator.Halt(ctx, env.JS, "nosuch", "tester@here", false); !errors.Is(err, coordinator.ErrRunNotFound) {
		t.Fatalf("halt an unknown run: %v, want ErrRunNotFound", err)
	}
}

// TestHaltNowStopsRunningCommands: a halt that let its commands run,
// followed by `halt --now`, stops them: each command's process group
// gets SIGTERM and is gone within the halt's wait, its shard goes back
// to pending with the attempt recorded as interrupted by the halt
// (uncharged: with no retries, the shard still completes), and nothing
// else starts. Halting it --now again changes nothing; submitting it
// again queues every held shard and the run completes.
func TestHaltNowStopsRunningCommands(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 2}})
	ctx := context.Background()
	gate := testenv.NewGate(t)
	// Each command writes its pid (its process group's) beside the gate.
	cmd := []string{"sh", "-c", `echo $$ > "$0.pid.$1"; while [ ! -e "$0" ]; do sleep 0.05; done; cp "$2" "$3/"`, gate.Path, "{id}", "{input}", "{out}"}
	spec := testenv.WriteJob(t, testenv.Job{Name: "n", Shards: 5, Retries: 0, Command: cmd})
	env.Submit(spec, coordinator.SubmitOptions{Resume: "shardpool submit " + spec})
	pids := func() map[string]int {
		got := map[string]int{}
		files, _ := filepath.Glob(gate.Path + ".pid.*")
		for _, f := range files {
			b, err := os.ReadFile(f)
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil {
				got[strings.TrimPrefix(f, gate.Path+".pid.")] = pid
			}
		}
		return got
	}
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, err := env.Run("n")
		return err == nil && r.Counts.Running == 2 && len(pids()) == 2, fmt.Sprintf("run record %+v (%v), %d command(s) started, want 2 running", r.Counts, err, len(pids()))
	})

	h, err := coordinator.Halt(ctx, env.JS, "n", "a@here", false)
	if err != nil || h.Stop || h.Running != 2 || h.Held != 3 {
		t.Fatalf("halt: %+v (%v), want 3 held and 2 running on", h, err)
	}
	h, err = coordinator.Halt(ctx, env.JS, "n", "b@there", true)
	if err != nil || h.Already != "" || !h.Stop || h.State != stream.RunBlocked || h.Running != 0 || h.Held != 5 ||
		!strings.Contains(h.Reason, "halted by hand (shardpool halt, by a@here") ||
		!strings.Contains(h.Reason, "its running commands stopped by hand (shardpool halt --now, by b@there") {
		t.Fatalf("halt --now after a halt: %+v (%v), want BLOCKED, both running stopped and held with the 3, by both", h, err)
	}
	stopped := pids()
	for id, pid := range stopped {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("command of %s (pid %d) still there after halt --now: %v", id, pid, err)
		}
		rec, err := env.Shard("n", id)
		if err != nil {
			t.Fatal(err)
		}
		at := rec.Attempts[len(rec.Attempts)-1]
		if rec.State != stream.ShardPending || rec.Interrupted != 1 || at.Outcome != stream.OutcomeInterrupted ||
			!strings.Contains(at.Reason, "stopped: the run was halted by hand") || !strings.Contains(rec.Reason, "held with the run's other shards") {
			t.Errorf("shard %s after halt --now: %s, %d interrupted, last attempt %s %q, reason %q; want pending, its attempt interrupted by the halt, uncharged",
				id, rec.State, rec.Interrupted, at.Outcome, at.Reason, rec.Reason)
		}
	}
	again, err := coordinator.Halt(ctx, env.JS, "n", "c@else", true)
	if err != nil || !strings.Contains(again.Already, "b@there") {
		t.Fatalf("halt --now again: %+v (%v), want the halt in place named, nothing changed", again, err)
	}
	time.Sleep(time.Second) // a worker that would fetch has had its chance
	if n := len(pids()); n != 2 {
		t.Fatalf("%d command(s) started in all, want the 2 stopped alone", n)
	}

	gate.Open()
	res := env.Submit(spec, coordinator.SubmitOptions{})
	if res.UnhaltedBy != "a@here" || res.Restored != 5 {
		t.Fatalf("submitted again: unhalted by %q, %d restored; want the halt lifted and the 5 held shards queued", res.UnhaltedBy, res.Restored)
	}
	env.WaitState("n", 30*time.Second, stream.RunComplete)
	r, err := env.Run("n")
	if err != nil || r.Halted != "" || r.HaltStop {
		t.Fatalf("completed run still says halted: %q, stop %v (%v)", r.Halted, r.HaltStop, err)
	}
	for id := range stopped {
		if rec, err := env.Shard("n", id); err != nil || rec.State != stream.ShardValidated {
			t.Errorf("shard %s stopped by the halt: %s (%v), want validated on its next attempt", id, rec.State, err)
		}
	}
}

// TestHaltNowStopsAShardStagingItsInputs: `halt --now` ends a shard's
// staging copy at once (a large input over a slow link would otherwise
// be copied to its end first), its command is never started, and the
// shard is held with the attempt recorded as interrupted by the halt.
func TestHaltNowStopsAShardStagingItsInputs(t *testing.T) {
	// 4 MiB at 128 KiB/s: a copy of half a minute.
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}, Staging: staging.Config{BytesPerSec: 128 << 10}})
	ctx := context.Background()
	started := filepath.Join(t.TempDir(), "started")
	cmd := []string{"sh", "-c", `touch "$0"; cp "$1" "$2/"`, started, "{input}", "{out}"}
	spec := testenv.WriteJob(t, testenv.Job{Name: "st", Shards: 1, InputSize: 4 << 20, Retries: 0, Command: cmd, Extra: "stage = true\n"})
	env.Submit(spec, coordinator.SubmitOptions{Resume: "shardpool submit " + spec})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, err := env.Run("st")
		return err == nil && r.Counts.Running == 1, fmt.Sprintf("run record %+v (%v), want the shard running (staging)", r.Counts, err)
	})
	time.Sleep(500 * time.Millisecond) // into the copy

	t0 := time.Now()
	h, err := coordinator.Halt(ctx, env.JS, "st", "a@here", true)
	if err != nil || !h.Stop || h.State != stream.RunBlocked || h.Running != 0 || h.Held != 1 {
		t.Fatalf("halt --now during staging: %+v (%v) after %s, want BLOCKED with the staging shard stopped and held", h, err, time.Since(t0))
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("halt --now took %s: the copy was not stopped", d)
	}
	rec, err := env.Shard("st", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	at := rec.Attempts[len(rec.Attempts)-1]
	if rec.State != stream.ShardPending || rec.Interrupted != 1 || at.Outcome != stream.OutcomeInterrupted ||
		!strings.Contains(at.Reason, "stopped: the run was halted by hand") || !strings.Contains(at.Reason, "staging the inputs, its command was not started") ||
		!strings.Contains(rec.Reason, "held with the run's other shards") {
		t.Fatalf("shard after halt --now: %s, %d interrupted, last attempt %s %q, reason %q; want pending, its attempt interrupted by the halt while staging",
			rec.State, rec.Interrupted, at.Outcome, at.Reason, rec.Reason)
	}
	time.Sleep(time.Second) // a worker that would start it has had its chance
	if _, err := os.Stat(started); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the command of the halted shard started (%v)", err)
	}
}
