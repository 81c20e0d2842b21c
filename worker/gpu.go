package worker

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// gpuView counts, for a class needing perShard GPUs with vramEach bytes on
// each, the devices this worker may give out now: usable (healthy, not MIG,
// free of other users' processes), not already reserved by one of this
// worker's own shards (whose processes may not have allocated yet), and
// with enough free memory. total counts the devices usable or held by us.
func (w *Worker) gpuView(snap *probe.Snapshot, vramEach int64) (free []probe.GPU, total int) {
	visible := w.visibleGPUs()
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gpuViewLocked(snap, vramEach, visible)
}

// gpuViewLocked is gpuView with w.mu held.
func (w *Worker) gpuViewLocked(snap *probe.Snapshot, vramEach int64, visible map[string]bool) (free []probe.GPU, total int) {
	for _, d := range snap.GPUs.Devices {
		if outside(visible, d) {
			continue // outside the worker's own allocation
		}
		if _, mine := w.gpuRes[d.UUID]; mine {
			total++
			continue
		}
		if !d.Usable {
			continue
		}
		total++
		if d.MemFree >= vramEach {
			free = append(free, d)
		}
	}
	sort.Slice(free, func(i, j int) bool { return free[i].Index < free[j].Index })
	return free, total
}

// reserveGPUs picks n devices for shard key and records the reservation;
// it returns CUDA_VISIBLE_DEVICES (UUIDs) or an error saying what is short.
func (w *Worker) reserveGPUs(snap *probe.Snapshot, key string, n int, vramEach int64) (string, error) {
	visible := w.visibleGPUs()
	// The host ledger, locked until the reservation is written, keeps the
	// devices held by the host's other workers out and this one's in.
	o, err := w.shareBegin(snap)
	if err != nil {
		return "", err
	}
	uuids, err := w.pickGPUs(snap, key, n, vramEach, visible, o.HostGPUs)
	if cerr := w.shareCommitHeld(); cerr != nil && err == nil {
		w.releaseGPUs(key)
		return "", cerr
	}
	return uuids, err
}

func (w *Worker) pickGPUs(snap *probe.Snapshot, key string, n int, vramEach int64, visible map[string]bool, theirs []string) (string, error) {
	// One lock for the look and the reservation: two shards starting at
	// once must not both take the first free device.
	w.mu.Lock()
	defer w.mu.Unlock()
	free, _ := w.gpuViewLocked(snap, vramEach, visible)
	free, _ = withoutGPUs(free, 0, theirs)
	if len(free) < n {
		return "", fmt.Errorf("needs %s, and %d of this host's %d can be given now (%s)", gpuNeed(n, vramEach), len(free), len(snap.GPUs.Devices),
			w.gpusTaken(snap.GPUs.Devices, free, vramEach, "this worker's shards", theirs))
	}
	uuids := make([]string, n)
	for i := range n {
		uuids[i] = free[i].UUID
		w.gpuRes[free[i].UUID] = key
	}
	return strings.Join(uuids, ","), nil
}

func (w *Worker) releaseGPUs(key string) {
	w.mu.Lock()
	for u, k := range w.gpuRes {
		if k == key {
			delete(w.gpuRes, u)
		}
	}
	w.mu.Unlock()
	// The host's other workers may place a shard on the devices at once.
	w.refreshHold()
}

// gpusTaken says why each of devs but those in free cannot take a shard
// with vramEach of VRAM now ("GPU 1: busy: ...; GPU 2: MIG mode: ...");
// a device in theirs (UUIDs) is held by another worker of the host, one
// this worker reserved by holder.
func (w *Worker) gpusTaken(devs, free []probe.GPU, vramEach int64, holder string, theirs []string) string {
	given := map[string]bool{}
	for _, d := range free {
		given[d.UUID] = true
	}
	visible := w.visibleGPUs()
	var why []string
	for _, d := range devs {
		switch {
		case given[d.UUID]:
		case outside(visible, d):
			why = append(why, fmt.Sprintf("GPU %d is outside CUDA_VISIBLE_DEVICES", d.Index))
		case !d.Usable:
			why = append(why, fmt.Sprintf("GPU %d: %s", d.Index, d.Why))
		case d.MemFree < vramEach:
			why = append(why, fmt.Sprintf("GPU %d has %s of VRAM free", d.Index, stream.FormatSize(d.MemFree)))
		case slices.Contains(theirs, d.UUID):
			why = append(why, fmt.Sprintf("GPU %d is held by another worker on this host", d.Index))
		default:
			why = append(why, fmt.Sprintf("GPU %d is held by %s", d.Index, holder))
		}
	}
	if len(devs) == 0 {
		why = append(why, "NVML lists no GPU")
	}
	return strings.Join(why, "; ")
}

