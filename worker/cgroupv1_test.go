package worker

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardpool/shardpool/worker/probe"
)

// v1Cgroups are this host's cgroup v1 controllers, for tests that place
// real processes in real cgroups (root on cgroup v1, as on this project's
// machines and CI).
func v1Cgroups(t *testing.T) *cgroups {
	t.Helper()
	// As testenv.RequireRoot, which this package's own tests cannot import.
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("this test needs root (CI runs as root)")
		}
		t.Skip("needs root: run as root or in CI")
	}
	c := detectCgroups("/")
	if c.mode != "v1" {
		t.Fatalf("per-shard cgroups here are %q (%s); this test needs cgroup v1 as root", c.mode, c.why)
	}
	return c
}

// TestTwoWorkersOfOneProcessNameTheirCgroupsApart: shard cgroups are
// named after the process's pid and a number; each worker counted from
// 1, so a second worker in the process (tests start several) found the
// first's "shardpool-p<pid>-1" and its shard ran outside any cgroup.
func TestTwoWorkersOfOneProcessNameTheirCgroupsApart(t *testing.T) {
	a, b := v1Cgroups(t), v1Cgroups(t)
	defer a.close()
	defer b.close()
	sa, err := a.newShard("t-s1-a1", 64<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.release(sa)
	sb, err := b.newShard("t-s2-a1", 64<<20, 0)
	if err != nil {
		t.Fatalf("the second worker's first shard cgroup: %v (the first worker's is %s)", err, sa.mem)
	}
	defer b.release(sb)
	if sa.mem == sb.mem {
		t.Fatalf("both workers' shards share the cgroup %s", sa.mem)
	}
}

// cgroupOf is the path of one controller's cgroup in a /proc cgroup file.
func cgroupOf(t *testing.T, text, controller string) string {
	t.Helper()
	for _, line := range strings.Split(text, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (parts[1] == controller || strings.HasPrefix(parts[1], controller+",")) {
			return parts[2]
		}
	}
	t.Fatalf("no %s controller in %q", controller, text)
	return ""
}

// TestChildStartsInItsV1CgroupsWithoutAPrologue: on cgroup v1 the child is
// in the shard's memory and cpu cgroups from its first instruction, so
// what it forks is too; and every thread of the worker, the main thread
// above all (whose memory cgroup is charged for the whole process), is
// back in the worker's own cgroups after each start. Starts run from
// several goroutines at once, as slots do.
func TestChildStartsInItsV1CgroupsWithoutAPrologue(t *testing.T) {
	c := v1Cgroups(t)
	if c.v1cpu == "" {
		t.Fatalf("no writable cgroup v1 cpu controller here")
	}
	self, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	homeMem, homeCPU := cgroupOf(t, string(self), "memory"), cgroupOf(t, string(self), "cpu")
	var wg sync.WaitGroup
	errs := make(chan error, 4*25*3)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				sc, err := c.newShard("", 64<<20, 1000)
				if err != nil {
					errs <- err
					return
				}
				// The grandchild reports its cgroups: it was forked by the
				// command, not placed by anyone.
				cmd := exec.Command("sh", "-c", "cat /proc/self/cgroup | cat")
				out, err := outputIn(sc, cmd)
				c.release(sc)
				if err != nil {
					errs <- err
					return
				}
				if got := cgroupOf(t, out, "memory"); got != filepath.Join(homeMem, filepath.Base(sc.mem)) {
					errs <- fmt.Errorf("start %d: the command's child is in memory cgroup %s, want %s", i, got, sc.mem)
				}
				if got := cgroupOf(t, out, "cpu"); got != filepath.Join(homeCPU, filepath.Base(sc.cpu)) {
					errs <- fmt.Errorf("start %d: the command's child is in cpu cgroup %s, want %s", i, got, sc.cpu)
				}
				// Other goroutines' starting threads may be in their shards'
				// cgroups now; the main thread never is.
				if err := threadsHome(homeMem, homeCPU, true); err != nil {
					errs <- fmt.Errorf("after start %d: %w", i, err)
				}
			}
		}()
	}
	wg.Wait()
	c.close()
	if err := threadsHome(homeMem, homeCPU, false); err != nil {
		t.Errorf("after all starts: %v", err)
	}
	if c.made > 4*3 {
		t.Errorf("%d cgroups made for 100 shards 4 at a time, want them reused", c.made)
	}
	if left, _ := filepath.Glob(filepath.Join(c.v1mem, fmt.Sprintf("shardpool-p%d-*", os.Getpid()))); len(left) > 0 {
		t.Errorf("cgroups left after close: %v", left)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// outputIn runs cmd started in sc and returns its stdout.
func outputIn(sc *shardCgroup, cmd *exec.Cmd) (string, error) {
	return outputOf(cmd, sc.startIn)
}

// outputOf starts cmd with start (a startCmd: its stdout must be a file),
// waits for it and returns what it wrote to stdout. Safe to call from
// any goroutine.
func outputOf(cmd *exec.Cmd, start func(*exec.Cmd) error) (string, error) {
	f, err := os.CreateTemp("", "shardpool-stdout-")
	if err != nil {
		return "", err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	cmd.Stdout = f
	if err := start(cmd); err != nil {
		return "", err
	}
	if err := waitCmd(cmd); err != nil {
		return "", err
	}
	b, err := os.ReadFile(f.Name())
	return string(b), err
}

// threadsHome checks that every thread of this process (or, with
// mainOnly, its main thread) is in the given memory and cpu cgroups.
func threadsHome(mem, cpu string, mainOnly bool) error {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return err
	}
	for _, task := range tasks {
		if mainOnly && task.Name() != fmt.Sprint(os.Getpid()) {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "cgroup"))
		if err != nil {
			continue // the thread ended
		}
		for _, line := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(line, ":", 3)
			if len(parts) != 3 {
				continue
			}
			if (parts[1] == "memory" && parts[2] != mem) || (parts[1] == "cpu" && parts[2] != cpu) {
				return fmt.Errorf("thread %s (main thread: %v) is in %s cgroup %s", task.Name(), task.Name() == fmt.Sprint(os.Getpid()), parts[1], parts[2])
			}
		}
	}
	return nil
}

