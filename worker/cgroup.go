package worker

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// cgroups is how this host lets the worker give each shard a cgroup of its
// own, under the worker's own so that every ancestor's limit still binds:
// cgroup v1 (a memory and a cpu cgroup per shard, as root) or cgroup v2
// with delegation (the worker moves itself into a leaf "shardpool-worker",
// enables the memory and cpu controllers for its cgroup's children, and
// makes a sibling per shard). Paths are read below root (tests use a
// fixture tree).
type cgroups struct {
	root    string
	v1mem   string
	v1cpu   string
	v2      string // the worker's own cgroup v2 directory
	mode    string // "v1", "v2" or ""
	why     string // why not enforced
	v2moved bool
}

// detectCgroups finds whether per-shard cgroups can be made here.
func detectCgroups(root string) *cgroups {
	c := &cgroups{root: root}
	f, err := os.Open(filepath.Join(root, "proc/self/cgroup"))
	if err != nil {
		c.why = "cannot read /proc/self/cgroup"
		return c
	}
	defer f.Close()
	v2path := ""
	s := bufio.NewScanner(f)
	for s.Scan() {
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			v2path = parts[2]
		}
		for _, ctl := range strings.Split(parts[1], ",") {
			switch ctl {
			case "memory":
				c.v1mem = filepath.Join(root, "sys/fs/cgroup/memory", parts[2])
			case "cpu":
				for _, d := range []string{"sys/fs/cgroup/cpu", "sys/fs/cgroup/cpu,cpuacct"} {
					if _, err := os.Stat(filepath.Join(root, d, parts[2], "cpu.cfs_quota_us")); err == nil {
						c.v1cpu = filepath.Join(root, d, parts[2])
						break
					}
				}
			}
		}
	}
	if c.v1mem != "" {
		if _, err := os.Stat(filepath.Join(c.v1mem, "memory.limit_in_bytes")); err == nil && writableDir(c.v1mem) {
			c.mode = "v1"
			return c
		}
	}
	if v2path != "" {
		dir := filepath.Join(root, "sys/fs/cgroup", v2path)
		ctl, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
		switch {
		case err != nil:
			c.why = "cgroup v2: " + err.Error()
		case !strings.Contains(" "+string(ctl)+" ", " memory "):
			c.why = "cgroup v2: the memory controller is not delegated to " + v2path
		case !writableDir(dir):
			c.why = "cgroup v2: " + v2path + " is not writable (no delegation)"
		default:
			c.v2, c.mode = dir, "v2"
			return c
		}
		return c
	}
	c.why = "no writable cgroup v1 memory controller and no delegated cgroup v2"
	return c
}

