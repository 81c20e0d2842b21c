package worker_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestCgroupV2DelegationProtocol runs a shard on a worker whose cgroup root
// is a fixture of a delegated cgroup v2 scope. This host has no cgroup v2
// controllers, so the kernel's side (EBUSY rules, limits taking effect) is
// not exercised here; the test checks the protocol the worker follows:
// move itself into a leaf, enable +memory +cpu for its cgroup's children,
// one sibling cgroup per shard with memory.max and cpu.max, entered by the
// child before it runs the command.
func TestCgroupV2DelegationProtocol(t *testing.T) {
	root, scope := delegatedScope(t, "")
	os.WriteFile(filepath.Join(scope, "cgroup.procs"), []byte("4242\n"), 0o644)

	env := testenv.New(t, testenv.Options{CgroupRoot: root})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Extra: "[class.cpu]\ncpus = 1\nmemory = \"64MiB\"\n", Command: []string{"true"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)

	read := func(p string) string { b, _ := os.ReadFile(p); return strings.TrimSpace(string(b)) }
	if got := read(filepath.Join(scope, "shardpool-worker", "cgroup.procs")); got != "4242" {
		t.Errorf("worker leaf cgroup.procs: got %q, want the scope's processes moved (4242)", got)
	}
	if got := read(filepath.Join(scope, "cgroup.subtree_control")); got != "+memory +cpu" {
		t.Errorf("subtree_control: got %q, want +memory +cpu", got)
	}
	shards, _ := filepath.Glob(filepath.Join(scope, "shardpool-p*-*-t-s0000-a1"))
	if len(shards) != 1 {
		t.Fatalf("shard cgroup: %v, want one beside the worker's leaf", shards)
	}
	if got := read(filepath.Join(shards[0], "memory.max")); got != "67108864" {
		t.Errorf("memory.max: got %q, want the class's 64 MiB", got)
	}
	if got := read(filepath.Join(shards[0], "cpu.max")); got != "100000 100000" {
		t.Errorf("cpu.max: got %q, want one CPU", got)
	}
	if got := read(filepath.Join(shards[0], "cgroup.procs")); got == "" {
		t.Errorf("the child did not enter its cgroup before running")
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		st, err := coordinator.ReadStatus(context.Background(), env.JS, "")
		return err == nil && len(st.Workers) == 1 && strings.Contains(st.Workers[0].Limits, "cgroup v2"), "worker report does not say v2 enforcement"
	})
}

// delegatedScope makes a fixture host whose cgroup v2 scope
// user.slice/user-1000.slice/app.scope is delegated to the user; the
// worker's own cgroup is the scope, or the named cgroup inside it.
func delegatedScope(t *testing.T, inside string) (root, scope string) {
	t.Helper()
	root = t.TempDir()
	scope = filepath.Join(root, "sys/fs/cgroup/user.slice/user-1000.slice/app.scope")
	own := "/user.slice/user-1000.slice/app.scope"
	if inside != "" {
		own += "/" + inside
	}
	for path, content := range map[string]string{
		"proc/self/cgroup":                 "0::" + own + "\n",
		"sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory pids\n",
	} {
		os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755)
		os.WriteFile(filepath.Join(root, path), []byte(content), 0o644)
	}
	os.MkdirAll(scope, 0o755)
	os.WriteFile(filepath.Join(scope, "cgroup.controllers"), []byte("cpu io memory pids\n"), 0o644)
	return root, scope
}

// TestCgroupV2WorkerInAnEarlierWorkersLeaf: a worker moves its delegated
// cgroup's processes, the user's shell among them, into the leaf
// shardpool-worker, so the next worker started from that shell is in the
// leaf. It must make its shards' cgroups beside the leaf, as the first
// did, and not a level deeper on every run; and it removes the cgroups a
// killed worker left there (named for a pid no process has), but not a
// live worker's.
func TestCgroupV2WorkerInAnEarlierWorkersLeaf(t *testing.T) {
	root, scope := delegatedScope(t, "shardpool-worker")
	leaf := filepath.Join(scope, "shardpool-worker")
	os.MkdirAll(leaf, 0o755)
	// The order the kernel lists them in; memory last, as when only cpu
	// and memory are delegated.
	os.WriteFile(filepath.Join(leaf, "cgroup.controllers"), []byte("cpu memory\n"), 0o644)
	os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte("4242\n"), 0o644)
	os.WriteFile(filepath.Join(scope, "cgroup.procs"), nil, 0o644)
	os.WriteFile(filepath.Join(scope, "cgroup.subtree_control"), []byte("+memory +cpu"), 0o644)
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(scope, fmt.Sprintf("shardpool-p%d-3-t-s0001-a1", gone.Process.Pid))
	live := filepath.Join(scope, "shardpool-p1-3-u-s0001-a1")
	os.Mkdir(dead, 0o755)
	os.Mkdir(live, 0o755)

	env := testenv.New(t, testenv.Options{CgroupRoot: root})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Extra: "[class.cpu]\ncpus = 1\nmemory = \"64MiB\"\n", Command: []string{"true"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)

	if shards, _ := filepath.Glob(filepath.Join(scope, "shardpool-p*-*-t-s0000-a1")); len(shards) != 1 {
		t.Errorf("shard cgroups beside the leaf: %v, want one", shards)
	}
	if nested, _ := filepath.Glob(filepath.Join(leaf, "shardpool-*")); len(nested) > 0 {
		t.Errorf("cgroups made inside the leaf: %v", nested)
	}
	if _, err := os.Stat(dead); err == nil {
		t.Errorf("a dead worker's shard cgroup was left: %s", dead)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a live worker's shard cgroup was removed: %v", err)
	}
}
