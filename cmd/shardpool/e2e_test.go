package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

// cluster is a coordinator process and a client connection to it.
type cluster struct {
	t     *testing.T
	data  string
	addr  string
	url   string
	coord *testenv.Proc
	nc    *nats.Conn
	js    jetstream.JetStream
}

func startCluster(t *testing.T, leaseTTL string) *cluster {
	c := newCluster(t)
	c.startCoordinator(leaseTTL)
	c.connect()
	return c
}

// newCluster picks the cluster's address; nothing runs yet.
func newCluster(t *testing.T) *cluster {
	c := &cluster{t: t, data: t.TempDir(), addr: testenv.FreePort(t)}
	c.url = "nats://" + c.addr
	return c
}

// token is the file holding the coordinator's token, which every client
// presents.
func (c *cluster) token() string { return filepath.Join(c.data, "jetstream", coordinator.TokenName) }

// connect gives the test its own connection to the coordinator.
func (c *cluster) connect() {
	tok, err := coordinator.ReadToken(c.token())
	if err != nil {
		c.t.Fatal(err)
	}
	opts := []nats.Option{nats.Token(tok), nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond)}
	if ca := filepath.Join(c.data, "jetstream", coordinator.CAName); isFile(ca) {
		tc, err := coordinator.ClientTLS(ca)
		if err != nil {
			c.t.Fatal(err)
		}
		opts = append(opts, nats.Secure(tc))
	}
	nc, err := nats.Connect(c.url, opts...)
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(nc.Close)
	c.nc = nc
	c.js, _ = jetstream.New(nc)
}

func (c *cluster) startCoordinator(leaseTTL string, extra ...string) {
	c.coord = testenv.Start(c.t, append([]string{"coordinator", "--data", c.data, "--listen", c.addr, "--http", "", "--lease-ttl", leaseTTL}, extra...)...)
	testenv.Eventually(c.t, 20*time.Second, func() (bool, string) {
		return strings.Contains(c.coord.Output(), "coordinator ready"), "coordinator output: " + c.coord.Output()
	})
}

// waitComplete waits for run t to be COMPLETE; a failure says what each
// shard's record holds and what the workers printed, newest first.
func (c *cluster) waitComplete(t *testing.T, timeout time.Duration, workers ...*testenv.Proc) {
	t.Helper()
	testenv.Eventually(t, timeout, func() (bool, string) {
		r, err := stream.ReadRun(context.Background(), c.js, "t")
		if err == nil && r.State == stream.RunComplete {
			return true, ""
		}
		var b strings.Builder
		fmt.Fprintf(&b, "run t is %s %+v (%v)", r.State, r.Counts, err)
		for i := range r.Counts.Total {
			id := fmt.Sprintf("s%04d", i)
			sh, _ := testenv.ReadShard(c.js, "t", id)
			fmt.Fprintf(&b, "; %s %s %+v", id, sh.State, sh.Attempts)
		}
		for _, w := range workers {
			fmt.Fprintf(&b, "\nworker:\n%s", w.Output())
		}
		return false, b.String()
	})
}

func (c *cluster) worker(name string, extra ...string) *testenv.Proc {
	return c.workerEnv(name, nil, extra...)
}

// workerEnv is worker with env added to its environment.
func (c *cluster) workerEnv(name string, env []string, extra ...string) *testenv.Proc {
	args := append([]string{"worker", "--server", c.url, "--token-file", c.token(), "--name", name, "--data", filepath.Join(c.data, "w-"+name),
		"--scratch", filepath.Join(c.data, "scratch-"+name), "--grace", "2s"}, extra...)
	return testenv.StartEnv(c.t, env, args...)
}

func (c *cluster) submit(spec string, extra ...string) string {
	p := testenv.Start(c.t, append(append([]string{"submit", "--server", c.url, "--token-file", c.token()}, extra...), spec)...)
	if code := p.Wait(c.t, 30*time.Second); code != 0 {
		c.t.Fatalf("submit exit %d:\n%s", code, p.Output())
	}
	return p.Output()
}

// bounceCoordinator SIGKILLs the coordinator and starts it again on its
// data after away.
func (c *cluster) bounceCoordinator(away time.Duration, leaseTTL string) {
	c.coord.SignalMain(syscall.SIGKILL)
	c.coord.Wait(c.t, 10*time.Second)
	time.Sleep(away)
	c.startCoordinator(leaseTTL)
}

// TestDaemonsSayWhatTheyHoldAndDid: SIGTERM stops a coordinator with
// exit 0 and a line that says its runs are kept and how to go on (its
// output used to end at its last run state, as if it had died); started
// again as the line says, it names the run it goes on with, which
// completes. A submission is on its output too, once: the same spec
// submitted again changes nothing and says nothing. The worker, which
// said nothing of the shards it ran, names the run's evidence directory
// and, stopping, what it ended.
func TestDaemonsSayWhatTheyHoldAndDid(t *testing.T) {
	c := startCluster(t, "20s")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Command: []string{"cp", "{input}", "{out}/"}})
	c.submit(spec)
	c.submit(spec)
	testenv.WaitState(t, c.js, "t", 20*time.Second, stream.RunQueued)
	if n := strings.Count(c.coord.Output(), `msg="run submitted" component=coordinator run=t fingerprint=`); n != 1 {
		t.Errorf("coordinator output after two submissions of one spec: %d 'run submitted' lines, want 1\n%s", n, c.coord.Output())
	}
	c.coord.SignalMain(syscall.SIGTERM)
	if code := c.coord.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("coordinator stopped with SIGTERM: exit %d, want 0\n%s", code, c.coord.Output())
	}
	want := "coordinator stopped by SIGTERM: the store and every run's state stay in " + c.data +
		"; `shardpool coordinator --data " + c.data + "` (with the same flags) goes on where it stopped"
	if !strings.Contains(c.coord.Output(), want) {
		t.Fatalf("coordinator output after SIGTERM:\n%s\nwant a line with %q", c.coord.Output(), want)
	}
	c.startCoordinator("20s")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		return strings.Contains(c.coord.Output(), `msg="runs in the store" component=coordinator complete=0 unfinished="t QUEUED 0/3 validated"`),
			"restarted coordinator's output, want the run it holds:\n" + c.coord.Output()
	})
	// A worker given a relative --data (started in c.data): what it
	// records and prints names its evidence by the absolute path, which
	// status prints on other hosts and in other directories.
	w := testenv.StartCmd(t, "/bin/sh", "-c", `cd "$0" && exec "$@"`, c.data, testenv.Binary(t), "worker", "--server", c.url, "--token-file", c.token(),
		"--name", "w1", "--data", "w-w1", "--scratch", filepath.Join(c.data, "scratch-w1"), "--grace", "2s", "--slots", "cpu=1")
	c.completesOnce(spec, 3, 60*time.Second)
	// The worker names where the run's evidence is when it first decides
	// about it, and what it ended when it stops.
	evidence := filepath.Join(c.data, "w-w1", "runs")
	w.SignalMain(syscall.SIGTERM)
	if code := w.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("worker stopped with SIGTERM: exit %d\n%s", code, w.Output())
	}
	for _, want := range []string{
		`msg="serving a run: its admission decisions and attempt logs on this host are in its evidence directory" component=worker worker=w1 run=t evidence=` + filepath.Join(evidence, "t"),
		"worker w1 stopped; since it started: run t 3 validated, 0 failed; evidence on this host in " + filepath.Join(evidence, "<run>"),
	} {
		if !strings.Contains(w.Output(), want) {
			t.Errorf("worker output:\n%s\nwant a line with %q", w.Output(), want)
		}
	}
}

// completesOnce waits for run t of spec to be COMPLETE with its n shards
// validated, each once, every output verified (validatedOnce).
func (c *cluster) completesOnce(spec string, n int, within time.Duration) {
	c.t.Helper()
	r := testenv.WaitState(c.t, c.js, "t", within, stream.RunComplete)
	if r.Counts.Validated != n {
		c.t.Fatalf("validated: got %d, want %d", r.Counts.Validated, n)
	}
	validatedOnce(c.t, c.js, "t", filepath.Join(filepath.Dir(spec), "out"), n)
}

// validatedOnce checks the KV history: each shard was recorded validated
// exactly once, and its output verifies with the run's fingerprint.
func validatedOnce(t *testing.T, js jetstream.JetStream, run, outDir string, n int) {
	t.Helper()
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, stream.BucketShards)
	if err != nil {
		t.Fatal(err)
	}
	r, err := stream.ReadRun(ctx, js, run)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		id := fmt.Sprintf("s%04d", i)
		hist, err := kv.History(ctx, stream.ShardKey(run, id))
		if err != nil {
			t.Fatalf("history of %s: %v", id, err)
		}
		if validated := len(stream.Validations(hist, r.Fingerprint)); validated != 1 {
			t.Errorf("shard %s recorded validated %d times, want exactly 1", id, validated)
		}
		mk, err := checkpoint.Verify(filepath.Join(outDir, id))
		if err != nil || mk.Fingerprint != r.Fingerprint {
			t.Errorf("output %s: %v (fingerprint %s, want %s)", id, err, mk.Fingerprint, r.Fingerprint)
		}
	}
}

func TestWorkerSIGKILLMidShardIsRedeliveredAndCompletesOnce(t *testing.T) {
	c := startCluster(t, "2s")
	started := filepath.Join(t.TempDir(), "started")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Retries: 2,
		Command: []string{"sh", "-c", `echo "$1" >> "$2"; sleep 1.5; cp "$3" "$4/"`, "sh", "{id}", started, "{input}", "{out}"}})
	c.submit(spec)
	w1 := c.worker("w1", "--slots", "cpu=3")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(started)
		return strings.Count(string(b), "\n") >= 3, "shards not started yet"
	})
	w1.SignalMain(syscall.SIGKILL)
	if code := w1.Wait(t, 10*time.Second); code != -1 {
		t.Fatalf("worker exit: got %d, want killed", code)
	}
	// Its children die with it (parent-death signal): no output appears.
	time.Sleep(2 * time.Second)
	out := filepath.Join(filepath.Dir(spec), "out")
	if ents, _ := os.ReadDir(out); len(ents) > 1 {
		t.Fatalf("outputs appeared after the worker was killed: %d entries", len(ents))
	}
	c.worker("w2", "--slots", "cpu=3")
	testenv.WaitState(t, c.js, "t", 60*time.Second, stream.RunComplete)
	validatedOnce(t, c.js, "t", out, 3)
	rec, _ := testenv.ReadShard(c.js, "t", "s0000")
	if len(rec.Attempts) != 2 || rec.Attempts[0].Outcome != stream.OutcomeLost || rec.Attempts[1].Worker != "w2" {
		t.Fatalf("attempts: got %+v, want a lost attempt on w1 then w2", rec.Attempts)
	}
}

// TestWorkerSIGKILLMidShardWithoutRetriesFailsTheShard: with retries = 0
// the one attempt of a shard whose worker was killed is charged once its
// owner is proven gone (the next worker on the host finds its process
// gone), and the shard fails as out of attempts: its command is not run
// again, and the run ends BLOCKED naming the command that retries it.
// The attempt limit waits for the lease (see the worker's
// TestRedeliveryAtTheAttemptLimitWaitsForTheRunningAttempt); this is the
// case where that wait ends with the owner gone.
func TestWorkerSIGKILLMidShardWithoutRetriesFailsTheShard(t *testing.T) {
	c := startCluster(t, "2s")
	started := filepath.Join(t.TempDir(), "started")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0,
		Command: []string{"sh", "-c", `echo "$1" >> "$2"; exec sleep 300`, "sh", "{id}", started}})
	c.submit(spec)
	w1 := c.worker("w1", "--slots", "cpu=1")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(started)
		return len(b) > 0, "the shard has not started yet"
	})
	w1.SignalMain(syscall.SIGKILL)
	w1.Wait(t, 10*time.Second)
	c.worker("w2", "--slots", "cpu=1")
	r := testenv.WaitState(t, c.js, "t", 30*time.Second, stream.RunBlocked, stream.RunComplete)
	if r.State != stream.RunBlocked || !strings.Contains(r.Reason, "attempt limit 1 reached") || !strings.Contains(r.Reason, "--retry-failed") {
		t.Fatalf("run %s: %s; want BLOCKED, the attempt limit reached, and the retry command", r.State, r.Reason)
	}
	if b, _ := os.ReadFile(started); strings.Count(string(b), "\n") != 1 {
		t.Fatalf("the command started %d times, want once", strings.Count(string(b), "\n"))
	}
	rec, err := testenv.ReadShard(c.js, "t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != stream.ShardFailed || len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeLost || rec.Attempts[0].Worker != "w1" {
		t.Fatalf("shard %s, attempts %+v; want failed after w1's one attempt, lost", rec.State, rec.Attempts)
	}
}

