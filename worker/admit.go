package worker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// Memory pressure (PSI some avg10, percent) above which auto admission
// stops fetching.
const pressureStop = 20.0

// admit says how many shards of class may be fetched now, and why.
func (w *Worker) admit(ctx context.Context, class string, inflight int) (int, string) {
	if crit, why := w.isCritical(); crit {
		return 0, fmt.Sprintf("class %s: host under critical memory pressure (%s): not fetching", class, why)
	}
	if !w.cfg.Auto {
		slots := w.cfg.Slots[class]
		return slots - inflight, fmt.Sprintf("%d of %d slots of class %s in use; slots from configuration", inflight, slots, class)
	}
	peak, gpu, ok := w.peakFor(class)
	if !ok {
		return 0, fmt.Sprintf("class %s: no active run declares it", class)
	}
	v, err := w.admissionView(ctx, gpu, false)
	if err != nil {
		return 0, fmt.Sprintf("class %s: probe failed, admitting nothing: %v", class, err)
	}
	k, detail, short := w.decide(v, class, inflight, peak, gpu)
	if short && !v.fresh {
		// A view that holds a shard back is taken again now: waiting must
		// rest on what the host has, not on what it had.
		if v, err = w.admissionView(ctx, gpu, true); err != nil {
			return 0, fmt.Sprintf("class %s: probe failed, admitting nothing: %v", class, err)
		}
		k, detail, _ = w.decide(v, class, inflight, peak, gpu)
	}
	if k > 0 {
		w.hostLog(class, "fetch", detail)
	}
	return k, detail
}

// decide is admit's arithmetic on one view of the host. short says that
// memory or pressure, not the slots, held the number back.
func (w *Worker) decide(v *admitView, class string, inflight int, peak plan.Peak, gpu bool) (int, string, bool) {
	snap := v.snap
	budget := plan.FromProbe(snap.Budget)
	var gpuFree []probe.GPU
	if gpu {
		// Devices held by this worker's own shards count as ours, not busy.
		var total int
		gpuFree, total = w.gpuView(snap, peak.VRAM/max(peak.GPUs, 1))
		budget["gpus"] = probe.Known(int64(total), "usable GPUs and those held by this worker")
	}
	slots := plan.Compute(budget, plan.Peak{}, peak, gpu)
	slots, _ = plan.Unmeasured(slots, peak)
	n, reason := slots.N, slots.Reason
	if max := w.cfg.Slots[class]; max > 0 && n > max {
		n, reason = max, fmt.Sprintf("%s; capped at %d by configuration", reason, max)
	}
	free := n - inflight
	if free <= 0 {
		return 0, fmt.Sprintf("class %s: all %d slot(s) in use (%s)", class, n, reason), false
	}
	// Live check: headroom now, minus what running shards may still grow to.
	mem := snap.Host.MemAvailable
	if !mem.IsKnown() {
		return 0, fmt.Sprintf("class %s: memory available unknown (%s): admitting nothing", class, mem.Unknown), true
	}
	headroom, src := mem.N, "MemAvailable"
	if cg := snap.Cgroups; cg.MemoryLimit.IsKnown() && cg.WorkingSet.IsKnown() {
		if h := cg.MemoryLimit.N - cg.WorkingSet.N; h < headroom {
			headroom, src = h, "cgroup "+cg.MemoryBinds+" limit minus working set"
		}
	} else if cg.MemoryLimit.IsUnknown() {
		return 0, fmt.Sprintf("class %s: cgroup memory limit unknown (%s): admitting nothing", class, cg.MemoryLimit.Unknown), true
	}
	// The view's running shards may still grow to their peaks; every shard
	// of the class in flight that was not running when the view was taken
	// (fetched and not started then, or admitted since) will grow to its
	// whole peak. Shards that ended since stay counted: that only errs
	// toward room.
	growth, running := v.growth, w.stillRunning(v, class)
	if starting := inflight - running; starting > 0 {
		growth += int64(starting) * peak.Memory
	}
	// The same for the other classes this worker serves: a shard of
	// another class being staged or started holds nothing yet either.
	growth += w.othersStarting(v, class)
	src += fmt.Sprintf(", probed %s ago", time.Since(v.at).Round(time.Millisecond))
	if ps := snap.PSI.MemorySome10; ps.Unknown == "" && ps.F > pressureStop {
		return 0, fmt.Sprintf("class %s: memory pressure %.1f%% > %.0f%%: not fetching", class, ps.F, pressureStop), true
	}
	fit := free
	if peak.Memory > 0 {
		fit = int((headroom - growth) / peak.Memory)
	}
	k := min(free, max(fit, 0))
	if gpu && peak.GPUs > 0 {
		k = min(k, len(gpuFree)/int(peak.GPUs))
	}
	detail := fmt.Sprintf("class %s: slots %d (%s); in flight %d; headroom %s (%s) - growth of running shards %s = %s; peak %s (%s): fetch %d",
		class, n, reason, inflight, stream.FormatSize(headroom), src, stream.FormatSize(growth), stream.FormatSize(headroom-growth),
		stream.FormatSize(peak.Memory), peak.Source, k)
	return k, detail, k < free
}

