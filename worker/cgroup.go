package worker

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/stream"
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
	v2moved bool   // under mu
	// noCloneInto is set once a child could not be started inside its
	// cgroup v2 (startInto): later shards go straight to the prologue.
	noCloneInto atomic.Bool
	// home keeps the worker's own v1 tasks files open, which every
	// starting thread writes itself back into (startLocked).
	home ctlFiles

	// Emptied v1 shard cgroups kept for the next shard with the same limits
	// (release): making and removing two cgroups per shard cost more CPU
	// than a short shard's command.
	mu   sync.Mutex
	idle map[shardLimits][]*shardCgroup
	kept int // in idle, at most keepAtMost
	made int // shard cgroups this instance made (pooled ones are reused)
}

// cgroupNames numbers shard cgroups' names after this process's pid. It
// is the process's, not a worker's: two workers of one process (tests
// start several; a worker started again in the process) each counted
// from 1, and the second's first shard found the first's cgroup of that
// name ("file exists") and ran outside any cgroup, unlimited.
var cgroupNames atomic.Int64

// shardLimits are the limits a pooled cgroup was made with.
type shardLimits struct{ mem, cpu int64 }

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
			// Started from a shell that an earlier worker moved into its
			// leaf (prepareV2): the delegated cgroup is the leaf's parent,
			// and shards go beside the leaf, not one level deeper per run.
			if filepath.Base(v2path) == v2Leaf {
				v2path = filepath.Dir(v2path)
			}
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
		case !slices.Contains(strings.Fields(string(ctl)), "memory"):
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
	// Numbered as the shard cgroups: workers of one process may look at
	// once.
	probe := filepath.Join(dir, fmt.Sprintf("shardpool-probe-%d-%d", os.Getpid(), cgroupNames.Add(1)))
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
		return "enforced: a cgroup v1 memory and cpu cgroup per shard, under the worker's own cgroups"
	case "v2":
		return "enforced: a cgroup v2 cgroup per shard beside the worker's, in its delegated cgroup"
	}
	return "watched: " + c.why + "; admission checks limits, the OS does not enforce them"
}

// LimitsMode says whether per-shard limits are enforced on this host.
func LimitsMode() string { return detectCgroups("/").describe() }

// v2Leaf is the cgroup v2 leaf that prepareV2 moves the delegated
// cgroup's processes into.
const v2Leaf = "shardpool-worker"

// prepareV2 moves the worker into a leaf and enables the controllers for
// its cgroup's children (cgroup v2 allows no processes in a cgroup whose
// children get controllers).
func (c *cgroups) prepareV2() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.v2moved {
		return nil
	}
	leaf := filepath.Join(c.v2, v2Leaf)
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
	if b, err := os.ReadFile(filepath.Join(c.v2, "cgroup.controllers")); err == nil && slices.Contains(strings.Fields(string(b)), "cpu") {
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
	from     *cgroups // that made it (v2: whether startInto works here)
	mem, cpu string
	limits   shardLimits
	pooled   bool  // made for reuse (v1): given back with release
	oomBase  int64 // the oom_kill count when this use began
	ctl      ctlFiles
	// home are the worker's own cgroup directories, one per directory of
	// the shard's (v1): the starting thread returns to them (startIn).
	homeMem, homeCPU string
	// seenEmpty: killLeft found no process in the memory cgroup on its
	// first read, so reset need not read it again.
	seenEmpty bool
}

// newShard creates a shard's cgroup; memLimit and cpuMillicores of 0 set
// no limit (the cgroup still measures). On cgroup v1 it is an emptied one
// from an earlier shard with the same limits when there is one. Names
// start with shardpool-p<pid>-<n>, unique while this process lives, so
// that removeDeadOwners knows whose they are; label ends a cgroup v2 one's
// name, for operators. Give it back with release.
func (c *cgroups) newShard(label string, memLimit, cpuMillicores int64) (*shardCgroup, error) {
	switch c.mode {
	case "v1":
		lim := shardLimits{memLimit, cpuMillicores}
		c.mu.Lock()
		for free := c.idle[lim]; len(free) > 0; free = c.idle[lim] {
			sc := free[len(free)-1]
			c.idle[lim] = free[:len(free)-1]
			c.kept--
			if _, err := os.Stat(sc.mem); err == nil {
				c.mu.Unlock()
				return sc, nil
			}
			// Removed under us (by hand, or taken for a dead worker's).
		}
		name := c.nextName()
		c.mu.Unlock()
		sc, err := c.newShardV1(name, memLimit, cpuMillicores)
		if err != nil {
			return nil, err
		}
		sc.limits, sc.pooled = lim, true
		return sc, nil
	case "v2":
		c.mu.Lock()
		name := c.nextName() + "-" + label
		c.mu.Unlock()
		return c.newShardV2(name, memLimit, cpuMillicores)
	}
	return nil, errors.New(c.why)
}

