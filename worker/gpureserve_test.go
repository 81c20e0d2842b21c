package worker

import (
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
