package worker_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

type noGPUs struct{}

func (noGPUs) Devices(context.Context) ([]probe.GPU, error) { return nil, probe.ErrNVMLMissing }

// fixtureProbe reads the fixture host probe/testdata/v2: cgroup limit 8 GiB
// with 2 GiB used, 4 CPUs of quota, no GPUs.
func fixtureProbe(t *testing.T) *probe.Prober {
	t.Helper()
	root, _ := filepath.Abs("probe/testdata/v2")
	pr, err := probe.New(probe.Config{Root: root, GPUs: noGPUs{}, PolicyPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	return pr
}

// TestAutoAdmissionLiveHeadroomBinds runs real shards on a worker whose
// probe reads a fixture host: cgroup limit 8 GiB with 2 GiB already used,
// 4 CPUs of quota. With a 2 GiB peak the formula allows 4 slots, but the
// live check (6 GiB of headroom minus what running shards may still grow
// to) admits only 3 at once.
func TestAutoAdmissionLiveHeadroomBinds(t *testing.T) {
	env := testenv.New(t, testenv.Options{Auto: true, Slots: map[string]int{}, Probe: fixtureProbe(t)})
	// Each shard runs a second, long enough for admitted shards to overlap
	// even on a busy machine.
	spec := concurrencyJob(t, 7, "1", "[class.cpu]\ncpus = 1\nmemory = \"2GiB\"\n")
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	if maxSeen := maxConcurrent(t, spec, 7); maxSeen != 3 {
		log, _ := os.ReadFile(filepath.Join(env.Data, "admission.log"))
		t.Fatalf("concurrent shards: got %d, want 3 (6 GiB of cgroup headroom / 2 GiB peak)\n%s", maxSeen, log)
	}
	log, _ := os.ReadFile(filepath.Join(env.Data, "admission.log"))
	for _, want := range []string{"slots 4 (cpu binds", "headroom 6.0GiB (cgroup /user.slice limit minus working set, probed ", "peak 2.0GiB (declared (spec))", "decision=wait"} {
		if !strings.Contains(string(log), want) {
			t.Errorf("admission.log lacks %q", want)
		}
	}
	// Each admit line of the run gives the measured decision that let it in.
	runLog, _ := os.ReadFile(filepath.Join(env.Data, "runs", "t", "admission.log"))
	for _, line := range strings.Split(strings.TrimSpace(string(runLog)), "\n") {
		if strings.Contains(line, "decision=admit") && (!strings.Contains(line, "headroom") || strings.Contains(line, "slots from configuration")) {
			t.Errorf("admit line without its measured reason: %s", line)
		}
	}
}

// TestAutoAdmissionMeasuredPeakReservesGrowth: the same host and shards,
// but the 2 GiB peak is measured (profile.json, passed at submit) and none
// is declared. A running shard holds little yet, so the live check must
// still reserve its whole measured peak: 3 at once, not 4.
func TestAutoAdmissionMeasuredPeakReservesGrowth(t *testing.T) {
	env := testenv.New(t, testenv.Options{Auto: true, Slots: map[string]int{}, Probe: fixtureProbe(t)})
	spec := concurrencyJob(t, 7, "1", "")
	env.Submit(spec, coordinator.SubmitOptions{MeasuredMemory: map[string]int64{"cpu": 2 << 30}})
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	if maxSeen := maxConcurrent(t, spec, 7); maxSeen != 3 {
		log, _ := os.ReadFile(filepath.Join(env.Data, "admission.log"))
		t.Fatalf("concurrent shards: got %d, want 3 (6 GiB of cgroup headroom / 2 GiB measured peak)\n%s", maxSeen, log)
	}
}

// TestAutoAdmissionUnknownAdmitsNothing: a host whose cgroup limit cannot
// be read runs nothing, and says why.
func TestAutoAdmissionUnknownAdmitsNothing(t *testing.T) {
	src, _ := filepath.Abs("probe/testdata/v2")
	root := filepath.Join(t.TempDir(), "host")
	if err := os.CopyFS(root, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	// memory.max that exists but cannot be read: a directory in its place.
	f := filepath.Join(root, "sys/fs/cgroup/user.slice/memory.max")
	os.Remove(f)
	os.Mkdir(f, 0o755)
	pr, _ := probe.New(probe.Config{Root: root, GPUs: noGPUs{}, PolicyPath: "/nonexistent"})
	env := testenv.New(t, testenv.Options{Auto: true, Slots: map[string]int{}, Probe: pr})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Extra: "[class.cpu]\ncpus = 1\nmemory = \"1GiB\"\n", Command: []string{"true"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		log, _ := os.ReadFile(filepath.Join(env.Data, "admission.log"))
		return strings.Contains(string(log), "memory budget unknown"), "no wait decision naming the unknown budget yet"
	})
	time.Sleep(time.Second)
	if r, _ := env.Run("t"); r.Counts.Running+r.Counts.Validated != 0 {
		t.Fatalf("counts %+v: shards ran although the memory budget is unknown", r.Counts)
	}
	// status tells why, from the worker's own report.
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		st, err := coordinator.ReadStatus(context.Background(), env.JS, "t")
		if err != nil || len(st.Runs) != 1 {
			return false, fmt.Sprint(err)
		}
		why := strings.Join(st.Runs[0].Waiting, "; ")
		return strings.Contains(why, "class cpu: 2 shard(s) wait: w1: ") && strings.Contains(why, "memory budget unknown"), "waiting: " + why
	})
}

