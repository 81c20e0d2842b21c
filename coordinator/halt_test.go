package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
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

	h, err := coordinator.Halt(ctx, env.JS, "h", "tester@here")
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
	again, err := coordinator.Halt(ctx, env.JS, "h", "someone@else")
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

	if _, err := coordinator.Halt(ctx, env.JS, "h", "tester@here"); !errors.Is(err, coordinator.ErrNothingToHalt) || !strings.Contains(err.Error(), "COMPLETE") {
		t.Fatalf("halt a COMPLETE run: %v, want ErrNothingToHalt naming the state", err)
	}
	if _, err := coordinator.Halt(ctx, env.JS, "nosuch", "tester@here"); !errors.Is(err, coordinator.ErrRunNotFound) {
		t.Fatalf("halt an unknown run: %v, want ErrRunNotFound", err)
	}
}
