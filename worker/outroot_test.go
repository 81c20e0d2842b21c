package worker_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestOutputDirectoryNotMadeIsTriedAgain: a worker's first commit makes
// the output directory; where that fails (a file where a directory of
// its path should be), the attempt fails, and once the path is clear the
// next attempt's commit makes it. The directory is not taken as made
// from the first try.
func TestOutputDirectoryNotMadeIsTriedAgain(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	gate := testenv.NewGate(t)
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 2, Extra: "retry_delay = \"100ms\"\n",
		Command: gate.NoteThenCopy()})
	parent := filepath.Join(t.TempDir(), "d")
	out := filepath.Join(parent, "out")
	testenv.SetOutput(t, spec, out)
	env.Submit(spec, coordinator.SubmitOptions{})
	// Once the command runs (with the file made at the RUNNING record,
	// the worker's look before the command could meet it: a start error,
	// not the commit's).
	gate.WaitStarted("s0000")
	// A file where the output directory's parent should be: the commit
	// cannot make it.
	if err := os.WriteFile(parent, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	gate.Open()
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		r, err := env.Shard("t", "s0000")
		return err == nil && len(r.Attempts) > 0 && r.Attempts[0].Outcome != "", fmt.Sprintf("s0000: %+v (%v)", r.Attempts, err)
	})
	if err := os.Remove(parent); err != nil {
		t.Fatal(err)
	}
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	r, err := env.Shard("t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if first := r.Attempts[0]; first.Outcome != stream.OutcomeCommit || !strings.Contains(first.Reason, "not a directory") {
		t.Errorf("first attempt: %s %q, want a commit error saying the path is not a directory", first.Outcome, first.Reason)
	}
	if _, err := checkpoint.Verify(filepath.Join(out, "s0000")); err != nil {
		t.Fatalf("output after the path was cleared: %v", err)
	}
}