// TestShardOverItsDeclaredMemoryIsKilledInItsOwnCgroup: with per-shard
// cgroups (root on cgroup v1), a shard that outgrows its class's memory is
// OOM-killed alone, the attempt says so exactly, and its peak is recorded.
func TestShardOverItsDeclaredMemoryIsKilledInItsOwnCgroup(t *testing.T) {
	testenv.RequireRoot(t)
	env := testenv.New(t, testenv.Options{})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 0,
		Extra: "[class.cpu]\ncpus = 1\nmemory = \"48MiB\"\n",
		Line: func(i int, in string) string {
			return fmt.Sprintf(`{"id":"m%d","inputs":[%q],"params":{"mib":"%d"}}`, i, in, []int{8, 300}[i])
		},
		Command: []string{"sh", "-c", `head -c "${SHARDPOOL_PARAM_MIB}M" /dev/zero | tail -n 1 > /dev/null`}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 60*time.Second, stream.RunBlocked)
	small, _ := env.Shard("t", "m0")
	big, _ := env.Shard("t", "m1")
	if small.State != stream.ShardValidated || small.Attempts[0].PeakMemory <= 0 || small.Attempts[0].PeakMemory > 48<<20 {
		t.Fatalf("small shard: %s, peak %d; want validated with a measured peak under the limit", small.State, small.Attempts[0].PeakMemory)
	}
	a := big.Attempts[0]
	if big.State != stream.ShardFailed || a.Outcome != stream.OutcomeOOM || !strings.Contains(a.Reason, "its own cgroup") {
		t.Fatalf("big shard: %s %s (%s), want failed by OOM in its own cgroup", big.State, a.Outcome, a.Reason)
	}
}

