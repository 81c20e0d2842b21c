package testenv

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/worker/probe"
)

// RequireRoot skips t when not root, except under CI (CI=true), where the
// test must run and a missing privilege is a failure, not a skip.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("this test needs root (CI runs as root)")
	}
	t.Skip("needs root: run as root or in CI")
}

// MemoryCgroup creates a cgroup v1 memory cgroup with limit bytes and
// returns its directory; it is removed at cleanup.
func MemoryCgroup(t testing.TB, limit int64) string {
	t.Helper()
	RequireRoot(t)
	root := "/sys/fs/cgroup/memory"
	if _, err := os.Stat(filepath.Join(root, "memory.limit_in_bytes")); err != nil {
		t.Fatalf("no cgroup v1 memory controller at %s: %v", root, err)
	}
	dir := filepath.Join(root, fmt.Sprintf("shardpool-test-%d-%d", os.Getpid(), time.Now().UnixNano()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "memory.limit_in_bytes"), []byte(fmt.Sprint(limit)), 0o644); err != nil {
		t.Fatal(err)
	}
	_ = os.WriteFile(filepath.Join(dir, "memory.memsw.limit_in_bytes"), []byte(fmt.Sprint(limit)), 0o644)
	t.Cleanup(func() {
		for range 50 {
			if os.Remove(dir) == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
	return dir
}

// SmallTmpfs mounts a tmpfs of size at dir (created) and unmounts it at cleanup.
func SmallTmpfs(t testing.TB, dir, size string) {
	t.Helper()
	RequireRoot(t)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mount tmpfs at %s: %v %s", dir, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
}

// ReadOnly bind-mounts dir (created) over itself read-only, as a file
// system remounted read-only after errors is, and unmounts it at cleanup.
func ReadOnly(t testing.TB, dir string) {
	t.Helper()
	RequireRoot(t)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "--bind", dir, dir).CombinedOutput(); err != nil {
		t.Fatalf("bind mount %s: %v %s", dir, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	if out, err := exec.Command("mount", "-o", "remount,bind,ro", dir).CombinedOutput(); err != nil {
		t.Fatalf("remount %s read-only: %v %s", dir, err, out)
	}
}

// FreeCPUs is the number of this host's CPUs, for a test of how others'
// use of them is counted: it fails t on a host with one CPU, or whose CPUs
// a cgroup or an allocation bounds (others' use is not subtracted there),
// which cannot show it.
func FreeCPUs(t testing.TB) int {
	t.Helper()
	pr, err := probe.New(probe.Config{PolicyPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := pr.Snapshot(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cpus := snap.Host.OnlineCPUs.N
	if hard := snap.Budget.Hard.CPU; cpus < 2 || hard.Effective.N != cpus*1000 {
		t.Fatalf("this test needs a host of 2 or more CPUs bound by nothing but the host: %d online, budget %+v bound by %s", cpus, hard.Effective, hard.Binding)
	}
	return int(cpus)
}

// BurnCPUs starts n busy loops (`sh -c 'while :; do :; done'`) as uid and
// gid 65534, another user of the host, and returns a func that kills
// them (also called at cleanup). The caller needs root (RequireRoot).
func BurnCPUs(t testing.TB, n int) func() {
	t.Helper()
	var burners []*exec.Cmd
	stop := func() {
		for _, c := range burners {
			if c.Process != nil {
				c.Process.Kill()
				c.Wait()
			}
		}
		burners = nil
	}
	for range n {
		c := exec.Command("sh", "-c", "while :; do :; done")
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}, Setpgid: true}
		if err := c.Start(); err != nil {
			stop()
			t.Fatalf("start a busy loop as uid 65534: %v", err)
		}
		burners = append(burners, c)
	}
	t.Cleanup(stop)
	return stop
}

// BurnCPUsDetached starts n busy loops of this user that are not this
// process's descendants, as a job started from another terminal is not: a
// shell starts them in the background and exits, and init (or a
// subreaper above this process) adopts them. It returns a func that kills
// them (also called at cleanup). It fails t where this process itself
// adopted them.
func BurnCPUsDetached(t testing.TB, n int) func() {
	t.Helper()
	out, err := exec.Command("sh", "-c", `i=0; while [ $i -lt "$1" ]; do sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & echo $!; i=$((i+1)); done`,
		"sh", strconv.Itoa(n)).Output()
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	stop := func() {
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		pids = nil
	}
	t.Cleanup(stop)
	if err != nil || len(pids) != n {
		stop()
		t.Fatalf("start %d detached busy loops: %v; pids %q", n, err, out)
	}
	for _, pid := range pids {
		st, err := probe.ReadStat("/proc", pid)
		if err != nil || st.PPid == os.Getpid() {
			stop()
			t.Fatalf("detached busy loop %d: parent %d (this process %d), %v: not detached", pid, st.PPid, os.Getpid(), err)
		}
	}
	return stop
}
