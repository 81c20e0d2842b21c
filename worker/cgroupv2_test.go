package worker_test

import (
	"context"
	"os"
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
	root := t.TempDir()
	scope := filepath.Join(root, "sys/fs/cgroup/user.slice/user-1000.slice/app.scope")
	for path, content := range map[string]string{
		"proc/self/cgroup":                 "0::/user.slice/user-1000.slice/app.scope\n",
		"sys/fs/cgroup/cgroup.controllers": "cpuset cpu io memory pids\n",
	} {
		os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755)
		os.WriteFile(filepath.Join(root, path), []byte(content), 0o644)
	}
	os.MkdirAll(scope, 0o755)
	os.WriteFile(filepath.Join(scope, "cgroup.controllers"), []byte("cpu io memory pids\n"), 0o644)
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
	shards, _ := filepath.Glob(filepath.Join(scope, "shardpool-t-s0000-a1"))
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
