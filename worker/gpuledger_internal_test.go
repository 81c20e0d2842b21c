package worker

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// gpuWorker is a worker of this process with its own handle on the host
// ledger in dir (a record of its own, as a second worker process would
// have) and a known class gpu of one device, on the devices devs.
func gpuWorker(t *testing.T, dir, name, share string, devs ...probe.GPU) *Worker {
	t.Helper()
	l, err := openLedger(dir, "/proc", ownRecord(name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.close)
	root, _ := filepath.Abs("probe/testdata/v2")
	pr, err := probe.New(probe.Config{Root: root, GPUs: staticGPUs(devs), PolicyPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	return &Worker{cfg: Config{Probe: pr}, ledger: l, fixedShare: share, gpuRes: map[string]string{},
		peaks: map[string]plan.Peak{"gpu": {GPUs: 1}}, gpuClass: map[string]bool{"gpu": true}}
}

// fixedGPULook is the GPU step of a fixed-slots worker's admission
// decision for one free slot of class gpu: the look at the devices and
// the hold it leads to. It returns how many shards the worker would
// fetch and why it holds back.
func fixedGPULook(w *Worker) (int, string) {
	k, note, locked := w.fixedGPUs(context.Background(), "gpu", 1)
	w.publishFixed("gpu", k, locked)
	return k, note
}

// TestFixedWorkersLookingAtOnceTakeTheOneDeviceOnce: two fixed-slots
// workers of one host look at its one idle GPU in the same moment. The
// look and the hold it leads to are one step for the host's other
// workers: the second looks once the first has written that it takes
// the device, and fetches nothing. Before, both saw the device free,
// both fetched, and the second's shard was handed back at its start
// (redelivered after a delay that doubles up to a minute).
func TestFixedWorkersLookingAtOnceTakeTheOneDeviceOnce(t *testing.T) {
	dir := t.TempDir()
	idle := GPUFixture(t)[0]
	w1 := gpuWorker(t, dir, "w1", "host", idle)
	w2 := gpuWorker(t, dir, "w2", "host", idle)
	var k2 int
	var note2 string
	done := make(chan struct{})
	w1.afterGPULook = func() {
		// w2 looks while w1 is between its look and its hold: it must
		// wait for the hold, not decide on what w1 has yet to write.
		go func() {
			defer close(done)
			k2, note2 = fixedGPULook(w2)
		}()
		select {
		case <-done:
		case <-time.After(300 * time.Millisecond):
		}
	}
	k1, _ := fixedGPULook(w1)
	<-done
	if k1 != 1 || k2 != 0 {
		t.Fatalf("w1 would fetch %d and w2 %d shard(s) needing the host's one GPU; want 1 and 0 (w2: %q)", k1, k2, note2)
	}
	if want := "1 more to be taken by shards other workers of this host fetched"; !strings.Contains(note2, want) {
		t.Fatalf("w2 holds back saying %q; want it to say %q", note2, want)
	}
}

// TestADeviceHeldUnderAnotherBudgetIsNotFree: a worker admitting against
// another budget (another cgroup, say) holds the host's one idle GPU in
// the ledger, its process not yet on the device. The device is the
// host's: a fixed-slots worker's look leaves it out, and a shard placed
// at its start is handed back, uncharged, instead of being given it.
// Before, only workers of the same budget counted, and the second shard
// went to the device the first one's process was about to allocate.
func TestADeviceHeldUnderAnotherBudgetIsNotFree(t *testing.T) {
	dir := t.TempDir()
	idle := GPUFixture(t)[0]
	holder := gpuWorker(t, dir, "other", "cpu /slice-a", idle)
	holder.gpuRes[idle.UUID] = "r.s0"
	if _, err := holder.ledger.begin(holder.fixedShare); err != nil {
		t.Fatal(err)
	}
	if err := holder.ledger.commit(holder.holding("", 0, plan.Peak{}, 0)); err != nil {
		t.Fatal(err)
	}

	w := gpuWorker(t, dir, "w", "host", idle)
	if k, note := fixedGPULook(w); k != 0 || !strings.Contains(note, "GPU 0 is held by another worker on this host") {
		t.Fatalf("fixed look: would fetch %d, saying %q; want 0, naming the device held by another worker", k, note)
	}
	a := &attemptState{key: "r.s1", m: stream.ShardMsg{Run: "r", ID: "s1", Class: "gpu"}}
	uuids, res := w.placeGPUs(context.Background(), a, stream.Class{GPUs: 1})
	if res.outcome != stream.OutcomePreempted || !strings.Contains(res.reason, "GPU 0 is held by another worker on this host") {
		t.Fatalf("placed on %q: outcome %q, reason %q; want the shard handed back, naming the held device", uuids, res.outcome, res.reason)
	}
	if len(w.gpuRes) != 0 {
		t.Fatalf("a shard handed back left reservations: %v", w.gpuRes)
	}
}
