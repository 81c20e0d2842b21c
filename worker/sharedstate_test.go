package worker_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker/probe"
)

// nfsAt answers statfs(2) as the real one does, except for one path, which
// it reports on NFS (the magic of statfs(2)'s NFS_SUPER_MAGIC): a state
// directory in a home directory shared by the nodes of a cluster.
type nfsAt struct{ path atomic.Pointer[string] }

func (f *nfsAt) Statfs(p string) (probe.Statfs, error) {
	if at := f.path.Load(); at != nil && p == *at {
		return probe.Statfs{Type: 0x6969, Bsize: 4096, Blocks: 1 << 20, Bavail: 1 << 19, Files: 1000, Ffree: 900}, nil
	}
	return probe.SysStatFS{}.Statfs(p)
}

// TestSharedStateDirNamesEvidenceByHost: workers on several hosts append
// to one admission.log when their state directory is on NFS, and NFS
// appends from two clients overwrite each other. With the state directory
// on network storage, the files a worker appends to carry its host's name,
// and the plain names are not written.
func TestSharedStateDirNamesEvidenceByHost(t *testing.T) {
	fs := &nfsAt{}
	p, err := probe.New(probe.Config{StatFS: fs})
	if err != nil {
		t.Fatal(err)
	}
	env := testenv.New(t, testenv.Options{NoWorkers: true, Probe: p})
	data, err := filepath.EvalSymlinks(env.Data)
	if err != nil {
		t.Fatal(err)
	}
	fs.path.Store(&data)
	env.StartWorker("w1", map[string]int{"cpu": 1})
	// One slot and three shards: the worker waits for its slot at least
	// once, which the host's admission log records. Staged inputs write
	// staging.jsonl.
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Retries: 0, Extra: "stage = true\n",
		Command: []string{"sh", "-c", `sleep 0.2 && cp "$1" "$2/"`, "sh", "{input}", "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	if r := env.WaitState("t", 30*time.Second, stream.RunComplete, stream.RunBlocked); r.State != stream.RunComplete {
		t.Fatalf("run %s: %s", r.State, r.Reason)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, want string }{
		{filepath.Join(env.Data, "admission."+host+".log"), "decision=wait 1 of 1 slots of class cpu in use"},
		{filepath.Join(env.Data, "runs", "t", "admission."+host+".log"), "decision=admit"},
		{filepath.Join(env.Data, "runs", "t", "staging."+host+".jsonl"), `"shard":"s0002"`},
	} {
		b, err := os.ReadFile(c.file)
		if err != nil || !strings.Contains(string(b), c.want) {
			t.Errorf("%s: %v; want a line with %q:\n%s", c.file, err, c.want, b)
		}
	}
	for _, plain := range []string{filepath.Join(env.Data, "admission.log"), filepath.Join(env.Data, "runs", "t", "admission.log"),
		filepath.Join(env.Data, "runs", "t", "staging.jsonl")} {
		if _, err := os.Stat(plain); err == nil {
			t.Errorf("%s written on shared storage, where another host's appends would overwrite its lines", plain)
		}
	}
}