// TestWhatAShardLeavesRunningEndsWithIt: a command that starts a process
// outside its process group (setsid, as a daemon does) and exits 0. With
// a cgroup of its own per shard (root on cgroup v1), that process is
// killed when the command ends, before the output is judged and
// committed; the attempt record, its log and the admission log say what
// was killed; and no shard cgroup is left behind.
func TestWhatAShardLeavesRunningEndsWithIt(t *testing.T) {
	testenv.RequireRoot(t)
	env := testenv.New(t, testenv.Options{})
	pidDir := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 0,
		Extra: "[class.cpu]\ncpus = 1\nmemory = \"64MiB\"\n",
		// The daemon writes its pid once it has its own session, and keeps
		// the output pipe open, as one started carelessly does.
		Command: []string{"sh", "-c", `f="$0/$SHARDPOOL_SHARD_ID"
setsid sh -c 'echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 300' "$f" &
while [ ! -s "$f" ]; do sleep 0.01; done`, pidDir}})
	t.Cleanup(func() {
		for _, id := range []string{"s0000", "s0001"} {
			if b, err := os.ReadFile(filepath.Join(pidDir, id)); err == nil {
				var pid int
				fmt.Sscan(string(b), &pid)
				if pid > 0 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	for _, id := range []string{"s0000", "s0001"} {
		b, err := os.ReadFile(filepath.Join(pidDir, id))
		if err != nil {
			t.Fatal(err)
		}
		var pid int
		if _, err := fmt.Sscan(string(b), &pid); err != nil || pid <= 0 {
			t.Fatalf("%s: daemon pid %q", id, b)
		}
		if probe.PIDAlive("/proc", pid) {
			t.Errorf("%s: the daemon it started (pid %d) still runs after the shard was validated", id, pid)
		}
		rec, _ := env.Shard("t", id)
		a := rec.Attempts[len(rec.Attempts)-1]
		want := fmt.Sprintf(" (pid %d)", pid)
		if rec.State != stream.ShardValidated || !strings.Contains(a.LeftRunning, want) {
			t.Errorf("%s: %s, left_running %q; want validated, naming %s", id, rec.State, a.LeftRunning, want)
		}
		if log, err := os.ReadFile(a.Log); err != nil || !strings.Contains(string(log), "[shardpool: killed ") || !strings.Contains(string(log), want) {
			t.Errorf("%s: attempt log %s: %q (%v); want a line saying what was killed", id, a.Log, log, err)
		}
	}
	evidence, err := os.ReadFile(filepath.Join(env.Data, "runs", "t", "admission.log"))
	if err != nil || strings.Count(string(evidence), "decision=left-running killed ") != 2 {
		t.Errorf("admission.log: want a left-running line per shard (%v):\n%s", err, evidence)
	}
	// This test's workers' own (goroutines of this process): others on
	// the host are not this test's to judge.
	own := fmt.Sprintf("shardpool-p%d-*", os.Getpid())
	entries, _ := filepath.Glob("/sys/fs/cgroup/memory/*/" + own)
	more, _ := filepath.Glob("/sys/fs/cgroup/memory/*/*/" + own)
	for _, d := range append(entries, more...) {
		if b, err := os.ReadFile(filepath.Join(d, "cgroup.procs")); err == nil && len(strings.TrimSpace(string(b))) > 0 {
			t.Errorf("shard cgroup %s still holds %s", d, strings.TrimSpace(string(b)))
		}
	}
}

// TestFleetCapBoundsAllHosts: two workers with two slots each, and a fleet
// cap of one shard of the class in flight: never more than one runs, and
// status says the cap is why the others wait.
func TestFleetCapBoundsAllHosts(t *testing.T) {
	env := testenv.New(t, testenv.Options{Workers: 2, Slots: map[string]int{"cpu": 2}})
	spec := concurrencyJob(t, 4, "0.5", "")
	env.Submit(spec, coordinator.SubmitOptions{ClassCaps: map[string]int{"cpu": 1}})
	var why string
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		st, err := coordinator.ReadStatus(context.Background(), env.JS, "t")
		if err != nil || len(st.Runs) != 1 {
			return false, fmt.Sprint(err)
		}
		why = strings.Join(st.Runs[0].Waiting, "; ")
		return strings.Contains(why, "fleet cap of 1"), "waiting: " + why
	})
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	// Every shard counts itself, so a maximum of 1 means each ran alone.
	if maxSeen := maxConcurrent(t, spec, 4); maxSeen != 1 {
		t.Fatalf("up to %d shards ran at once, want 1 under a fleet cap of 1", maxSeen)
	}
}

// TestPeakRSSIsTheCommandsOwn: the kernel's peak RSS of a child includes
// the RSS of the process that forked and exec'd it (the worker's), so a
// command smaller than the worker would report the worker's size. An
// attempt records only a peak that is above the worker's own: a small
// command's is left out, a large one's is kept.
func TestPeakRSSIsTheCommandsOwn(t *testing.T) {
	// The large command must outgrow this test binary, which under -race
	// reaches 600 MiB by the end of the package.
	var self syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &self); err != nil {
		t.Fatal(err)
	}
	big := self.Maxrss/1024 + 300 // MiB
	env := testenv.New(t, testenv.Options{})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 0,
		Line: func(i int, in string) string {
			return fmt.Sprintf(`{"id":"m%d","inputs":[%q],"params":{"mib":"%d"}}`, i, in, []int64{0, big}[i])
		},
		// tail holds its one line, all of it, in memory.
		Command: []string{"sh", "-c", `head -c "${SHARDPOOL_PARAM_MIB}M" /dev/zero | tail -n 1 > /dev/null`}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	small, _ := env.Shard("t", "m0")
	large, _ := env.Shard("t", "m1")
	if got := small.Attempts[0].PeakRSS; got != 0 {
		t.Errorf("a command of about 1 MiB recorded peak_rss %s; want none (the kernel's figure is this process's own RSS)", stream.FormatSize(got))
	}
	if got := large.Attempts[0].PeakRSS; got < big<<20 || got > (big+100)<<20 {
		t.Errorf("a command holding %d MiB recorded peak_rss %s; want about that", big, stream.FormatSize(got))
	}
}

