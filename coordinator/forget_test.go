package coordinator_test

import (
	"context"
	"encoding/json"
	"errors"
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

// TestForgetRemovesAFinishedRun: a COMPLETE run is forgotten (its run
// record, shard and commit records, leases gone from the store; outputs
// and evidence kept); a run that is still going is not. Submitted again at
// once, within the queue's duplicate window (10 minutes), the forgotten
// run's shard IDs are taken for duplicates of the purged messages: submit
// publishes them again under IDs of their own, and the run finds its
// committed outputs and completes without running its command.
func TestForgetRemovesAFinishedRun(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 2}})
	ctx := context.Background()
	runs := filepath.Join(t.TempDir(), "runs")
	spec := testenv.WriteJob(t, testenv.Job{Name: "old", Shards: 3, Retries: 0,
		Command: []string{"sh", "-c", `echo x >> "$1"; cp "$2" "$3/"`, "sh", runs, "{input}", "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("old", 30*time.Second, stream.RunComplete)
	b := env.Buckets()
	// A run is COMPLETE once its records say validated; the last ack
	// lands a moment later (1 message still queued in 1 of 40 runs).
	var before stream.Footprint
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		var err error
		before, err = b.RunFootprint(ctx, "old")
		return err == nil && before.Shards == 3 && before.Checkpoints == 3 && before.Queued == 0,
			fmt.Sprintf("footprint of the finished run: %+v (%v), want 3 shard and 3 commit records, nothing queued", before, err)
	})

	// Another run, still going: refused, nothing removed.
	gate := testenv.NewGate(t)
	busy := testenv.WriteJob(t, testenv.Job{Name: "busy", Shards: 2, Retries: 0,
		Command: gate.ThenCopy()})
	env.Submit(busy, coordinator.SubmitOptions{})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, _ := env.Run("busy")
		return r.Counts.Running > 0, "busy has nothing running yet"
	})
	if _, err := coordinator.Forget(ctx, env.JS, "busy"); !errors.Is(err, coordinator.ErrRunActive) || !strings.Contains(err.Error(), "RUNNING") {
		t.Fatalf("forget a running run: %v, want ErrRunActive naming its state", err)
	}
	if _, err := env.Run("busy"); err != nil {
		t.Fatalf("the refused forget removed the run: %v", err)
	}
	gate.Open()
	env.WaitState("busy", 30*time.Second, stream.RunComplete)

	if _, err := coordinator.Forget(ctx, env.JS, "nosuch"); !errors.Is(err, coordinator.ErrRunNotFound) {
		t.Fatalf("forget an unknown run: %v, want ErrRunNotFound", err)
	}
	got, err := coordinator.Forget(ctx, env.JS, "old")
	if err != nil {
		t.Fatal(err)
	}
	if got.Removed != before || got.State != stream.RunComplete || got.Output == "" {
		t.Fatalf("forgotten: %+v, want what the run held (%+v), its state and output", got, before)
	}
	if left, err := b.RunFootprint(ctx, "old"); err != nil || left != (stream.Footprint{}) {
		t.Fatalf("left in the store: %+v (%v), want nothing", left, err)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		st, err := coordinator.ReadStatus(ctx, env.JS, "")
		if err != nil {
			return false, err.Error()
		}
		for _, r := range st.Runs {
			if r.Name == "old" {
				return false, "status still lists the forgotten run"
			}
		}
		return len(st.Runs) == 1, "status lists the other run too"
	})
	// Forget wrote nothing on disk (a client on another host cannot);
	// the coordinator, whose host has the evidence, notes it there.
	evidence := env.Coord.EvidenceDir("old")
	var note coordinator.ForgottenNote
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(evidence, coordinator.ForgottenName))
		if err != nil {
			return false, err.Error()
		}
		if err := json.Unmarshal(b, &note); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	if note.Run != "old" || note.Fingerprint != got.Fingerprint || note.State != stream.RunComplete || note.Output != got.Output {
		t.Fatalf("%s: %+v, want the forgotten run's name, generation %s, state and output %s", coordinator.ForgottenName, note, got.Fingerprint, got.Output)
	}
	if _, err := os.Stat(filepath.Join(env.Coord.EvidenceDir("busy"), coordinator.ForgottenName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the run not forgotten has a %s (%v)", coordinator.ForgottenName, err)
	}
	for i := range 3 {
		if _, err := os.Stat(filepath.Join(got.Output, "s000"+string(rune('0'+i)), "COMPLETE")); err != nil {
			t.Fatalf("forgetting touched an output: %v", err)
		}
	}

	// Submitted again at once: the committed outputs settle it, no
	// command runs.
	res := env.Submit(spec, coordinator.SubmitOptions{})
	if res.Published != 0 || res.Restored != 3 {
		t.Fatalf("resubmission: %d published, %d restored; want the 3 IDs taken for duplicates and published again", res.Published, res.Restored)
	}
	env.WaitState("old", 30*time.Second, stream.RunComplete)
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "x") != 3 {
		t.Fatalf("the command ran %d times in all, want 3 (none after forgetting)", strings.Count(string(b), "x"))
	}
	r, err := env.Shard("old", "s0001")
	if err != nil || r.State != stream.ShardValidated || !strings.Contains(r.Reason, "already committed") {
		t.Fatalf("shard record after resubmission: %+v (%v), want validated from the committed output", r, err)
	}
}