// TestOrphansOfAKilledWorkerAreReaped: a SIGKILLed worker's commands die
// with it (Pdeathsig), but what they started lives on in their process
// groups, and what left those groups (setsid) lives on elsewhere. Another
// worker on the host with the same state directory kills both when it
// starts, from the dead worker's journal (the latter by the attempt its
// environment names), and removes the dead worker's scratch pairs.
func TestOrphansOfAKilledWorkerAreReaped(t *testing.T) {
	c := startCluster(t, "4s")
	pids := filepath.Join(t.TempDir(), "pids")
	daemons := filepath.Join(t.TempDir(), "daemons")
	state := filepath.Join(t.TempDir(), "state")
	// The first attempt leaves a descendant running and waits for it,
	// after starting a daemon in a session of its own; a later attempt
	// finishes at once.
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 2, Command: []string{"sh", "-c",
		`if [ "$SHARDPOOL_ATTEMPT" = 1 ]; then setsid sh -c 'echo $$ >> "$0"; exec sleep 299' "$4" </dev/null >/dev/null 2>&1 & sleep 300 & echo $! >> "$1"; wait; fi; cp "$2" "$3/"`,
		"sh", pids, "{input}", "{out}", daemons}})
	c.submit(spec)
	w1 := c.worker("w1", "--slots", "cpu=2", "--data", state)
	var orphans []int
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		orphans = nil
		for _, file := range []string{pids, daemons} {
			b, _ := os.ReadFile(file)
			for _, f := range strings.Fields(string(b)) {
				var pid int
				fmt.Sscan(f, &pid)
				orphans = append(orphans, pid)
			}
		}
		return len(orphans) == 4, "descendants not started yet"
	})
	c.journalHolds(state, 2)
	t.Cleanup(func() {
		for _, pid := range orphans {
			// Should the test fail before w2 reaps them; a pid reused since
			// by another program is left alone.
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && (strings.HasPrefix(string(b), "sleep\x00300") || strings.HasPrefix(string(b), "sleep\x00299")) {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	w1.SignalMain(syscall.SIGKILL)
	w1.Wait(t, 10*time.Second)
	time.Sleep(500 * time.Millisecond)
	for _, pid := range orphans {
		if syscall.Kill(pid, 0) != nil {
			t.Fatalf("descendant %d died with the worker: the test does not reproduce an orphan", pid)
		}
	}
	w1Scratch := filepath.Join(c.data, "scratch-w1")
	pairs, _ := filepath.Glob(filepath.Join(w1Scratch, "t", fmt.Sprintf("p%d-*", w1.Cmd.Process.Pid)))
	if len(pairs) == 0 {
		t.Fatal("the killed worker left no scratch pairs: nothing to check their removal against")
	}
	c.worker("w2", "--slots", "cpu=2", "--data", state)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		for _, pid := range orphans {
			if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && !strings.Contains(string(b), ") Z ") {
				log, _ := os.ReadFile(filepath.Join(state, "admission.log"))
				return false, fmt.Sprintf("descendant %d of the killed worker still runs; w2's admission.log:\n%s", pid, log)
			}
		}
		return true, ""
	})
	// The pairs go after the groups are killed (and the dead worker's
	// shards handed back): a moment later, not at once.
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		left, _ := filepath.Glob(filepath.Join(w1Scratch, "t", fmt.Sprintf("p%d-*", w1.Cmd.Process.Pid)))
		return len(left) == 0, fmt.Sprintf("the killed worker's scratch pairs are still there: %v", left)
	})
	log, _ := os.ReadFile(filepath.Join(state, "admission.log"))
	if strings.Count(string(log), "decision=reap ") != 3 || !strings.Contains(string(log), "killed 2 process(es) that attempts of worker pid "+strconv.Itoa(w1.Cmd.Process.Pid)) {
		t.Errorf("w2's admission.log does not record two reaped groups and the two daemons:\n%s", log)
	}
	testenv.WaitState(t, c.js, "t", 60*time.Second, stream.RunComplete)
}

// TestOrphansInADeadWorkersCgroupAreKilled: a SIGKILLed worker's command
// left a descendant running in its shard cgroup, and no worker of its
// state directory starts again. A worker of another state directory on
// the host kills it as it starts, says so in its own admission.log, and
// removes the cgroup. Before, it ran to its end.
func TestOrphansInADeadWorkersCgroupAreKilled(t *testing.T) {
	testenv.RequireRoot(t)
	c := startCluster(t, "4s")
	pids := filepath.Join(t.TempDir(), "pids")
	c.submit(testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 2, Extra: "[class.cpu]\ncpus = 1\nmemory = \"64MiB\"\n", Command: []string{"sh", "-c",
		`if [ "$SHARDPOOL_ATTEMPT" = 1 ]; then sleep 298 & echo $! >> "$1"; wait; fi; cp "$2" "$3/"`, "sh", pids, "{input}", "{out}"}}))
	w1 := c.worker("w1", "--slots", "cpu=1")
	var orphan int
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(pids)
		_, err := fmt.Sscan(string(b), &orphan)
		return err == nil && orphan > 0, "descendant not started yet"
	})
	c.journalHolds(filepath.Join(c.data, "w-w1"), 1)
	t.Cleanup(func() {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", orphan)); err == nil && strings.HasPrefix(string(b), "sleep\x00298") {
			syscall.Kill(orphan, syscall.SIGKILL)
		}
	})
	// Its shard cgroup, from its memory controller's line
	// ("7:memory:/.../shardpool-p<w1>-1").
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", orphan))
	if err != nil {
		t.Fatal(err)
	}
	shardCgroup := ""
	for _, line := range strings.Split(string(cg), "\n") {
		if parts := strings.SplitN(line, ":", 3); len(parts) == 3 && strings.Contains(","+parts[1]+",", ",memory,") &&
			strings.Contains(parts[2], fmt.Sprintf("/shardpool-p%d-", w1.Cmd.Process.Pid)) {
			shardCgroup = filepath.Join("/sys/fs/cgroup/memory", parts[2])
		}
	}
	if shardCgroup == "" {
		t.Fatalf("descendant %d is in no cgroup v1 memory cgroup of w1's shards (this test needs per-shard cgroups, as root on cgroup v1):\n%s", orphan, cg)
	}
	w1.SignalMain(syscall.SIGKILL)
	w1.Wait(t, 10*time.Second)
	time.Sleep(500 * time.Millisecond)
	if syscall.Kill(orphan, 0) != nil {
		t.Fatalf("descendant %d died with the worker: the test does not reproduce an orphan", orphan)
	}
	w2 := c.worker("w2", "--slots", "cpu=1")
	log := filepath.Join(c.data, "w-w2", "admission.log")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", orphan)); err == nil && !strings.Contains(string(b), ") Z ") {
			l, _ := os.ReadFile(log)
			return false, fmt.Sprintf("descendant %d of the killed worker still runs; w2's admission.log:\n%s", orphan, l)
		}
		// The line goes out once the cgroup is empty, a moment after.
		l, _ := os.ReadFile(log)
		want := fmt.Sprintf("decision=reap killed sleep (pid %d) left running in cgroup %s by worker pid %d, which died", orphan, shardCgroup, w1.Cmd.Process.Pid)
		return strings.Contains(string(l), want), fmt.Sprintf("w2's admission.log does not say it killed the orphan (%q):\n%s\nw2:\n%s", want, l, w2.Output())
	})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		_, err := os.Stat(shardCgroup)
		return os.IsNotExist(err), fmt.Sprintf("w1's shard cgroup %s: %v, want it removed", shardCgroup, err)
	})
	testenv.WaitState(t, c.js, "t", 60*time.Second, stream.RunComplete)
}

// A worker started before its coordinator (a scheduler starts both at
// once) waits for it and then serves; without a wait it fails at once,
// saying what is missing.
func TestWorkerWaitsForItsCoordinator(t *testing.T) {
	c := newCluster(t)
	p := c.worker("early", "--slots", "cpu=1", "--connect-wait", "0")
	if code := p.Wait(t, 10*time.Second); code != 1 || !strings.Contains(p.Output(), "no coordinator answers at "+c.url) {
		t.Fatalf("worker without a coordinator and no wait: exit %d, want 1 and the reason\n%s", code, p.Output())
	}
	w := c.worker("early", "--slots", "cpu=1", "--connect-wait", "60s")
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(w.Output(), "waiting up to 1m0s for the coordinator at "+c.url), "worker output: " + w.Output()
	})
	time.Sleep(time.Second)
	c.startCoordinator("30s")
	c.connect()
	c.submit(testenv.WriteJob(t, testenv.Job{Shards: 2, Command: []string{"cp", "{input}", "{out}/"}}))
	r := testenv.WaitState(t, c.js, "t", 30*time.Second, stream.RunComplete)
	if r.Counts.Validated != 2 {
		t.Fatalf("run completed with %+v, want 2 validated", r.Counts)
	}
}