// TestPeakOfALongerCommandIsSampled: a command without a cgroup that
// holds less than the worker's own RSS for seconds gets the peak of its
// process group sampled from /proc, where the kernel's figure would say
// only the worker's size (TestPeakRSSIsTheCommandsOwn leaves that out).
// Its class's profile measured far less (a sample that missed the large
// shards): the worker warns, once for the run and class, in the run's
// admission.log.
func TestPeakOfALongerCommandIsSampled(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	// Below this test binary's own peak, so that only the samples can
	// have measured it.
	const mib = 32
	self := peakRSSAbove(t, 3*mib)
	env.Submit(heldMemoryJob(t, "long", 2, mib, "3"), coordinator.SubmitOptions{MeasuredMemory: map[string]int64{"cpu": 4 << 20}})
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	checkSampled(t, env, "long", 2, mib, "3", self)
	runLog, _ := os.ReadFile(filepath.Join(env.Data, "runs", "t", "admission.log"))
	if n := strings.Count(string(runLog), "decision=peak-above"); n != 1 ||
		!strings.Contains(string(runLog), "above the 4.0MiB per shard its admission reserves (measured (profile.json)): more shards may be started than this host can hold once they grow; profile again") {
		t.Errorf("the run's admission.log has %d peak-above line(s), want 1 naming the profile's 4 MiB and what to do:\n%s", n, runLog)
	}
	// What run's verdict repeats: the same, once, for this run alone.
	if said := env.Worker("w1").W.PeaksAbove("t"); len(said) != 1 || !strings.Contains(string(runLog), said[0]) {
		t.Errorf("PeaksAbove(t) = %q, want the one line of the run's admission.log", said)
	}
	if said := env.Worker("w1").W.PeaksAbove("other"); len(said) != 0 {
		t.Errorf("PeaksAbove of another run = %q, want none", said)
	}
}

// peakRSSAbove raises this process's peak RSS (that of the workers the
// tests run in it) to at least mib MiB, touching a buffer that is then
// let go, and returns its rusage: a command smaller than that is told
// apart from the worker only by the samples. Under -race the test binary
// is far larger anyway; without it, it may be 40 MiB.
func peakRSSAbove(t *testing.T, mib int64) syscall.Rusage {
	t.Helper()
	var self syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &self); err != nil {
		t.Fatal(err)
	}
	if self.Maxrss/1024 < mib {
		b := make([]byte, mib<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		runtime.KeepAlive(b)
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &self); err != nil {
			t.Fatal(err)
		}
	}
	if self.Maxrss/1024 < mib {
		t.Fatalf("this process's peak RSS is %d KiB after touching %d MiB", self.Maxrss, mib)
	}
	return self
}

