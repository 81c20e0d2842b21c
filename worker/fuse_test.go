package worker_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

// TestOutputsOnFuse: a run whose output directory is a FUSE mount (as on
// sshfs, s3fs or gcsfuse) commits each shard there from local scratch,
// and a new generation replaces every output, though FUSE refuses the
// atomic exchange a local disk offers (checkpoint's fallback renames the
// old output aside): every output verifies with its record's checksum,
// the damaged one replaced is kept aside, and no temporary directory is
// left.
func TestOutputsOnFuse(t *testing.T) {
	fuse := testenv.FuseDir(t) // first: unmounted after the workers stop
	env := testenv.New(t, testenv.Options{})
	spec, runs := copyJob(t, 4, 0, "")
	out := filepath.Join(fuse, "out")
	text := testenv.SetOutput(t, spec, out)
	ids := []string{"s0000", "s0001", "s0002", "s0003"}
	verifyAll := func(fp string) {
		t.Helper()
		for _, id := range ids {
			mk, err := checkpoint.Verify(filepath.Join(out, id))
			if err != nil || mk.Fingerprint != fp {
				t.Fatalf("output %s: %v, fingerprint %q, want %s", id, err, mk.Fingerprint, fp)
			}
			r, err := env.Shard("t", id)
			if err != nil || r.State != stream.ShardValidated || r.Output == nil || r.Output.Checksum != mk.Manifest {
				t.Fatalf("record of %s: %+v (%v), want validated with checksum %s", id, r, err, mk.Manifest)
			}
		}
	}

	// Submitted as `submit` does, with where the output directory is:
	// missing, on a mount this host has, it is made.
	on := outputOn(t, out, fuse)
	first := env.Submit(spec, coordinator.SubmitOptions{OutputOn: on})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	verifyAll(first.Fingerprint)

	// One output damaged, then a new generation: every shard runs again
	// and its output replaces the one there.
	if err := os.WriteFile(filepath.Join(out, "s0001", "s0001.txt"), []byte("short"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(spec, []byte(text+"env = { MODE = \"v2\" }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	changed := env.Submit(spec, coordinator.SubmitOptions{})
	if changed.Fingerprint == first.Fingerprint || changed.Published != len(ids) {
		t.Fatalf("changed spec: got %+v, want a new fingerprint with %d published", changed, len(ids))
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		r, err := env.Run("t")
		return err == nil && r.Fingerprint == changed.Fingerprint && r.State == stream.RunComplete, fmt.Sprintf("run %+v (%v)", r.Counts, err)
	})
	verifyAll(changed.Fingerprint)
	for id, n := range countLines(t, runs) {
		if n != 2 {
			t.Errorf("shard %s ran %d times over two generations, want 2", id, n)
		}
	}
	kept, _ := os.ReadDir(filepath.Join(out, ".shardpool", "replaced"))
	if len(kept) != 1 || !strings.HasPrefix(kept[0].Name(), "s0001-") {
		t.Errorf("kept aside: %v, want the damaged s0001 alone", kept)
	}
	ents, _ := os.ReadDir(out)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), checkpoint.TempPrefix) {
			t.Errorf("left in the output directory: %s", e.Name())
		}
	}
}