// TestWorkerRefusedAfterACoordinatorRestartStops: the coordinator is
// replaced by one with another --data (another token, and with TLS
// another certificate authority) on its address. A worker rode out the
// restart, was refused, and went on for ever with a connection that could
// not come back, logging twice a second. Now it says why and what to do,
// stops with exit 1 after --connect-wait, and a worker whose files get the
// new coordinator's meanwhile is taken again and runs its shards.
func TestWorkerRefusedAfterACoordinatorRestartStops(t *testing.T) {
	for _, tls := range []string{"off", "on"} {
		t.Run("tls "+tls, func(t *testing.T) {
			c := newCluster(t)
			c.startCoordinator("30s", "--tls", tls)
			// The patient worker's token, and authority beside it, are
			// copies: the new coordinator's are copied over them later.
			files := t.TempDir()
			copyFiles := func(from string) {
				for _, name := range []string{coordinator.TokenName, coordinator.CAName} {
					if b, err := os.ReadFile(filepath.Join(from, "jetstream", name)); err == nil {
						if err := os.WriteFile(filepath.Join(files, name), b, 0o600); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			copyFiles(c.data)
			brief := c.worker("brief", "--slots", "cpu=1", "--connect-wait", "3s")
			patient := c.worker("patient", "--slots", "cpu=1", "--connect-wait", "2m", "--token-file", filepath.Join(files, coordinator.TokenName))
			for _, w := range []*testenv.Proc{brief, patient} {
				testenv.Eventually(t, 20*time.Second, func() (bool, string) {
					return strings.Contains(w.Output(), "serving"), "worker output: " + w.Output()
				})
			}
			c.coord.SignalMain(syscall.SIGKILL)
			c.coord.Wait(t, 10*time.Second)
			anew := &cluster{t: t, data: t.TempDir(), addr: c.addr, url: c.url}
			anew.startCoordinator("30s", "--tls", tls)
			anew.connect()
			says, patientSays := "refuses this worker now (authorization violation): its token is no longer the one in "+c.token(), "its token is no longer the one in "+filepath.Join(files, coordinator.TokenName)
			if tls == "on" {
				says, patientSays = "is not the one whose certificate authority is "+filepath.Join(c.data, "jetstream", coordinator.CAName), "is not the one whose certificate authority is "+filepath.Join(files, coordinator.CAName)
			}
			if code := brief.Wait(t, 30*time.Second); code != 1 || !strings.Contains(brief.Output(), says) || !strings.Contains(brief.Output(), "refused for 3s (--connect-wait), so it stops") {
				t.Fatalf("worker refused by the new coordinator: exit %d, want 1, %q and that it stops\n%s", code, says, brief.Output())
			}
			testenv.Eventually(t, 20*time.Second, func() (bool, string) {
				return strings.Contains(patient.Output(), patientSays), "patient worker: " + patient.Output()
			})
			copyFiles(anew.data)
			testenv.Eventually(t, 20*time.Second, func() (bool, string) {
				return strings.Contains(patient.Output(), "takes this worker again"), "patient worker: " + patient.Output()
			})
			anew.submit(testenv.WriteJob(t, testenv.Job{Shards: 2, Command: []string{"cp", "{input}", "{out}/"}}))
			if r := testenv.WaitState(t, anew.js, "t", 30*time.Second, stream.RunComplete); r.Counts.Validated != 2 {
				t.Fatalf("the new coordinator's run: %+v, want 2 validated by the worker taken again", r.Counts)
			}
			patient.Signal(syscall.SIGTERM)
			if code := patient.Wait(t, 20*time.Second); code != 0 {
				t.Fatalf("patient worker on SIGTERM: exit %d, want 0\n%s", code, patient.Output())
			}
		})
	}
}

// hangingFirstAttempts submits n shards whose first attempt hangs and whose
// later ones succeed, and returns worker w1 (state directory state) once
// it runs all n first attempts.
func (c *cluster) hangingFirstAttempts(n int, state string) *testenv.Proc {
	started := filepath.Join(c.t.TempDir(), "started")
	c.submit(testenv.WriteJob(c.t, testenv.Job{Shards: n, Retries: 2, Command: []string{"sh", "-c",
		`if [ "$SHARDPOOL_ATTEMPT" = 1 ]; then echo x >> "$1"; exec sleep 300; fi; cp "$2" "$3/"`, "sh", started, "{input}", "{out}"}}))
	w1 := c.worker("w1", "--slots", fmt.Sprintf("cpu=%d", n), "--data", state)
	testenv.Eventually(c.t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(started)
		return strings.Count(string(b), "x") == n, "first attempts not all running yet"
	})
	c.journalHolds(state, n)
	return w1
}

// journalHolds waits until the worker journals under state name n running
// commands with their shards ("+ <pgid> <key> ..."). A command runs a
// moment before its worker's journal names it; a kill in that moment
// leaves its group and its shard to the lease TTL, which is not what the
// tests that kill a worker are about.
func (c *cluster) journalHolds(state string, n int) {
	c.t.Helper()
	testenv.Eventually(c.t, 20*time.Second, func() (bool, string) {
		paths, _ := filepath.Glob(filepath.Join(state, "children", "*", "*"))
		held := 0
		for _, p := range paths {
			b, _ := os.ReadFile(p)
			for _, line := range strings.Split(string(b), "\n") {
				if f := strings.Fields(line); len(f) >= 3 && f[0] == "+" {
					held++
				}
			}
		}
		return held == n, fmt.Sprintf("%d of %d running commands in the journal", held, n)
	})
}

// handedBackBy waits for run t to complete and checks that it did within
// limit of killed (well before its lease TTL), with n shards handed back
// according to the admission log in state.
func (c *cluster) handedBackBy(killed time.Time, limit time.Duration, state string, n int) {
	c.t.Helper()
	testenv.WaitState(c.t, c.js, "t", limit+10*time.Second, stream.RunComplete)
	if took := time.Since(killed); took > limit {
		c.t.Errorf("the killed worker's shards took %s to complete: they waited for the lease TTL", took)
	}
	log, _ := os.ReadFile(filepath.Join(state, "admission.log"))
	if got := strings.Count(string(log), "decision=hand-back "); got != n {
		c.t.Errorf("%d shard(s) handed back, want %d:\n%s", got, n, log)
	}
}

// The shards of a worker killed with SIGKILL come back as soon as a worker
// with the same state directory starts and proves it dead, not after the
// lease TTL (60 s here): a crashed `shardpool run` resumes at once.
func TestKilledWorkersShardsComeBackAtOnce(t *testing.T) {
	c := startCluster(t, "60s")
	state := filepath.Join(t.TempDir(), "state")
	w1 := c.hangingFirstAttempts(3, state)
	w1.SignalMain(syscall.SIGKILL)
	w1.Wait(t, 10*time.Second)
	killed := time.Now()
	c.worker("w2", "--slots", "cpu=3", "--data", state)
	c.handedBackBy(killed, 30*time.Second, state, 3)
	for i := range 3 {
		rec, err := testenv.ReadShard(c.js, "t", fmt.Sprintf("s%04d", i))
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Attempts) != 2 || rec.Attempts[0].Outcome != stream.OutcomeLost || rec.Attempts[1].Outcome != stream.OutcomeOK || rec.Attempts[1].Worker != "w2" {
			t.Errorf("shard s%04d attempts %+v, want w1's lost, then w2's ok", i, rec.Attempts)
		}
	}
}

// A live worker sharing the dead one's state directory hands its shards
// back too, from its periodic reap (every third of the 15 s TTL).
func TestLivePeerHandsBackADeadWorkersShards(t *testing.T) {
	c := startCluster(t, "15s")
	state := filepath.Join(t.TempDir(), "state")
	w1 := c.hangingFirstAttempts(2, state)
	c.worker("w2", "--slots", "cpu=2", "--data", state)
	time.Sleep(time.Second) // w2 is up and reaping, with nothing to reap yet
	w1.SignalMain(syscall.SIGKILL)
	w1.Wait(t, 10*time.Second)
	killed := time.Now()
	c.handedBackBy(killed, 12*time.Second, state, 2)
}

// A live worker in another pid namespace on this host (a container with
// the host's name, so the same host and boot ID) shares the state
// directory: its pids do not exist here, yet it is not taken for dead.
// Nothing of it is reaped and none of its shards is handed back, so each
// shard runs once.
func TestWorkerInAnotherPIDNamespaceIsNotTakenForDead(t *testing.T) {
	testenv.RequireRoot(t)
	c := startCluster(t, "6s")
	state := filepath.Join(t.TempDir(), "state")
	runs := filepath.Join(t.TempDir(), "runs")
	c.submit(testenv.WriteJob(t, testenv.Job{Shards: 3, Retries: 2, Command: []string{"sh", "-c",
		`echo "$2" >> "$1"; sleep 3; cp "$3" "$4/"`, "sh", runs, "{id}", "{input}", "{out}"}}))
	testenv.StartCmd(t, "unshare", "--pid", "--fork", "--mount-proc", testenv.Binary(t), "worker", "--server", c.url, "--token-file", c.token(),
		"--name", "w1", "--data", state, "--scratch", filepath.Join(c.data, "scratch-w1"), "--slots", "cpu=3")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(runs)
		return len(strings.Fields(string(b))) == 3, "w1 (own pid namespace) not running all shards yet"
	})
	c.worker("w2", "--slots", "cpu=1", "--data", state)
	testenv.WaitState(t, c.js, "t", 40*time.Second, stream.RunComplete)
	if b, _ := os.ReadFile(runs); len(strings.Fields(string(b))) != 3 {
		t.Errorf("shards ran %d times, want 3 (once each):\n%s", len(strings.Fields(string(b))), b)
	}
	log, _ := os.ReadFile(filepath.Join(state, "admission.log"))
	if strings.Contains(string(log), "decision=reap") || strings.Contains(string(log), "decision=hand-back") {
		t.Errorf("w2 took the live worker of another pid namespace for dead:\n%s", log)
	}
}

// Two runs share a state directory (the default) and each has its own
// coordinator. When one is killed, the other's worker reaps its orphans but
// leaves its shards to it: restarted, the killed run hands them back at
// once instead of waiting out their leases (15 s TTL here).
func TestAnotherRunLeavesAKilledRunsShardsToIt(t *testing.T) {
	data := t.TempDir()
	started := filepath.Join(t.TempDir(), "started")
	x := testenv.WriteJob(t, testenv.Job{Name: "x", Shards: 2, Retries: 2, Command: []string{"sh", "-c",
		`if [ "$SHARDPOOL_ATTEMPT" = 1 ]; then echo x >> "$1"; exec sleep 300; fi; cp "$2" "$3/"`, "sh", started, "{input}", "{out}"}})
	y := testenv.WriteJob(t, testenv.Job{Name: "y", Shards: 1, Command: []string{"sleep", "30"}})
	testenv.Start(t, "run", "--data", data, "--slots", "1", "--lease-ttl", "15s", y)
	px := testenv.Start(t, "run", "--data", data, "--slots", "2", "--lease-ttl", "15s", x)
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(started)
		return strings.Count(string(b), "x") == 2, "first attempts not running yet: " + px.Output()
	})
	px.SignalMain(syscall.SIGKILL)
	px.Wait(t, 10*time.Second)
	killed := time.Now()
	hostLog := filepath.Join(data, "admission.log")
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(hostLog)
		return strings.Contains(string(b), "held 2 shard(s) of another coordinator"), "run y's worker has not reaped x's journal yet:\n" + string(b)
	})
	p := testenv.Start(t, "run", "--data", data, "--slots", "2", "--lease-ttl", "15s", x)
	// A hang says what the logs say: a delivery numbered again after the
	// coordinator's restart once ran as attempt 1 and slept
	// (TestRepeatedDeliveryNumberIsNotAnAttemptAgain).
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		host, _ := os.ReadFile(hostLog)
		run, _ := os.ReadFile(filepath.Join(data, "runs", "x", "admission.log"))
		return p.Exited(), fmt.Sprintf("restarted run x still running:\n%s\nhost log:\n%s\nrun x's admission log:\n%s", p.Output(), host, run)
	})
	if code := p.Wait(t, 5*time.Second); code != 0 {
		t.Fatalf("restarted run x: exit %d\n%s", code, p.Output())
	}
	if took := time.Since(killed); took > 12*time.Second {
		t.Errorf("run x completed %s after it was killed: its shards waited out their leases", took)
	}
	if b, _ := os.ReadFile(hostLog); strings.Count(string(b), "decision=hand-back ") != 2 {
		t.Errorf("restarted run x did not hand its 2 shards back:\n%s", b)
	}
}

// TestDeliveryKilledBeforeItsLeaseComesBackAtOnce: a worker SIGKILLed
// between its fetch and its lease (here: waiting for a lease held by a
// worker of another host) held a delivery with no lease of its own. The
// next worker on the host hands it back at once from the dead worker's
// journal, instead of leaving it to the ack wait (the lease TTL, 20 s).
func TestDeliveryKilledBeforeItsLeaseComesBackAtOnce(t *testing.T) {
	ctx := context.Background()
	c := startCluster(t, "20s")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Command: []string{"sh", "-c", `cp "$1" "$2/"`, "sh", "{input}", "{out}"}})
	b, err := stream.OpenBuckets(ctx, c.js)
	if err != nil {
		t.Fatal(err)
	}
	key := stream.ShardKey("t", "s0000")
	other := stream.Lease{Owner: stream.Owner{Worker: "elsewhere", Host: "another-host", BootID: "boot-x", PID: 1, Attempt: 1},
		Taken: time.Now().UTC(), Renewed: time.Now().UTC()}
	data, _ := stream.Encode(&other)
	if _, err := b.Leases.Create(ctx, key, data); err != nil {
		t.Fatal(err)
	}
	c.submit(spec)
	state := filepath.Join(c.data, "w-w1")
	w1 := c.worker("w1", "--slots", "cpu=1")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		log, _ := os.ReadFile(filepath.Join(state, "runs", "t", "admission.log"))
		return strings.Contains(string(log), "waiting for it to expire"), "w1 is not waiting for the other host's lease yet:\n" + string(log) + w1.Output()
	})
	w1.SignalMain(syscall.SIGKILL)
	w1.Wait(t, 10*time.Second)
	if err := b.Leases.Delete(ctx, key); err != nil { // the other host's worker lets go
		t.Fatal(err)
	}
	killed := time.Now()
	c.worker("w2", "--slots", "cpu=1", "--data", state) // the same host's state: it reaps w1's journal
	testenv.WaitState(t, c.js, "t", 30*time.Second, stream.RunComplete)
	if took := time.Since(killed); took > 10*time.Second {
		t.Fatalf("the shard completed %s after its worker was killed: it waited out the ack wait", took.Round(time.Millisecond))
	}
	log, _ := os.ReadFile(filepath.Join(state, "runs", "t", "admission.log"))
	if !strings.Contains(string(log), "it held no lease") {
		t.Fatalf("the run's admission.log does not say the delivery was handed back:\n%s", log)
	}
}

func TestCoordinatorSIGKILLAndRestartLosesNothing(t *testing.T) {
	c := startCluster(t, "3s")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 30, Retries: 2,
		Command: []string{"sh", "-c", `sleep 0.3; cp "$1" "$2/"`, "sh", "{input}", "{out}"}})
	c.submit(spec)
	w := c.worker("w1", "--slots", "cpu=4")
	var before int
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		r, err := stream.ReadRun(context.Background(), c.js, "t")
		before = r.Counts.Validated
		return err == nil && before >= 5, fmt.Sprintf("validated %d", before)
	})
	if before >= 30 {
		t.Fatalf("the run finished before the coordinator was killed; the test proves nothing")
	}
	c.bounceCoordinator(500*time.Millisecond, "3s")
	c.completesOnce(spec, 30, 90*time.Second)
	// The worker told the loss and the return, once each; its own close
	// when it stops is no loss (it said "lost the coordinator" there too).
	w.SignalMain(syscall.SIGTERM)
	if code := w.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("worker exit %d after SIGTERM, want 0\n%s", code, w.Output())
	}
	out := w.Output()
	if strings.Count(out, "lost the coordinator at "+c.url) != 1 || !regexpMatch(`the coordinator at \S+ answers again, after \d+s`, out) {
		t.Errorf("worker output over the coordinator's restart: want one line for the loss and one for its return\n%s", out)
	}
}

// TestShardsOutliveACoordinatorRestart: the coordinator is SIGKILLed while
// two shards run and started again 10 s later, past the lease TTL (3 s).
// One command ends during the outage, the other runs through it. A
// renewal that got no answer was taken for a lost lease, so the command
// running through was killed at its next heartbeat, and the output of the
// one that ended was discarded at its commit: both ran again. Now the
// running command goes on, the ended one keeps its output until the store
// answers, and each lease, expired meanwhile and taken by no one, is
// taken back: each command ran once, each shard is validated once in its
// first attempt.
func TestShardsOutliveACoordinatorRestart(t *testing.T) {
	c := startCluster(t, "3s")
	ran := filepath.Join(t.TempDir(), "ran")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 2,
		Command: []string{"sh", "-c", `echo "$1" >> "$3"; case "$1" in *s0000*) sleep 2;; *) sleep 14;; esac; cp "$1" "$2/"`, "sh", "{input}", "{out}", ran}})
	c.submit(spec)
	w := c.worker("w1", "--slots", "cpu=2")
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(ran)
		return strings.Count(string(b), "\n") == 2, "commands started: " + string(b)
	})
	// Away longer than a request's timeout (5 s) after the first
	// command's end: its commit's requests fail, not only wait.
	c.bounceCoordinator(10*time.Second, "3s")
	c.completesOnce(spec, 2, 60*time.Second)
	if b, _ := os.ReadFile(ran); strings.Count(string(b), "\n") != 2 {
		t.Errorf("commands ran:\n%s\nwant each of the 2 once\nworker:\n%s", b, w.Output())
	}
	for _, id := range []string{"s0000", "s0001"} {
		rec, err := testenv.ReadShard(c.js, "t", id)
		if err != nil || len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeOK {
			t.Errorf("shard %s: %+v (%v), want one attempt, ok", id, rec.Attempts, err)
		}
	}
	// The outage is told once ("lost the coordinator ..."), not warned
	// by each loop that meets it: its report every 5 s, its look for the
	// class's consumer, its ask for the coordinator's info.
	for _, l := range strings.Split(w.Output(), "\n") {
		if strings.Contains(l, "level=WARN") && regexpMatch(`msg="(worker report|consumer lookup|coordinator info unavailable)"`, l) {
			t.Errorf("the worker warned of the outage itself: %s", l)
		}
	}
}