// nextName is a new shard cgroup's name without its "shardpool-" prefix;
// under mu.
func (c *cgroups) nextName() string {
	c.made++
	return fmt.Sprintf("p%d-%d", os.Getpid(), cgroupNames.Add(1))
}

// newShardV2 makes one cgroup beside the worker's own leaf (prepareV2). A cpu.max
// that cannot be written (cpu controller not delegated) leaves CPU
// unlimited; memory.max must hold.
func (c *cgroups) newShardV2(name string, memLimit, cpuMillicores int64) (*shardCgroup, error) {
	if err := c.prepareV2(); err != nil {
		return nil, err
	}
	sc := &shardCgroup{v2: true, mem: filepath.Join(c.v2, "shardpool-"+name), from: c}
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
	sc := &shardCgroup{mem: filepath.Join(c.v1mem, "shardpool-"+name), homeMem: c.v1mem, homeCPU: c.v1cpu, from: c}
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

// prologue wraps argv in the /bin/sh script that writes the shell's pid
// into the shard's cgroup v2 before it execs argv (which it receives as
// positional parameters, never as text in the script): the way in where
// startInto cannot be used.
func (c *shardCgroup) prologue(argv []string) []string {
	wrapped := []string{"/bin/sh", "-c", enterScript, "shardpool-enter", filepath.Join(c.mem, "cgroup.procs"), "--"}
	return append(wrapped, argv...)
}

// errNoCloneInto: the kernel here cannot start a process inside a cgroup
// (clone3 with CLONE_INTO_CGROUP needs Linux 5.7 and a cgroup v2
// directory).
var errNoCloneInto = errors.New("cannot start a process inside its cgroup here")

// startInto starts cmd with its first process already in the shard's
// cgroup v2 (clone3 with CLONE_INTO_CGROUP): the command itself is that
// process, so nothing it runs or forks is ever outside, and no prologue
// process is exec'd before it. Where the kernel cannot (no clone3, or a
// directory that is not a cgroup v2 one) it returns an error wrapping
// errNoCloneInto, nothing has run, and the worker's later shards are not
// tried this way. The start's error cannot tell a failed clone from an
// exec that failed with the same errno; an exec failing with EINVAL or
// EBADF only costs this worker the faster start.
func (c *shardCgroup) startInto(cmd *exec.Cmd) error {
	if c.from == nil || c.from.noCloneInto.Load() {
		return errNoCloneInto
	}
	fd, err := unix.Open(c.mem, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", c.mem, err)
	}
	defer unix.Close(fd)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	err = startCmd(cmd)
	for _, no := range []syscall.Errno{syscall.ENOSYS, syscall.EBADF, syscall.EINVAL, syscall.EOPNOTSUPP} {
		if errors.Is(err, no) {
			c.from.noCloneInto.Store(true)
			return fmt.Errorf("%w: %v", errNoCloneInto, err)
		}
	}
	return err
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
	var err error
	var homes []string // of the cgroups the thread joined
	for _, p := range [][2]string{{c.mem, c.homeMem}, {c.cpu, c.homeCPU}} {
		if p[0] == "" {
			continue
		}
		if err = c.ctl.write(filepath.Join(p[0], "tasks"), tid); err != nil {
			err = fmt.Errorf("enter %s: %w", p[0], err)
			break
		}
		homes = append(homes, p[1])
	}
	if err == nil {
		err = startCmd(cmd)
	}
	for _, home := range homes {
		if e := c.from.home.write(filepath.Join(home, "tasks"), tid); e != nil {
			// The thread stays where it is and ends with this goroutine.
			if cmd.Process != nil {
				_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // its group, when it has one
				_ = cmd.Process.Kill()
				_ = waitCmd(cmd)
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
	b, err := c.ctl.read(filepath.Join(c.mem, file))
	if err != nil {
		return -1
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return -1
	}
	return n
}

// oomKills is the cgroup's OOM-kill count in this use, or -1 when
// unreadable.
func (c *shardCgroup) oomKills() int64 {
	if c.v2 {
		return c.keyed("memory.events", "oom_kill")
	}
	n := c.keyed("memory.oom_control", "oom_kill")
	if n < 0 {
		return n
	}
	return n - c.oomBase
}

// reuseBelow is the most memory a used v1 cgroup may still be charged
// with (kernel objects and page cache its shard left) to be kept: the next
// shard's peak starts from it, so a peak errs high by at most this much.
// A short command leaves 0.2-1.2 MiB (kernel objects, and charges the
// kernel holds in advance per CPU); one that wrote files leaves their page
// cache and gets a new cgroup. Emptying with memory.force_empty instead
// cost more CPU than making a new cgroup (5,000 /bin/true).
const reuseBelow = 4 << 20

// release gives a shard's cgroup back once its processes are gone. A
// pooled v1 cgroup has its peak reset and its OOM count noted, and is kept
// for the next shard with the same limits; one that still has a task
// (something left the shard's process group and lives on), is charged
// with more than reuseBelow, or does not reset is removed instead, as
// every v2 one is.
func (c *cgroups) release(sc *shardCgroup) {
	if sc == nil {
		return
	}
	if !sc.pooled || !sc.reset() {
		sc.remove()
		return
	}
	c.mu.Lock()
	if c.idle == nil {
		c.idle = map[shardLimits][]*shardCgroup{}
	}
	if c.kept >= keepAtMost {
		c.mu.Unlock()
		sc.remove()
		return
	}
	c.idle[sc.limits] = append(c.idle[sc.limits], sc)
	c.kept++
	c.mu.Unlock()
}

// keepAtMost bounds the kept cgroups of a worker: a long-lived one serves
// runs with many different limits, and each set keeps its own.
const keepAtMost = 64

// reset empties a used v1 cgroup for its next shard; false when it cannot
// be reused.
func (c *shardCgroup) reset() bool {
	for _, d := range []string{c.mem, c.cpu} {
		if d == "" || d == c.mem && c.seenEmpty {
			continue
		}
		// Opened afresh: cgroup v1 keeps the pid list an open tasks file
		// read, and a kept descriptor would see it for up to a second.
		if b, err := os.ReadFile(filepath.Join(d, "tasks")); err != nil || len(bytes.TrimSpace(b)) > 0 {
			return false
		}
	}
	usage, err := c.ctl.read(filepath.Join(c.mem, "memory.usage_in_bytes"))
	if n, perr := strconv.ParseInt(strings.TrimSpace(string(usage)), 10, 64); err != nil || perr != nil || n > reuseBelow {
		return false
	}
	if err := c.ctl.write(filepath.Join(c.mem, "memory.max_usage_in_bytes"), []byte("0")); err != nil {
		return false
	}
	c.seenEmpty = false
	c.oomBase = c.keyed("memory.oom_control", "oom_kill")
	return c.oomBase >= 0
}

// keyed is the value of key in one of the cgroup's "key value" files, or
// -1 when unreadable.
func (c *shardCgroup) keyed(file, key string) int64 {
	b, err := c.ctl.read(filepath.Join(c.mem, file))
	return keyedOf(b, err, key)
}

// close removes the kept cgroups (the worker is done with them).
func (c *cgroups) close() {
	c.mu.Lock()
	idle := c.idle
	c.idle, c.kept = nil, 0
	c.mu.Unlock()
	for _, free := range idle {
		for _, sc := range free {
			sc.remove()
		}
	}
	c.home.close()
}

// removeDeadOwners removes the shard cgroups a worker left that is no
// longer running (a SIGKILL, or a crash): its kept v1 cgroups, or its
// cgroup v2 ones beside the leaf, named for a pid that no running process
// has. One still in use (the pid reused by a worker that made it) is not
// empty and stays. What a dead worker's commands left running in them
// (their process group outlives the command, which Pdeathsig ended, and
// so does what left the group) is killed first (killDeadLeft), wherever
// the dead worker kept its state: the journal reaper finds only the
// orphans of workers of its own state directory, and a host where no
// such worker starts again kept them running. It returns what it killed,
// one line per cgroup.
func (c *cgroups) removeDeadOwners() []string {
	parents := []string{c.v1mem, c.v1cpu}
	switch c.mode {
	case "v2":
		parents = []string{c.v2}
	case "":
		return nil
	}
	var killed []string
	ns := stream.PIDNamespace()
	for i, parent := range parents {
		if parent == "" {
			continue
		}
		entries, _ := os.ReadDir(parent)
		for _, e := range entries {
			var pid, n int
			if _, err := fmt.Sscanf(e.Name(), "shardpool-p%d-%d", &pid, &n); err != nil || !e.IsDir() || pid == os.Getpid() {
				continue
			}
			if pidAlive(pid) {
				continue
			}
			dir := filepath.Join(parent, e.Name())
			// A v1 shard's processes are in both hierarchies: the first
			// (memory) names them.
			if i == 0 {
				if left := killDeadLeft(dir, ns); len(left) > 0 {
					killed = append(killed, fmt.Sprintf("killed %s left running in cgroup %s by worker pid %d, which died without ending them", strings.Join(left, ", "), dir, pid))
				}
			}
			_ = os.Remove(dir)
		}
	}
	return killed
}

// killDeadLeft kills what a dead worker's shard cgroup dir still holds,
// and waits, as killLeft does, for it to leave. Only processes of this
// pid namespace (ns) are killed: the cgroup's name holds its worker's
// pid in the worker's own namespace, and only a process that shares
// this one proves that the worker did too, so that its pid, which no
// process here has, means it is gone. Where ns is unknown, nothing is.
func killDeadLeft(dir, ns string) []string {
	if ns == "" {
		return nil
	}
	left, _ := killIn(dir, func(pid int) bool {
		their, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
		return err == nil && their == ns
	}, nil)
	return left
}

// remove deletes the cgroups once their processes are gone.
func (c *shardCgroup) remove() {
	c.ctl.close()
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

// killLeft ends what is still in the shard's cgroup once its command has
// ended and its process group is killed: processes that left the group
// (setsid, a daemon) and would otherwise live on unaccounted, holding
// memory, CPU or a GPU and writing where the next attempt works. It
// returns what it found, as "comm (pid N)", in the order found. A process
// that forks while it is killed is caught by the next read; after
// killRounds reads the rest is left (and the cgroup is removed rather
// than kept, as release does with any that is not empty). The worker's own
// pid is never killed: on cgroup v1 a starting thread of the worker
// passes through a shard's cgroups (startIn), if only for a moment.
func (c *shardCgroup) killLeft() []string {
	if c == nil {
		return nil
	}
	var first func()
	if c.v2 {
		// Linux 5.14+: one write kills every process, those forking too;
		// where it is missing the signals do.
		first = func() { _ = os.WriteFile(filepath.Join(c.mem, "cgroup.kill"), []byte("1"), 0o644) }
	}
	left, none := killIn(c.mem, func(int) bool { return true }, first)
	c.seenEmpty = none
	return left
}

// killIn SIGKILLs the processes of cgroup dir that pick chooses (this
// process never), round after round, until none is left or killRounds
// have passed: a process killed leaves the cgroup a moment later. first,
// when set, runs before the first round's signals. It returns what it
// killed, as "comm (pid N)", and whether the first look found none.
func killIn(dir string, pick func(pid int) bool, first func()) ([]string, bool) {
	self := os.Getpid()
	var left []string
	seen := map[int]bool{}
	for round := range killRounds {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			break
		}
		var pids []int
		for _, pid := range procList(b, self) {
			if pick(pid) {
				pids = append(pids, pid)
			}
		}
		if len(pids) == 0 {
			return left, round == 0
		}
		if round == 0 && first != nil {
			first()
		}
		for _, pid := range pids {
			if !seen[pid] {
				seen[pid] = true
				left = append(left, processName(pid))
			}
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(killPause)
	}
	return left, false
}

// killRounds and killPause bound killLeft's wait for a cgroup to empty:
// a process killed leaves it when it has exited, a moment later, unless
// it waits on a device or a hung mount.
const (
	killRounds = 50
	killPause  = 10 * time.Millisecond
)

// procList parses a cgroup.procs file (or a children list, adopt.go),
// leaving out self.
func procList(b []byte, self int) []int {
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 && pid != self {
			pids = append(pids, pid)
		}
	}
	return pids
}

// processName is "comm (pid N)", or "pid N" when its name cannot be read.
func processName(pid int) string {
	if name := readComm("/proc", pid); name != "" {
		return fmt.Sprintf("%s (pid %d)", name, pid)
	}
	return fmt.Sprintf("pid %d", pid)
}