// TestPeakOfASubSecondCommandIsSampled: a command without a cgroup that
// holds less than the worker's own RSS for under a second is sampled a
// quarter of a second after its start. With the first sample after a
// second, shards of a Python job of half a second went unmeasured, and
// the verdict said only "of the 4 measured" of 30.
func TestPeakOfASubSecondCommandIsSampled(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	const mib = 32
	self := peakRSSAbove(t, 3*mib)
	env.Submit(heldMemoryJob(t, "short", 3, mib, "0.8"), coordinator.SubmitOptions{})
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	checkSampled(t, env, "short", 3, mib, "0.8", self)
}

// heldMemoryJob writes a job of shards (prefix0, prefix1, ...) that each
// hold mib MiB for hold seconds: tail keeps its one line, all of it,
// until the sleep ends.
func heldMemoryJob(t *testing.T, prefix string, shards int, mib int64, hold string) string {
	t.Helper()
	return testenv.WriteJob(t, testenv.Job{Shards: shards, Retries: 0,
		Line: func(i int, in string) string {
			return fmt.Sprintf(`{"id":"%s%d","inputs":[%q],"params":{"mib":"%d","hold":%q}}`, prefix, i, in, mib, hold)
		},
		Command: []string{"sh", "-c", `{ head -c "${SHARDPOOL_PARAM_MIB}M" /dev/zero; sleep "$SHARDPOOL_PARAM_HOLD"; } | tail -n 1 > /dev/null`}})
}

// checkSampled fails the test where a heldMemoryJob's shard recorded a
// peak other than about its mib MiB.
func checkSampled(t *testing.T, env *testenv.Env, prefix string, shards int, mib int64, hold string, self syscall.Rusage) {
	t.Helper()
	for i := range shards {
		id := fmt.Sprintf("%s%d", prefix, i)
		rec, _ := env.Shard("t", id)
		if got := rec.Attempts[0].PeakRSS; got < mib<<20 || got > (mib+32)<<20 {
			t.Errorf("%s, a command holding %d MiB for %s s (below the worker's own %d MiB) in %s, recorded peak_rss %s; want about %d MiB, sampled",
				id, mib, hold, self.Maxrss/1024, time.Duration(rec.Attempts[0].Duration).Round(time.Millisecond), stream.FormatSize(got), mib)
		}
	}
}

// TestWorkersOfOneHostShareItsBudget: two auto-mode workers on one host
// (the fixture: 4 CPUs of quota) share its budget through the host
// ledger. Each alone would admit 4 one-CPU shards, 8 at once together;
// sharing, never more than 4 run at once, and both workers take part.
func TestWorkersOfOneHostShareItsBudget(t *testing.T) {
	env := testenv.New(t, testenv.Options{Workers: 2, Auto: true, Slots: map[string]int{}, Probe: fixtureProbe(t)})
	spec := concurrencyJob(t, 12, "1", "[class.cpu]\ncpus = 1\nmemory = \"256MiB\"\n")
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	log, _ := os.ReadFile(filepath.Join(env.Data, "admission.log"))
	if maxSeen := maxConcurrent(t, spec, 12); maxSeen != 4 {
		t.Fatalf("concurrent shards on one host of 4 CPUs with two workers: got %d, want 4\n%s", maxSeen, log)
	}
	if ran := shardsPerWorker(t, env, 12); len(ran) != 2 {
		t.Errorf("shards ran on %v; want both workers", ran)
	}
	if !strings.Contains(string(log), "shared with w") || !strings.Contains(string(log), "on this host") {
		t.Errorf("admission.log does not say the budget is shared:\n%s", log)
	}
}

// TestDrainedQueueHoldsOneShardsRoom: once a class's queue is empty, a
// worker keeps one fetch open for the next shard, not one per free slot,
// so that what it holds in the host ledger is what runs plus one shard:
// two workers with 4 CPUs each and one long shard hold 1 + 1 and 1 CPU,
// not 4 each.
func TestDrainedQueueHoldsOneShardsRoom(t *testing.T) {
	env := testenv.New(t, testenv.Options{Workers: 2, Auto: true, Slots: map[string]int{}, Probe: fixtureProbe(t)})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Command: []string{"sleep", "4"}, Extra: "[class.cpu]\ncpus = 1\nmemory = \"256MiB\"\n"})
	env.Submit(spec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		ws, err := worker.HostWorkers(testenv.LedgerDir(t))
		var total int64
		for _, w := range ws {
			total += w.CPU
		}
		return err == nil && len(ws) == 2 && total == 3000, fmt.Sprintf("%+v (%v)", ws, err)
	})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
}

