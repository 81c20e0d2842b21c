package worker

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ownV2Cgroup is this process's cgroup v2 directory on a real cgroup2
// mount (on this project's machines, the unified hierarchy that cgroup v1
// hosts mount beside their v1 controllers), and its path in the
// hierarchy. Starting a process inside a cgroup works there without any
// controller, which is all TestChildStartsInsideItsV2Cgroup needs.
func ownV2Cgroup(t *testing.T) (dir, path string) {
	t.Helper()
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			path = p
		}
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mount := ""
	s := bufio.NewScanner(f)
	for s.Scan() {
		// "36 25 0:31 / /sys/fs/cgroup/unified rw,... - cgroup2 cgroup2 rw"
		fields := strings.Fields(s.Text())
		for i, fld := range fields {
			if fld == "-" && i+1 < len(fields) && fields[i+1] == "cgroup2" && fields[3] == "/" {
				mount = fields[4]
			}
		}
	}
	if mount == "" || path == "" {
		t.Skipf("no cgroup2 hierarchy is mounted here (/proc/self/cgroup: %q)", strings.TrimSpace(string(b)))
	}
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("this test needs root (CI runs as root)")
		}
		t.Skip("needs root: run as root or in CI")
	}
	return filepath.Join(mount, path), path
}

// TestChildStartsInsideItsV2Cgroup: on cgroup v2 the command is cloned
// into its shard's cgroup (CLONE_INTO_CGROUP), so the command itself, not
// a prologue shell, is the first process there, and what it forks is
// there too. A directory that is not a cgroup v2 one makes the start fail
// before anything runs, and the worker goes to the prologue from then on.
func TestChildStartsInsideItsV2Cgroup(t *testing.T) {
	dir, path := ownV2Cgroup(t)
	c := &cgroups{mode: "v2", v2: dir}
	sc := &shardCgroup{v2: true, mem: filepath.Join(dir, fmt.Sprintf("shardpool-clone-test-%d", os.Getpid())), from: c}
	if err := os.Mkdir(sc.mem, 0o755); err != nil {
		t.Fatalf("make a cgroup beside this process's: %v", err)
	}
	defer os.Remove(sc.mem)

	// The grandchild reports its cgroup: it was forked by the command,
	// which nobody placed after it started.
	got, err := outputOf(exec.Command("sh", "-c", "cat /proc/self/cgroup | cat"), sc.startInto)
	if err != nil {
		t.Fatalf("start inside %s: %v", sc.mem, err)
	}
	want := "0::" + filepath.Join(path, filepath.Base(sc.mem))
	if !strings.Contains(got, want+"\n") {
		t.Errorf("the command's child reports:\n%s\nwant the line %q", got, want)
	}
	if c.noCloneInto.Load() {
		t.Errorf("a start that worked turned the prologue on")
	}

	// A plain directory is no cgroup: nothing runs, and later starts do
	// not try again.
	plain := &shardCgroup{v2: true, mem: t.TempDir(), from: c}
	marker := filepath.Join(t.TempDir(), "ran")
	cmd := exec.Command("touch", marker)
	err = plain.startInto(cmd)
	if !errors.Is(err, errNoCloneInto) || err == errNoCloneInto {
		t.Fatalf("start inside a plain directory: got %v, want errNoCloneInto with the kernel's reason", err)
	}
	if cmd.Process != nil {
		t.Errorf("a process started: %d", cmd.Process.Pid)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("the command ran")
	}
	if err := sc.startInto(exec.Command("true")); err != errNoCloneInto {
		t.Errorf("a start after the failed one: got %v, want errNoCloneInto at once", err)
	}
}

// TestCgroupV2ControllersAreReadAsAList: cgroup.controllers ends with a
// newline, so a controller listed last (only cpu and memory delegated) is
// still one.
func TestCgroupV2ControllersAreReadAsAList(t *testing.T) {
	root := t.TempDir()
	for path, content := range map[string]string{
		"proc/self/cgroup": "0::/user.slice/app.scope\n",
		"sys/fs/cgroup/user.slice/app.scope/cgroup.controllers": "cpu memory\n",
		"sys/fs/cgroup/user.slice/app.scope/cgroup.procs":       "4242\n",
	} {
		os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755)
		os.WriteFile(filepath.Join(root, path), []byte(content), 0o644)
	}
	c := detectCgroups(root)
	if c.mode != "v2" {
		t.Fatalf("memory delegated last: mode %q (%s), want v2", c.mode, c.why)
	}
	if err := c.prepareV2(); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(c.v2, "cgroup.subtree_control"))
	if got := string(b); got != "+memory +cpu" {
		t.Errorf("subtree_control %q, want cpu enabled too", got)
	}
}
