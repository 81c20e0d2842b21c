package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker/probe"
)

// preflightIn runs `shardpool preflight --json` inside the cgroup v1 memory
// cgroup dir and returns its snapshot.
func preflightIn(t *testing.T, dir string) probe.Snapshot {
	t.Helper()
	bin := testenv.Binary(t)
	sh := testenv.StartCmd(t, "sh", "-c", `echo $$ > "$1/cgroup.procs" && exec "$2" preflight --json`, "sh", dir, bin)
	if code := sh.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("preflight in %s: exit %d\n%s", dir, code, sh.Output())
	}
	var s probe.Snapshot
	if err := json.Unmarshal([]byte(sh.Output()), &s); err != nil {
		t.Fatalf("preflight --json: %v\n%s", err, sh.Output())
	}
	return s
}

func TestPreflightFindsRealCgroupLimits(t *testing.T) {
	one := testenv.MemoryCgroup(t, 300<<20)
	s := preflightIn(t, one)
	want := "/" + filepath.Base(one)
	if s.Cgroups.MemoryPath != want || s.Cgroups.MemoryLimit.N != 300<<20 || s.Cgroups.MemoryBinds != want {
		t.Fatalf("own cgroup: got path %s limit %+v binding %q; want %s, 300MiB, binding there", s.Cgroups.MemoryPath, s.Cgroups.MemoryLimit, s.Cgroups.MemoryBinds, want)
	}
	// A tighter parent above a looser child: the parent binds.
	parent := testenv.MemoryCgroup(t, 256<<20)
	child := filepath.Join(parent, "child")
	if err := os.Mkdir(child, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(child) })
	if err := os.WriteFile(filepath.Join(child, "memory.limit_in_bytes"), []byte(fmt.Sprint(1<<30)), 0o644); err != nil {
		t.Fatal(err)
	}
	s = preflightIn(t, child)
	wantParent := "/" + filepath.Base(parent)
	if s.Cgroups.MemoryLimit.N != 256<<20 || s.Cgroups.MemoryBinds != wantParent {
		t.Fatalf("nested: got limit %+v binding %q, want 256MiB bound by %s", s.Cgroups.MemoryLimit, s.Cgroups.MemoryBinds, wantParent)
	}
	if len(s.Cgroups.MemoryLevels) < 2 || s.Cgroups.MemoryLevels[0].Limit.N != 1<<30 {
		t.Fatalf("levels: got %+v, want the child's own 1GiB first", s.Cgroups.MemoryLevels)
	}
	if s.Budget.Memory.Effective.N != 256<<20 || !strings.Contains(s.Budget.Memory.Binding, wantParent) {
		t.Fatalf("budget: %+v bound by %q, want 256MiB by the parent cgroup", s.Budget.Memory.Effective, s.Budget.Memory.Binding)
	}
}

// TestPreflightNamesTheHostsWorkers: preflight names this user's workers
// on the host that admit against the budget it prints, with what their
// shards hold: a `run` with slots measured, one shard of one CPU running.
func TestPreflightNamesTheHostsWorkers(t *testing.T) {
	p := testenv.Start(t, "preflight")
	if code := p.Wait(t, 30*time.Second); code != 0 || !strings.Contains(p.Output(), "workers: none of this user's running on this host") {
		t.Fatalf("preflight with no worker: exit %d\n%s", code, p.Output())
	}
	spec := testenv.WriteJob(t, testenv.Job{Name: "held", Shards: 1, Command: []string{"sleep", "30"}, Extra: "[class.cpu]\ncpus = 1\nmemory = \"64MiB\"\n"})
	run := testenv.Start(t, "run", "--data", t.TempDir(), spec)
	// One shard running and, the queue drained, one fetch open for the
	// next shard where the host has a second CPU: 1 or 2 CPUs held.
	want := regexp.MustCompile(fmt.Sprintf(`\(pid %d\) holds ([12])\.00 CPUs, [0-9.]+MiB still to grow`, run.Cmd.Process.Pid))
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		p := testenv.Start(t, "preflight")
		p.Wait(t, 30*time.Second)
		return strings.Contains(p.Output(), "workers: 1 of this user's on this host") && want.MatchString(p.Output()), p.Output()
	})
}

// TestPreflightProbesTheStateDirectory: stores and evidence go to the
// state directory, often a home directory on NFS; preflight lists its
// storage beside scratch's.
func TestPreflightProbesTheStateDirectory(t *testing.T) {
	data := t.TempDir()
	p := testenv.Start(t, "preflight", "--json", "--data", data)
	if code := p.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("preflight: exit %d\n%s", code, p.Output())
	}
	var s probe.Snapshot
	if err := json.Unmarshal([]byte(p.Output()), &s); err != nil {
		t.Fatalf("preflight --json: %v\n%s", err, p.Output())
	}
	for _, pi := range s.Storage {
		if pi.Name == "state" {
			if pi.Path != data || pi.Unknown != "" || pi.Locality == "" {
				t.Fatalf("state directory probed as %+v, want %s with its type and locality", pi, data)
			}
			return
		}
	}
	t.Fatalf("preflight storage %+v lacks the state directory %s", s.Storage, data)
}
