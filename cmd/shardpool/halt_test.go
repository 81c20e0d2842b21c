package main

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/testenv"
)

// TestHaltCommandStopsARun: `shardpool halt --data DIR RUN` halts a
// `shardpool run` from another terminal: no shard starts after it, the
// one running ends as it would and is committed, and only then does the
// run end, BLOCKED (exit 3), saying who halted it and the command that
// goes on; that command queues the held shards and completes the run.
// Halting a COMPLETE run or an unknown one exits 1; with no run named,
// 2; and where nothing serves the state directory, 1 saying so.
func TestHaltCommandStopsARun(t *testing.T) {
	data := t.TempDir()
	gate := testenv.NewGate(t)
	spec := testenv.WriteJob(t, testenv.Job{Name: "hh", Shards: 3, Retries: 0, Command: gate.NoteThenCopy()})
	p := testenv.Start(t, "run", "--data", data, "--slots", "1", spec)
	gate.WaitStarted("s0000")

	halt := testenv.Start(t, "halt", "--data", data, "--json", "hh")
	if code := halt.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("halt: exit %d, want 0\n%s", code, halt.Output())
	}
	var h coordinator.Halted
	if err := json.Unmarshal([]byte(halt.Output()), &h); err != nil || h.Held != 2 || h.Running != 1 || h.Already != "" || !strings.Contains(h.Resume, "shardpool run") {
		t.Fatalf("halt --json: %+v (%v), want 2 held, 1 running and the run's command to go on\n%s", h, err, halt.Output())
	}
	// The run waits for its running shard rather than stopping it.
	time.Sleep(500 * time.Millisecond)
	if p.Exited() {
		t.Fatalf("run ended while its shard ran on after the halt:\n%s", p.Output())
	}
	gate.Open()
	if code := p.Wait(t, 60*time.Second); code != 3 {
		t.Fatalf("run halted by hand: exit %d, want 3 (BLOCKED)\n%s", code, p.Output())
	}
	out := p.Output()
	if !strings.Contains(out, "run hh: BLOCKED  (1 validated, 0 failed of 3)") || !strings.Contains(out, "halted by hand (shardpool halt, by ") ||
		!strings.Contains(out, "To go on: shardpool run") || strings.Contains(out, "left,") {
		t.Fatalf("run's verdict lacks the halt, its counts or the command that goes on (or gives a time left):\n%s", out)
	}
	outDir := filepath.Join(filepath.Dir(spec), "out")
	if _, err := os.Stat(filepath.Join(outDir, "s0000", "COMPLETE")); err != nil {
		t.Fatalf("the shard running at the halt was not committed: %v", err)
	}
	for _, id := range []string{"s0001", "s0002"} {
		if _, err := os.Stat(gate.Path + ".started." + id); err == nil {
			t.Fatalf("shard %s started after the halt", id)
		}
	}

	code := testenv.Start(t, "halt", "--data", data, "hh").Wait(t, 30*time.Second)
	if code != 1 {
		t.Fatalf("halt with no run serving the directory: exit %d, want 1", code)
	}
	p = testenv.Start(t, "run", "--data", data, "--slots", "1", spec)
	if code := p.Wait(t, 60*time.Second); code != 0 || !strings.Contains(p.Output(), "the run was halted by hand (shardpool halt, by ") ||
		!strings.Contains(p.Output(), "2 held shard(s) queued again\n") {
		t.Fatalf("run again after the halt: exit %d, want 0 with the held shards queued again\n%s", code, p.Output())
	}

	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}})
	done := testenv.WriteJob(t, testenv.Job{Name: "done", Shards: 1, Command: []string{"cp", "{input}", "{out}/"}})
	env.Submit(done, coordinator.SubmitOptions{})
	env.WaitState("done", 30*time.Second, "COMPLETE")
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"done"}, 1, "nothing to halt: the run is COMPLETE"},
		{[]string{"nosuch"}, 1, "run not found"},
		{nil, 2, "Usage"},
	} {
		p := testenv.Start(t, append([]string{"halt", "--server", env.URL}, c.args...)...)
		if code := p.Wait(t, 30*time.Second); code != c.code || !strings.Contains(p.Output(), c.want) {
			t.Errorf("halt %v: exit %d, want %d and %q\n%s", c.args, code, c.code, c.want, p.Output())
		}
	}
}

// TestHaltNowEndsARunAtOnce: a `shardpool run` halted with --now from
// another terminal does not wait for its commands: they are stopped, the
// run ends BLOCKED (exit 3) with every shard held, nothing committed,
// and says how it was halted.
func TestHaltNowEndsARunAtOnce(t *testing.T) {
	data := t.TempDir()
	gate := testenv.NewGate(t)
	spec := testenv.WriteJob(t, testenv.Job{Name: "nn", Shards: 4, Retries: 0, Command: gate.NoteThenCopy()})
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", spec)
	gate.WaitStarted("s0000", "s0001")

	halt := testenv.Start(t, "halt", "--data", data, "--now", "nn")
	if code := halt.Wait(t, 30*time.Second); code != 0 || !strings.Contains(halt.Output(), "run nn halted (fingerprint ") ||
		!strings.Contains(halt.Output(), "4 shard(s) held (taken off the queue, or stopped as they ran, uncharged); none running") {
		t.Fatalf("halt --now: exit %d, want 0, every shard held and none running\n%s", code, halt.Output())
	}
	if code := p.Wait(t, 30*time.Second); code != 3 {
		t.Fatalf("run halted --now: exit %d, want 3 (BLOCKED)\n%s", code, p.Output())
	}
	if out := p.Output(); !strings.Contains(out, "run nn: BLOCKED  (0 validated, 0 failed of 4)") ||
		!strings.Contains(out, "halted by hand (shardpool halt --now, its running commands stopped, by ") {
		t.Fatalf("run's verdict lacks the halt or its counts:\n%s", out)
	}
	entries, err := os.ReadDir(filepath.Join(filepath.Dir(spec), "out"))
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			t.Errorf("output %s committed after halt --now", e.Name())
		}
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	for _, id := range []string{"s0002", "s0003"} {
		if _, err := os.Stat(gate.Path + ".started." + id); err == nil {
			t.Fatalf("shard %s started after the halt", id)
		}
	}
}