// admitViewFor is how long one look at the host serves admission decisions
// that admit. A look costs about a millisecond and a half of CPU (the
// probe, and a scan of /proc for the running shards' memory); taken before
// every fetch it halved the rate of short shards. A decision that holds a
// shard back always looks again.
const admitViewFor = 250 * time.Millisecond

// admitView is one look at the host for admission: the probe's snapshot,
// and the running shards with what they may still grow to at that time.
type admitView struct {
	at     time.Time
	snap   *probe.Snapshot
	growth int64
	live   map[int]liveShard
	fresh  bool // taken for the decision at hand
}

// admissionView returns a view of the host younger than admitViewFor, or
// takes one. GPU classes always take one: free device memory moves with
// other users' jobs, and their shards are long enough for the cost.
func (w *Worker) admissionView(ctx context.Context, gpu, force bool) (*admitView, error) {
	w.viewMu.Lock()
	defer w.viewMu.Unlock()
	if v := w.admitView; v != nil && !force && !gpu && time.Since(v.at) < w.viewFor {
		c := *v
		c.fresh = false
		return &c, nil
	}
	at := time.Now()
	snap, err := w.cfg.Probe.Snapshot(ctx, nil)
	if err != nil {
		w.admitView = nil
		return nil, err
	}
	growth, live := w.growthRoom()
	w.admitView = &admitView{at: at, snap: snap, growth: growth, live: live}
	v := *w.admitView
	v.fresh = true
	return &v, nil
}

// othersStarting is the whole peak of every shard of a class other than
// class that is in flight and was not running at the view.
func (w *Worker) othersStarting(v *admitView, class string) int64 {
	w.mu.Lock()
	gates := make(map[string]*gate, len(w.gates))
	for c, g := range w.gates {
		if c != class {
			gates[c] = g
		}
	}
	w.mu.Unlock()
	var sum int64
	for c, g := range gates {
		peak, _, ok := w.peakFor(c)
		if !ok {
			continue
		}
		if starting := g.count() - w.stillRunning(v, c); starting > 0 {
			sum += int64(starting) * peak.Memory
		}
	}
	return sum
}

// stillRunning counts the view's running shards of class that run now (the
// same process group of the same start).
func (w *Worker) stillRunning(v *admitView, class string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for pgid, s := range v.live {
		if s.class == class && w.live[pgid].seq == s.seq {
			n++
		}
	}
	return n
}

// peakFor is the largest declared peak of class over the active runs.
func (w *Worker) peakFor(class string) (plan.Peak, bool, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.peaks[class]
	return p, w.gpuClass[class], ok
}