// TestMoreWorkersThanSlotsTakeTurns: three workers on a host with room
// for two shards at once (4 CPUs, two each): a worker whose shard ended
// lets one that has waited longer go first, so none waits for good while
// the other two refill at once.
func TestMoreWorkersThanSlotsTakeTurns(t *testing.T) {
	env := testenv.New(t, testenv.Options{Workers: 3, Auto: true, Slots: map[string]int{}, Probe: fixtureProbe(t)})
	spec := concurrencyJob(t, 12, "0.5", "[class.cpu]\ncpus = 2\nmemory = \"256MiB\"\n")
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	log, _ := os.ReadFile(filepath.Join(env.Data, "admission.log"))
	if maxSeen := maxConcurrent(t, spec, 12); maxSeen > 2 {
		t.Fatalf("concurrent shards with room for 2: got %d\n%s", maxSeen, log)
	}
	ran := shardsPerWorker(t, env, 12)
	t.Logf("shards per worker: %v", ran)
	for _, w := range []string{"w1", "w2", "w3"} {
		if ran[w] < 2 {
			t.Errorf("worker %s ran %d of 12 shards (%v); want each its turn", w, ran[w], ran)
		}
	}
}

// TestLargeShardsAreNotStarvedBySmallOnes: two runs on one host (4 CPUs),
// each with a worker of its own coordinator: one of small shards (one CPU
// each) started first, one whose shards need the whole host. The small
// run's worker lets the large one go first once its shards have ended,
// instead of refilling at once, so the large run finishes first; before,
// it waited for the small run's whole queue.
func TestLargeShardsAreNotStarvedBySmallOnes(t *testing.T) {
	small := testenv.New(t, testenv.Options{Auto: true, Slots: map[string]int{}, Probe: fixtureProbe(t)})
	large := testenv.New(t, testenv.Options{Auto: true, Slots: map[string]int{}, Probe: fixtureProbe(t)})
	smallSpec := concurrencyJob(t, 24, "0.5", "[class.cpu]\ncpus = 1\nmemory = \"256MiB\"\n")
	largeSpec := testenv.WriteJob(t, testenv.Job{Shards: 2, Command: []string{"sleep", "0.5"}, Extra: "[class.cpu]\ncpus = 4\nmemory = \"256MiB\"\n"})
	small.Submit(smallSpec, coordinator.SubmitOptions{})
	time.Sleep(time.Second)
	large.Submit(largeSpec, coordinator.SubmitOptions{})
	large.WaitState("t", 60*time.Second, stream.RunComplete)
	st, err := coordinator.ReadStatus(context.Background(), small.JS, "t")
	if err != nil || len(st.Runs) != 1 {
		t.Fatalf("small run status: %v", err)
	}
	log, _ := os.ReadFile(filepath.Join(small.Data, "admission.log"))
	if c := st.Runs[0].Counts; c.Validated >= 20 {
		t.Fatalf("the large run finished after %d of the small run's 24 shards; want it let in early\n%s", c.Validated, log)
	}
	if !strings.Contains(string(log), "letting w1 (pid ") {
		t.Errorf("the small run's admission.log does not say it let the large shard go first:\n%s", log)
	}
	small.WaitState("t", 60*time.Second, stream.RunComplete)
}

// shardsPerWorker counts, per worker, the shards of run t (s0000 on) whose
// last attempt it ran.
func shardsPerWorker(t *testing.T, env *testenv.Env, shards int) map[string]int {
	t.Helper()
	ran := map[string]int{}
	for i := range shards {
		rec, err := env.Shard("t", fmt.Sprintf("s%04d", i))
		if err != nil || len(rec.Attempts) == 0 {
			t.Fatalf("shard %d: %+v (%v)", i, rec, err)
		}
		ran[rec.Attempts[len(rec.Attempts)-1].Worker]++
	}
	return ran
}

