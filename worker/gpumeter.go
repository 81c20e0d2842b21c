package worker

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// gpuMeter samples NVML while a child runs: the memory of GPU processes in
// the child's process group (peak VRAM, over all its devices, and the
// most on one device) and the utilization of the devices they run on
// (GPU duty).
type gpuMeter struct {
	w       *Worker
	mu      sync.Mutex
	peak    int64
	peakDev int64
	utilSum float64
	utilN   int
	unknown string
}

const gpuSampleEvery = 100 * time.Millisecond

// start samples until the returned function is called.
func (g *gpuMeter) start(ctx context.Context, pgid int) func() {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(gpuSampleEvery)
		defer t.Stop()
		for {
			g.sample(ctx, pgid)
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(stop); <-done }
}

func (g *gpuMeter) sample(ctx context.Context, pgid int) {
	devs, err := g.w.cfg.Probe.GPUDevices(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.unknown = err.Error()
		return
	}
	members := groupMembers(g.w.cfg.ProcRoot, pgid)
	var mem int64
	for _, d := range devs {
		on := false
		var onDev int64
		for _, p := range d.Processes {
			if members[p.PID] {
				onDev += p.Mem
				on = true
			}
		}
		mem += onDev
		g.peakDev = max(g.peakDev, onDev)
		if on {
			g.utilSum += float64(d.UtilGPU) / 100
			g.utilN++
		}
	}
	g.peak = max(g.peak, mem)
}

// devicePeak is the most the child's processes held on one device.
func (g *gpuMeter) devicePeak() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.peakDev
}

// result renders peak VRAM (bytes) and GPU duty (0..1), or why unknown.
func (g *gpuMeter) result() (string, string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.unknown != "" && g.peak == 0 && g.utilN == 0 {
		why := "unknown: " + g.unknown
		return why, why
	}
	duty := "0 (no GPU process of the shard seen)"
	if g.utilN > 0 {
		duty = fmt.Sprintf("%.2f", g.utilSum/float64(g.utilN))
	}
	return strconv.FormatInt(g.peak, 10), duty
}

// groupMembers lists the pids of a process group (one /proc scan).
func groupMembers(procRoot string, pgid int) map[int]bool {
	out := map[int]bool{}
	for pid, pg := range procGroups(procRoot) {
		if pg == pgid {
			out[pid] = true
		}
	}
	return out
}