func writableDir(dir string) bool {
	probe := filepath.Join(dir, fmt.Sprintf("shardpool-probe-%d", os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil {
		return false
	}
	os.Remove(probe)
	return true
}

// describe says whether per-shard limits are enforced (for plans and reports).
func (c *cgroups) describe() string {
	switch c.mode {
	case "v1":
		return "enforced: a cgroup v1 memory and cpu cgroup per shard, under the worker's own"
	case "v2":
		return "enforced: a cgroup v2 cgroup per shard beside the worker's, in its delegated cgroup"
	}
	return "watched: " + c.why + "; admission checks limits, the OS does not enforce them"
}

// LimitsMode says whether per-shard limits are enforced on this host.
func LimitsMode() string { return detectCgroups("/").describe() }

// prepareV2 moves the worker into a leaf and enables the controllers for
// its cgroup's children (cgroup v2 allows no processes in a cgroup whose
// children get controllers).
func (c *cgroups) prepareV2() error {
	if c.v2moved {
		return nil
	}
	leaf := filepath.Join(c.v2, "shardpool-worker")
	if err := os.MkdirAll(leaf, 0o755); err != nil {
		return err
	}
	procs, err := os.ReadFile(filepath.Join(c.v2, "cgroup.procs"))
	if err != nil {
		return err
	}
	for _, p := range strings.Fields(string(procs)) {
		if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(p), 0o644); err != nil {
			return fmt.Errorf("move pid %s into %s: %w", p, leaf, err)
		}
	}
	ctl := "+memory"
	if b, err := os.ReadFile(filepath.Join(c.v2, "cgroup.controllers")); err == nil && strings.Contains(" "+string(b)+" ", " cpu ") {
		ctl += " +cpu"
	}
	if err := os.WriteFile(filepath.Join(c.v2, "cgroup.subtree_control"), []byte(ctl), 0o644); err != nil {
		return fmt.Errorf("enable %s for %s: %w", ctl, c.v2, err)
	}
	c.v2moved = true
	return nil
}

// shardCgroup is one child's cgroup(s). It measures the child's peak
// exactly and enforces its class's limits.
type shardCgroup struct {
	v2       bool
	mem, cpu string
	// home are the worker's own cgroup directories, one per directory of
	// the shard's (v1): the starting thread returns to them (startIn).
	homeMem, homeCpu string
}

// newShard creates a shard's cgroup; memLimit and cpuMillicores of 0 set
// no limit (the cgroup still measures).
func (c *cgroups) newShard(name string, memLimit, cpuMillicores int64) (*shardCgroup, error) {
	switch c.mode {
	case "v1":
		return c.newShardV1(name, memLimit, cpuMillicores)
	case "v2":
		return c.newShardV2(name, memLimit, cpuMillicores)
	}
	return nil, errors.New(c.why)
}

// newShardV2 makes one cgroup beside the worker's own leaf (prepareV2). A cpu.max
// that cannot be written (cpu controller not delegated) leaves CPU
// unlimited; memory.max must hold.
func (c *cgroups) newShardV2(name string, memLimit, cpuMillicores int64) (*shardCgroup, error) {
	if err := c.prepareV2(); err != nil {
		return nil, err
	}
	sc := &shardCgroup{v2: true, mem: filepath.Join(c.v2, "shardpool-"+name)}
	if err := os.Mkdir(sc.mem, 0o755); err != nil {
		return nil, err
	}
	if memLimit > 0 {
		if err := os.WriteFile(filepath.Join(sc.mem, "memory.max"), []byte(strconv.FormatInt(memLimit, 10)), 0o644); err != nil {
			sc.remove()
			return nil, fmt.Errorf("set memory.max: %w", err)
		}
	}
	if cpuMillicores > 0 {
		_ = os.WriteFile(filepath.Join(sc.mem, "cpu.max"), []byte(fmt.Sprintf("%d 100000", cpuMillicores*100)), 0o644)
	}
	return sc, nil
}

// newShardV1 makes a memory cgroup, and a cpu one when the cpu hierarchy is
// writable, each under the worker's own.
func (c *cgroups) newShardV1(name string, memLimit, cpuMillicores int64) (*shardCgroup, error) {
	sc := &shardCgroup{mem: filepath.Join(c.v1mem, "shardpool-"+name), homeMem: c.v1mem, homeCpu: c.v1cpu}
	if err := os.Mkdir(sc.mem, 0o755); err != nil {
		return nil, err
	}
	if memLimit > 0 {
		if err := os.WriteFile(filepath.Join(sc.mem, "memory.limit_in_bytes"), []byte(strconv.FormatInt(memLimit, 10)), 0o644); err != nil {
			sc.remove()
			return nil, fmt.Errorf("set memory limit: %w", err)
		}
		// Without swap accounting this file is absent; the limit above holds.
		_ = os.WriteFile(filepath.Join(sc.mem, "memory.memsw.limit_in_bytes"), []byte(strconv.FormatInt(memLimit, 10)), 0o644)
	}
	if c.v1cpu != "" && cpuMillicores > 0 {
		sc.cpu = filepath.Join(c.v1cpu, "shardpool-"+name)
		if err := os.Mkdir(sc.cpu, 0o755); err == nil {
			_ = os.WriteFile(filepath.Join(sc.cpu, "cpu.cfs_period_us"), []byte("100000"), 0o644)
			_ = os.WriteFile(filepath.Join(sc.cpu, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(cpuMillicores*100, 10)), 0o644)
		} else {
			sc.cpu = ""
		}
	}
	return sc, nil
}

// procsFiles are the cgroup.procs files a child writes itself into (nil
// for a nil cgroup, and for v1, where startIn places the child).
func (c *shardCgroup) procsFiles() []string {
	if c == nil || !c.v2 {
		return nil
	}
	return []string{filepath.Join(c.mem, "cgroup.procs")}
}

// startIn starts cmd with its first process already in the shard's v1
// cgroups, without a prologue process: cgroup v1 places threads, not only
// processes, so a thread of this process joins the shard's cgroups, forks
// (a child starts in its forking thread's cgroups, so nothing it runs or
// forks is ever outside), and returns to the worker's own before it runs
// anything else. The thread is never the main one: in cgroup v1 the memory
// of the whole process is charged to the main thread's memory cgroup, and
// the worker's pages must not count against, or be killed at, a shard's
// limit. When the thread cannot return, it ends with its goroutine (taking
// the child, whose parent-death signal is tied to it) and startIn fails.
func (c *shardCgroup) startIn(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == os.Getpid() {
			// The main thread: while this goroutine holds it, another
			// goroutine locked to its own thread starts the child.
			inner := make(chan error, 1)
			go func() {
				runtime.LockOSThread()
				c.startLocked(cmd, inner)
			}()
			done <- <-inner
			runtime.UnlockOSThread()
			return
		}
		c.startLocked(cmd, done)
	}()
	return <-done
}

