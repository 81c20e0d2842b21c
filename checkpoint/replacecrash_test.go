package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/shardpool/shardpool/checkpoint"
)

// replaceThenDie is set in the environment of the test binary run by
// TestCrashMidReplaceKeepsTheDamagedOutput: "OUT SRC". TestMain then
// publishes SRC over OUT/s1, keeping what it held in
// OUT/.shardpool/replaced, and kills itself with SIGKILL after the
// publish's first rename.
const replaceThenDie = "SHARDPOOL_TEST_REPLACE_THEN_DIE"

func TestMain(m *testing.M) {
	if v := os.Getenv(replaceThenDie); v != "" {
		var out, src string
		fmt.Sscan(v, &out, &src)
		p, err := checkpoint.Prepare(context.Background(), filepath.Join(out, "s1"), src, checkpoint.Options{Fingerprint: "b"})
		if err != nil {
			fmt.Fprintln(os.Stderr, "prepare:", err)
			os.Exit(2)
		}
		checkpoint.SetAfterSwap(func() { syscall.Kill(os.Getpid(), syscall.SIGKILL) })
		err = p.Publish(filepath.Join(out, ".shardpool", "replaced"))
		fmt.Fprintln(os.Stderr, "publish returned:", err)
		os.Exit(3)
	}
	os.Exit(m.Run())
}

// TestCrashMidReplaceKeepsTheDamagedOutput: a commit over an output that
// does not verify keeps that output for inspection. A process killed in
// the middle of that replace (here with SIGKILL right after its first
// rename), then a sweep of its dead temporary directories (the next
// worker's start), must leave the damaged output somewhere: kept aside,
// or still in place. Swapped first, it sat beside the output under a
// temporary name until its move into .shardpool/replaced, and the sweep
// removed it as a dead commit's. The output itself is never partial:
// absent (the shard is committed again) or a whole commit.
func TestCrashMidReplaceKeepsTheDamagedOutput(t *testing.T) {
	out := t.TempDir()
	dst, keep, src := damagedOutput(t, out)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), replaceThenDie+"="+out+" "+src)
	b, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Fatalf("the committing process was not killed mid-replace: %v\n%s", err, b)
	}

	if _, err := checkpoint.SweepTemps(out); err != nil {
		t.Fatal(err)
	}
	if left := tempDirs(out); len(left) > 0 {
		t.Errorf("the sweep left %v beside the output", left)
	}
	var damaged []string
	if v, err := os.ReadFile(filepath.Join(dst, "v")); err == nil && string(v) == "damaged" {
		damaged = append(damaged, dst)
	}
	kept, _ := os.ReadDir(keep)
	for _, e := range kept {
		if v, err := os.ReadFile(filepath.Join(keep, e.Name(), "v")); err == nil && string(v) == "damaged" {
			damaged = append(damaged, filepath.Join(keep, e.Name()))
		}
	}
	if len(damaged) != 1 {
		t.Errorf("the damaged output is at %v after the crash and the sweep; want it in one place, kept aside or in place (%d kept aside)", damaged, len(kept))
	}
	if _, err := os.Stat(dst); err == nil && (len(damaged) == 0 || damaged[0] != dst) {
		if mk, err := checkpoint.Verify(dst); err != nil || mk.Fingerprint != "b" {
			t.Errorf("the output after the crash: %v, fingerprint %q; want it absent or the new commit whole", err, mk.Fingerprint)
		}
	}
}