// TestWorkerSIGTERMDrainsAndExitsZero: SIGTERM, and SIGHUP (the terminal
// a worker was started from goes away), stop a worker gracefully.
func TestWorkerSIGTERMDrainsAndExitsZero(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGHUP} {
		t.Run(unix.SignalName(sig), func(t *testing.T) { workerStopsOn(t, sig) })
	}
}

func workerStopsOn(t *testing.T, sig syscall.Signal) {
	// A lease TTL (and ack wait) far above the bound below: shards that
	// were not handed back at once would wait 20 s, and the bound leaves a
	// slow host room to start a worker.
	c := startCluster(t, "20s")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 2,
		// The job checkpoints on SIGTERM by writing a marker, then exits.
		Command: []string{"sh", "-c", `trap 'echo term > "$2/term"; exit 143' TERM; [ -f "$3/done" ] && { cp "$1" "$4/"; exit 0; }; touch "$3/done"; sleep 30 & wait`, "sh", "{input}", "{ckpt}", "{ckpt}", "{out}"}})
	c.submit(spec)
	w1 := c.worker("w1", "--slots", "cpu=2")
	// Both commands have begun: each has left its marker. (Two running
	// records were not enough: on a loaded host a shell not yet past its
	// first line met the signal, and its next attempt slept 30 s.)
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, _ := stream.ReadRun(context.Background(), c.js, "t")
		for _, id := range []string{"s0000", "s0001"} {
			if _, err := os.Stat(filepath.Join(worker.CkptDir(filepath.Join(filepath.Dir(spec), "out"), "t", r.Fingerprint, id), "done")); err != nil {
				return false, fmt.Sprintf("running %d; %s has not begun: %v", r.Counts.Running, id, err)
			}
		}
		return true, ""
	})
	time.Sleep(300 * time.Millisecond) // into their sleep, past the trap
	w1.SignalMain(sig)
	if code := w1.Wait(t, 15*time.Second); code != 0 {
		t.Fatalf("worker exit after %s: got %d, want 0\n%s", unix.SignalName(sig), code, w1.Output())
	}
	rec, _ := testenv.ReadShard(c.js, "t", "s0000")
	if rec.State != stream.ShardPending || rec.Attempts[0].Outcome != stream.OutcomeInterrupted {
		t.Fatalf("after drain: got %s %+v, want pending with an interrupted attempt", rec.State, rec.Attempts)
	}
	run, err := stream.ReadRun(context.Background(), c.js, "t")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(worker.CkptDir(filepath.Join(filepath.Dir(spec), "out"), "t", run.Fingerprint, "s0000"), "term")); err != nil {
		t.Fatalf("child did not get SIGTERM to checkpoint: %v", err)
	}
	// Nak'd at once: a new worker finishes them without waiting for a lease.
	start := time.Now()
	w2 := c.worker("w2", "--slots", "cpu=2")
	c.waitComplete(t, 30*time.Second, w2, w1)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("requeued shards took %s to finish, want them redelivered at once, not after the 20 s ack wait", d)
	}
}

// TestStatusSaysAWorkerIsStopping: a worker stopped with SIGTERM while
// its command ignores SIGTERM (it runs the worker's whole --grace) keeps
// reporting, and status says it stops, what it still runs and how to
// cut that short, and a shard waiting for a slot says why. It fell silent: status showed its report growing old
// and nothing else. The same worker started again at once, with the same
// command line, is refused with why; a second SIGTERM kills the command
// and the worker exits 0 before its grace is out.
func TestStatusSaysAWorkerIsStopping(t *testing.T) {
	c := startCluster(t, "20s")
	// Two shards, one slot: the second waits, and says why.
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 1, Command: []string{"sh", "-c", `trap '' TERM; sleep 60`}})
	c.submit(spec)
	w1 := c.worker("w1", "--slots", "cpu=1", "--grace", "40s")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, _ := stream.ReadRun(context.Background(), c.js, "t")
		return r.Counts.Running == 1, fmt.Sprintf("running %d", r.Counts.Running)
	})
	w1.SignalMain(syscall.SIGTERM)
	status := func() string {
		st := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token())
		st.Wait(t, 30*time.Second)
		return st.Output()
	}
	want := []string{"t: class cpu: 1 shard(s) wait: w1: stopping (SIGTERM): fetching no more", "w1: stopping since ", " (SIGTERM): it fetches no more and exits once its shards have settled: 1 shard(s) still hold a slot",
		fmt.Sprintf("(to kill them now, stop it again: kill %d on host ", w1.Cmd.Process.Pid)}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		out := status()
		for _, s := range want {
			if !strings.Contains(out, s) {
				return false, fmt.Sprintf("status lacks %q:\n%s", s, out)
			}
		}
		return true, ""
	})
	again := c.worker("w1", "--slots", "cpu=1")
	if code := again.Wait(t, 30*time.Second); code == 0 || !strings.Contains(again.Output(), "is stopping (SIGTERM, since") {
		t.Fatalf("w1 started again while the first stops: exit %d, want it refused as the name of a stopping worker\n%s", code, again.Output())
	}
	if w1.Exited() {
		t.Fatalf("w1 exited before its command's grace was out\n%s", w1.Output())
	}
	hurried := time.Now()
	w1.SignalMain(syscall.SIGTERM)
	if code := w1.Wait(t, 20*time.Second); code != 0 || !strings.Contains(w1.Output(), "stopping now: SIGKILL") {
		t.Fatalf("w1 after a second SIGTERM: exit %d, want 0 with the command killed\n%s", code, w1.Output())
	}
	if d := time.Since(hurried); d > 15*time.Second {
		t.Errorf("w1 took %s to exit after the second SIGTERM, want its command killed at once", d)
	}
	if out := status(); strings.Contains(out, "w1") {
		t.Errorf("status still shows w1 after it exited:\n%s", out)
	}
}

// TestAWorkerThatDidNotRunSaysSo: a worker stopped with SIGSTOP (Ctrl-Z,
// a suspended job) for longer than its lease TTL says, once it runs again,
// that its process did not run and for how long, and that its leases may
// have expired meanwhile: what it then loses or discards is otherwise
// unexplained. Its shard still completes, committed once.
func TestAWorkerThatDidNotRunSaysSo(t *testing.T) {
	c := startCluster(t, "3s")
	gate := testenv.NewGate(t)
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Command: gate.NoteThenCopy()})
	c.submit(spec)
	w1 := c.worker("w1", "--slots", "cpu=1")
	gate.WaitStarted("s0000")
	w1.SignalMain(syscall.SIGSTOP)
	time.Sleep(4 * time.Second)
	w1.SignalMain(syscall.SIGCONT)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		o := w1.Output()
		return strings.Contains(o, "this worker's process did not run for ") && strings.Contains(o, "its leases (TTL 3s) may have expired meanwhile"),
			"worker output:\n" + o
	})
	gate.Open()
	r := testenv.WaitState(t, c.js, "t", 30*time.Second, stream.RunComplete)
	if r.Counts.Validated != 1 {
		t.Fatalf("counts %+v, want the shard validated", r.Counts)
	}
	if strings.Count(w1.Output(), "did not run for") != 1 {
		t.Errorf("the worker said it did not run more than once for one stop:\n%s", w1.Output())
	}
}

// TestAStoppedWorkerSaysWhatItWaitsOn: a worker stopped while its
// commits hang on an output mount that does not answer (bindfs stopped
// with SIGSTOP, as a hard NFS mount whose server is gone) cannot exit
// until the mount answers. Past its grace it says so on stderr, and what
// it waits on; status says it stops. It said nothing after "stopping".
// Once the mount answers, the commits end, the shards are validated and
// the worker exits 0.
func TestAStoppedWorkerSaysWhatItWaitsOn(t *testing.T) {
	fuse := testenv.FuseDir(t)
	daemon := testenv.FuseDaemon(t, fuse)
	c := startCluster(t, "20s")
	gate := testenv.NewGate(t)
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2,
		Command: gate.ThenCopy()})
	out := filepath.Join(fuse, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	testenv.SetOutput(t, spec, out)
	c.submit(spec)
	w1 := c.worker("w1", "--slots", "cpu=2", "--grace", "1s", "--slow-fs", "1s")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, _ := stream.ReadRun(context.Background(), c.js, "t")
		return r.Counts.Running == 2, fmt.Sprintf("running %d", r.Counts.Running)
	})
	resume := testenv.HangFuse(t, daemon)
	gate.Open()
	status := func() string {
		st := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token())
		st.Wait(t, 30*time.Second)
		return st.Output()
	}
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		out := status()
		return strings.Contains(out, "w1: 2 attempt(s) have waited long on a file system"), "status:\n" + out
	})
	stopped := time.Now()
	w1.SignalMain(syscall.SIGTERM)
	want := []string{"still stopping after ", "2 shard(s) whose command ended are committed and recorded",
		"2 attempt(s) wait on a file system (a large commit, or a mount that does not answer, such as a hung NFS mount; it exits once they are through): ", "t.s0000 in its commit to " + out + " for "}
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		o := w1.Output()
		for _, s := range want {
			if !strings.Contains(o, s) {
				return false, fmt.Sprintf("worker output lacks %q:\n%s", s, o)
			}
		}
		return true, ""
	})
	if d := time.Since(stopped); d < 5*time.Second {
		t.Errorf("the worker said it still stops %s after SIGTERM, before its grace of 1s and 5s more", d)
	}
	if st := status(); !strings.Contains(st, "w1: stopping since ") || !strings.Contains(st, "2 shard(s) whose command ended are committed, recorded and acked first") {
		t.Errorf("status while w1 stops on the hung mount:\n%s", st)
	}
	if w1.Exited() {
		t.Fatalf("w1 exited while its commits hung\n%s", w1.Output())
	}
	resume()
	if code := w1.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("w1 once the mount answered: exit %d, want 0\n%s", code, w1.Output())
	}
	testenv.WaitState(t, c.js, "t", 10*time.Second, stream.RunComplete)
}

// TestCoordinatorReloadsItsStoreAfterAFullDisk: a write that meets a full
// disk leaves nats-server's stream refusing every write, also once space
// is freed. The coordinator daemon reloads its store by itself once there
// is room, on the same listener: a client reconnects, writes again, and
// finds what was written before.
func TestCoordinatorReloadsItsStoreAfterAFullDisk(t *testing.T) {
	c := newCluster(t)
	c.data = filepath.Join(c.data, "state")
	testenv.SmallTmpfs(t, c.data, "16m")
	c.startCoordinator("30s")
	c.connect()
	kv, err := c.js.KeyValue(context.Background(), stream.BucketCheckpoint)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string, value []byte) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := kv.Put(ctx, key, value)
		return err
	}
	if err := put("before", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(c.data, "filler")
	_ = exec.Command("sh", "-c", `head -c 32M /dev/zero > "$1"`, "sh", filler).Run() // stops at the tmpfs's end
	if err := put("during", make([]byte, 100_000)); err == nil {
		t.Fatal("a write on a full disk succeeded")
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		st, err := coordinator.ReadStatus(context.Background(), c.js, "")
		return err == nil && st.Coordinator != nil && strings.Contains(st.Coordinator.StoreFull, "a write to the store failed"),
			fmt.Sprintf("status: %+v (%v)", st, err)
	})
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		out := c.coord.Output()
		return strings.Contains(out, "reloading it") && strings.Count(out, "coordinator ready: nats") == 2, "coordinator output:\n" + out
	})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		err := put("after", []byte("x"))
		return err == nil, fmt.Sprintf("write after the reload: %v", err)
	})
	if e, err := kv.Get(context.Background(), "before"); err != nil || string(e.Value()) != "kept" {
		t.Fatalf("the value written before the full disk: %v", err)
	}
	if c.coord.Exited() {
		t.Fatalf("the coordinator exited:\n%s", c.coord.Output())
	}
}