// TestOutputDirectoryUnmountedIsNotMadeAgain: an output directory on a
// file system unmounted while the worker runs (an NFS or sshfs mount
// gone) leaves the empty mount point on the local disk. The worker makes
// nothing there: the attempt whose command ends after the unmount hands
// its shard back uncharged without committing, the next attempt does not
// start its command, and the shard fails naming the directory gone,
// instead of committing outputs to the disk beneath the mount point,
// hidden once the file system is back.
func TestOutputDirectoryUnmountedIsNotMadeAgain(t *testing.T) {
	fuse := testenv.FuseDir(t)
	env := testenv.New(t, testenv.Options{})
	gate := testenv.NewGate(t)
	spec, _ := copyJob(t, 2, 0, "")
	out := filepath.Join(fuse, "out")
	text := testenv.SetOutput(t, spec, out)
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)

	// The next generation waits for the gate: its command is running
	// when the file system goes. It says it started: the worker's looks
	// at the output directory come before the command, and a RUNNING
	// record does not (unmounted then, no attempt would have run).
	started := filepath.Join(t.TempDir(), "started")
	gated := strings.Replace(text, `["sh","-c","`, fmt.Sprintf(`["sh","-c","touch %s; while [ ! -e %s ]; do sleep 0.05; done; `, started, gate.Path), 1)
	if gated == text {
		t.Fatalf("the spec's command is not the sh -c this test gates:\n%s", text)
	}
	text = gated
	if err := os.WriteFile(spec, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	changed := env.Submit(spec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		_, err := os.Stat(started)
		return err == nil, "no command of the next generation has started"
	})
	if out, err := exec.Command("umount", fuse).CombinedOutput(); err != nil {
		t.Fatalf("umount %s: %v %s", fuse, err, out)
	}
	gate.Open()
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		r, err := env.Run("t")
		return err == nil && r.Fingerprint == changed.Fingerprint && r.State == stream.RunBlocked, fmt.Sprintf("run %s %+v (%v)", r.State, r.Counts, err)
	})
	if ents, _ := os.ReadDir(fuse); len(ents) != 0 {
		t.Fatalf("the mount point got %s: outputs were committed beneath the unmounted file system", ents[0].Name())
	}
	for _, id := range []string{"s0000", "s0001"} {
		r, err := env.Shard("t", id)
		if err != nil || r.State != stream.ShardFailed {
			t.Fatalf("%s: %+v (%v), want failed", id, r, err)
		}
		last := r.Attempts[len(r.Attempts)-1]
		if last.Outcome != stream.OutcomeStart || !strings.Contains(last.Reason, "the output directory "+out+" is gone on host") ||
			!strings.Contains(last.Reason, "not made again") || !strings.Contains(last.Reason, "the command was not run") {
			t.Errorf("%s: last attempt %s %q, want a start error naming the output directory gone", id, last.Outcome, last.Reason)
		}
	}
	// The attempts whose command ran when the file system went committed
	// nothing and were not charged.
	deferred := 0
	for _, id := range []string{"s0000", "s0001"} {
		r, _ := env.Shard("t", id)
		for _, a := range r.Attempts {
			if a.Outcome == stream.OutcomeInterrupted && strings.Contains(a.Reason, "is gone on host") {
				deferred++
			}
		}
	}
	if deferred == 0 {
		t.Errorf("no attempt was handed back at its commit for the output directory gone")
	}
}

// outputOn is where the submitter sees out, under the mount at mount
// (worker.OutputStorageOf), as `submit` records it.
func outputOn(t *testing.T, out, mount string) *stream.OutputStorage {
	t.Helper()
	pr, err := probe.New(probe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	on := worker.OutputStorageOf(context.Background(), pr, host, stream.BootID("/proc"), out)
	if on == nil || on.MountPoint != mount || !strings.HasPrefix(on.Type, "fuse") || on.Host != host {
		t.Fatalf("the storage of %s as a submitter records it: %+v, want FUSE mounted at %s on %s", out, on, mount, host)
	}
	return on
}

// TestOutputNotMountedHereIsNotMade: a run submitted where its output
// directory is on a mount (a FUSE one here, NFS in life), taken by a
// worker on a host where that file system is not mounted (here it is
// unmounted before the run is submitted): the directory, missing, is not
// made on the disk beneath, and each shard fails before its command with
// a reason that names both places and the fix. Made by hand as that
// reason says, the directory takes the retried shards.
func TestOutputNotMountedHereIsNotMade(t *testing.T) {
	fuse := testenv.FuseDir(t)
	env := testenv.New(t, testenv.Options{})
	spec, runs := copyJob(t, 2, 0, "")
	out := filepath.Join(fuse, "out")
	testenv.SetOutput(t, spec, out)
	on := outputOn(t, out, fuse)
	if b, err := exec.Command("umount", fuse).CombinedOutput(); err != nil {
		t.Fatalf("umount %s: %v %s", fuse, err, b)
	}
	env.Submit(spec, coordinator.SubmitOptions{OutputOn: on})
	env.WaitState("t", 30*time.Second, stream.RunBlocked)
	if _, err := os.Lstat(out); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("%s beneath the unmounted file system: %v, want it not made", out, err)
	}
	for _, id := range []string{"s0000", "s0001"} {
		r, err := env.Shard("t", id)
		if err != nil || r.State != stream.ShardFailed || len(r.Attempts) != 1 {
			t.Fatalf("%s: %+v (%v), want failed after one attempt", id, r, err)
		}
		a := r.Attempts[0]
		for _, want := range []string{"the output directory " + out + " does not exist on host", "which does not mount its file system (" + on.String() + " where the run was submitted",
			"made here it would be on", "mkdir -p " + out, "the command was not run"} {
			if a.Outcome != stream.OutcomeStart || !strings.Contains(a.Reason, want) {
				t.Errorf("%s: attempt %s %q, want a start error with %q", id, a.Outcome, a.Reason, want)
			}
		}
	}
	if ran := countLines(t, runs); len(ran) != 0 {
		t.Errorf("commands ran: %v", ran)
	}

	// The fix the reason names: the outputs are to be on this disk.
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	env.Submit(spec, coordinator.SubmitOptions{RetryFailed: true, OutputOn: on})
	r := env.WaitState("t", 30*time.Second, stream.RunComplete)
	for _, id := range []string{"s0000", "s0001"} {
		if mk, err := checkpoint.Verify(filepath.Join(out, id)); err != nil || mk.Fingerprint != r.Fingerprint {
			t.Errorf("output %s: %v, fingerprint %q", id, err, mk.Fingerprint)
		}
	}
}