// TestAutoWorkerCountsAFixedWorkersShards: a worker with fixed slots
// (another run on the host, `--slots 4`) admits as configured but writes
// what its shards hold to the host ledger, so an auto worker beside it
// (4 CPUs) waits while those hold the CPUs instead of running 4 more.
func TestAutoWorkerCountsAFixedWorkersShards(t *testing.T) {
	fixed := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 4}, Probe: fixtureProbe(t)})
	auto := testenv.New(t, testenv.Options{Auto: true, Slots: map[string]int{}, Probe: fixtureProbe(t)})
	fixedSpec := concurrencyJob(t, 4, "3", "[class.cpu]\ncpus = 1\nmemory = \"64MiB\"\n")
	fixed.Submit(fixedSpec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		st, err := coordinator.ReadStatus(context.Background(), fixed.JS, "t")
		return err == nil && len(st.Runs) == 1 && st.Runs[0].Counts.Running == 4, fmt.Sprint(st, err)
	})
	autoSpec := concurrencyJob(t, 2, "0.2", "[class.cpu]\ncpus = 1\nmemory = \"64MiB\"\n")
	auto.Submit(autoSpec, coordinator.SubmitOptions{})
	auto.WaitState("t", 30*time.Second, stream.RunComplete)
	log, _ := os.ReadFile(filepath.Join(auto.Data, "admission.log"))
	if !strings.Contains(string(log), "(4.00 CPUs - 4.00 CPUs shared) / 1.00 CPUs peak = 0") {
		t.Fatalf("the auto worker did not count the fixed worker's 4 one-CPU shards:\n%s", log)
	}
	if st, err := coordinator.ReadStatus(context.Background(), fixed.JS, "t"); err != nil || st.Runs[0].Counts.Validated != 4 {
		t.Fatalf("the auto run completed before the fixed run's shards ended: %+v (%v)", st, err)
	}
}

// TestAnIdleFixedWorkerHoldsOneFetch: a worker with fixed slots whose
// run is BLOCKED (an active run of the class, nothing queued) keeps one
// fetch open, not one for each of its 4 slots: an open fetch counts as
// held in the host ledger, and 4 of them kept an auto worker beside it on
// the fixture's 4 CPUs from admitting anything for as long as the
// BLOCKED run stayed (found by hand: `shardpool run` beside an idle
// `shardpool worker --slots 2` waited without end on 2 CPUs).
func TestAnIdleFixedWorkerHoldsOneFetch(t *testing.T) {
	fixed := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 4}, Probe: fixtureProbe(t)})
	auto := testenv.New(t, testenv.Options{Auto: true, Slots: map[string]int{}, Probe: fixtureProbe(t)})
	class := "[class.cpu]\ncpus = 1\nmemory = \"64MiB\"\n"
	fixed.Submit(testenv.WriteJob(t, testenv.Job{Shards: 1, Command: []string{"false"}, Extra: class}), coordinator.SubmitOptions{})
	fixed.WaitState("t", 30*time.Second, stream.RunBlocked)
	// Its first fetch asked for 4 and brought the one shard; it stays
	// open for the rest until its expiry (FetchWait, 500 ms here).
	time.Sleep(time.Second)
	auto.Submit(concurrencyJob(t, 4, "0.2", class), coordinator.SubmitOptions{})
	auto.WaitState("t", 30*time.Second, stream.RunComplete)
	log, _ := os.ReadFile(filepath.Join(auto.Data, "admission.log"))
	if !strings.Contains(string(log), "(4.00 CPUs - 1.00 CPUs shared) / 1.00 CPUs peak = 3") {
		t.Fatalf("the auto worker did not count the idle fixed worker's one open fetch alone:\n%s", log)
	}
}