// TestStoreThatRefusesWritesIsSaidSo: the ext4 under a coordinator's
// store meets an error and refuses every write, with free space left and
// its mount still listed rw (Linux 6.12 and later). `status` says the
// store is read-only and what to do, not that it is full and to free
// space; `submit` publishes nothing and says why, where it failed part way
// with nats-server's "error creating store for consumer"; and the
// coordinator does not reload its store for the free space it has.
func TestStoreThatRefusesWritesIsSaidSo(t *testing.T) {
	efs := testenv.NewErrorFS(t, 64<<20) // first: unmounted after the coordinator stops
	c := newCluster(t)
	c.data = filepath.Join(efs.Dir, "state")
	c.startCoordinator("30s")
	c.connect()
	efs.Fail()
	var out string
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		p := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token())
		p.Wait(t, 20*time.Second)
		out = p.Output()
		return strings.Contains(out, "STORE READ-ONLY: the file system of "+filepath.Join(c.data, "jetstream")+" refuses writes: read-only file system"), "status:\n" + out
	})
	if !strings.Contains(out, "make its file system writable again") || strings.Contains(out, "free space") {
		t.Errorf("status of a read-only store, want what to do and no word of space:\n%s", out)
	}
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Command: []string{"true"}})
	sub := testenv.Start(t, "submit", "--server", c.url, "--token-file", c.token(), spec)
	if code := sub.Wait(t, 30*time.Second); code != 1 || !strings.Contains(sub.Output(), "submit t: nothing published: the coordinator's store cannot be written") {
		t.Errorf("submit to a read-only store: exit %d, want 1 and the reason\n%s", code, sub.Output())
	}
	time.Sleep(3 * time.Second) // a look every 2 s: one would have reloaded by now
	if out := c.coord.Output(); strings.Contains(out, "reloading it") || strings.Count(out, "store takes no writes") != 1 {
		t.Errorf("coordinator on a read-only store: want no reload and the reason logged once\n%s", out)
	}
}

// TestWorkerNameIsNotShared: a second worker started under a live worker's
// name is refused with the holder's host and pid (their reports would
// overwrite each other); after that worker is SIGKILLed, its name can be
// taken again at once, its pid being gone. Of two started at the same
// moment under one name, one is refused.
func TestWorkerNameIsNotShared(t *testing.T) {
	c := startCluster(t, "6s")
	w1 := c.worker("w1", "--slots", "cpu=1")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		return strings.Contains(w1.Output(), "worker w1 serving"), "w1 output: " + w1.Output()
	})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		kv, err := c.js.KeyValue(context.Background(), stream.BucketWorkers)
		if err != nil {
			return false, err.Error()
		}
		_, err = kv.Get(context.Background(), "w1")
		return err == nil, fmt.Sprintf("no report of w1 yet (%v)", err)
	})
	dup := c.worker("w1", "--slots", "cpu=1")
	if code := dup.Wait(t, 30*time.Second); code != 1 ||
		!strings.Contains(dup.Output(), fmt.Sprintf("a live worker reports under it from host %s pid %d", hostname(t), w1.Cmd.Process.Pid)) ||
		!strings.Contains(dup.Output(), "give this one another --name") {
		t.Fatalf("second worker named w1: exit %d, want 1 naming the live one\n%s", code, dup.Output())
	}
	w1.SignalMain(syscall.SIGKILL)
	w1.Wait(t, 10*time.Second)
	again := c.worker("w1", "--slots", "cpu=1")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		return strings.Contains(again.Output(), "worker w1 serving"), "w1 after its predecessor was killed: " + again.Output()
	})
	// Two started at the same moment under one name: both found it free
	// before either had reported, and both served. The name is now taken
	// with compare-and-set, so one of them is refused.
	a, b := c.worker("w2", "--slots", "cpu=1"), c.worker("w2", "--slots", "cpu=1")
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return a.Exited() || b.Exited(), fmt.Sprintf("both workers w2 serve\nfirst:\n%s\nsecond:\n%s", a.Output(), b.Output())
	})
	refused, kept := a, b
	if b.Exited() {
		refused, kept = b, a
	}
	if code := refused.Wait(t, 10*time.Second); code != 1 || !strings.Contains(refused.Output(), "give this one another --name") {
		t.Errorf("the refused w2: exit %d, want 1 naming the live one\n%s", code, refused.Output())
	}
	// The other serves on.
	time.Sleep(3 * time.Second)
	if kept.Exited() {
		t.Fatalf("both workers w2 stopped; the first to take the name should serve\n%s", kept.Output())
	}
}

func hostname(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestOnlyClientsWithTheTokenAreTaken: a coordinator took any client that
// reached its port, so on a shared host any other user could rewrite a
// run's command in the runs bucket and have this user's workers execute
// it. `shardpool coordinator` and `shardpool run` now ask every client for
// the token in their store (0600). Without it, or with another, a client
// is refused with the way to the file; the stock nats CLI gets in with
// the token in NATS_URL, as the coordinator prints; `status --data` finds
// the token itself.
func TestOnlyClientsWithTheTokenAreTaken(t *testing.T) {
	c := startCluster(t, "30s")
	if fi, err := os.Stat(c.token()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file %s: %v (%v), want mode 0600", c.token(), fi, err)
	}
	if !strings.Contains(c.coord.Output(), "--token-file "+c.token()) {
		t.Fatalf("the coordinator does not say where its token is:\n%s", c.coord.Output())
	}
	if nc, err := nats.Connect(c.url); err == nil {
		nc.Close()
		t.Fatal("a connection without the token was taken")
	}
	spec := testenv.WriteJob(t, testenv.Job{Name: "tok", Shards: 2, Command: []string{"cp", "{input}", "{out}/"}})
	other := filepath.Join(t.TempDir(), "other")
	os.WriteFile(other, []byte("0123456789abcdef\n"), 0o600)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "pass --token-file FILE"},
		{[]string{"--token-file", other}, "the token in " + other + " is not this coordinator's"},
	} {
		p := testenv.Start(t, append(append([]string{"submit", "--server", c.url}, tc.args...), spec)...)
		if code := p.Wait(t, 30*time.Second); code != 1 || !strings.Contains(p.Output(), "refused this connection") || !strings.Contains(p.Output(), tc.want) {
			t.Fatalf("submit %v: exit %d, want 1, refused, and %q\n%s", tc.args, code, tc.want, p.Output())
		}
	}
	if _, err := c.js.KeyValue(context.Background(), stream.BucketRuns); err != nil {
		t.Fatal(err)
	}
	if r, err := stream.ReadRun(context.Background(), c.js, "tok"); err == nil {
		t.Fatalf("a refused submit published run %+v", r)
	}
	out := c.submit(spec) // with the token
	if !strings.Contains(out, "published 2 of 2") {
		t.Fatalf("submit with the token:\n%s", out)
	}
	nats := natsCLI(t)
	tok, _ := coordinator.ReadToken(c.token())
	cmd := exec.Command(nats, "stream", "info", stream.StreamShards, "--json")
	cmd.Env = append(os.Environ(), "NATS_URL=nats://"+tok+"@"+c.addr)
	if b, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(b), `"messages": 2`) {
		t.Fatalf("nats CLI with the token in NATS_URL: %v\n%s", err, b)
	}
	if b, err := exec.Command(nats, "-s", c.url, "stream", "info", stream.StreamShards).CombinedOutput(); err == nil || !strings.Contains(strings.ToLower(string(b)), "authorization") {
		t.Fatalf("nats CLI without the token: %v, want refused\n%s", err, b)
	}
	st := testenv.Start(t, "status", "--data", c.data, "tok")
	if code := st.Wait(t, 30*time.Second); code != 0 || !regexpMatch(`tok\s+QUEUED`, st.Output()) {
		t.Fatalf("status --data of a coordinator with a token: exit %d\n%s", code, st.Output())
	}
}

// TestRunAsksForItsToken: the listener of a `shardpool run` (loopback, a
// port anyone on the host can find) takes only clients with the token it
// keeps beside its store, and says where that is.
func TestRunAsksForItsToken(t *testing.T) {
	data := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Name: "held", Shards: 1, Command: []string{"sleep", "30"}})
	p := testenv.Start(t, "run", "--data", data, "--http", "127.0.0.1:0", spec)
	re := regexp.MustCompile(`nats: (nats://\S+), token in (\S+)`)
	var m []string
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		m = re.FindStringSubmatch(p.Output())
		return m != nil, "run has not printed its URL and token file:\n" + p.Output()
	})
	if want := filepath.Join(data, "stores", "held", coordinator.TokenName); m[2] != want {
		t.Fatalf("token file %s, want %s", m[2], want)
	}
	if nc, err := nats.Connect(m[1]); err == nil {
		nc.Close()
		t.Fatalf("run's listener took a connection without the token")
	}
	tok, err := coordinator.ReadToken(m[2])
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(m[1], nats.Token(tok))
	if err != nil {
		t.Fatalf("with the token: %v", err)
	}
	nc.Close()
	if strings.Contains(p.Output(), tok) {
		t.Fatalf("run printed its token:\n%s", p.Output())
	}
	// GET /status, at the address run prints, asks for the same token.
	sm := regexp.MustCompile(`status: (http://\S+/status)`).FindStringSubmatch(p.Output())
	if sm == nil {
		t.Fatalf("run --http printed no status URL:\n%s", p.Output())
	}
	for _, tc := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {tok, http.StatusOK}} {
		req, _ := http.NewRequest("GET", sm[1], nil)
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Fatalf("GET %s (token given: %v): %d, want %d", sm[1], tc.token != "", resp.StatusCode, tc.want)
		}
	}
}

// TestWorkerChecksItsScratchBeforeWaiting: a worker whose scratch
// directory it cannot use says so at once, before waiting up to
// --connect-wait for its coordinator (and before printing that it
// serves).
func TestWorkerChecksItsScratchBeforeWaiting(t *testing.T) {
	c := newCluster(t)
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o644)
	start := time.Now()
	p := c.worker("w1", "--slots", "cpu=1", "--scratch", file, "--connect-wait", "60s")
	code := p.Wait(t, 30*time.Second)
	if out := p.Output(); code != 1 || !strings.Contains(out, "worker w1: scratch directory "+file) || strings.Contains(out, "waiting up to") {
		t.Fatalf("exit %d, want 1 naming the scratch directory, without waiting for the coordinator\n%s", code, out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %s, want at once", d)
	}
}

// TestWorkerSIGUSR1Drains: SIGUSR1, which Slurm sends ahead of a job's end
// where the job asks for it (--signal=USR1@SECONDS), drains a worker: it
// fetches no more, lets its running shards end and commit, and exits 0.
// Slurm sends it to every process of the job: a command that dies of it
// is handed back, not charged (retries = 0 would fail the shard), and
// comes back at once for the next worker.
func TestWorkerSIGUSR1Drains(t *testing.T) {
	c := startCluster(t, "20s")
	gate := testenv.NewGate(t)
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Retries: 0,
		Command: gate.ThenCopy()})
	c.submit(spec)
	w1 := c.worker("w1", "--slots", "cpu=2")
	var kids []int
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		kids = probe.Children("/proc", w1.Cmd.Process.Pid)
		return len(kids) == 2, fmt.Sprintf("commands running under the worker: %v", kids)
	})
	// As Slurm does, the command and the worker at about the same time;
	// the command first, so that it dies before the worker knows.
	if err := syscall.Kill(-kids[0], syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	w1.SignalMain(syscall.SIGUSR1)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		return strings.Contains(w1.Output(), "SIGUSR1: draining"), "worker output: " + w1.Output()
	})
	// status says so, whether or not shards wait (it said so only in the
	// waits of classes with shards queued).
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		st := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token())
		st.Wait(t, 30*time.Second)
		return strings.Contains(st.Output(), "w1: draining (SIGUSR1): it fetches no more and exits once its shards have settled: 1 shard(s) hold a slot and end as they would (to stop them now: kill "),
			"status:\n" + st.Output()
	})
	gate.Open()
	if code := w1.Wait(t, 20*time.Second); code != 0 {
		t.Fatalf("worker exit after SIGUSR1: got %d, want 0\n%s", code, w1.Output())
	}
	var validated, handedBack, untouched []string
	for i := range 3 {
		id := fmt.Sprintf("s%04d", i)
		rec, err := testenv.ReadShard(c.js, "t", id)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || (err == nil && len(rec.Attempts) == 0):
			untouched = append(untouched, id)
		case err != nil:
			t.Fatalf("record of %s: %v", id, err)
		case rec.State == stream.ShardValidated && len(rec.Attempts) == 1:
			validated = append(validated, id)
		case rec.State == stream.ShardPending && len(rec.Attempts) == 1 && rec.Attempts[0].Outcome == stream.OutcomeInterrupted &&
			strings.Contains(rec.Attempts[0].Reason, "while the worker drains (SIGUSR1)") && rec.Interrupted == 1:
			handedBack = append(handedBack, id)
		default:
			t.Errorf("shard %s after the drain: %s, interrupted %d, attempts %+v", id, rec.State, rec.Interrupted, rec.Attempts)
		}
	}
	if len(validated) != 1 || len(handedBack) != 1 || len(untouched) != 1 {
		t.Fatalf("after the drain: validated %v, handed back %v, never fetched %v; want one of each\n%s", validated, handedBack, untouched, w1.Output())
	}
	start := time.Now()
	w2 := c.worker("w2", "--slots", "cpu=2")
	c.waitComplete(t, 30*time.Second, w2, w1)
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the drained worker's shards took %s to finish, want them at once, not after the 20 s ack wait", d)
	}
	validatedOnce(t, c.js, "t", filepath.Join(filepath.Dir(spec), "out"), 3)
}

