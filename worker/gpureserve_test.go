package worker

import (
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/shardpool/shardpool/worker/probe"
)

// TestConcurrentGPUReservationsNeverShareADevice: two shards of a GPU class
// that start at once each get a device of their own (the view of free
// devices and the reservation are one step).
func TestConcurrentGPUReservationsNeverShareADevice(t *testing.T) {
	w := &Worker{gpuRes: map[string]string{}}
	snap := &probe.Snapshot{}
	snap.GPUs.Devices = []probe.GPU{
		{Index: 0, UUID: "GPU-a", Usable: true, MemFree: 80 << 30},
		{Index: 1, UUID: "GPU-b", Usable: true, MemFree: 80 << 30},
	}
	for i := range 2000 {
		var wg sync.WaitGroup
		got := make([]string, 2)
		errs := make([]error, 2)
		start := make(chan struct{})
		for j, key := range []string{"r.x", "r.y"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				got[j], errs[j] = w.reserveGPUs(snap, key, 1, 40<<30)
			}()
		}
		close(start)
		wg.Wait()
		if errs[0] != nil || errs[1] != nil || got[0] == got[1] {
			t.Fatalf("round %d: got %q (%v) and %q (%v), want two different devices", i, got[0], errs[0], got[1], errs[1])
		}
		w.releaseGPUs("r.x")
		w.releaseGPUs("r.y")
	}
}

// TestWorkersOfOneHostNeverShareADevice: two workers on one host (one
// ledger) place shards at once: each device goes to one of them, also
// before the first one's process shows on it, and a third shard finds
// none left.
func TestWorkersOfOneHostNeverShareADevice(t *testing.T) {
	dir := t.TempDir()
	snap := &probe.Snapshot{}
	snap.GPUs.Devices = []probe.GPU{
		{Index: 0, UUID: "GPU-a", Usable: true, MemFree: 80 << 30},
		{Index: 1, UUID: "GPU-b", Usable: true, MemFree: 80 << 30},
	}
	self := ledgerRec{Host: "h", Boot: "b", PID: os.Getpid(), Start: processStart("/proc", os.Getpid())}
	newWorker := func(name string) *Worker {
		r := self
		r.Name = name
		l, err := openLedger(dir, "/proc", r)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(l.close)
		return &Worker{gpuRes: map[string]string{}, gates: map[string]*gate{}, ledger: l}
	}
	w1, w2 := newWorker("w1"), newWorker("w2")
	for i := range 500 {
		var wg sync.WaitGroup
		got := make([]string, 2)
		errs := make([]error, 2)
		start := make(chan struct{})
		for j, w := range []*Worker{w1, w2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				got[j], errs[j] = w.reserveGPUs(snap, "r.x", 1, 40<<30)
			}()
		}
		close(start)
		wg.Wait()
		if errs[0] != nil || errs[1] != nil || got[0] == got[1] {
			t.Fatalf("round %d: got %q (%v) and %q (%v), want two different devices", i, got[0], errs[0], got[1], errs[1])
		}
		if _, err := w1.reserveGPUs(snap, "r.y", 1, 40<<30); err == nil || !strings.Contains(err.Error(), "another worker on this host") {
			t.Fatalf("round %d: a third shard got a device (%v), want none left", i, err)
		}
		w1.releaseGPUs("r.x")
		w2.releaseGPUs("r.x")
		// Both devices are free again for either worker, at once.
		if _, err := w2.reserveGPUs(snap, "r.z", 2, 40<<30); err != nil {
			t.Fatalf("round %d: after both released, two devices for one shard: %v", i, err)
		}
		w2.releaseGPUs("r.z")
	}
}
