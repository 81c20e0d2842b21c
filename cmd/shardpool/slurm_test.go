package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

// TestWorkerUnderSlurm places a worker with real Slurm (a single-node
// cluster of this host, testenv.StartSlurm) as the README does, in an
// allocation that srun makes itself: `srun --mem=300M shardpool worker`.
// Such a job has no SLURM_MEM_* variable, and its memory comes from its
// record in slurmctld. Shards that declare 200MiB then run one at a time,
// though the host has GiBs free and the job 2 CPUs: two at once would
// both find the other's directory and fail the run.
//
// Under Slurm's task/cgroup plugin (as sites confine jobs) the job's
// cgroup gives the same 300MiB, the worker's per-shard cgroups nest under
// its task's, and nothing of either is left once scancel ends the job.
func TestWorkerUnderSlurm(t *testing.T) {
	for _, cgroups := range []bool{false, true} {
		t.Run(map[bool]string{false: "no cgroups", true: "task cgroup"}[cgroups], func(t *testing.T) {
			workerUnderSlurm(t, cgroups)
		})
	}
}

func workerUnderSlurm(t *testing.T, cgroups bool) {
	sl := testenv.StartSlurm(t, testenv.SlurmOptions{Cgroups: cgroups})
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
	binding := snap.Budget.Memory.Binding
	if snap.Budget.Memory.Effective.N != 300<<20 || !strings.HasPrefix(binding, "Slurm job ") && !(cgroups && strings.Contains(binding, "/job_"+snap.Slurm.JobID+"/")) {
		t.Fatalf("memory budget %+v bound by %q, want 300MiB bound by the Slurm job or its cgroup", snap.Budget.Memory.Effective, binding)
	}
	if cgroups && (snap.Slurm.Cgroup == "" || snap.Cgroups.MemoryLimit.N != 300<<20 || snap.Budget.CPU.Effective.N != 1000) {
		t.Fatalf("preflight under task/cgroup: job cgroup %q, cgroup memory %+v, CPU budget %+v; want the job's cgroup, 300MiB and 1 CPU (its cpuset)",
			snap.Slurm.Cgroup, snap.Cgroups.MemoryLimit, snap.Budget.CPU.Effective)
	}

	env := submitOneAtATime(t)
	state := t.TempDir()
	// Shard cgroups of other tests' workers, which this one must not be
	// blamed for.
	before, _ := filepath.Glob("/sys/fs/cgroup/*/shardpool-p*")
	worker, logPath := srunWorker(t, sl, env.URL, state, []string{"--mem=300M"}, "--grace", "2s")
	ended := false
	end := func() {
		if ended {
			return
		}
		ended = true
		_ = sl.Command("scancel", "--full", "-u", "root").Run()
		done := make(chan error, 1)
		go func() { done <- worker.Wait() }()
		select {
		case <-done:
		case <-time.After(40 * time.Second):
			_ = worker.Process.Kill()
			t.Errorf("srun did not end within 40s of scancel")
		}
	}
	defer end()
	rec := env.WaitState("t", 90*time.Second, stream.RunComplete, stream.RunBlocked)
	if rec.State != stream.RunComplete {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("run under a Slurm worker: %s (%s), want COMPLETE with one shard at a time\nworker log:\n%s", rec.State, rec.Reason, b)
	}
	admissions, _ := os.ReadFile(filepath.Join(state, "data", "runs", "t", "admission.log"))
	if !strings.Contains(string(admissions), "Slurm job") && !(cgroups && strings.Contains(string(admissions), "/job_")) {
		t.Errorf("the worker's admission log does not name the Slurm job's memory as what binds:\n%s", admissions)
	}
	if !cgroups {
		return
	}
	end()
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		left, _ := filepath.Glob("/sys/fs/cgroup/*/slurm_*/uid_*/job_*")
		mine, _ := filepath.Glob("/sys/fs/cgroup/*/shardpool-p*")
		for _, c := range mine {
			if !slices.Contains(before, c) {
				left = append(left, c)
			}
		}
		return len(left) == 0, fmt.Sprintf("cgroups left after the job ended: %v", left)
	})
}