// TestWorkerIdleExit: `worker --idle-exit 1s` serves while it has shards,
// one that runs longer than a second included, and exits 0 once it has
// had nothing to run for a second.
func TestWorkerIdleExit(t *testing.T) {
	c := startCluster(t, "20s")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Command: []string{"sh", "-c", `sleep 2; cp "$1" "$2/"`, "sh", "{input}", "{out}"}})
	c.submit(spec)
	start := time.Now()
	w := c.worker("w1", "--slots", "cpu=2", "--idle-exit", "1s")
	if code := w.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("idle worker: exit %d, want 0\n%s", code, w.Output())
	}
	// Two rounds of 2 s shards, then a second idle.
	if d := time.Since(start); d < 4*time.Second {
		t.Errorf("the worker exited after %s, before its shards could have run", d)
	}
	r, err := stream.ReadRun(context.Background(), c.js, "t")
	if err != nil || r.State != stream.RunComplete {
		t.Fatalf("run after the idle worker left: %+v, %v; want COMPLETE\n%s", r, err, w.Output())
	}
	if !strings.Contains(w.Output(), "draining (no shard to run for") {
		t.Errorf("the worker does not say why it left:\n%s", w.Output())
	}
}

// TestWorkerIdleExitWaitsForTheRetriesItHandedBack: a worker whose
// --idle-exit (300 ms) is shorter than the delay before a failed shard's
// retry (1 s) stays until that delay is over, runs the retries, and only
// then exits as idle. Before, it left while its shards waited in their
// delays, and with no other worker nothing ran them: the run stayed
// RUNNING with no worker.
func TestWorkerIdleExitWaitsForTheRetriesItHandedBack(t *testing.T) {
	c := startCluster(t, "20s")
	tried := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 2, Command: []string{"sh", "-c",
		`[ -e "$0/$1" ] || { : > "$0/$1"; echo "first attempt fails" >&2; exit 1; }; cp "$2" "$3/"`, tried, "{id}", "{input}", "{out}"}})
	c.submit(spec)
	w := c.worker("w1", "--slots", "cpu=2", "--idle-exit", "300ms")
	if code := w.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("idle worker: exit %d, want 0\n%s", code, w.Output())
	}
	r, err := stream.ReadRun(context.Background(), c.js, "t")
	if err != nil || r.State != stream.RunComplete {
		t.Fatalf("run after the idle worker left: %s %+v, %v; want COMPLETE, the retries run before the worker left\n%s", r.State, r.Counts, err, w.Output())
	}
	validatedOnce(t, c.js, "t", filepath.Join(filepath.Dir(spec), "out"), 2)
}

// TestIdleWorkerStaysForTheShardsOfAWorkerThatDies: a worker whose
// --idle-exit (300 ms) has passed stays while another worker's shard is
// out, and runs it when that worker is killed and its lease runs out (3
// s). Before, it left as soon as its own shard was done, and when the
// other worker died nothing ran the shard: the run stayed RUNNING with
// no worker, as a batch allocation's would.
func TestIdleWorkerStaysForTheShardsOfAWorkerThatDies(t *testing.T) {
	c := startCluster(t, "3s")
	started := filepath.Join(t.TempDir(), "started")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 2, Command: []string{"sh", "-c",
		`if [ "$SHARDPOOL_ATTEMPT" = 1 ] && [ "$4" = s0000 ]; then echo x >> "$1"; exec sleep 300; fi; cp "$2" "$3/"`, "sh", started, "{input}", "{out}", "{id}"}})
	c.submit(spec)
	// A batch job's worker, as w2 is: one without --idle-exit (it serves
	// until stopped) and idle would be counted on to stay.
	w1 := c.worker("w1", "--slots", "cpu=1", "--idle-exit", "1m")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(started)
		return len(b) > 0, "s0000's first attempt not running yet"
	})
	c.journalHolds(filepath.Join(c.data, "w-w1"), 1)
	w2 := c.worker("w2", "--slots", "cpu=1", "--idle-exit", "300ms")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		rec, err := testenv.ReadShard(c.js, "t", "s0001")
		return err == nil && rec.State == stream.ShardValidated, fmt.Sprintf("s0001: %+v, %v", rec, err)
	})
	time.Sleep(2 * time.Second)
	if w2.Exited() {
		t.Fatalf("w2 left 2 s after its shard, while w1's shard was out\n%s", w2.Output())
	}
	w1.SignalMain(syscall.SIGKILL)
	w1.Wait(t, 10*time.Second)
	if code := w2.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("w2: exit %d, want 0 once nothing is out\n%s", code, w2.Output())
	}
	r, err := stream.ReadRun(context.Background(), c.js, "t")
	if err != nil || r.State != stream.RunComplete {
		t.Fatalf("run after w2 left: %s %+v, %v; want COMPLETE\n%s", r.State, r.Counts, err, w2.Output())
	}
	rec, _ := testenv.ReadShard(c.js, "t", "s0000")
	if len(rec.Attempts) != 2 || rec.Attempts[0].Outcome != stream.OutcomeLost || rec.Attempts[1].Worker != "w2" {
		t.Errorf("s0000 attempts %+v, want w1's lost, then w2's", rec.Attempts)
	}
	if !strings.Contains(w2.Output(), "idle, but staying") {
		t.Errorf("w2 did not say why it stayed:\n%s", w2.Output())
	}
	validatedOnce(t, c.js, "t", filepath.Join(filepath.Dir(spec), "out"), 2)
}

// TestOneIdleWorkerStaysForTheShardsOut: of two workers idle past their
// --idle-exit while a third runs the class's last shard, one (w2, whose
// name sorts first) stays until that shard is done, and the other (w3)
// leaves at once: a fleet's tail keeps one node, not all of them.
func TestOneIdleWorkerStaysForTheShardsOut(t *testing.T) {
	c := startCluster(t, "20s")
	slow := c.slowFirstShard(3, "--idle-exit", "1m")
	w2 := c.worker("w2", "--slots", "cpu=1", "--idle-exit", "300ms")
	w3 := c.worker("w3", "--slots", "cpu=1", "--idle-exit", "300ms")
	if code := w3.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("w3: exit %d, want 0\n%s", code, w3.Output())
	}
	if rec, err := testenv.ReadShard(c.js, "t", "s0000"); err != nil || rec.State == stream.ShardValidated {
		t.Fatalf("s0000 %s, %v when w3 left; the test wants it still running", rec.State, err)
	}
	if w2.Exited() {
		t.Fatalf("w2 left while s0000 ran on w1\n%s", w2.Output())
	}
	st := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token())
	if code := st.Wait(t, 30*time.Second); code != 0 || !strings.Contains(st.Output(), "w2: idle past its --idle-exit, it stays while shards of class cpu are out") {
		t.Errorf("status: exit %d; want a line saying w2 stays for class cpu\n%s", code, st.Output())
	}
	if w2.Exited() {
		t.Fatalf("w2 left while s0000 ran on w1\n%s", w2.Output())
	}
	slow.Open()
	if code := w2.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("w2: exit %d, want 0\n%s", code, w2.Output())
	}
	if rec, err := testenv.ReadShard(c.js, "t", "s0000"); err != nil || rec.State != stream.ShardValidated {
		t.Errorf("s0000 %s, %v when w2 left; want it validated first", rec.State, err)
	}
	if !strings.Contains(w2.Output(), "idle, but staying") {
		t.Errorf("w2 did not say why it stayed:\n%s", w2.Output())
	}
}

// TestIdleWorkerLeavesTheShardsOutToOneThatStays: a worker with
// --idle-exit leaves while a shard is out when an idle worker that serves
// until stopped (no --idle-exit) serves the class: the shard has a worker
// should it come back, and a batch job joining a standing fleet is not
// held for the tail the fleet runs.
func TestIdleWorkerLeavesTheShardsOutToOneThatStays(t *testing.T) {
	c := startCluster(t, "20s")
	slow := c.slowFirstShard(2)
	c.worker("w0", "--slots", "cpu=1")
	burst := c.worker("w2", "--slots", "cpu=1", "--idle-exit", "300ms")
	if code := burst.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("w2: exit %d, want 0\n%s", code, burst.Output())
	}
	if rec, err := testenv.ReadShard(c.js, "t", "s0000"); err != nil || rec.State == stream.ShardValidated {
		t.Fatalf("s0000 %s, %v when w2 left; the test wants it still running", rec.State, err)
	}
	slow.Open()
	testenv.WaitState(t, c.js, "t", 30*time.Second, stream.RunComplete)
}

// slowFirstShard submits run t of n shards, of which s0000 runs until
// the test opens the gate returned and the others at once, and starts
// worker w1 (one slot, and the flags extra) on it; it returns once s0000
// runs there. (s0000 slept 10 s: the tests waited that out, and on a slow
// machine it could end before they had seen what they look for.)
func (c *cluster) slowFirstShard(n int, extra ...string) *testenv.Gate {
	c.t.Helper()
	started := filepath.Join(c.t.TempDir(), "started")
	gate := testenv.NewGate(c.t)
	c.submit(testenv.WriteJob(c.t, testenv.Job{Shards: n, Command: []string{"sh", "-c",
		`if [ "$4" = s0000 ]; then echo x >> "$1"; while [ ! -e "$5" ]; do sleep 0.05; done; fi; cp "$2" "$3/"`,
		"sh", started, "{input}", "{out}", "{id}", gate.Path}}))
	c.worker("w1", append([]string{"--slots", "cpu=1"}, extra...)...)
	testenv.Eventually(c.t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(started)
		return len(b) > 0, "s0000 not running yet"
	})
	return gate
}

// TestArchiveBuildNamesItsCommit: a build from `git archive` (a release
// tarball: no .git for the go command to read) names its commit, with
// the pseudo-version the go command gives the same commit in a checkout.
// It said "dev".
func TestArchiveBuildNamesItsCommit(t *testing.T) {
	head, err := exec.Command("git", "-C", "../..", "log", "-1", "--format=%H").Output()
	if err != nil {
		t.Skipf("not a git checkout (%v): there is no archive to make", err)
	}
	rev := strings.TrimSpace(string(head))
	dir := t.TempDir()
	archive := exec.Command("sh", "-c", `git -C ../.. archive --format=tar HEAD | tar -x -C "$0"`, dir)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, ".git")); err == nil {
		t.Fatal("the archive has a .git")
	}
	bin := filepath.Join(t.TempDir(), "shardpool")
	build := exec.Command("go", "build", "-o", bin, "./cmd/shardpool")
	build.Dir = dir
	build.Env = append(os.Environ(), "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build in the archive: %v\n%s", err, out)
	}
	version := func(bin string) stream.Build {
		t.Helper()
		out, err := exec.Command(bin, "version", "--json").Output()
		var b stream.Build
		if err == nil {
			err = json.Unmarshal(out, &b)
		}
		if err != nil {
			t.Fatalf("%s version --json: %v\n%s", bin, err, out)
		}
		return b
	}
	got, checkout := version(bin), version(testenv.Binary(t))
	if got.Revision != rev || got.Version != strings.TrimSuffix(checkout.Version, "+dirty") {
		t.Errorf("built from an archive of %s: %+v; want that revision and the checkout's version %q", rev, got, checkout.Version)
	}
}

// TestCoordinatorAndWorkerNameTheirBuild: `version --json`, the
// coordinator's info and the worker's report (status --json) and the
// run's final.json name the same build; built in a git checkout (as
// `make build` and testenv build it), with its commit.
func TestCoordinatorAndWorkerNameTheirBuild(t *testing.T) {
	c := startCluster(t, "20s")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Command: []string{"cp", "{input}", "{out}/"}})
	c.submit(spec)
	c.worker("w1", "--slots", "cpu=1")
	testenv.WaitState(t, c.js, "t", 30*time.Second, stream.RunComplete)
	v := testenv.Start(t, "version", "--json")
	if code := v.Wait(t, 10*time.Second); code != 0 {
		t.Fatalf("version --json: exit %d\n%s", code, v.Output())
	}
	var b stream.Build
	if err := json.Unmarshal([]byte(v.Output()), &b); err != nil || b.Version == "" || !strings.HasPrefix(b.Go, "go") {
		t.Fatalf("version --json: %+v, %v; want a version and a Go release\n%s", b, err, v.Output())
	}
	if head, err := exec.Command("git", "-C", "../..", "rev-parse", "HEAD").Output(); err == nil {
		rev := strings.TrimSpace(string(head))
		if b.Revision != rev || !strings.Contains(b.Version, rev[:12]) {
			t.Errorf("version --json in a checkout at %s: %+v; want that commit in revision and version", rev, b)
		}
	} else {
		t.Logf("not a git checkout (%v): the commit is not checked", err)
	}
	var st coordinator.Status
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		p := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token(), "--json")
		if code := p.Wait(t, 30*time.Second); code != 0 {
			return false, fmt.Sprintf("status --json: exit %d\n%s", code, p.Output())
		}
		st = coordinator.Status{}
		err := json.Unmarshal([]byte(p.Output()), &st)
		return err == nil && len(st.Workers) == 1 && len(st.Runs) == 1, fmt.Sprintf("status --json: %v; want one worker and one run\n%s", err, p.Output())
	})
	if st.Coordinator == nil || st.Coordinator.Version != b.Version || st.Workers[0].Version != b.Version {
		t.Errorf("status --json: coordinator %+v, worker %q; want both at %q", st.Coordinator, st.Workers[0].Version, b.Version)
	}
	f, err := coordinator.ReadFinal(st.Runs[0].Evidence)
	if err != nil || f == nil || f.Shardpool != b.Version {
		t.Errorf("final.json in %s: %+v, %v; want shardpool %q", st.Runs[0].Evidence, f, err, b.Version)
	}
}