// TestStartingThreadThatCannotReturnEnds: when the starting thread cannot
// go back to the worker's cgroups, the start fails saying so, the child is
// gone, and the thread ends with it, so the shard's cgroup empties and is
// removed, and no thread of the worker stays in it.
func TestStartingThreadThatCannotReturnEnds(t *testing.T) {
	c := v1Cgroups(t)
	sc, err := c.newShard(fmt.Sprintf("test-noreturn-%d", os.Getpid()), 64<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer sc.remove()
	sc.homeMem = filepath.Join(t.TempDir(), "gone")
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = nil
	err = sc.startIn(cmd)
	if err == nil || !strings.Contains(err.Error(), "return the starting thread") {
		t.Fatalf("start: %v, want an error saying the thread could not return", err)
	}
	if cmd.ProcessState == nil {
		t.Fatalf("the child was not waited for")
	}
	// The thread ends when its goroutine does, just after startIn returns.
	var tasks []byte
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		tasks, err = os.ReadFile(filepath.Join(sc.mem, "tasks"))
		if err == nil && strings.TrimSpace(string(tasks)) == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tasks of the shard's cgroup after 5s: %q %v, want none", tasks, err)
		}
	}
	if err := os.Remove(sc.mem); err != nil {
		t.Fatalf("remove the shard's cgroup: %v", err)
	}
}