// startLocked runs on a goroutine locked (once) to a thread that is not
// the main one; it unlocks the thread only after the thread is back home.
// A thread that ends takes the child along (its parent-death signal), so
// the goroutine must not end locked unless it means to.
func (c *shardCgroup) startLocked(cmd *exec.Cmd, done chan<- error) {
	tid := []byte(strconv.Itoa(unix.Gettid()))
	var joined []string
	join := func(dir string) error {
		if dir == "" {
			return nil
		}
		if err := os.WriteFile(filepath.Join(dir, "tasks"), tid, 0o644); err != nil {
			return fmt.Errorf("enter %s: %w", dir, err)
		}
		joined = append(joined, dir)
		return nil
	}
	err := join(c.mem)
	if err == nil {
		err = join(c.cpu)
	}
	if err == nil {
		err = cmd.Start()
	}
	for _, home := range []string{c.homeMem, c.homeCpu}[:len(joined)] {
		if e := os.WriteFile(filepath.Join(home, "tasks"), tid, 0o644); e != nil {
			// The thread stays where it is and ends with this goroutine.
			if cmd.Process != nil {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // its group, when it has one
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			}
			done <- fmt.Errorf("return the starting thread to %s: %w", home, e)
			return
		}
	}
	runtime.UnlockOSThread()
	done <- err
}

// peak is the cgroup's highest memory use, or -1 when unreadable.
func (c *shardCgroup) peak() int64 {
	file := "memory.max_usage_in_bytes"
	if c.v2 {
		file = "memory.peak" // Linux 5.19+
	}
	b, err := os.ReadFile(filepath.Join(c.mem, file))
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// oomKills is the cgroup's OOM-kill count, or -1 when unreadable.
func (c *shardCgroup) oomKills() int64 {
	if c.v2 {
		return keyedValue(filepath.Join(c.mem, "memory.events"), "oom_kill")
	}
	return keyedValue(filepath.Join(c.mem, "memory.oom_control"), "oom_kill")
}

// remove deletes the cgroups once their processes are gone.
func (c *shardCgroup) remove() {
	for _, d := range []string{c.cpu, c.mem} {
		if d == "" {
			continue
		}
		for range 50 {
			if err := os.Remove(d); err == nil || errors.Is(err, os.ErrNotExist) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}
