// Command soak is the crash soak behind `make soak`: a coordinator and two
// workers (real `shardpool` processes on this host) run N short shards
// while the soak kills them at random: SIGKILL of the coordinator (then
// restarted on the same --data), SIGKILL of either worker, SIGTERM of a
// worker, SIGUSR1 of a worker and its commands as Slurm's --signal sends
// it (each restarted under its name). When the run ends it checks
// what shardpool promises: the run is COMPLETE, every shard was recorded
// validated exactly once (KV history) with every attempt in its record
// closed, and every output verifies against its marker with the run's
// fingerprint. It exits 1 on any violation.
// With -cluster three coordinators form a cluster (--cluster), and each
// coordinator kill picks one of them.
// With -powercut (root, loop devices) a sixth event cuts the host's power:
// every process dies, and the disk holding the store and the workers'
// state and the one holding the job and its outputs lose what was not
// made durable (coordinator/drill/powercut); then all restart.
//
// It is a tool for hunting rare recovery bugs, not a test: the kills fall
// at random moments, so a run explores different interleavings each time
// (-seed repeats one). Its random events are printed with their times.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/coordinator/drill/powercut"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

func main() {
	bin := flag.String("bin", "bin/shardpool", "shardpool binary")
	n := flag.Int("n", 300, "shards")
	events := flag.Int("events", 12, "random kills")
	seed := flag.Uint64("seed", uint64(time.Now().UnixNano()), "random seed (printed; pass it to repeat a run's choices)")
	keep := flag.Bool("keep", false, "keep the work directory also when every check passed")
	memory := flag.String("memory", "", `declare this memory for the shards' class (e.g. "64MiB"): as root, each shard runs in cgroups of its own, and the soak checks that no dead worker's are left`)
	cuts := flag.Bool("powercut", false, "also cut the power (as root, with loop devices): the state on one simulated disk, the job and its outputs on another, both losing what was not made durable (coordinator/drill/powercut)")
	fsKind := flag.String("fs", powercut.Ext4, "with -powercut, the simulated disks' file system: ext4 or xfs (XFS keeps less of what was not fsynced: delayed allocation)")
	cluster := flag.Bool("cluster", false, "a cluster of three coordinators (--cluster) instead of one: the coordinator kills pick one of them")
	flag.Parse()
	abs, err := filepath.Abs(*bin)
	if err != nil {
		fail("%v", err)
	}
	dir, err := os.MkdirTemp("", "shardpool-soak-")
	if err != nil {
		fail("%v", err)
	}
	fmt.Printf("soak: %d shards, %d events, seed %d, in %s\n", *n, *events, *seed, dir)
	if *cuts {
		fmt.Printf("soak: power cuts under %s\n", *fsKind)
	}
	s := &soak{bin: abs, dir: dir, rng: rand.New(rand.NewPCG(*seed, 0)), procs: map[string]*exec.Cmd{}, memory: *memory, state: dir, job: dir, coords: 1}
	if *cluster {
		s.coords = 3
		fmt.Println("soak: a cluster of 3 coordinators")
	}
	if *cuts {
		if s.stateFS, err = powercut.NewKind(filepath.Join(dir, "state-disk"), 1<<30, *fsKind); err != nil {
			fail("power cuts: %v", err)
		}
		if s.jobFS, err = powercut.NewKind(filepath.Join(dir, "job-disk"), 256<<20, *fsKind); err != nil {
			s.stateFS.Close()
			fail("power cuts: %v", err)
		}
		s.state, s.job = s.stateFS.Dir, s.jobFS.Dir
	}
	code := s.run(*n, *events)
	s.stopAll()
	if *cuts {
		s.stateFS.Close()
		s.jobFS.Close()
	}
	if code == 0 && *memory != "" {
		code = s.checkCgroups()
	}
	if code == 0 && !*keep {
		os.RemoveAll(dir) // a violation keeps it, for its logs and store
	}
	os.Exit(code)
}

type soak struct {
	bin, dir, url string
	// coords is how many coordinators run (3: a cluster); addrs and
	// routes are their client and route listeners.
	coords        int
	addrs, routes []string
	// state holds the coordinator's store and the workers' state and
	// scratch, job the job and its outputs: dir, or with -powercut the
	// two simulated disks.
	state, job     string
	stateFS, jobFS *powercut.FS
	memory         string // the class's memory, when declared
	rng            *rand.Rand
	procs          map[string]*exec.Cmd
	start          time.Time
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "soak: "+format+"\n", args...)
	os.Exit(1)
}

// fail stops what the soak started, then exits 1.
func (s *soak) fail(format string, args ...any) {
	s.stopAll()
	fail(format, args...)
}

func (s *soak) logf(format string, args ...any) {
	fmt.Printf("%6.2fs  %s\n", time.Since(s.start).Seconds(), fmt.Sprintf(format, args...))
}