// TestSlurmCancelHandsShardsBack: scancel (as at preemption or a job's
// time limit) sends SIGTERM to every process of the job at once, the
// shards' commands as well as their worker, and SIGKILL KillWait later.
// The shards those commands were running are handed back uncharged, not
// recorded as failed or lost attempts: with retries = 0 the run still
// completes on another worker. Commands that die of the SIGTERM are
// judged with their worker's stop; commands that ignore it are SIGKILLed
// by the worker's drain before Slurm's KillWait is up (the default
// --grace of 10s is shortened to fit a KillWait of 4s).
func TestSlurmCancelHandsShardsBack(t *testing.T) {
	cases := []struct {
		name     string
		killWait time.Duration
		trap     string
		grace    []string
		notice   string
		scancel  []string
	}{
		{"commands die of the SIGTERM", 0, "", []string{"--grace", "5s"}, "", nil},
		{"commands ignore the SIGTERM", 4 * time.Second, "trap '' TERM; ", nil, "--grace 10s shortened to 2s", nil},
		// What --signal=USR1@SECONDS sends ahead of a job's time limit:
		// the worker drains and exits 0, ending the job; the commands die
		// of the signal and are handed back.
		{"SIGUSR1 drains the worker", 0, "", nil, "SIGUSR1: draining", []string{"--signal=USR1"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sl := testenv.StartSlurm(t, testenv.SlurmOptions{KillWait: c.killWait})
			env := testenv.New(t, testenv.Options{NoWorkers: true})
			doneFile := filepath.Join(t.TempDir(), "done")
			// The shards of the Slurm worker sleep; those of the local
			// worker that takes them over find "done" and exit at once.
			spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Command: []string{"sh", "-c", c.trap + `if [ -e "$0" ]; then exit 0; fi; sleep 60`, doneFile}})
			env.Submit(spec, coordinator.SubmitOptions{})
			worker, logPath := srunWorker(t, sl, env.URL, t.TempDir(), []string{"--mem=500M", "--job-name=sp-cancel"}, append([]string{"--slots", "cpu=2"}, c.grace...)...)
			testenv.Eventually(t, 30*time.Second, func() (bool, string) {
				r, err := env.Run("t")
				return err == nil && r.Counts.Running == 2, fmt.Sprintf("run %+v, %v", r.Counts, err)
			})
			if out, err := sl.Command("scancel", append(c.scancel, "--name=sp-cancel")...).CombinedOutput(); err != nil {
				t.Fatalf("scancel: %v\n%s", err, out)
			}
			done := make(chan error, 1)
			go func() { done <- worker.Wait() }()
			var exit error
			select {
			case exit = <-done:
			case <-time.After(45 * time.Second):
				_ = worker.Process.Kill()
				t.Fatalf("srun did not end within 45s of scancel")
			}
			b, _ := os.ReadFile(logPath)
			if c.scancel != nil && exit != nil {
				t.Errorf("srun after scancel %v: %v, want the drained worker to exit 0\n%s", c.scancel, exit, b)
			}
			if c.notice != "" && !strings.Contains(string(b), c.notice) {
				t.Errorf("worker log does not say %q:\n%s", c.notice, b)
			}
			if err := os.WriteFile(doneFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			env.StartWorker("local", map[string]int{"cpu": 2})
			rec := env.WaitState("t", 60*time.Second, stream.RunComplete, stream.RunBlocked)
			if rec.State != stream.RunComplete {
				t.Fatalf("run after scancel of its Slurm worker: %s (%s), want COMPLETE (the cancelled shards handed back)\nworker log:\n%s", rec.State, rec.Reason, b)
			}
			for _, id := range []string{"s0000", "s0001"} {
				sh, err := env.Shard("t", id)
				if err != nil {
					t.Fatal(err)
				}
				cancelled := 0
				for _, a := range sh.Attempts {
					if a.Worker == "slurm1" {
						cancelled++
						if a.Outcome != stream.OutcomeInterrupted {
							t.Errorf("shard %s: the cancelled attempt was recorded %s, want interrupted: %+v", id, a.Outcome, a)
						}
					}
				}
				if cancelled != 1 {
					t.Errorf("shard %s: %d attempt(s) of the Slurm worker recorded, want the one scancel stopped: %+v", id, cancelled, sh.Attempts)
				}
			}
		})
	}
}

