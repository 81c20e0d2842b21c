package worker

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
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
	errs := make(chan error, 4*25)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 25 {
				name := fmt.Sprintf("test-%d-%d-%d", os.Getpid(), g, i)
				sc, err := c.newShard(name, 64<<20, 1000)
				if err != nil {
					errs <- err
					return
				}
				// The grandchild reports its cgroups: it was forked by the
				// command, not placed by anyone.
				cmd := exec.Command("sh", "-c", "cat /proc/self/cgroup | cat")
				out, err := outputIn(sc, cmd)
				sc.remove()
				if err != nil {
					errs <- err
					return
				}
				if got := cgroupOf(t, out, "memory"); got != filepath.Join(homeMem, "shardpool-"+name) {
					errs <- fmt.Errorf("start %d: the command's child is in memory cgroup %s", i, got)
				}
				if got := cgroupOf(t, out, "cpu"); got != filepath.Join(homeCPU, "shardpool-"+name) {
					errs <- fmt.Errorf("start %d: the command's child is in cpu cgroup %s", i, got)
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
	if err := threadsHome(homeMem, homeCPU, false); err != nil {
		t.Errorf("after all starts: %v", err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// outputIn runs cmd started in sc and returns its stdout.
func outputIn(sc *shardCgroup, cmd *exec.Cmd) (string, error) {
	var b strings.Builder
	cmd.Stdout = &b
	if err := sc.startIn(cmd); err != nil {
		return "", err
	}
	err := cmd.Wait()
	return b.String(), err
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