// TestAutoWorkerStartsANewRunAtOnce: an auto-mode worker learns of runs
// and their classes from the runs bucket. On its report period alone, a
// run submitted to an idle worker waited up to that period (5 s by
// default) before its first shard; the worker watches the bucket, so the
// run starts as it is submitted. The period here is a minute, which the
// run would otherwise wait out.
func TestAutoWorkerStartsANewRunAtOnce(t *testing.T) {
	env := testenv.New(t, testenv.Options{Auto: true, Slots: map[string]int{}, Probe: fixtureProbe(t), ReportEvery: time.Minute})
	// Let the worker's first look at the (empty) runs bucket pass.
	time.Sleep(500 * time.Millisecond)
	spec := concurrencyJob(t, 2, "0", "[class.cpu]\ncpus = 1\nmemory = \"64MiB\"\n")
	start := time.Now()
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	if took := time.Since(start); took > 20*time.Second {
		t.Fatalf("run completed %s after its submission, want well under the worker's 1m report period", took.Round(time.Millisecond))
	}
}

// TestWorkersTakeTurnsWithoutPolling: two auto-mode workers on one host
// whose shards each take the whole budget (the fixture's 4 CPUs) take
// turns. The worker whose turn comes learns that the other's shard ended
// from the other's write to the host ledger. Polled alone, every turn
// waited up to the recheck period (two runs of 40 shards of 50 ms each took
// 10.7 s, against 5.3 s for one run of 80). The period here is a minute,
// which no turn may wait out.
func TestWorkersTakeTurnsWithoutPolling(t *testing.T) {
	env := testenv.New(t, testenv.Options{Workers: 2, Auto: true, Slots: map[string]int{}, Probe: fixtureProbe(t), Recheck: time.Minute})
	spec := concurrencyJob(t, 8, "0.2", "[class.cpu]\ncpus = 4\nmemory = \"256MiB\"\n")
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 40*time.Second, stream.RunComplete)
	if ran := shardsPerWorker(t, env, 8); len(ran) != 2 {
		t.Errorf("shards ran on %v; want both workers, taking turns", ran)
	}
	if maxSeen := maxConcurrent(t, spec, 8); maxSeen != 1 {
		t.Errorf("concurrent shards that each take the whole budget: got %d, want 1", maxSeen)
	}
}

// TestPeaksSeenReachEveryWorker: the coordinator keeps the largest peak
// each class's attempts recorded in the run record, and a worker that
// never ran a shard of the run admits by it. A run profiled at 32 MiB
// whose shards hold 200 MiB, on a fixture host of 512 MiB of headroom:
// w1 (one slot) runs the first; w2, started once the record has its
// peak, makes its first decision by it, not by the profile's figure.
func TestPeaksSeenReachEveryWorker(t *testing.T) {
	pr := worker.FixtureWithHeadroom(t, 512)
	env := testenv.New(t, testenv.Options{Auto: true, Slots: map[string]int{"cpu": 1}, Probe: pr})
	env.Submit(heldMemoryJob(t, "h", 5, 200, "1.5"), coordinator.SubmitOptions{MeasuredMemory: map[string]int64{"cpu": 32 << 20}})
	var seen stream.PeakSeen
	testenv.Eventually(t, 60*time.Second, func() (bool, string) {
		r, err := env.Run("t")
		seen = r.PeaksSeen["cpu"]
		return err == nil && seen.Bytes > 0, fmt.Sprintf("the run record's peaks_seen: %+v (%v)", r.PeaksSeen, err)
	})
	if seen.Bytes < 200<<20 || seen.Bytes > 240<<20 || !strings.HasPrefix(seen.Shard, "h") {
		t.Fatalf("peaks_seen of class cpu: %s of shard %q, want about 200 MiB of one of the run's shards", stream.FormatSize(seen.Bytes), seen.Shard)
	}
	env.StartWorker("w2", map[string]int{})
	env.WaitState("t", 90*time.Second, stream.RunComplete)
	log, _ := os.ReadFile(filepath.Join(env.Data, "admission.log"))
	var first string
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "worker=w2 ") && strings.Contains(line, "decision=fetch") {
			first = line
			break
		}
	}
	if want := "(learned from shard " + seen.Shard + ", above the 32.0MiB measured (profile.json))"; !strings.Contains(first, want) {
		t.Errorf("w2's first fetch decision does not go by the peak the run record gave (%q):\n%s\nadmission.log:\n%s", want, first, log)
	}
}