// srunWorker starts `shardpool worker` named slurm1 as a Slurm job of its
// own with 2 CPUs (srun -n1 -c2 and srunArgs), serving the coordinator at
// url, its data and scratch under state and its output in the returned
// log. The caller ends the job.
func srunWorker(t *testing.T, sl *testenv.Slurm, url, state string, srunArgs []string, workerArgs ...string) (*exec.Cmd, string) {
	t.Helper()
	args := append(append([]string{"-n1", "-c2"}, srunArgs...), testenv.Binary(t), "worker", "--server", url, "--name", "slurm1",
		"--data", filepath.Join(state, "data"), "--scratch", filepath.Join(state, "scratch"))
	worker := sl.Command("srun", append(args, workerArgs...)...)
	logPath := filepath.Join(state, "worker.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { log.Close() })
	worker.Stdout, worker.Stderr = log, log
	if err := worker.Start(); err != nil {
		t.Fatal(err)
	}
	return worker, logPath
}

// submitOneAtATime submits 4 shards that declare 200MiB each and fail
// when two run at once (a mkdir lock), to a coordinator of their own.
func submitOneAtATime(t *testing.T) *testenv.Env {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	lock := filepath.Join(t.TempDir(), "running")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 4, Command: []string{"sh", "-c", `mkdir "$0" || exit 7; sleep 0.5; rmdir "$0"`, lock},
		Extra: "[class.cpu]\ncpus = 1\nmemory = \"200MiB\"\n"})
	env.Submit(spec, coordinator.SubmitOptions{})
	return env
}

