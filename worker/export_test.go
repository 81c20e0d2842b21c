package worker

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/shardpool/shardpool/worker/probe"
)

// ScratchHeld is how many of class's shards in flight count as holding
// what they need of the scratch (scratchadmit.go): for tests, which check
// that every count ends with its shard.
func (w *Worker) ScratchHeld(class string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.scratchHeld[class]
}

// HoldGPUsInLedger writes a record in the host ledger in dir, of this
// process as a worker named name whose shards hold the GPUs uuids, until
// release: for tests of what reads the ledger.
func HoldGPUsInLedger(dir, name string, uuids ...string) (release func(), err error) {
	l, err := openLedger(dir, "/proc", ownRecord(name))
	if err != nil {
		return nil, err
	}
	if _, err := l.begin(""); err != nil {
		l.close()
		return nil, err
	}
	if err := l.commit(Hold{GPUs: uuids}); err != nil {
		l.close()
		return nil, err
	}
	return l.close, nil
}

// GPUFixture is the probe's GPU fixture (probe/testdata/gpus.json, read
// from the package's directory): an idle H100, a busy A100 (another
// user's process, 70 GiB free), a MIG A100 and a lost GPU.
func GPUFixture(t testing.TB) []probe.GPU {
	t.Helper()
	b, err := os.ReadFile("probe/testdata/gpus.json")
	if err != nil {
		t.Fatal(err)
	}
	var devs []probe.GPU
	if err := json.Unmarshal(b, &devs); err != nil {
		t.Fatal(err)
	}
	return devs
}

// FixtureWithHeadroom is a host probe of the fixture probe/testdata/v2
// (limit 8 GiB, 4 CPUs) with its working set raised to leave mib MiB of
// cgroup headroom: for tests of admission whose shards hold real memory.
func FixtureWithHeadroom(t *testing.T, mib int64) *probe.Prober {
	t.Helper()
	src, err := filepath.Abs("probe/testdata/v2")
	if err != nil {
		t.Fatal(err)
	}
	root := filepath.Join(t.TempDir(), "host")
	if err := os.CopyFS(root, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
	// The fixture's memory.stat has 1 GiB of inactive file, which the
	// working set leaves out.
	current := int64(8<<30) - mib<<20 + 1<<30
	if err := os.WriteFile(filepath.Join(root, "sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/memory.current"), []byte(strconv.FormatInt(current, 10)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	pr, err := probe.New(probe.Config{Root: root, GPUs: noDevices{}, PolicyPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	return pr
}