// TestReusedCgroupMeasuresOnlyItsShard: a v1 shard cgroup given back is
// used again for the next shard with the same limits, and that shard's
// peak and OOM count are its own, not those of the one before; a cgroup
// with a process still in it is not used again.
func TestReusedCgroupMeasuresOnlyItsShard(t *testing.T) {
	c := v1Cgroups(t)
	defer c.close()
	run := func(script string) (*shardCgroup, int64, int64) {
		t.Helper()
		sc, err := c.newShard("", 48<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("sh", "-c", script)
		if sc.startIn(cmd) == nil {
			_ = waitCmd(cmd)
		}
		peak, ooms := sc.peak(), sc.oomKills()
		c.release(sc)
		return sc, peak, ooms
	}
	first, peak, ooms := run(`head -c 30M /dev/zero | tail -n 1 > /dev/null`)
	if peak < 30<<20 || ooms != 0 {
		t.Fatalf("30 MiB shard: peak %d, %d OOM kill(s); want at least 30 MiB and none", peak, ooms)
	}
	second, peak, ooms := run(`true`)
	if second != first {
		t.Fatalf("the second shard got a new cgroup (%s), want %s again", second.mem, first.mem)
	}
	if peak > 8<<20 || ooms != 0 {
		t.Fatalf("reused for true: peak %d, %d OOM kill(s); want its own peak (under 8 MiB) and none", peak, ooms)
	}
	_, _, ooms = run(`head -c 300M /dev/zero | tail -n 1 > /dev/null`)
	if ooms != 1 {
		t.Fatalf("300 MiB shard at a 48 MiB limit: %d OOM kill(s), want 1", ooms)
	}
	if _, _, ooms = run(`true`); ooms != 0 {
		t.Fatalf("the shard after an OOM kill: %d OOM kill(s), want its own (none)", ooms)
	}

	// A process left in the cgroup: the cgroup is not reused.
	sc, err := c.newShard("", 48<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer os.Remove(sc.mem) // last, once the stray is gone
	stray := exec.Command("sleep", "30")
	if err := sc.startIn(stray); err != nil {
		t.Fatal(err)
	}
	defer waitCmd(stray)
	defer stray.Process.Kill()
	go func() {
		time.Sleep(1500 * time.Millisecond)
		stray.Process.Kill()
	}()
	c.release(sc) // tries to remove it while the stray lives, for a second
	next, err := c.newShard("", 48<<20, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer c.release(next)
	if next == sc {
		t.Fatalf("a cgroup with a live process in it was handed out again")
	}
}

// TestDeadWorkersCgroupsAreRemoved: kept cgroups named for a pid no process
// has (a worker killed with SIGKILL) are removed when a worker starts;
// this process's own stay.
func TestDeadWorkersCgroupsAreRemoved(t *testing.T) {
	c := v1Cgroups(t)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(c.v1mem, fmt.Sprintf("shardpool-p%d-1", gone.Process.Pid))
	own := filepath.Join(c.v1mem, fmt.Sprintf("shardpool-p%d-1", os.Getpid()))
	for _, d := range []string{dead, own} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(d)
	}
	c.removeDeadOwners()
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead worker's cgroup %s: %v, want it removed", dead, err)
	}
	if _, err := os.Stat(own); err != nil {
		t.Errorf("this worker's own cgroup: %v, want it kept", err)
	}
}

// TestDeadWorkersCgroupsLoseWhatTheyHold: what a dead worker's commands
// left running in its shard cgroup (a daemon, a grandchild) is killed
// when a worker looks, whatever state directory either kept, and the
// cgroup is removed; the line says what and whose.
func TestDeadWorkersCgroupsLoseWhatTheyHold(t *testing.T) {
	c := v1Cgroups(t)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("shardpool-p%d-1", gone.Process.Pid)
	dirs := []string{filepath.Join(c.v1mem, name), filepath.Join(c.v1cpu, name)}
	for _, d := range dirs {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(d)
	}
	orphan := exec.Command("sleep", "300")
	if err := orphan.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- orphan.Wait() }()
	defer orphan.Process.Kill()
	for _, d := range dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(orphan.Process.Pid)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	killed := c.removeDeadOwners()
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatalf("the orphan (pid %d) in the dead worker's cgroup still runs; removeDeadOwners said %q", orphan.Process.Pid, killed)
	}
	want := fmt.Sprintf("killed sleep (pid %d) left running in cgroup %s by worker pid %d", orphan.Process.Pid, dirs[0], gone.Process.Pid)
	if len(killed) != 1 || !strings.HasPrefix(killed[0], want) {
		t.Errorf("removeDeadOwners: %q, want one line starting %q", killed, want)
	}
	c.removeDeadOwners() // the cgroups empty once the orphan is reaped
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("the dead worker's cgroup %s: %v, want it removed", d, err)
		}
	}
}

// TestADeadWorkersCgroupOfAnotherNamespaceIsLeft: a process in a shard
// cgroup whose pid namespace is not this worker's is not killed (the
// cgroup's pid proves nothing about its worker there), and without a
// namespace of its own to compare the worker kills nothing.
func TestADeadWorkersCgroupOfAnotherNamespaceIsLeft(t *testing.T) {
	c := v1Cgroups(t)
	dir := filepath.Join(c.v1mem, fmt.Sprintf("shardpool-p%d-9", 1<<22+7))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := exec.Command("sleep", "300")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		p.Process.Kill()
		p.Wait()
		os.Remove(dir)
	}()
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(p.Process.Pid)), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{"pid:[1]", ""} {
		if left := killDeadLeft(dir, ns); len(left) > 0 || !probe.PIDAlive("/proc", p.Process.Pid) {
			t.Errorf("namespace %q: killed %q, want nothing", ns, left)
		}
	}
}

// TestKeptCgroupsAreBounded: a worker keeps at most keepAtMost emptied
// cgroups, whatever number of different limits it has served; the rest
// are removed when given back.
func TestKeptCgroupsAreBounded(t *testing.T) {
	c := v1Cgroups(t)
	defer c.close()
	var got []*shardCgroup
	for i := range keepAtMost + 6 {
		sc, err := c.newShard("", int64(i+1)<<20, 0)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, sc)
	}
	for _, sc := range got {
		c.release(sc)
	}
	left, _ := filepath.Glob(filepath.Join(c.v1mem, fmt.Sprintf("shardpool-p%d-*", os.Getpid())))
	if c.kept != keepAtMost || len(left) != keepAtMost {
		t.Fatalf("%d cgroups given back: %d kept, %d on disk; want %d of each", len(got), c.kept, len(left), keepAtMost)
	}
}

// TestProcListLeavesOutTheWorker: the pids killLeft kills never include
// the worker's own, which a starting thread on cgroup v1 puts in a
// shard's cgroup for a moment.
func TestProcListLeavesOutTheWorker(t *testing.T) {
	self := os.Getpid()
	got := procList([]byte(fmt.Sprintf("12\n%d\n\n34\nx\n", self)), self)
	if fmt.Sprint(got) != "[12 34]" {
		t.Fatalf("procList = %v, want [12 34] (not %d, this process)", got, self)
	}
}