// refreshPeaks reads the active runs and records, per class, the largest
// declared peak; it returns the classes seen.
func (w *Worker) refreshPeaks(ctx context.Context) []string {
	keys, err := w.b.Keys(ctx, w.b.Runs)
	if err != nil {
		return nil
	}
	peaks, gpu := map[string]plan.Peak{}, map[string]bool{}
	for _, k := range keys {
		e, err := w.b.Runs.Get(ctx, k)
		if err != nil {
			continue
		}
		var r stream.RunRecord
		if stream.Decode(e.Value(), &r) != nil || r.State == stream.RunComplete {
			continue
		}
		for c := range r.Classes {
			d := plan.Declared(r.Spec.Classes[c])
			if m, ok := r.MeasuredMemory[c]; ok && m > 0 {
				d.Memory, d.Source = m, "measured (profile.json)"
			}
			cur := peaks[c]
			cur.CPU, cur.Memory, cur.GPUs, cur.VRAM = max(cur.CPU, d.CPU), max(cur.Memory, d.Memory), max(cur.GPUs, d.GPUs), max(cur.VRAM, d.VRAM)
			cur.Source = d.Source
			peaks[c] = cur
			gpu[c] = gpu[c] || d.GPUs > 0
		}
	}
	w.mu.Lock()
	w.peaks, w.gpuClass = peaks, gpu
	w.mu.Unlock()
	classes := make([]string, 0, len(peaks))
	for c := range peaks {
		classes = append(classes, c)
	}
	return classes
}

// liveShard is a running child: its process group and its class's peak;
// seq tells apart two shards that had the same process group id.
type liveShard struct {
	class string
	peak  int64
	seq   uint64
}

// trackLive returns an onStart hook that registers a running shard's
// process group with its class's peak for the growth estimate.
func (w *Worker) trackLive(class string, peak int64) func(int) func() {
	return func(pgid int) func() {
		w.mu.Lock()
		w.liveSeq++
		w.live[pgid] = liveShard{class: class, peak: peak, seq: w.liveSeq}
		w.mu.Unlock()
		return func() { w.liveEnd(pgid) }
	}
}

func (w *Worker) liveEnd(pgid int) {
	w.mu.Lock()
	delete(w.live, pgid)
	w.mu.Unlock()
}

// growthRoom is how much running shards may still grow (for each, its
// peak minus what its process group holds now; one scan of /proc), with
// the registry of running shards it was computed for.
func (w *Worker) growthRoom() (int64, map[int]liveShard) {
	w.mu.Lock()
	live := make(map[int]liveShard, len(w.live))
	for k, v := range w.live {
		live[k] = v
	}
	w.mu.Unlock()
	if len(live) == 0 {
		return 0, live
	}
	rss := groupRSS(w.cfg.ProcRoot, live)
	var g int64
	for pgid, s := range live {
		g += max(s.peak-rss[pgid], 0)
	}
	return g, live
}

// groupRSS sums the resident memory of the processes of each group.
func groupRSS(procRoot string, groups map[int]liveShard) map[int]int64 {
	out := map[int]int64{}
	page := int64(os.Getpagesize())
	for _, st := range procStats(procRoot) {
		if _, ok := groups[st.pgrp]; ok {
			out[st.pgrp] += st.rssPages * page
		}
	}
	return out
}

// procGroups maps every pid to its process group.
func procGroups(procRoot string) map[int]int {
	out := map[int]int{}
	for _, st := range procStats(procRoot) {
		out[st.pid] = st.pgrp
	}
	return out
}

type procStat struct {
	pid, pgrp int
	rssPages  int64
	start     int64 // clock ticks since boot
	zombie    bool  // exited, not yet reaped by its parent
}

// procStats reads pid, process group and RSS of every process.
func procStats(procRoot string) []procStat {
	ents, err := os.ReadDir(procRoot)
	if err != nil {
		return nil
	}
	out := make([]procStat, 0, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "stat"))
		if err != nil {
			continue
		}
		if st, ok := probe.ParseStat(b); ok {
			out = append(out, procStat{pid: pid, pgrp: st.PGrp, rssPages: st.RSSPages, start: st.Start, zombie: st.State == 'Z'})
		}
	}
	return out
}

// hostLog appends a worker-level admission decision (fetch or wait, per
// class, with its numbers) to <state>/admission.log.
func (w *Worker) hostLog(class, decision, detail string) {
	line := fmt.Sprintf("%s worker=%s class=%s decision=%s %s\n", time.Now().UTC().Format(time.RFC3339Nano), w.cfg.Name, class, decision, detail)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hostLogF == nil {
		if err := os.MkdirAll(w.cfg.StateDir, 0o755); err != nil {
			return
		}
		f, err := os.OpenFile(filepath.Join(w.cfg.StateDir, "admission.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return
		}
		w.hostLogF = f
	}
	w.hostLogF.WriteString(line)
}
