package main_test

import (
	"context"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/testenv"
)

// TestRunSurvivesPowerCuts cuts the power under `shardpool run` several
// times at random moments (testenv.PowerCutFS: what was not made durable
// is lost), each time starting the run again with its resume command. The
// state directory and the scratch are on one file system, the job with its
// inputs and outputs on another, as on hosts whose data sit on their own
// disk: a syncfs of one does not make the other durable. The run must end COMPLETE with every
// output verifying and every shard recorded validated exactly once: group
// sync's promise that every write a decision depends on is on disk before
// anyone acts on it (docs/decisions.md, "Group sync"). A SIGKILL keeps the
// page cache, so the coordinator tests of SIGKILL do not show this. It
// runs under ext4 and XFS (testenv.PowerCutKinds).
func TestRunSurvivesPowerCuts(t *testing.T) {
	for _, kind := range testenv.PowerCutKinds {
		t.Run(kind, func(t *testing.T) { runSurvivesPowerCuts(t, kind) })
	}
}

func runSurvivesPowerCuts(t *testing.T, kind string) {
	state, disk := testenv.NewPowerCutFSKind(t, 512<<20, kind), testenv.NewPowerCutFSKind(t, 128<<20, kind)
	const n = 60
	ran := filepath.Join(t.TempDir(), "ran") // outside: survives the cuts
	// An attempt whose worker dies is charged (docs/decisions.md,
	// "Attempts"): a shard running at each of the (up to 4) cuts has lost
	// 4 attempts, and must still have one left. With retries = 2 one such
	// shard failed, correctly, in one of the nine runs of a session.
	job := testenv.WriteJob(t, testenv.Job{Shards: n, Retries: 4, InputSize: 4096,
		Command: []string{"sh", "-c", `echo "$1" >> "$4"; sleep 0.2; cp "$2" "$3/"; echo done > "$3/status"`, "sh", "{id}", "{input}", "{out}", ran}})
	// The job's files go onto the file system whose power is cut, made
	// durable before anything runs.
	dir := filepath.Join(disk.Dir, "job")
	if out, err := exec.Command("cp", "-r", filepath.Dir(job), dir).CombinedOutput(); err != nil {
		t.Fatalf("copy the job: %v %s", err, out)
	}
	syscall.Sync()
	spec := filepath.Join(dir, filepath.Base(job))
	data, scratch := filepath.Join(state.Dir, "data"), filepath.Join(state.Dir, "scratch")
	run := func() *testenv.Proc {
		return testenv.Start(t, "run", "--quiet", "--data", data, "--scratch", scratch, "--slots", "4", "--lease-ttl", "3s", spec)
	}

	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 3))
	cuts := 0
	for range 4 {
		p := run()
		// From the start (the manifest still being published) to well into
		// the shards.
		time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
		p.Signal(syscall.SIGKILL)
		p.Wait(t, 10*time.Second)
		if strings.Contains(p.Output(), "COMPLETE") {
			break
		}
		state.Cut()
		disk.Cut()
		cuts++
	}
	if cuts < 2 {
		t.Fatalf("only %d power cut(s) came before the run completed; the test proves little", cuts)
	}
	// The last run logs what it does (-v): a run that does not end is
	// asked where it stands before the test gives up on it (CI saw such a
	// hang twice, in the thirty-ninth and forty-seventh sessions).
	p := testenv.Start(t, "run", "-v", "--data", data, "--scratch", scratch, "--slots", "4", "--lease-ttl", "3s", spec)
	waitOrStatus(t, p, 3*time.Minute, data, "t")
	if code := p.Wait(t, time.Second); code != 0 || !strings.Contains(p.Output(), "COMPLETE") {
		t.Fatalf("after the cuts the run exited %d:\n%s", code, p.Output())
	}

	// The records, read from the store the run left.
	c, err := coordinator.New(coordinator.Config{DataDir: data, StoreDir: filepath.Join(data, "stores", "t"), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := c.Start(ctx); err != nil {
		t.Fatalf("open the run's store: %v", err)
	}
	defer c.Close()
	out := filepath.Join(dir, "out")
	validatedOnce(t, c.JetStream(), "t", out, n)
	for i := range n {
		got, err := os.ReadFile(filepath.Join(out, fmt.Sprintf("s%04d", i), "status"))
		if err != nil || string(got) != "done\n" {
			t.Errorf("output s%04d: status %q, %v", i, got, err)
		}
	}
	for _, name := range leftovers(t, out) {
		t.Errorf("left in the output directory: %s", name)
	}
	runs, _ := os.ReadFile(ran)
	t.Logf("%d commands ran for %d shards over %d power cuts", strings.Count(string(runs), "\n"), n, cuts)
	if strings.Contains(p.Output(), "no consumer would deliver again") {
		t.Logf("the resumed run removed messages its store had kept past their acknowledgement (stream.RemoveOrphans)")
	}
}

// waitOrStatus waits up to limit for p to end. A run still going then is
// asked where it stands (`shardpool status`, its JSON too), killed, and
// the test fails with that and the run's output.
func waitOrStatus(t *testing.T, p *testenv.Proc, limit time.Duration, data, run string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !p.Exited() {
		if time.Now().After(deadline) {
			st, _ := exec.Command(testenv.Binary(t), "status", "--data", data, run).CombinedOutput()
			js, _ := exec.Command(testenv.Binary(t), "status", "--json", "--data", data, run).CombinedOutput()
			p.Signal(syscall.SIGKILL)
			p.Wait(t, 10*time.Second)
			t.Fatalf("run still going after %s; shardpool status:\n%s\n%s\nits output:\n%s", limit, st, js, p.Output())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestInterruptedCommitsLeaveNothingBehind: a commit killed between its
// first write and its rename leaves a temporary directory beside the
// outputs. The worker removes those it finds when it first commits into
// the output directory, and the coordinator those left since, when the
// run completes; a user's output directory holds the outputs only.
func TestInterruptedCommitsLeaveNothingBehind(t *testing.T) {
	spec := testenv.WriteJob(t, testenv.Job{Shards: 6, Command: []string{"sh", "-c", `sleep 0.3; cp "$1" "$2/"`, "sh", "{input}", "{out}"}})
	out := filepath.Join(filepath.Dir(spec), "out")
	before := filepath.Join(out, ".tmp-s0001-0123456789ab")
	if err := os.MkdirAll(filepath.Join(before, "partial"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := testenv.Start(t, "run", "--data", t.TempDir(), "--slots", "1", spec)
	// Once the worker has committed (and swept), another one appears, as
	// from a second worker killed mid-commit.
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		_, err := os.Stat(filepath.Join(out, "s0000", "COMPLETE"))
		return err == nil, "no output committed yet"
	})
	if _, err := os.Stat(before); err == nil {
		t.Errorf("the worker committed without removing %s", before)
	}
	during := filepath.Join(out, ".tmp-s0004-ba9876543210")
	if err := os.MkdirAll(filepath.Join(during, "partial"), 0o755); err != nil {
		t.Fatal(err)
	}
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run: exit %d\n%s", code, p.Output())
	}
	ents, _ := os.ReadDir(out)
	var names []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".") {
			names = append(names, e.Name())
		}
	}
	if left := leftovers(t, out); len(names) != 6 || len(left) > 0 {
		t.Errorf("output directory holds %v and %v, want the 6 outputs only", names, left)
	}
}

// leftovers lists what an output directory holds besides outputs: each
// hidden entry but .shardpool, and what .shardpool holds (a run's claim
// is removed when it ends; the directory stays).
func leftovers(t *testing.T, out string) []string {
	t.Helper()
	ents, err := os.ReadDir(out)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range ents {
		if e.Name() == ".shardpool" {
			meta, _ := os.ReadDir(filepath.Join(out, e.Name()))
			for _, m := range meta {
				left = append(left, filepath.Join(e.Name(), m.Name()))
			}
		} else if strings.HasPrefix(e.Name(), ".") {
			left = append(left, e.Name())
		}
	}
	return left
}