// TestOutputOnAnotherHostsDiskIsRefused: a run submitted where its
// output directory is on a local disk of the submitter's own (recorded as
// such with that host's boot ID: another host here), taken by a worker
// that sees the directory on a local disk of its own. Missing or there,
// nothing is made or committed: each worker's outputs would lie on its
// own disk, and the coordinator's check would see only its host's. Each
// shard fails before its command with a reason that names both disks and
// the fix. A worker that sees the directory on other storage (a mount:
// the submitter's disk may be what it exports), or on the submitter's
// own boot, commits there.
func TestOutputOnAnotherHostsDiskIsRefused(t *testing.T) {
	fuse := testenv.FuseDir(t)
	env := testenv.New(t, testenv.Options{})
	pr, err := probe.New(probe.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	runs := filepath.Join(t.TempDir(), "runs.log")
	job := func(name, out string) string {
		spec := testenv.WriteJob(t, testenv.Job{Name: name, Shards: 2,
			Command: []string{"sh", "-c", `echo "$1" >> "$3" && cp "$2" "$4/"`, "sh", "{id}", "{input}", runs, "{out}"}})
		testenv.SetOutput(t, spec, out)
		return spec
	}
	// As `submit` records it on host login1, of another boot: the disk
	// is this host's root file system, seen from there.
	elsewhere := func(out string) *stream.OutputStorage {
		on := worker.OutputStorageOf(ctx, pr, "login1", "another-boot", out)
		if on == nil || !on.Local {
			t.Fatalf("the storage of %s: %+v, want a local disk recorded", out, on)
		}
		return on
	}
	missing := filepath.Join(t.TempDir(), "out")
	there := filepath.Join(t.TempDir(), "out")
	if err := os.Mkdir(there, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, out, here string }{
		{"missing", missing, "does not exist; made, it would be on a disk of its own ("},
		{"there", there, "exists on a disk of its own too ("},
	} {
		on := elsewhere(c.out)
		env.Submit(job(c.name, c.out), coordinator.SubmitOptions{OutputOn: on})
		env.WaitState(c.name, 30*time.Second, stream.RunBlocked)
		for _, id := range []string{"s0000", "s0001"} {
			r, err := env.Shard(c.name, id)
			if err != nil || r.State != stream.ShardFailed || len(r.Attempts) != 1 {
				t.Fatalf("%s %s: %+v (%v), want failed after one attempt", c.name, id, r, err)
			}
			a := r.Attempts[0]
			for _, want := range []string{"the output directory " + c.out + " is on host login1's own disk, where the run was submitted, not on storage host ",
				" shares: here it " + c.here, "nothing is made or committed here", "(on host login1 it is on " + on.Type + " " + on.Source + " mounted at " + on.MountPoint + ";",
				"put the output on storage every worker's host mounts", "the command was not run"} {
				if a.Outcome != stream.OutcomeStart || !strings.Contains(a.Reason, want) {
					t.Errorf("%s %s: attempt %s %q, want a start error with %q", c.name, id, a.Outcome, a.Reason, want)
				}
			}
		}
	}
	if _, err := os.Lstat(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("%s: %v, want it not made", missing, err)
	}
	if ents, err := os.ReadDir(there); err != nil || len(ents) != 0 {
		t.Errorf("%s holds %v (%v), want nothing committed", there, ents, err)
	}
	if ran := countLines(t, runs); len(ran) != 0 {
		t.Fatalf("commands ran: %v", ran)
	}

	// The same record, taken where the directory is on a mount (the
	// submitter's disk may be the export), or on the submitter's own boot.
	onFuse := filepath.Join(fuse, "out")
	// The file server's view: the directory bindfs exports, on its disk.
	onMount := elsewhere(filepath.Join(filepath.Dir(fuse), "back"))
	ownOut := filepath.Join(t.TempDir(), "out")
	own := elsewhere(ownOut)
	own.BootID = stream.BootID("/proc")
	for _, c := range []struct {
		name, out string
		on        *stream.OutputStorage
	}{{"mounted", onFuse, onMount}, {"own", ownOut, own}} {
		r := func() stream.RunRecord {
			env.Submit(job(c.name, c.out), coordinator.SubmitOptions{OutputOn: c.on})
			return env.WaitState(c.name, 30*time.Second, stream.RunComplete)
		}()
		for _, id := range []string{"s0000", "s0001"} {
			if mk, err := checkpoint.Verify(filepath.Join(c.out, id)); err != nil || mk.Fingerprint != r.Fingerprint {
				t.Errorf("%s output %s: %v", c.name, id, err)
			}
		}
	}
}

// TestHungOutputMountIsReported: the output directory's file system stops
// answering (its FUSE daemon stopped, as a hard NFS mount whose server is
// gone) while two shards run. Their commits wait in the kernel, and the
// third shard, which takes a freed slot, waits in the look at its
// destination before its command; the worker's report lists all three
// with where they wait, once they have waited its SlowFS, while their
// shards stay RUNNING. Once the file system answers again they carry
// on, the run completes and the list empties.
func TestHungOutputMountIsReported(t *testing.T) {
	fuse := testenv.FuseDir(t)
	daemon := testenv.FuseDaemon(t, fuse)
	env := testenv.New(t, testenv.Options{SlowFS: time.Second})
	gate := testenv.NewGate(t)
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3,
		Command: gate.NoteThenCopy()})
	out := filepath.Join(fuse, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.SetOutput(t, spec, out)
	env.Submit(spec, coordinator.SubmitOptions{})
	ids := []string{"s0000", "s0001", "s0002"}
	first := ids[:2] // the slots' first shards; the third waits for a slot
	// Their commands run, past the looks at the output directory that
	// come before them (hung before those, the shards would wait there,
	// not in their commits).
	gate.WaitStarted(first...)
	resume := testenv.HangFuse(t, daemon)
	gate.Open()
	ctx := context.Background()
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		rs, err := env.Buckets().WorkerReports(ctx)
		if err != nil || len(rs) != 1 {
			return false, fmt.Sprintf("reports %+v (%v)", rs, err)
		}
		r := rs[0]
		if r.SlowFSCount != 3 || len(r.SlowFS) != 3 {
			return false, fmt.Sprintf("slow_fs %q, count %d", r.SlowFS, r.SlowFSCount)
		}
		for _, want := range []string{"t.s0000 in its commit to " + out + " for ", "t.s0001 in its commit to " + out + " for ",
			"t.s0002 in the look at its destination " + filepath.Join(out, "s0002") + " before its command for "} {
			if !slices.ContainsFunc(r.SlowFS, func(s string) bool { return strings.HasPrefix(s, want) }) {
				return false, fmt.Sprintf("slow_fs %q lacks %q", r.SlowFS, want)
			}
		}
		return true, ""
	})
	for _, id := range first {
		if r, err := env.Shard("t", id); err != nil || r.State != stream.ShardRunning {
			t.Errorf("%s while its commit waits: %s (%v), want running", id, r.State, err)
		}
	}
	resume()
	r := env.WaitState("t", 30*time.Second, stream.RunComplete)
	for _, id := range ids {
		if mk, err := checkpoint.Verify(filepath.Join(out, id)); err != nil || mk.Fingerprint != r.Fingerprint {
			t.Errorf("output %s: %v", id, err)
		}
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		rs, err := env.Buckets().WorkerReports(ctx)
		return err == nil && len(rs) == 1 && len(rs[0].SlowFS) == 0 && rs[0].SlowFSCount == 0, fmt.Sprintf("reports %+v (%v)", rs, err)
	})
}