func (s *soak) run(n, events int) int {
	var urls []string
	for range s.coords {
		s.addrs = append(s.addrs, freePort())
		s.routes = append(s.routes, freePort())
		urls = append(urls, "nats://"+s.addrs[len(s.addrs)-1])
	}
	s.url = strings.Join(urls, ",")
	spec := s.writeJob(n)
	syscall.Sync() // the job is on its disk before any power cut
	s.start = time.Now()
	for i := range s.coords {
		s.startCoordinator(i)
	}
	if s.coords > 1 {
		// A cluster answers JetStream requests once it has a leader and
		// its layout: before, a request can wait out its whole timeout.
		for i := range s.coords {
			s.waitReady(i)
		}
	}
	nc, err := nats.Connect(s.url, nats.TokenHandler(coordinator.TokenReader(s.tokenFile())), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		s.fail("connect: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		s.fail("%v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	_, err = stream.WaitBuckets(ctx, js, 30*time.Second)
	cancel()
	if err != nil {
		s.fail("coordinator not ready: %v", err)
	}
	sub := exec.Command(s.bin, "submit", "--server", s.url, "--token-file", s.tokenFile(), spec)
	if out, err := sub.CombinedOutput(); err != nil {
		s.fail("submit: %v\n%s", err, out)
	}
	for _, w := range []string{"w1", "w2"} {
		s.startWorker(w)
	}
	kinds := 5
	if s.stateFS != nil {
		kinds = 6
	}
	for range events {
		time.Sleep(time.Duration(500+s.rng.IntN(1500)) * time.Millisecond)
		switch s.rng.IntN(kinds) {
		case 0:
			i := s.rng.IntN(s.coords)
			s.signal(s.coordName(i), syscall.SIGKILL)
			time.Sleep(300 * time.Millisecond)
			s.startCoordinator(i)
		case 1:
			s.signal("w1", syscall.SIGKILL)
			s.startWorker("w1")
		case 2:
			s.signal("w2", syscall.SIGKILL)
			s.startWorker("w2")
		case 3:
			s.signal("w1", syscall.SIGTERM)
			s.startWorker("w1")
		case 4:
			s.slurmWarning("w2")
			s.startWorker("w2")
		case 5:
			s.powerCut()
		}
	}
	s.logf("events done; waiting for the verdict")
	final, err := waitVerdict(js, 3*time.Minute)
	if err != nil {
		s.logf("VIOLATION: %v", err)
		return 1
	}
	s.logf("run %s: %+v", final.State, final.Counts)
	bad := 0
	if final.State != stream.RunComplete || final.Counts.Validated != n {
		s.logf("VIOLATION: run %s with %d of %d validated: %s", final.State, final.Counts.Validated, n, final.Reason)
		bad++
	}
	bad += s.check(js, final, n)
	if bad > 0 {
		s.logf("%d violation(s); work directory kept: %s", bad, s.dir)
		return 1
	}
	s.logf("ok: every shard validated once, every attempt closed, and its output verifies")
	return 0
}

// writeJob writes n shards of a script that sleeps up to 0.4 s, counts its
// runs in a side file and writes one output file.
func (s *soak) writeJob(n int) string {
	job := filepath.Join(s.job, "job.sh")
	script := "#!/bin/sh\necho \"$1\" >> \"$3\"\nsleep 0.$(( $$ % 5 ))\necho \"result of $1\" > \"$2/r.txt\"\n"
	if err := os.WriteFile(job, []byte(script), 0o755); err != nil {
		fail("%v", err)
	}
	var man strings.Builder
	for i := range n {
		fmt.Fprintf(&man, "{\"id\":\"s%04d\"}\n", i)
	}
	if err := os.WriteFile(filepath.Join(s.job, "manifest.jsonl"), []byte(man.String()), 0o644); err != nil {
		fail("%v", err)
	}
	spec := filepath.Join(s.job, "shardpool.toml")
	body := fmt.Sprintf("name = \"soak\"\nmanifest = \"manifest.jsonl\"\noutput = \"out\"\nretries = 3\ncommand = [%q, \"{id}\", \"{out}\", %q]\n",
		job, filepath.Join(s.dir, "ran.log"))
	if s.memory != "" {
		body += fmt.Sprintf("[class.cpu]\ncpus = 1\nmemory = %q\n", s.memory)
	}
	if err := os.WriteFile(spec, []byte(body), 0o644); err != nil {
		fail("%v", err)
	}
	return spec
}

// coordName is the name of coordinator i in the soak's logs.
func (s *soak) coordName(i int) string {
	if s.coords == 1 {
		return "coordinator"
	}
	return fmt.Sprintf("coordinator%d", i+1)
}

func (s *soak) startCoordinator(i int) {
	args := []string{"coordinator", "--listen", s.addrs[i], "--http", "", "--lease-ttl", "5s"}
	if s.coords == 1 {
		args = append(args, "--data", filepath.Join(s.state, "coord"))
	} else {
		args = append(args, "--data", filepath.Join(s.state, fmt.Sprintf("coord%d", i+1)), "--cluster", s.routes[i],
			"--peers", strings.Join(s.routes, ","), "--token-file", s.tokenFile())
	}
	s.startProc(s.coordName(i), args...)
}

// waitReady waits for coordinator i to say it is ready.
func (s *soak) waitReady(i int) {
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(filepath.Join(s.dir, s.coordName(i)+".log"))
		if strings.Contains(string(b), "coordinator ready") {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.fail("%s not ready after 90s; its log is in %s", s.coordName(i), s.dir)
}

// freePort is a loopback address no one listens on now
// (coordinator.LoopbackPorts: below the kernel's ephemeral range, where a
// worker's outgoing connection cannot take it before the coordinator
// binds it; one that restarts during the soak gets its own address back).
func freePort() string {
	ports, err := coordinator.LoopbackPorts(1)
	if err != nil {
		fail("%v", err)
	}
	return ports[0]
}

// tokenFile holds the coordinator's token (in its store), which every
// client presents.
func (s *soak) tokenFile() string {
	if s.coords > 1 {
		return filepath.Join(s.state, "cluster", coordinator.TokenName) // shared by the cluster
	}
	return filepath.Join(s.state, "coord", "jetstream", coordinator.TokenName)
}

// names lists the processes: the coordinators, then the workers.
func (s *soak) names() []string {
	var out []string
	for i := range s.coords {
		out = append(out, s.coordName(i))
	}
	return append(out, "w1", "w2")
}

func (s *soak) startWorker(name string) {
	s.startProc(name, "worker", "--server", s.url, "--token-file", s.tokenFile(), "--name", name, "--slots", "cpu=3", "--grace", "2s",
		"--data", filepath.Join(s.state, "state"), "--scratch", filepath.Join(s.state, "scratch-"+name))
}

// powerCut is the whole host losing power: every process dies at once
// (their commands with them), both disks lose what was not made durable,
// and everything starts again.
func (s *soak) powerCut() {
	s.logf("power cut")
	for _, name := range s.names() {
		s.signal(name, syscall.SIGKILL)
	}
	// The commands die with their workers (parent-death signal).
	time.Sleep(100 * time.Millisecond)
	if err := s.stateFS.Cut(); err != nil {
		s.fail("power cut: %v", err)
	}
	if err := s.jobFS.Cut(); err != nil {
		s.fail("power cut: %v", err)
	}
	for i := range s.coords {
		s.startCoordinator(i)
	}
	s.startWorker("w1")
	s.startWorker("w2")
}

func (s *soak) startProc(name string, args ...string) {
	log, err := os.OpenFile(filepath.Join(s.dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fail("%v", err)
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		s.fail("start %s: %v", name, err)
	}
	go func() { _ = cmd.Wait(); log.Close() }()
	s.procs[name] = cmd
	s.logf("start %s (pid %d)", name, cmd.Process.Pid)
}

// slurmWarning is what Slurm's --signal=USR1@SECONDS sends ahead of a
// job's time limit: SIGUSR1 to every process of the job, the worker's
// commands (first: they may die of it before the worker knows) and the
// worker, which drains and exits; it waits for that.
func (s *soak) slurmWarning(name string) {
	cmd := s.procs[name]
	if cmd == nil {
		return
	}
	kids := probe.Children("/proc", cmd.Process.Pid)
	s.logf("SIGUSR1 to %s's %d command(s)", name, len(kids))
	for _, k := range kids {
		_ = syscall.Kill(-k, syscall.SIGUSR1)
	}
	s.signal(name, syscall.SIGUSR1)
}

// signal sends sig to a process and, for a graceful stop, waits for it to
// exit (a worker restarted under its name before the old one left would be
// refused the name).
func (s *soak) signal(name string, sig syscall.Signal) {
	cmd := s.procs[name]
	if cmd == nil {
		return
	}
	s.logf("%s %s (pid %d)", sig, name, cmd.Process.Pid)
	_ = cmd.Process.Signal(sig)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && syscall.Kill(cmd.Process.Pid, 0) == nil {
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *soak) stopAll() {
	names := s.names()
	slices.Reverse(names) // the workers first
	for _, name := range names {
		if cmd := s.procs[name]; cmd != nil {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			deadline := time.Now().Add(10 * time.Second)
			for time.Now().Before(deadline) && syscall.Kill(cmd.Process.Pid, 0) == nil {
				time.Sleep(20 * time.Millisecond)
			}
			_ = cmd.Process.Kill()
		}
	}
}

// waitVerdict waits for the run record to say COMPLETE or BLOCKED.
func waitVerdict(js jetstream.JetStream, timeout time.Duration) (*stream.RunRecord, error) {
	deadline := time.Now().Add(timeout)
	var last stream.RunRecord
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := stream.ReadRun(ctx, js, "soak")
		cancel()
		if err == nil {
			if last = r; r.State == stream.RunComplete || r.State == stream.RunBlocked {
				return &last, nil
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	return nil, fmt.Errorf("no verdict after %s; the run is %s with %+v", timeout, last.State, last.Counts)
}

// check reads every shard's KV history and output: validated exactly once
// for the run's fingerprint, every attempt in its record closed, an output
// that verifies with it, and nothing of an interrupted commit left beside
// the outputs.
func (s *soak) check(js jetstream.JetStream, run *stream.RunRecord, n int) int {
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, stream.BucketShards)
	if err != nil {
		s.logf("VIOLATION: shards bucket: %v", err)
		return 1
	}
	bad, reran, drained := 0, 0, 0
	for i := range n {
		id := fmt.Sprintf("s%04d", i)
		hist, err := kv.History(ctx, stream.ShardKey("soak", id))
		for try := 0; err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) && try < 5; try++ {
			// A cluster just back from a power cut may still be moving
			// a stream's leader: a read that found no answer is not a
			// violation; one that finds the history wrong is.
			s.logf("history of %s: %v; reading again", id, err)
			time.Sleep(time.Second)
			hist, err = kv.History(ctx, stream.ShardKey("soak", id))
		}
		if err != nil {
			s.logf("VIOLATION: history of %s: %v", id, err)
			bad++
			continue
		}
		validated := stream.Validations(hist, run.Fingerprint)
		if len(validated) != 1 {
			s.logf("VIOLATION: %s recorded validated %d times", id, len(validated))
			bad++
		}
		if len(validated) > 0 && len(validated[len(validated)-1].Attempts) > 1 {
			reran++
		}
		if err := stream.CheckClosed(hist[len(hist)-1].Value()); err != nil {
			s.logf("VIOLATION: %s: %v", id, err)
			bad++
		}
		if len(validated) > 0 {
			// A command killed by the drain's SIGUSR1 is handed back, not
			// charged.
			for _, a := range validated[len(validated)-1].Attempts {
				if (strings.Contains(a.Reason, "user defined signal 1") || strings.Contains(a.Reason, "exit status 138")) && a.Outcome != stream.OutcomeInterrupted {
					s.logf("VIOLATION: %s attempt %d charged for the drain's SIGUSR1: %s: %s", id, a.N, a.Outcome, a.Reason)
					bad++
				}
				if a.Outcome == stream.OutcomeInterrupted && strings.Contains(a.Reason, "while the worker drains") {
					drained++
				}
			}
		}
		mk, err := checkpoint.Verify(filepath.Join(s.job, "out", id))
		if err != nil || mk.Fingerprint != run.Fingerprint {
			s.logf("VIOLATION: output of %s: %v (fingerprint %q, want %q)", id, err, mk.Fingerprint, run.Fingerprint)
			bad++
		}
	}
	// What interrupted commits left beside the outputs is gone once the
	// run is COMPLETE (the coordinator sweeps it).
	ents, _ := os.ReadDir(filepath.Join(s.job, "out"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), checkpoint.TempPrefix) {
			s.logf("VIOLATION: left in the output directory: %s", e.Name())
			bad++
		}
	}
	ran, _ := os.ReadFile(filepath.Join(s.dir, "ran.log"))
	s.logf("%d shard(s) needed more than one attempt (%d handed back by a drain); commands ran %d times for %d shards", reran, drained, strings.Count(string(ran), "\n"), n)
	return bad
}

// checkCgroups runs after every process the soak started has stopped: the
// shard cgroups workers keep (shardpool-p<pid>-<n>, beside the soak's own,
// which its workers share) must all be gone, those of killed workers
// removed by the workers that came after them. It returns 1 when some
// are left.
func (s *soak) checkCgroups() int {
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		s.logf("VIOLATION: cannot read /proc/self/cgroup: %v", err)
		return 1
	}
	var left []string
	for _, line := range strings.Split(string(self), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			if ctl != "memory" && ctl != "cpu" {
				continue
			}
			dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", parts[1], parts[2], "shardpool-p*"))
			left = append(left, dirs...)
		}
	}
	if len(left) > 0 {
		s.logf("VIOLATION: %d shard cgroup(s) left behind: %s", len(left), strings.Join(left, " "))
		return 1
	}
	s.logf("ok: no shard cgroup left behind")
	return 0
}