// fixedGPUs bounds n, the shards of a GPU class a fixed-slots worker
// would fetch, by the devices it could place them on now, as measured
// admission does: fetched with none to be had, a shard was handed back
// at its start, each time spending one of its few deliveries that are
// not attempts (stream.InterruptDeliveries), and then failed. The
// devices the host's other workers hold, or will take for shards they
// fetched, are not counted (the host ledger): counted, two fixed-slots
// workers of one host took turns at handing back each other's shards,
// with delays of up to a minute. It returns n and "" where the devices
// do not bind. locked says that it read the ledger and left it locked:
// the caller's publishFixed writes what this worker then holds and
// unlocks it, so that the look and the hold it leads to are one step
// for the host's other workers (two that looked in the same moment
// both took the one free device, and one handed its shard back at the
// start).
func (w *Worker) fixedGPUs(ctx context.Context, class string, n int) (k int, note string, locked bool) {
	peak, gpu, known := w.peakFor(class)
	if n <= 0 || !known || !gpu || peak.GPUs <= 0 {
		return n, "", false
	}
	devs, err := w.cfg.Probe.GPUDevices(ctx)
	if err != nil {
		return 0, fmt.Sprintf("GPUs unknown (%v): fetching none", err), false
	}
	var o others
	if w.ledger != nil {
		if o, err = w.ledger.begin(w.fixedShare); err != nil {
			return 0, fmt.Sprintf("the GPUs this host's other workers hold unknown (%v): fetching none", err), false
		}
		locked = true
		if w.afterGPULook != nil {
			w.afterGPULook()
		}
	}
	vramEach := peak.VRAM / peak.GPUs
	free, _ := w.gpuView(&probe.Snapshot{GPUs: probe.GPUs{Devices: devs}}, vramEach)
	free, _ = withoutGPUs(free, 0, o.HostGPUs)
	can := max(len(free)-int(o.HostGPUPending)-w.gpusUnplaced(class, peak), 0)
	if k := can / int(peak.GPUs); k < n {
		var why []string
		if taken := w.gpusTaken(devs, free, vramEach, "this worker's shards", o.HostGPUs); taken != "" {
			why = append(why, taken)
		}
		if o.HostGPUPending > 0 {
			why = append(why, fmt.Sprintf("%d more to be taken by shards other workers of this host fetched", o.HostGPUPending))
		}
		return k, fmt.Sprintf("%d of this host's %d GPU(s) can take a shard needing %s (%s)",
			can, len(devs), gpuNeed(int(peak.GPUs), vramEach), strings.Join(why, "; ")), locked
	}
	return n, "", locked
}

// gpusUnplaced is how many devices this worker's shards fetched (or
// asked for) and not yet placed will take: admission counts them as
// taken, or a second decision between a shard's fetch and its placement
// gives the same free device to another shard, whose start finds none.
// class's shards count with peak, the others with their class's.
func (w *Worker) gpusUnplaced(class string, peak plan.Peak) int {
	return int(w.holding(class, 0, peak, 0).GPUPending)
}

// gpuNeed is what a shard asks of a host's GPUs, as its messages say it:
// "2 GPU(s) with 8.0GiB of VRAM free each", the VRAM where declared or
// measured.
func gpuNeed(n int, vramEach int64) string {
	need := fmt.Sprintf("%d GPU(s)", n)
	if vramEach > 0 {
		need += fmt.Sprintf(" with %s of VRAM free each", stream.FormatSize(vramEach))
	}
	return need
}

// outside reports whether d lies outside visible, the worker's own
// CUDA_VISIBLE_DEVICES (UUIDs or indexes; nil: every device).
func outside(visible map[string]bool, d probe.GPU) bool {
	return visible != nil && !visible[d.UUID] && !visible[fmt.Sprint(d.Index)]
}

// gpusBusy reports whether n devices of this worker's (its
// CUDA_VISIBLE_DEVICES) with at least vramEach of memory are healthy and
// only in use: free, held by this worker's or the host's other workers'
// shards, or busy with other jobs' processes. Devices that are
// unhealthy, in MIG mode, too small or missing do not count: waiting for
// them does not help.
func (w *Worker) gpusBusy(snap *probe.Snapshot, n int, vramEach int64) bool {
	visible := w.visibleGPUs()
	w.mu.Lock()
	defer w.mu.Unlock()
	healthy := 0
	for _, d := range snap.GPUs.Devices {
		if outside(visible, d) {
			continue
		}
		if d.MemTotal > 0 && d.MemTotal < vramEach {
			continue
		}
		if _, mine := w.gpuRes[d.UUID]; mine || d.Usable || strings.HasPrefix(d.Why, "busy") {
			healthy++
		}
	}
	return healthy >= n
}

// visibleGPUs is the worker's own CUDA_VISIBLE_DEVICES (set by Slurm or the
// user) as a set of UUIDs and indexes; nil when unset (all devices).
func (w *Worker) visibleGPUs() map[string]bool {
	v, ok := w.env["CUDA_VISIBLE_DEVICES"]
	if !ok {
		return nil
	}
	set := map[string]bool{}
	for _, x := range strings.Split(v, ",") {
		if x = strings.TrimSpace(x); x != "" {
			set[x] = true
		}
	}
	return set
}