// TestWorkerSlotsForEachClass: `shardpool worker --slots N`, as `run
// --slots N` has it, gives N fixed slots to every class of the runs it
// learns of, classes that appear after it started included. Before, the
// worker refused to start ("no class to serve") unless each class was
// named.
func TestWorkerSlotsForEachClass(t *testing.T) {
	c := startCluster(t, "10s")
	w := c.worker("w1", "--slots", "2")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		return strings.Contains(w.Output(), "serving 2 slot(s) of each class"), "worker output: " + w.Output()
	})
	events := filepath.Join(t.TempDir(), "events")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 6, Extra: "[class.io]\ncpus = 1\n",
		Command: []string{"sh", "-c", `case $1 in *[13579]) c=io;; *) c=cpu;; esac; echo "+$c" >> "$0"; sleep 1; echo "-$c" >> "$0"; cp "$2" "$3/"`, events, "{id}", "{input}", "{out}"},
		Line: func(i int, in string) string {
			class := "cpu"
			if i%2 == 1 {
				class = "io"
			}
			return fmt.Sprintf(`{"id":"s%04d","inputs":[%q],"class":%q}`, i, in, class)
		}})
	c.submit(spec)
	testenv.WaitState(t, c.js, "t", 60*time.Second, stream.RunComplete)
	validatedOnce(t, c.js, "t", filepath.Join(filepath.Dir(spec), "out"), 6)
	b, err := os.ReadFile(events)
	if err != nil {
		t.Fatal(err)
	}
	now, most, total := map[string]int{}, map[string]int{}, 0
	mostTotal := 0
	for _, ev := range strings.Fields(string(b)) {
		d := 1
		if ev[0] == '-' {
			d = -1
		}
		now[ev[1:]] += d
		total += d
		most[ev[1:]] = max(most[ev[1:]], now[ev[1:]])
		mostTotal = max(mostTotal, total)
	}
	if most["cpu"] != 2 || most["io"] != 2 || mostTotal < 3 {
		t.Fatalf("shards at once: cpu %d, io %d, in all %d; want 2 per class and more than 2 in all\n%s", most["cpu"], most["io"], mostTotal, b)
	}
	st := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token())
	if code := st.Wait(t, 30*time.Second); code != 0 || !regexp.MustCompile(`(?m)^w1\s+\S+\s+cpu=2,io=2\s`).MatchString(st.Output()) {
		t.Fatalf("status: exit %d, want w1 with cpu=2,io=2 slots\n%s", code, st.Output())
	}
}

// TestStatusWarnsWhenEveryShardFails: a submitted run has no `run` to halt
// it, and its workers go on; status says, while the run is under way,
// that every shard so far failed and how to stop the workers.
func TestStatusWarnsWhenEveryShardFails(t *testing.T) {
	c := startCluster(t, "10s")
	spec := testenv.WriteJob(t, testenv.Job{Name: "broken", Shards: 40, Retries: 0, Command: []string{"sh", "-c", "sleep 0.2; exit 1"}})
	// Not halted by the coordinator (TestSubmittedRunHalts): it warns.
	c.submit(spec, "--halt", "0")
	w := c.worker("w1", "--slots", "2")
	status := func() string {
		p := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token(), "broken")
		p.Wait(t, 30*time.Second)
		return p.Output()
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		out := status()
		return strings.Contains(out, "broken: warning: ") && strings.Contains(out, "failed after their retries and none has been validated") &&
			strings.Contains(out, "SIGUSR1 drains a worker"), "status:\n" + out
	})
	w.SignalMain(syscall.SIGUSR1)
	if code := w.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("worker drained on SIGUSR1: exit %d\n%s", code, w.Output())
	}
}

// TestSubmittedRunHalts: a submitted run whose first shards all fail
// (--halt 3) is halted by the coordinator: BLOCKED with the reason, its
// queued messages taken off the queue so that no worker starts another of
// its shards, while the shard running at the halt ends as it would (its
// message gone, its ack must not hang the worker). Once the cause is
// fixed, --retry-failed queues the failed and the held shards again and
// the run completes, each shard validated once.
func TestSubmittedRunHalts(t *testing.T) {
	c := startCluster(t, "10s")
	fixed := filepath.Join(t.TempDir(), "fixed")
	const n = 30
	spec := testenv.WriteJob(t, testenv.Job{Shards: n, Retries: 0, Command: []string{"sh", "-c",
		`if [ "$1" = s0000 ]; then sleep 3; cp "$3" "$4/"; exit 0; fi; sleep 0.1; [ -e "$2" ] || { echo "no tool here" >&2; exit 9; }; cp "$3" "$4/"`,
		"sh", "{id}", fixed, "{input}", "{out}"}})
	bad := testenv.Start(t, "submit", "--server", c.url, "--token-file", c.token(), "--halt", "-1", spec)
	if code := bad.Wait(t, 30*time.Second); code != 2 || !strings.Contains(bad.Output(), "--halt -1") {
		t.Fatalf("submit --halt -1: exit %d, want 2 (usage) naming the flag\n%s", code, bad.Output())
	}
	c.submit(spec, "--halt", "3")
	w := c.worker("w1", "--slots", "2")
	r := testenv.WaitState(t, c.js, "t", 30*time.Second, stream.RunBlocked)
	// The retry command keeps the submission's --halt (it was once left
	// out, so a retry ran under the default).
	if !strings.HasPrefix(r.Halted, "halted: ") || !strings.Contains(r.Reason, "taken off the queue") || !strings.Contains(r.Reason, "--halt 3 --retry-failed "+spec) {
		t.Fatalf("halted run: halted %q, reason %q; want why, what was held and how to go on (with --halt 3)", r.Halted, r.Reason)
	}
	ctx := context.Background()
	s, err := c.js.Stream(ctx, stream.StreamShards)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(stream.RunSubjects("t")))
		if err != nil {
			return false, err.Error()
		}
		return len(info.State.Subjects) == 0, fmt.Sprintf("queued messages of the halted run: %v", info.State.Subjects)
	})
	// The shard running at the halt ends validated; nothing else starts.
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		rec, err := stream.ReadRun(ctx, c.js, "t")
		return err == nil && rec.Counts.Validated == 1 && rec.Counts.Running == 0, fmt.Sprintf("counts %+v, err %v", rec.Counts, err)
	})
	before, _ := stream.ReadRun(ctx, c.js, "t")
	time.Sleep(1500 * time.Millisecond)
	after, _ := stream.ReadRun(ctx, c.js, "t")
	if after.Counts != before.Counts || after.State != stream.RunBlocked || after.Counts.Failed < 3 || after.Counts.Failed > 6 {
		t.Fatalf("after the halt: %s %+v, then %s %+v; want BLOCKED with 3 to 6 failed (the halt at 3, one slot), and no shard started since",
			before.State, before.Counts, after.State, after.Counts)
	}
	p := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token(), "--json", "t")
	if code := p.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("status --json: exit %d\n%s", code, p.Output())
	}
	var st coordinator.Status
	if err := json.Unmarshal([]byte(p.Output()), &st); err != nil || len(st.Runs) != 1 || st.Runs[0].Halted != r.Halted || st.Runs[0].Halt != 3 || len(st.Runs[0].Waiting) != 0 {
		t.Fatalf("status --json: %v; want the run with halt 3, its halt's reason and no waiting lines\n%s", err, p.Output())
	}
	if err := os.WriteFile(fixed, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	out := c.submit(spec, "--retry-failed", "--halt", "3")
	if !strings.Contains(out, "the run had halted: ") || !strings.Contains(out, "held shard(s) queued again") {
		t.Fatalf("submit --retry-failed of the halted run:\n%s\nwant what it lifted and how many it queued again", out)
	}
	testenv.WaitState(t, c.js, "t", 60*time.Second, stream.RunComplete)
	validatedOnce(t, c.js, "t", filepath.Join(filepath.Dir(spec), "out"), n)
	w.SignalMain(syscall.SIGTERM)
	if code := w.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("worker exit %d\n%s", code, w.Output())
	}
}

// TestRetryDelayIsNotABusyWorker: while a failed shard waits out its
// retry's delay, the worker's slots hold only open fetches. status used
// to say the shard waited because "2 of 2 slots of class cpu in use",
// with nothing running; it now gives no waiting line, and the shard's own
// line says when it is retried.
func TestRetryDelayIsNotABusyWorker(t *testing.T) {
	c := startCluster(t, "10s")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 3, Command: []string{"sh", "-c", `[ "$SHARDPOOL_ATTEMPT" -ge 4 ] || exit 5; cp "$0" "$1/"`, "{input}", "{out}"}})
	c.submit(spec)
	w := c.worker("w1", "--slots", "2")
	var seen int
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		p := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token(), "--json", "t")
		p.Wait(t, 30*time.Second)
		var st coordinator.Status
		if err := json.Unmarshal([]byte(p.Output()), &st); err != nil || len(st.Runs) != 1 {
			return false, fmt.Sprintf("status --json: %v\n%s", err, p.Output())
		}
		r := st.Runs[0]
		delayed := r.Counts.Running == 0 && len(r.Shards) == 1 && strings.Contains(r.Shards[0].Reason, "; retry in ")
		reported := len(st.Workers) == 1 && st.Workers[0].Slots["cpu"] == 2 && st.Workers[0].Running["cpu"] == 0
		if delayed && reported {
			if len(r.Waiting) > 0 {
				t.Fatalf("a shard in its retry's delay, nothing running: status says it waits for the worker: %q\n%s", r.Waiting, p.Output())
			}
			seen++
		}
		// Looked at several times within the delays (1, 2 and 4 s).
		return seen >= 5, fmt.Sprintf("looked at a delayed shard %d time(s) of 5; last status:\n%s", seen, p.Output())
	})
	testenv.WaitState(t, c.js, "t", 30*time.Second, stream.RunComplete)
	w.SignalMain(syscall.SIGTERM)
	w.Wait(t, 30*time.Second)
}

// TestWorkerStopsWhereAttemptsCannotStart: a worker on a host that
// lacks the job's program (its PATH has no `sptool`) fails each attempt
// before its command starts; after --stop-after-start-failures of them
// in a row, while another worker starts the same command, it stops
// fetching and exits 1 saying why, instead of failing the rest of the
// queue. At most one attempt more fails: the other worker's report may
// predate the failures, and the bad worker waits for the next one.
func TestWorkerStopsWhereAttemptsCannotStart(t *testing.T) {
	c := startCluster(t, "10s")
	// Enough for the good worker to be busy past the bad one's hold (5s
	// at 0.2s a shard): the bad one must fetch again to stop.
	const n = 50
	tools := t.TempDir()
	if err := os.WriteFile(filepath.Join(tools, "sptool"), []byte("#!/bin/sh\nsleep 0.2; cp \"$1\" \"$2/\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := testenv.WriteJob(t, testenv.Job{Shards: n, Retries: 0, Command: []string{"sptool", "{input}", "{out}"}})
	c.submit(spec, "--halt", "0")
	good := c.workerEnv("good", []string{"PATH=" + tools + ":" + os.Getenv("PATH")}, "--slots", "1")
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(good.Output(), "worker good serving"), "the good worker is not serving yet:\n" + good.Output()
	})
	bad := c.worker("bad", "--slots", "1", "--stop-after-start-failures", "3")
	if code := bad.Wait(t, 30*time.Second); code != 1 || !strings.Contains(bad.Output(), "worker bad: the last ") ||
		!strings.Contains(bad.Output(), "attempts could not start their command on host") || !strings.Contains(bad.Output(), "while worker good started commands") {
		t.Fatalf("worker on a host without the job's program: exit %d\n%s\nwant 1, saying it stopped while good started commands", code, bad.Output())
	}
	r := testenv.WaitState(t, c.js, "t", 60*time.Second, stream.RunBlocked, stream.RunComplete)
	if r.Counts.Failed < 3 || r.Counts.Failed > 4 || r.Counts.Validated != n-r.Counts.Failed {
		t.Fatalf("after the bad worker stopped: %s %+v; want 3 or 4 failed there, the rest validated by good", r.State, r.Counts)
	}
}

