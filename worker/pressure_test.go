package worker_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker/probe"
)

// TestMemoryHogTriggersPressureResponse puts a real memory hog into a test
// cgroup (1 GiB limit) that the worker's probe watches. When its
// headroom falls below the critical floor, the worker stops fetching and
// SIGTERMs its youngest shard, which checkpoints and goes back to the
// queue; once the hog is gone, everything completes.
func TestMemoryHogTriggersPressureResponse(t *testing.T) {
	cg := testenv.MemoryCgroup(t, 1<<30)
	// A process parked in the cgroup names it for the probe.
	park := exec.Command("sh", "-c", `echo $$ > "$1/cgroup.procs" && exec sleep 120`, "sh", cg)
	if err := park.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { park.Process.Kill(); park.Wait() })
	time.Sleep(100 * time.Millisecond)
	pr, err := probe.New(probe.Config{PID: strconv.Itoa(park.Process.Pid), PolicyPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 2}, Probe: pr, Grace: time.Second})
	marks := t.TempDir()
	// Shards run until the test releases them, so that two still run
	// however long the hog takes to fill and the worker to count its
	// critical checks (a fixed sleep raced a slow CI host: both shards ended
	// first, and with none running there was nothing to preempt). A
	// preempted one leaves a mark from its SIGTERM handler (where a real job
	// would checkpoint) and, run again, ends at once.
	// No retries: a preemption is the host's doing and spends no attempt.
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Retries: 0,
		Command: []string{"sh", "-c", `trap 'touch "$1/$2.term"; exit 143' TERM; [ -e "$1/$2.term" ] && exit 0; while [ ! -e "$1/release" ]; do sleep 0.2 & wait; done`, "sh", marks, "{id}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, _ := env.Run("t")
		return r.Counts.Running == 2, "two shards not running yet"
	})
	// The hog: 900 MiB in the 1 GiB cgroup leaves about 120 MiB of
	// headroom, under the 256 MiB critical floor.
	hog := exec.Command("sh", "-c", `echo $$ > "$1/cgroup.procs" && (head -c 900M /dev/zero; sleep 120) | tail -n 1 > /dev/null`, "sh", cg)
	hog.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := hog.Start(); err != nil {
		t.Fatal(err)
	}
	killHog := func() {
		if hog.Process != nil {
			syscall.Kill(-hog.Process.Pid, syscall.SIGKILL)
			hog.Wait()
			hog.Process = nil
		}
	}
	t.Cleanup(killHog)
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		ents, _ := filepath.Glob(filepath.Join(marks, "*.term"))
		return len(ents) >= 1, "no shard was preempted"
	})
	hostLog, _ := os.ReadFile(filepath.Join(env.Data, "admission.log"))
	for _, want := range []string{"decision=pressure", "decision=preempt", "SIGTERM to the youngest shard"} {
		if !strings.Contains(string(hostLog), want) {
			t.Errorf("admission.log lacks %q", want)
		}
	}
	// Release the pressure: the hog goes, the shards are let finish.
	killHog()
	if err := os.WriteFile(filepath.Join(marks, "release"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	preempted := 0
	for _, id := range []string{"s0000", "s0001", "s0002"} {
		rec, _ := env.Shard("t", id)
		for _, a := range rec.Attempts {
			if a.Outcome == stream.OutcomePreempted && strings.Contains(a.Reason, "memory pressure") {
				preempted++
				if rec.Interrupted == 0 {
					t.Errorf("shard %s: a preempted attempt, but the record counts no interruption", id)
				}
			}
		}
	}
	if preempted == 0 {
		t.Fatal("no attempt records a preemption for memory pressure")
	}
}
