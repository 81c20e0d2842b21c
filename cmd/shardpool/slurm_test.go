package main_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker/probe"
)

// TestWorkerUnderSlurm places a worker with real Slurm (a single-node
// cluster of this host, testenv.StartSlurm) as the README does, in an
// allocation that srun makes itself: `srun --mem=300M shardpool worker`.
// Such a job has no SLURM_MEM_* variable, and its memory comes from its
// record in slurmctld. Shards that declare 200MiB then run one at a time,
// though the host has GiBs free and the job 2 CPUs: two at once would
// both find the other's directory and fail the run.
func TestWorkerUnderSlurm(t *testing.T) {
	sl := testenv.StartSlurm(t)
	bin := testenv.Binary(t)

	out, err := sl.Command("srun", "-n1", "-c1", "--mem=300M", bin, "preflight", "--json").Output()
	if err != nil {
		t.Fatalf("srun preflight: %v\n%s", err, out)
	}
	var snap probe.Snapshot
	if err := json.Unmarshal(out, &snap); err != nil {
		t.Fatalf("preflight --json under srun: %v\n%s", err, out)
	}
	if snap.Slurm == nil || snap.Slurm.JobID == "" || snap.Slurm.Memory.N != 300<<20 || !snap.Slurm.Memory.IsKnown() ||
		snap.Slurm.CPUs.N != 1 || !strings.Contains(snap.Slurm.Memory.Source, "scontrol") {
		t.Fatalf("preflight under srun --mem=300M -c1: slurm %+v, want job, 1 CPU and 300MiB from the job's record", snap.Slurm)
	}
	if !strings.HasPrefix(snap.Budget.Memory.Binding, "Slurm job ") || snap.Budget.Memory.Effective.N != 300<<20 {
		t.Fatalf("memory budget %+v bound by %q, want 300MiB bound by the Slurm job", snap.Budget.Memory.Effective, snap.Budget.Memory.Binding)
	}

	env := testenv.New(t, testenv.Options{NoWorkers: true})
	lock := filepath.Join(t.TempDir(), "running")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 4, Command: []string{"sh", "-c", `mkdir "$0" || exit 7; sleep 0.5; rmdir "$0"`, lock},
		Extra: "[class.cpu]\ncpus = 1\nmemory = \"200MiB\"\n"})
	env.Submit(spec, coordinator.SubmitOptions{})
	state := t.TempDir()
	worker := sl.Command("srun", "-n1", "-c2", "--mem=300M", bin, "worker", "--server", env.URL, "--name", "slurm1",
		"--data", filepath.Join(state, "data"), "--scratch", filepath.Join(state, "scratch"), "--grace", "2s")
	logPath := filepath.Join(state, "worker.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	worker.Stdout, worker.Stderr = log, log
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = sl.Command("scancel", "--full", "-u", "root").Run()
		done := make(chan error, 1)
		go func() { done <- worker.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = worker.Process.Kill()
		}
	}()
	rec := env.WaitState("t", 90*time.Second, stream.RunComplete, stream.RunBlocked)
	if rec.State != stream.RunComplete {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("run under a Slurm worker: %s (%s), want COMPLETE with one shard at a time\nworker log:\n%s", rec.State, rec.Reason, b)
	}
	admissions, _ := os.ReadFile(filepath.Join(state, "data", "runs", "t", "admission.log"))
	if !strings.Contains(string(admissions), "Slurm job") {
		t.Errorf("the worker's admission log does not name the Slurm job's memory as what binds:\n%s", admissions)
	}
}