// TestWorkersHoldWhileNoneCanStartCommands: where the attempts of every
// worker fail before their command starts (the run's directory moved
// away, as a file server rebooting takes it), a worker at
// --stop-after-start-failures holds its fetches instead of stopping, and
// fetches again after the wait: once the directory is back, it runs the
// rest of the queue. Before, it exited 1, and a fleet stopped itself in
// an outage of a few seconds.
func TestWorkersHoldWhileNoneCanStartCommands(t *testing.T) {
	c := startCluster(t, "10s")
	const n = 12
	spec := testenv.WriteJob(t, testenv.Job{Shards: n, Retries: 0, Command: []string{"cp", "{input}", "{out}/"}})
	c.submit(spec, "--halt", "0")
	dir := filepath.Dir(spec)
	if err := os.Rename(dir, dir+"-away"); err != nil {
		t.Fatal(err)
	}
	w := c.worker("w", "--slots", "1", "--stop-after-start-failures", "3")
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(w.Output(), "start failures: holding"), "the worker does not hold:\n" + w.Output()
	})
	if !strings.Contains(w.Output(), "no other worker serving class cpu started a command meanwhile") || !strings.Contains(w.Output(), "not fetching for 10s") {
		t.Errorf("the hold does not say why or for how long:\n%s", w.Output())
	}
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		rec, err := stream.ReadRun(context.Background(), c.js, "t")
		return err == nil && rec.Counts.Failed == 3 && rec.Counts.Pending == n-3, fmt.Sprintf("during the hold: %+v (%v); want 3 failed, the rest pending", rec.Counts, err)
	})
	if err := os.Rename(dir+"-away", dir); err != nil {
		t.Fatal(err)
	}
	r := testenv.WaitState(t, c.js, "t", 60*time.Second, stream.RunBlocked)
	if r.Counts.Failed != 3 || r.Counts.Validated != n-3 {
		t.Fatalf("after the directory came back: %+v, want the 3 failed and the rest validated by the same worker", r.Counts)
	}
	if w.Exited() {
		t.Fatalf("the worker exited:\n%s", w.Output())
	}
	st := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token())
	if code := st.Wait(t, 30*time.Second); code != 0 || !regexp.MustCompile(`(?m)^w\s`).MatchString(st.Output()) {
		t.Fatalf("status: exit %d, want the worker w serving still\n%s", code, st.Output())
	}
}

// TestStatusPointsAtAHostThatFailsWhatOthersRun: a worker whose host
// lacks what the command needs (here, its scratch directory's name makes
// the job fail as a missing library would) fails every attempt at once,
// while another worker validates shards. Its report carries the failures
// in a row and the last reason, and `status` points at the host and how
// to drain it; the healthy worker gets no such line.
func TestStatusPointsAtAHostThatFailsWhatOthersRun(t *testing.T) {
	c := startCluster(t, "10s")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 30, Retries: 2, Command: []string{"sh", "-c",
		`case "$SHARDPOOL_SCRATCH" in *scratch-bad*) echo "libfoo.so.1: cannot open shared object file" >&2; exit 127;; esac; sleep 0.1; cp "$1" "$2/"`,
		"sh", "{input}", "{out}"}})
	c.submit(spec, "--halt", "0")
	good := c.worker("good", "--slots", "1")
	// Reported, not stopped: TestWorkerStopsWhereOthersValidateWhatFailsOnItsHost.
	bad := c.worker("bad", "--slots", "1", "--stop-when-failing-alone=false")
	var out string
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		p := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token())
		p.Wait(t, 20*time.Second)
		out = p.Output()
		return strings.Contains(out, "bad: its last ") && strings.Contains(out, "1 other worker(s) validate shards meanwhile"), "status:\n" + out
	})
	if !strings.Contains(out, "attempts failed, none validated since (the last: t s") || !strings.Contains(out, "libfoo.so.1: cannot open shared object file") ||
		!strings.Contains(out, fmt.Sprintf("drain it (kill -USR1 %d on %s)", bad.Cmd.Process.Pid, hostname(t))) {
		t.Errorf("status names the failing worker without its last failure or how to drain it:\n%s", out)
	}
	if strings.Contains(out, "good: its last") {
		t.Errorf("status points at the healthy worker:\n%s", out)
	}
	p := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token(), "--json")
	p.Wait(t, 20*time.Second)
	var st struct {
		Workers []stream.WorkerReport `json:"workers"`
	}
	if err := json.Unmarshal([]byte(p.Output()), &st); err != nil {
		t.Fatalf("status --json: %v\n%s", err, p.Output())
	}
	for _, wk := range st.Workers {
		switch {
		case wk.Name == "bad" && (wk.FailedInARow < 5 || !strings.Contains(wk.LastFailure, "libfoo")):
			t.Errorf("bad worker's report: %d failed in a row, last %q; want at least 5 and the missing library", wk.FailedInARow, wk.LastFailure)
		case wk.Name == "good" && (wk.FailedInARow != 0 || wk.Done == 0):
			t.Errorf("good worker's report: %d failed in a row, %d done; want none failed and some done", wk.FailedInARow, wk.Done)
		}
	}
	for _, w := range []*testenv.Proc{good, bad} {
		w.SignalMain(syscall.SIGTERM)
		w.Wait(t, 30*time.Second)
	}
}

// TestWorkerStopsWhereOthersValidateWhatFailsOnItsHost: a worker whose
// host lacks what the command needs (its scratch directory's name makes
// the job fail as a missing library would) fails each shard at once,
// faster than the healthy worker runs its own. After 5 failures in a row
// it holds its fetches while those shards run on the healthy worker;
// once that worker has validated enough of them, the bad worker stops
// and exits 1 saying why. It fails 10 attempts in all (5, a hold whose
// evidence is too thin to judge, 5 more, whatever the timing: a failed
// attempt is counted before its slot fetches again), not the 78 it
// failed before it held, and spends no shard's retries: the run
// completes, every shard validated by the good worker.
func TestWorkerStopsWhereOthersValidateWhatFailsOnItsHost(t *testing.T) {
	c := startCluster(t, "10s")
	const n = 30
	spec := testenv.WriteJob(t, testenv.Job{Shards: n, Retries: 3, Command: []string{"sh", "-c",
		`case "$SHARDPOOL_SCRATCH" in *scratch-bad*) echo "libfoo.so.1: cannot open shared object file" >&2; exit 127;; esac; sleep 0.1; cp "$1" "$2/"`,
		"sh", "{input}", "{out}"}})
	c.submit(spec, "--halt", "0")
	good := c.worker("good", "--slots", "1")
	// Serving, so its report is there when the bad worker starts: a bad
	// worker that knows of no peer holds only once it reads one, which
	// it tries at its 5th failure and then at most once a second (in CI
	// the two, started at once, made it fail 29 attempts).
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return strings.Contains(good.Output(), "worker good serving"), "the good worker is not serving yet:\n" + good.Output()
	})
	bad := c.worker("bad", "--slots", "1")
	if code := bad.Wait(t, 60*time.Second); code != 1 || !strings.Contains(bad.Output(), "worker bad: its last ") ||
		!strings.Contains(bad.Output(), "libfoo.so.1: cannot open shared object file") ||
		!strings.Contains(bad.Output(), "while other workers validated ") || !strings.Contains(bad.Output(), "the fault is likely the host's") {
		t.Fatalf("worker on a host that fails what the other validates: exit %d\n%s\nwant 1, saying it stopped and why", code, bad.Output())
	}
	r := testenv.WaitState(t, c.js, "t", 60*time.Second, stream.RunComplete, stream.RunBlocked)
	if r.State != stream.RunComplete || r.Counts.Validated != n {
		t.Fatalf("after the bad worker stopped: %s %+v; want COMPLETE, all %d shards validated by the good worker", r.State, r.Counts, n)
	}
	failedOnBad := 0
	for i := range n {
		rec, err := testenv.ReadShard(c.js, "t", fmt.Sprintf("s%04d", i))
		if err != nil {
			t.Fatal(err)
		}
		for _, at := range rec.Attempts {
			switch {
			case at.Worker == "bad" && at.Outcome == stream.OutcomeOK:
				t.Errorf("shard %s validated by the bad worker", rec.ID)
			case at.Worker == "bad":
				failedOnBad++
			}
		}
	}
	log, err := os.ReadFile(filepath.Join(c.data, "w-bad", "admission.log"))
	if err != nil {
		t.Fatal(err)
	}
	if failedOnBad != 10 {
		// CI once saw 11: the slot freed at the command's exit fetched a
		// 6th shard before the 5th failure was counted and the hold began.
		t.Errorf("%d attempts failed on the bad worker; want 10: 5 in a row start a hold, 5 more the next\n%s\nits admission.log:\n%s", failedOnBad, bad.Output(), log)
	}
	if !strings.Contains(string(log), "decision=wait class cpu: its last 5 attempts failed here while worker good runs shards: not fetching while the failed shards run elsewhere") {
		t.Errorf("the bad worker's admission.log has no hold:\n%s", log)
	}
	good.SignalMain(syscall.SIGTERM)
	good.Wait(t, 30*time.Second)
}

// TestWorkersKeepServingAJobThatFailsEverywhere: a job that fails on
// every host is not a host's fault. Both workers hold their fetches
// after 5 failures in a row while the other looks healthy, and fetch
// again once the other fails the same shards; neither stops, and the run
// ends BLOCKED with every shard failed.
func TestWorkersKeepServingAJobThatFailsEverywhere(t *testing.T) {
	c := startCluster(t, "10s")
	const n = 16
	spec := testenv.WriteJob(t, testenv.Job{Shards: n, Retries: 2, Command: []string{"sh", "-c", `echo "no such model: $1" >&2; exit 2`, "sh", "{input}"}})
	c.submit(spec, "--halt", "0")
	wa := c.worker("wa", "--slots", "1")
	wb := c.worker("wb", "--slots", "1")
	r := testenv.WaitState(t, c.js, "t", 60*time.Second, stream.RunBlocked)
	if r.Counts.Failed != n {
		t.Fatalf("run %+v; want all %d shards failed", r.Counts, n)
	}
	for _, w := range []*testenv.Proc{wa, wb} {
		if w.Exited() {
			t.Errorf("a worker stopped where the job fails everywhere:\n%s", w.Output())
		}
	}
	held := 0
	for _, name := range []string{"wa", "wb"} {
		log, err := os.ReadFile(filepath.Join(c.data, "w-"+name, "admission.log"))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(log), "not fetching while the failed shards run elsewhere") {
			held++
			if !strings.Contains(string(log), "decision=resume fetching again: ") {
				t.Errorf("worker %s held its fetches and never resumed:\n%s", name, log)
			}
		}
	}
	if held == 0 {
		t.Errorf("neither worker held its fetches after 5 failures in a row while the other looked healthy")
	}
	for _, w := range []*testenv.Proc{wa, wb} {
		w.SignalMain(syscall.SIGTERM)
		if code := w.Wait(t, 30*time.Second); code != 0 {
			t.Errorf("worker exit %d after SIGTERM, want 0:\n%s", code, w.Output())
		}
	}
}

// TestWhatACommandLeavesRunningEndsWithItWithoutACgroup: a worker is its
// commands' subreaper, so a process a command started outside its
// process group (setsid, as a daemon does) is killed when the command
// ends even where the shard has no cgroup of its own (no memory
// declared), and the attempt record says so; a process the command left
// that exits on its own meanwhile is waited for, not kept as a zombie
// of the worker.
func TestWhatACommandLeavesRunningEndsWithItWithoutACgroup(t *testing.T) {
	c := startCluster(t, "10s")
	pidDir := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Command: []string{"sh", "-c", `f="$0/$SHARDPOOL_SHARD_ID"
setsid sh -c 'echo $$ > "$0.tmp" && mv "$0.tmp" "$0" && exec sleep 300' "$f" &
(sleep 0.2 &)
while [ ! -s "$f" ]; do sleep 0.01; done
sleep 0.5`, pidDir}})
	t.Cleanup(func() {
		for i := range 3 {
			if b, err := os.ReadFile(filepath.Join(pidDir, fmt.Sprintf("s%04d", i))); err == nil {
				if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
	})
	w := c.worker("w", "--slots", "2")
	c.submit(spec)
	testenv.WaitState(t, c.js, "t", 60*time.Second, stream.RunComplete)
	kv, err := c.js.KeyValue(context.Background(), stream.BucketShards)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		id := fmt.Sprintf("s%04d", i)
		b, err := os.ReadFile(filepath.Join(pidDir, id))
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		if pid <= 0 || probe.PIDAlive("/proc", pid) {
			t.Errorf("%s: the daemon it started (pid %q) still runs after the shard was validated", id, b)
		}
		e, err := kv.Get(context.Background(), stream.ShardKey("t", id))
		if err != nil {
			t.Fatal(err)
		}
		var rec stream.ShardRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			t.Fatal(err)
		}
		if a := rec.Attempts[len(rec.Attempts)-1]; !strings.Contains(a.LeftRunning, fmt.Sprintf(" (pid %d)", pid)) {
			t.Errorf("%s: left_running %q, want it to name pid %d", id, a.LeftRunning, pid)
		}
	}
	// status names the worker whose attempts left processes running.
	var out string
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		p := testenv.Start(t, "status", "--server", c.url, "--token-file", c.token())
		p.Wait(t, 20*time.Second)
		out = p.Output()
		return strings.Contains(out, "w: 3 attempt(s) left processes running when their command ended, killed then (the last: t s000"), "status:\n" + out
	})
	wpid := w.Cmd.Process.Pid
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", wpid, wpid))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(children)) {
		pid, _ := strconv.Atoi(f)
		if st, err := probe.ReadStat("/proc", pid); err == nil {
			t.Errorf("the worker still has child %d (state %c) after the run ended", pid, st.State)
		}
	}
	w.SignalMain(syscall.SIGTERM)
	w.Wait(t, 30*time.Second)
}

func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}
