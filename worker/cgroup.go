package worker

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// shardCgroup is a cgroup v1 memory (and cpu) cgroup for one child,
// created under this worker's own cgroups so that every ancestor's limit
// still binds. It measures the child's peak exactly and enforces its
// class's limits.
type shardCgroup struct {
	mem, cpu string
}

// cgroupV1Dirs finds this process's memory and cpu cgroup directories on a
// cgroup v1 (or hybrid) host; ok=false elsewhere or when not writable.
func cgroupV1Dirs() (mem, cpu string, ok bool) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", "", false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		parts := strings.SplitN(s.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			switch c {
			case "memory":
				mem = filepath.Join("/sys/fs/cgroup/memory", parts[2])
			case "cpu":
				for _, root := range []string{"/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"} {
					if _, err := os.Stat(filepath.Join(root, parts[2], "cpu.cfs_quota_us")); err == nil {
						cpu = filepath.Join(root, parts[2])
						break
					}
				}
			}
		}
	}
	if mem == "" {
		return "", "", false
	}
	if _, err := os.Stat(filepath.Join(mem, "memory.limit_in_bytes")); err != nil {
		return "", "", false
	}
	probe := filepath.Join(mem, fmt.Sprintf("shardpool-probe-%d", os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil {
		return "", "", false
	}
	os.Remove(probe)
	return mem, cpu, true
}

// LimitsMode says whether per-shard limits are enforced on this host (for
// plans and reports).
func LimitsMode() string { return limitsMode() }

// limitsMode says whether per-shard limits are enforced on this host.
func limitsMode() string {
	if _, _, ok := cgroupV1Dirs(); ok {
		return "enforced: a cgroup v1 memory and cpu cgroup per shard, under the worker's own"
	}
	return "watched: per-shard cgroups need cgroup v1 with write access (cgroup v2 delegation is not built yet); admission checks limits, the OS does not enforce them"
}

// newShardCgroup creates the cgroup; memLimit and cpuMillicores of 0 set
// no limit (the cgroup still measures).
func newShardCgroup(name string, memLimit, cpuMillicores int64) (*shardCgroup, error) {
	memRoot, cpuRoot, ok := cgroupV1Dirs()
	if !ok {
		return nil, errors.New("no writable cgroup v1 memory controller")
	}
	c := &shardCgroup{mem: filepath.Join(memRoot, "shardpool-"+name)}
	if err := os.Mkdir(c.mem, 0o755); err != nil {
		return nil, err
	}
	if memLimit > 0 {
		if err := os.WriteFile(filepath.Join(c.mem, "memory.limit_in_bytes"), []byte(strconv.FormatInt(memLimit, 10)), 0o644); err != nil {
			c.remove()
			return nil, fmt.Errorf("set memory limit: %w", err)
		}
		// Without swap accounting this file is absent; the limit above holds.
		_ = os.WriteFile(filepath.Join(c.mem, "memory.memsw.limit_in_bytes"), []byte(strconv.FormatInt(memLimit, 10)), 0o644)
	}
	if cpuRoot != "" && cpuMillicores > 0 {
		c.cpu = filepath.Join(cpuRoot, "shardpool-"+name)
		if err := os.Mkdir(c.cpu, 0o755); err == nil {
			_ = os.WriteFile(filepath.Join(c.cpu, "cpu.cfs_period_us"), []byte("100000"), 0o644)
			_ = os.WriteFile(filepath.Join(c.cpu, "cpu.cfs_quota_us"), []byte(strconv.FormatInt(cpuMillicores*100, 10)), 0o644)
		} else {
			c.cpu = ""
		}
	}
	return c, nil
}

// procsFiles are the cgroup.procs files a child writes itself into (nil
// for a nil cgroup).
func (c *shardCgroup) procsFiles() []string {
	if c == nil {
		return nil
	}
	files := []string{filepath.Join(c.mem, "cgroup.procs")}
	if c.cpu != "" {
		files = append(files, filepath.Join(c.cpu, "cgroup.procs"))
	}
	return files
}

// peak is the cgroup's highest memory use, or -1 when unreadable.
func (c *shardCgroup) peak() int64 {
	b, err := os.ReadFile(filepath.Join(c.mem, "memory.max_usage_in_bytes"))
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