// TestWorkerInBatchJob: the README's placement inside a batch script,
// `sbatch --mem=300M` running `srun shardpool worker`. There Slurm sets
// SLURM_MEM_PER_NODE, and the worker admits against it: the 200MiB
// shards run one at a time.
func TestWorkerInBatchJob(t *testing.T) {
	sl := testenv.StartSlurm(t, testenv.SlurmOptions{})
	bin := testenv.Binary(t)
	dir := t.TempDir()
	script := func(name string, argv ...string) string {
		p := filepath.Join(dir, name)
		body := "#!/bin/sh\nexec srun --ntasks-per-node=1 " + strings.Join(argv, " ") + "\n"
		if err := os.WriteFile(p, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	snapPath := filepath.Join(dir, "preflight.json")
	if out, err := sl.Command("sbatch", "--wait", "-n1", "-c1", "--mem=300M", "-o", snapPath, "-e", snapPath+".err", script("preflight.sh", bin, "preflight", "--json")).CombinedOutput(); err != nil {
		t.Fatalf("sbatch preflight: %v\n%s", err, out)
	}
	b, _ := os.ReadFile(snapPath)
	var snap probe.Snapshot
	if err := json.Unmarshal(b, &snap); err != nil {
		e, _ := os.ReadFile(snapPath + ".err")
		t.Fatalf("preflight --json in a batch job: %v\n%s\n%s", err, b, e)
	}
	if snap.Slurm == nil || snap.Slurm.Memory.N != 300<<20 || snap.Slurm.Memory.Source != "SLURM_MEM_PER_NODE" ||
		snap.Budget.Memory.Effective.N != 300<<20 || !strings.HasPrefix(snap.Budget.Memory.Binding, "Slurm job ") {
		t.Fatalf("preflight in sbatch --mem=300M: slurm %+v, memory budget %+v bound by %q; want 300MiB from SLURM_MEM_PER_NODE binding",
			snap.Slurm, snap.Budget.Memory.Effective, snap.Budget.Memory.Binding)
	}

	env := submitOneAtATime(t)
	logPath := filepath.Join(dir, "worker.log")
	out, err := sl.Command("sbatch", "--parsable", "-n1", "-c2", "--mem=300M", "-o", logPath,
		script("worker.sh", bin, "worker", "--server", env.URL, "--name", "slurm1", "--data", filepath.Join(dir, "data"),
			"--scratch", filepath.Join(dir, "scratch"), "--grace", "2s")).Output()
	if err != nil {
		t.Fatalf("sbatch worker: %v\n%s", err, out)
	}
	job := strings.TrimSpace(string(out))
	defer func() {
		_ = sl.Command("scancel", job).Run()
		testenv.Eventually(t, 40*time.Second, func() (bool, string) {
			q, err := sl.Command("squeue", "-h", "-j", job).CombinedOutput()
			return err != nil || strings.TrimSpace(string(q)) == "", fmt.Sprintf("job %s still queued or running:\n%s", job, q)
		})
	}()
	rec := env.WaitState("t", 90*time.Second, stream.RunComplete, stream.RunBlocked)
	if rec.State != stream.RunComplete {
		b, _ := os.ReadFile(logPath)
		t.Fatalf("run under a worker of batch job %s: %s (%s), want COMPLETE with one shard at a time\nworker log:\n%s", job, rec.State, rec.Reason, b)
	}
	// Status names the job each worker runs in, for scancel.
	p := testenv.Start(t, "status", "--server", env.URL)
	if code := p.Wait(t, 30*time.Second); code != 0 || !strings.Contains(p.Output(), "slurm1: runs in Slurm job "+job+" (scancel "+job) {
		t.Errorf("status: exit %d, want the worker's Slurm job %s named\n%s", code, job, p.Output())
	}
	st, err := coordinator.ReadStatus(context.Background(), env.JS, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, wk := range st.Workers {
		if wk.Name == "slurm1" && wk.SlurmJob != job {
			t.Errorf("status --json: worker slurm1 reports Slurm job %q, want %s", wk.SlurmJob, job)
		}
	}
}

// TestSbatchPlacesWorkers: `shardpool sbatch` asks the test cluster for a
// node sized to the run (2 slots of a class declaring 1 CPU and 100MiB: 2
// CPUs, 456MiB with the worker's 256MiB), with Slurm's warning signal.
// Two real submissions of 1 slot each (1 CPU, 356MiB) land on the one
// node at once: their workers, each named after the node and its job,
// serve side by side, complete the run and then, with nothing left to
// run, exit and release the node.
func TestSbatchPlacesWorkers(t *testing.T) {
	sl := testenv.StartSlurm(t, testenv.SlurmOptions{})
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	dir := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 8, Command: []string{"sh", "-c", `sleep 1; cp "$1" "$2/"`, "sh", "{input}", "{out}"},
		Extra: "[class.cpu]\ncpus = 1\nmemory = \"100MiB\"\n"})
	env.Submit(spec, coordinator.SubmitOptions{})
	out := runSbatch(t, sl, env.URL, dir, "--slots", "2", "--dry-run", spec, "--", "--comment=shardpool-test")
	for _, want := range []string{"--job-name=shardpool-t ", "--nodes=1 ", "--cpus-per-task=2 ", "--mem=456M ", "--signal=USR1@90 ", "--time=0-00:10:00 ",
		"--comment=shardpool-test SCRIPT", "srun --ntasks-per-node=1 --kill-on-bad-exit=0 " + testenv.Binary(t) + " worker --server " + env.URL + " --idle-exit 2m0s"} {
		if !strings.Contains(out, want) {
			t.Errorf("sbatch --dry-run does not say %q:\n%s", want, out)
		}
	}
	if q, err := sl.Command("squeue", "-h").CombinedOutput(); err != nil || strings.TrimSpace(string(q)) != "" {
		t.Fatalf("after --dry-run, squeue: %v\n%s; want no job", err, q)
	}

	var jobs []string
	for range 2 {
		jobs = append(jobs, sbatchJob(t, sl, env.URL, dir, "1 node\\(s\\), each one worker with 1 CPU\\(s\\), 356MiB for 1 slot\\(s\\)",
			"--slots", "1", "--idle-exit", "3s", spec))
	}
	slurmOut := func() string { return sbatchOutput(dir, jobs...) }
	// Both jobs' workers report at once from the one node, under names of
	// their own. (Named after the host alone, the second stopped at once:
	// "a live worker reports under it".)
	host, _ := os.Hostname()
	var want []slurmWorker
	for _, job := range jobs {
		want = append(want, slurmWorker{host: host, job: job})
	}
	waitSlurmWorkers(t, env, want, slurmOut)
	rec := env.WaitState("t", 90*time.Second, stream.RunComplete, stream.RunBlocked)
	if rec.State != stream.RunComplete {
		t.Fatalf("run under the sbatch workers: %s (%s), want COMPLETE\nSlurm's output:\n%s", rec.State, rec.Reason, slurmOut())
	}
	// With nothing left to run the workers exit, and the jobs end long
	// before their 10 minutes.
	waitJobsGone(t, sl, 40*time.Second, jobs...)
	for _, job := range jobs {
		if n := strings.Count(sbatchOutput(dir, job), "draining (no shard to run for"); n != 1 {
			t.Errorf("Slurm's output of job %s shows %d idle workers draining, want 1:\n%s", job, n, sbatchOutput(dir, job))
		}
		jobRecordHas(t, sl, job, "NumCPUs=1 ", "MinMemoryNode=356M ", "JobState=COMPLETED ")
	}
	job := jobs[1]
	if b, err := os.ReadFile(filepath.Join(dir, "runs", "t", "slurm", "sbatch.txt")); err != nil || !strings.Contains(string(b), "job "+job+": sbatch --parsable") {
		t.Errorf("sbatch.txt does not record the submission of job %s: %v\n%s", job, err, b)
	}
}

// TestSbatchAcrossNodes: `shardpool sbatch --nodes 2` on a cluster of two
// nodes (two slurmd on this host, each in a UTS namespace under a host
// name of its own: testenv.SlurmOptions.Nodes) makes one job whose srun
// starts one worker on each node. Both serve at once, named after their
// node and the job; both run shards of the run, which completes; then,
// with nothing left to run, both drain and the job ends COMPLETED on both
// nodes.
func TestSbatchAcrossNodes(t *testing.T) {
	sl := testenv.StartSlurm(t, testenv.SlurmOptions{Nodes: 2})
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	dir := t.TempDir()
	const shards = 12
	spec := testenv.WriteJob(t, testenv.Job{Shards: shards, Command: []string{"sh", "-c", `sleep 1; cp "$1" "$2/"`, "sh", "{input}", "{out}"},
		Extra: "[class.cpu]\ncpus = 1\nmemory = \"100MiB\"\n"})
	env.Submit(spec, coordinator.SubmitOptions{})
	job := sbatchJob(t, sl, env.URL, dir, "2 node\\(s\\), each one worker with 1 CPU\\(s\\), 356MiB for 1 slot\\(s\\)",
		"--nodes", "2", "--slots", "1", "--idle-exit", "3s", spec)
	slurmOut := func() string { return sbatchOutput(dir, job) }
	// One worker on each node, both reporting at once, each from its node
	// (the host name its process sees) and named after it.
	var want []slurmWorker
	for _, node := range sl.Nodes {
		want = append(want, slurmWorker{host: node, job: job})
	}
	waitSlurmWorkers(t, env, want, slurmOut)
	rec := env.WaitState("t", 90*time.Second, stream.RunComplete, stream.RunBlocked)
	if rec.State != stream.RunComplete {
		t.Fatalf("run under the workers of job %s: %s (%s), want COMPLETE\nSlurm's output:\n%s", job, rec.State, rec.Reason, slurmOut())
	}
	// Both nodes ran shards: the validated attempts' hosts.
	ran := map[string]int{}
	for i := range shards {
		id := fmt.Sprintf("s%04d", i)
		r, err := env.Shard("t", id)
		if err != nil || r.State != stream.ShardValidated || len(r.Attempts) == 0 {
			t.Fatalf("shard %s: %+v, %v; want validated", id, r, err)
		}
		ran[r.Attempts[len(r.Attempts)-1].Host]++
	}
	for _, node := range sl.Nodes {
		if ran[node] == 0 {
			t.Errorf("no shard ran on node %s: validated attempts by host %v", node, ran)
		}
	}
	waitJobsGone(t, sl, 40*time.Second, job)
	if n := strings.Count(slurmOut(), "draining (no shard to run for"); n != 2 {
		t.Errorf("Slurm's output of job %s shows %d idle workers draining, want 2:\n%s", job, n, slurmOut())
	}
	jobRecordHas(t, sl, job, "NumNodes=2 ", "NodeList=spn[1-2] ", "JobState=COMPLETED ")
}

// TestSbatchNodeThatStopsLeavesTheOthers: on a cluster whose Slurm ends
// a job step when one of its tasks exits non-zero (KillOnBadExit=1, as
// sites set it), the worker of a node that lacks what the command needs
// stops by itself and exits 1, and the worker of the other node goes on
// and completes the run: sbatch's srun says --kill-on-bad-exit=0.
func TestSbatchNodeThatStopsLeavesTheOthers(t *testing.T) {
	sl := testenv.StartSlurm(t, testenv.SlurmOptions{Nodes: 2, KillOnBadExit: true})
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	dir := t.TempDir()
	// Enough for the healthy node to run well after the other stops: it
	// fails 5, holds while they run on spn2, fails 5 more and stops.
	const shards = 60
	spec := testenv.WriteJob(t, testenv.Job{Shards: shards, Retries: 3, Command: []string{"sh", "-c",
		`[ "$(cat /proc/sys/kernel/hostname)" != spn1 ] || { echo "libfoo.so.1: cannot open shared object file" >&2; exit 127; }; sleep 0.3; cp "$1" "$2/"`, "sh", "{input}", "{out}"},
		Extra: "[class.cpu]\ncpus = 1\nmemory = \"100MiB\"\n"})
	env.Submit(spec, coordinator.SubmitOptions{})
	job := sbatchJob(t, sl, env.URL, dir, "2 node\\(s\\), each one worker with 1 CPU\\(s\\), 356MiB for 1 slot\\(s\\)",
		"--nodes", "2", "--slots", "1", "--idle-exit", "3s", spec)
	slurmOut := func() string { return sbatchOutput(dir, job) }
	// spn1's worker hands its failed shards back and stops. --idle-exit
	// is below their retry delays (1, 2 and 4 s): should spn2's worker
	// be idle while they wait in them, it stays for them (they are out:
	// keeping). Before, this test needed 10s.
	testenv.Eventually(t, 120*time.Second, func() (bool, string) {
		rec, err := env.Run("t")
		return err == nil && rec.State == stream.RunComplete, fmt.Sprintf("run under the workers of job %s: %s %+v (%v), want COMPLETE\nSlurm's output:\n%s", job, rec.State, rec.Counts, err, slurmOut())
	})
	bad := worker.DefaultNameFor("spn1", job, "")
	if out := slurmOut(); !strings.Contains(out, "worker "+bad+": its last ") || !strings.Contains(out, "the fault is likely the host's") {
		t.Errorf("Slurm's output of job %s does not say the worker of spn1 stopped and why:\n%s", job, out)
	}
	for i := range shards {
		r, err := env.Shard("t", fmt.Sprintf("s%04d", i))
		if err != nil || r.State != stream.ShardValidated || r.Attempts[len(r.Attempts)-1].Host != "spn2" {
			t.Fatalf("shard s%04d: %+v, %v; want validated on spn2", i, r, err)
		}
	}
	waitJobsGone(t, sl, 40*time.Second, job)
}

// runSbatch runs `shardpool sbatch` on sl for the coordinator at url
// (90 s warning, 10 minutes), with dir as its --data and as the
// worker's state and scratch, and returns what it printed.
func runSbatch(t *testing.T, sl *testenv.Slurm, url, dir string, args ...string) string {
	t.Helper()
	cmd := sl.Command(testenv.Binary(t), append([]string{"sbatch", "--server", url, "--data", dir, "--warn", "90s", "--time", "10m"}, args...)...)
	// The job inherits these (sbatch exports the environment): the
	// worker's state and scratch stay in the test's directory.
	cmd.Env = append(cmd.Env, "XDG_STATE_HOME="+filepath.Join(dir, "state"), "TMPDIR="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("shardpool sbatch %v: %v\n%s", args, err, out)
	}
	return string(out)
}

// sbatchJob submits with runSbatch and returns the job's id, once sbatch
// said it submitted what allocation (a regular expression) describes.
// The job is cancelled at cleanup.
func sbatchJob(t *testing.T, sl *testenv.Slurm, url, dir, allocation string, args ...string) string {
	t.Helper()
	out := runSbatch(t, sl, url, dir, args...)
	m := regexp.MustCompile(`submitted Slurm job (\d+): ` + allocation).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("sbatch did not say it submitted %s:\n%s", allocation, out)
	}
	t.Cleanup(func() {
		_ = sl.Command("scancel", m[1]).Run()
		waitJobsGone(t, sl, 40*time.Second, m[1])
	})
	return m[1]
}

// sbatchOutput is Slurm's output of the jobs of run t that sbatch
// submitted with --data dir.
func sbatchOutput(dir string, jobs ...string) string {
	var b strings.Builder
	for _, job := range jobs {
		out, _ := os.ReadFile(filepath.Join(dir, "runs", "t", "slurm", job+".out"))
		fmt.Fprintf(&b, "== job %s\n%s", job, out)
	}
	return b.String()
}

// waitJobsGone waits until Slurm lists none of jobs.
func waitJobsGone(t *testing.T, sl *testenv.Slurm, limit time.Duration, jobs ...string) {
	t.Helper()
	testenv.Eventually(t, limit, func() (bool, string) {
		q, err := sl.Command("squeue", "-h", "-j", strings.Join(jobs, ",")).CombinedOutput()
		return err != nil || strings.TrimSpace(string(q)) == "", fmt.Sprintf("jobs %v still queued or running:\n%s", jobs, q)
	})
}

// jobRecordHas checks that `scontrol show job` of job says each of wants.
func jobRecordHas(t *testing.T, sl *testenv.Slurm, job string, wants ...string) {
	t.Helper()
	info, err := sl.Command("scontrol", "show", "job", "-o", job).CombinedOutput()
	if err != nil {
		t.Fatalf("scontrol show job %s: %v\n%s", job, err, info)
	}
	for _, want := range wants {
		if !strings.Contains(string(info), want) {
			t.Errorf("job %s: want %q in its record:\n%s", job, want, info)
		}
	}
}

// A slurmWorker is a worker that a Slurm job started on a host, under the
// default name there.
type slurmWorker struct{ host, job string }

// waitSlurmWorkers waits until every one of want reports at once, under
// its default name, from its host and in its job; slurmOut says what
// the jobs printed, for the failure.
func waitSlurmWorkers(t *testing.T, env *testenv.Env, want []slurmWorker, slurmOut func() string) {
	t.Helper()
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		kv, err := env.JS.KeyValue(context.Background(), stream.BucketWorkers)
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, w := range want {
			e, err := kv.Get(context.Background(), worker.DefaultNameFor(w.host, w.job, ""))
			if err != nil {
				continue
			}
			var r stream.WorkerReport
			if stream.Decode(e.Value(), &r) == nil && r.SlurmJob == w.job && r.Host == w.host {
				seen = append(seen, r.Name)
			}
		}
		return len(seen) == len(want), fmt.Sprintf("workers %+v reporting at once: %v\nSlurm's output:\n%s", want, seen, slurmOut())
	})
}
