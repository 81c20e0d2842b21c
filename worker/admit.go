package worker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// Memory pressure (PSI some avg10, percent) above which auto admission
// stops fetching.
const pressureStop = 20.0

// admit says how many shards of class may be fetched now, and why.
// blind says that they are fetched before a run of the class is seen:
// with no look at what the class needs of the host's GPUs (fixed slots
// only; measured admission fetches nothing of a class it does not know).
func (w *Worker) admit(ctx context.Context, class string, inflight int) (n int, why string, blind bool) {
	if crit, why := w.isCritical(); crit {
		return 0, fmt.Sprintf("class %s: host under critical memory pressure (%s): not fetching", class, why), false
	}
	if err := w.scratchUsable(); err != nil {
		return 0, fmt.Sprintf("class %s: %v: not fetching; looking again every %s", class, err, scratchRecheck), false
	}
	if why := w.fetchHeld(); why != "" {
		return 0, fmt.Sprintf("class %s: %s", class, why), false
	}
	if why := w.outputFullHeld(class); why != "" {
		return 0, fmt.Sprintf("class %s: %s", class, why), false
	}
	if !w.cfg.Auto {
		slots := w.fixedSlots(class)
		n, why = slots-inflight, fmt.Sprintf("%d of %d slots of class %s in use; slots from configuration", inflight, slots, class)
		_, _, known := w.peakFor(class)
		// No active run has the class yet: one open fetch waits for its
		// first shard, so that the others are admitted by what the run
		// declares (its scratch), not by a request for every slot made
		// before the run was seen.
		unseen := !known && w.runsWatched.Load()
		if !unseen {
			if k, note := w.scratchFit(class, inflight, n); note != "" {
				n, why = k, why+"; "+note
			}
		}
		// Or the queue ran dry (a run whose last shards run, a BLOCKED
		// one): as in auto mode, one open fetch waits for the next shard.
		// An open fetch counts as held in the host ledger, and a fetch for
		// every free slot kept an idle worker's whole share from the
		// host's other workers for as long as the run stayed.
		if g := w.gate(class); unseen || g.dry() {
			if k, cut := g.oneOpen(n); cut {
				until := "while the queue is dry"
				if unseen {
					until = "until a run of the class is seen"
				}
				n, why = k, why+"; one open fetch "+until
			}
		}
		k, note, locked := w.fixedGPUs(ctx, class, n)
		if note != "" {
			n, why = k, why+"; "+note
		}
		w.publishFixed(class, max(n, 0), locked)
		return n, why, !known
	}
	peak, gpu, ok := w.peakFor(class)
	if !ok {
		return 0, fmt.Sprintf("class %s: no active run declares it", class), false
	}
	v, err := w.admissionView(ctx, gpu, false)
	if err != nil {
		return 0, fmt.Sprintf("class %s: probe failed, admitting nothing: %v", class, err), false
	}
	// The ledger stays locked from reading what the host's other workers
	// hold until this worker's new hold is written: two workers never
	// admit into the same room.
	o, err := w.shareBegin(v.snap)
	if err != nil {
		return 0, fmt.Sprintf("class %s: %v: admitting nothing", class, err), false
	}
	k, detail, short, hold := w.decide(v, class, inflight, peak, gpu, o)
	if short && !v.fresh {
		// A view that holds a shard back is taken again now: waiting must
		// rest on what the host has, not on what it had.
		w.shareAbort()
		if v, err = w.admissionView(ctx, gpu, true); err != nil {
			return 0, fmt.Sprintf("class %s: probe failed, admitting nothing: %v", class, err), false
		}
		if o, err = w.shareBegin(v.snap); err != nil {
			return 0, fmt.Sprintf("class %s: %v: admitting nothing", class, err), false
		}
		k, detail, _, hold = w.decide(v, class, inflight, peak, gpu, o)
	}
	if err := w.shareCommit(hold); err != nil {
		// The others would not see these shards: admit none.
		return 0, fmt.Sprintf("class %s: %v: admitting nothing", class, err), false
	}
	if k > 0 && w.gate(class).logFetch(k, time.Now()) {
		w.hostLog(class, "fetch", detail)
	}
	return k, detail, false
}

// decide is admit's arithmetic on one view of the host, with o what the
// host's other workers sharing the budget hold. short says that memory or
// pressure, not the slots, held the number back; hold is what this
// worker's shards in flight hold once the k admitted are fetched.
func (w *Worker) decide(v *admitView, class string, inflight int, peak plan.Peak, gpu bool, o others) (k int, detail string, short bool, hold Hold) {
	snap := v.snap
	budget := plan.FromProbe(snap.Budget)
	if m := budget["memory"]; learnedAbove(peak, m) {
		// A shard of it ran here: a peak learned of it must not leave the
		// class no slot at all (learn.go).
		peak.Memory, peak.Source = m.N, peak.Source+"; capped at the memory budget"
	}
	// The view's running shards may still grow to their peaks; every shard
	// of the class in flight that was not running when the view was taken
	// (fetched and not started then, or admitted since) will grow to its
	// whole peak. Shards that ended since stay counted: that only errs
	// toward room. The same for the other classes this worker serves: a
	// shard of another class being staged or started holds nothing yet
	// either.
	own := v.growth
	if starting := inflight - w.stillRunning(v, class); starting > 0 {
		own += int64(starting) * peak.Memory
	}
	own += w.othersStarting(v, class)
	var gpuFree []probe.GPU
	if gpu {
		// Devices held by this worker's own shards count as ours, not busy;
		// those held by the host's other workers are theirs, even before
		// their processes show on the device.
		var total int
		gpuFree, total = w.gpuView(snap, peak.VRAM/max(peak.GPUs, 1))
		gpuFree, total = withoutGPUs(gpuFree, total, o.HostGPUs)
		budget["gpus"] = probe.Known(int64(total), "usable GPUs and those held by this worker")
	}
	var limit *othersLimit
	if l := snap.Budget.CPU; strings.HasPrefix(l.Binding, probe.ScopeOthers) && l.Effective.IsKnown() {
		limit = &othersLimit{text: l.Binding, millicores: l.Effective.N}
		// Others keep the CPUs busy: one shard still runs, sharing them
		// as any process does, so that a run does not wait on another
		// user's for as long as theirs lasts. One for this user, not for
		// each of its workers: the others' holds in the ledger count
		// against it.
		if hard := snap.Budget.Hard.CPU.Effective; peak.CPU > l.Effective.N && hard.IsKnown() && peak.CPU <= hard.N {
			limit.text += "; one shard still runs"
			budget["cpu"] = probe.Known(peak.CPU, limit.text)
		}
	}
	w.othersLimit.Store(limit)
	shared := plan.Peak{CPU: o.CPU, Memory: o.Memory, GPUs: o.GPUPending}
	slots := plan.Compute(budget, shared, peak, gpu)
	slots, _ = plan.Unmeasured(slots, peak)
	n, reason := slots.N, slots.Reason
	// wants: this class has shards queued that sharing the host held back.
	wants := false
	w.sharing.Store(o.Active > 0)
	if len(o.Workers) > 0 {
		alone, _ := plan.Unmeasured(plan.Compute(budget, plan.Peak{}, peak, gpu), peak)
		wants = n < alone.N && w.hasBacklog(class)
		reason += "; shared with " + strings.Join(o.Workers, ", ") + " on this host"
		if fair, ok := w.fairSlots(budget, class, inflight, peak, o); ok && fair < n {
			// Others wait for room: keep to an equal share of the CPUs,
			// or one worker that got there first would hold them all.
			n, wants = fair, w.hasBacklog(class)
			reason += fmt.Sprintf("; %d slot(s) as an equal share with %d other active worker(s), %d waiting", fair, o.Active, o.Wanting)
		}
	}
	if max, _ := w.slotsOf(class); max > 0 && n > max {
		n, reason = max, fmt.Sprintf("%s; capped at %d by configuration", reason, max)
	}
	free := n - inflight
	if free <= 0 {
		h := w.holding(class, 0, peak, own)
		if wants {
			h.want(peak)
		}
		return 0, fmt.Sprintf("class %s: all %d slot(s) in use (%s)", class, n, reason), false, h
	}
	// Live check: headroom now, minus what running shards may still grow to.
	mem := snap.Host.MemAvailable
	if !mem.IsKnown() {
		return 0, fmt.Sprintf("class %s: memory available unknown (%s): admitting nothing", class, mem.Unknown), true, w.holding(class, 0, peak, own)
	}
	headroom, src := mem.N, "MemAvailable"
	if cg := snap.Cgroups; cg.MemoryLimit.IsKnown() && cg.WorkingSet.IsKnown() {
		if h := cg.MemoryLimit.N - cg.WorkingSet.N; h < headroom {
			headroom, src = h, "cgroup "+cg.MemoryBinds+" limit minus working set"
		}
	} else if cg.MemoryLimit.IsUnknown() {
		return 0, fmt.Sprintf("class %s: cgroup memory limit unknown (%s): admitting nothing", class, cg.MemoryLimit.Unknown), true, w.holding(class, 0, peak, own)
	}
	growth := own
	// What the host's other workers' shards may still grow by is not in
	// MemAvailable yet either.
	growth += o.Memory
	src += fmt.Sprintf(", probed %s ago", time.Since(v.at).Round(time.Millisecond))
	if ps := snap.PSI.MemorySome10; ps.Unknown == "" && ps.F > pressureStop {
		return 0, fmt.Sprintf("class %s: memory pressure %.1f%% > %.0f%%: not fetching", class, ps.F, pressureStop), true, w.holding(class, 0, peak, own)
	}
	if cpu := budget["cpu"]; cpu.IsKnown() && len(o.Starved) > 0 {
		mine := w.holding(class, 0, peak, own)
		now := room{cpu: cpu.N - o.CPU - mine.CPU, memory: headroom - growth}
		// Capacity once the others' shards end; memory: what this worker's
		// shards hold now (their peaks less what they may still grow by)
		// comes back too.
		capacity := room{cpu: cpu.N, memory: headroom - o.Memory + max(w.inflightMemory()-own, 0)}
		if gpu {
			now.gpus, capacity.gpus = int64(len(gpuFree))-o.GPUPending, budget["gpus"].N
		} else {
			// Whether a starved GPU shard could start now, were it not for
			// this class's CPU or memory.
			free, total := w.gpuView(snap, 0)
			free, total = withoutGPUs(free, total, o.HostGPUs)
			now.gpus, capacity.gpus = int64(len(free))-o.GPUPending, int64(total)
		}
		if y := w.yieldTo(o, now, capacity, peak); y != "" {
			if w.hasBacklog(class) {
				mine.want(peak)
			}
			return 0, fmt.Sprintf("class %s: letting %s go first (%s)", class, y, reason), true, mine
		}
	}
	fit := free
	if peak.Memory > 0 {
		fit = int((headroom - growth) / peak.Memory)
	}
	k = min(free, max(fit, 0))
	if gpu && peak.GPUs > 0 {
		k = min(k, max(len(gpuFree)-int(o.GPUPending)-w.gpusUnplaced(class, peak), 0)/int(peak.GPUs))
	}
	k, scratchNote := w.scratchFit(class, inflight, k)
	if g := w.gate(class); g.dry() {
		// The queue ran dry: one open fetch at a time waits for the next
		// shard, so that what this worker holds for shards not yet queued
		// is one shard's room, not every free slot's.
		k, _ = g.oneOpen(k)
	}
	growthOf := "growth of running shards"
	if o.Memory > 0 {
		growthOf = fmt.Sprintf("growth of running shards (%s of them other workers')", stream.FormatSize(o.Memory))
	}
	peakOf := fmt.Sprintf("peak %s (%s)", stream.FormatSize(peak.Memory), peak.Source)
	if peak.Memory <= 0 {
		// Not a declared 0B: none is known, and the slots above say what
		// that costs.
		peakOf = "peak memory neither declared nor measured"
	}
	detail = fmt.Sprintf("class %s: slots %d (%s); in flight %d; headroom %s (%s) - %s %s = %s; %s: fetch %d",
		class, n, reason, inflight, stream.FormatSize(headroom), src, growthOf, stream.FormatSize(growth), stream.FormatSize(headroom-growth),
		peakOf, k)
	if scratchNote != "" {
		detail += "; " + scratchNote
	}
	hold = w.holding(class, k, peak, own+int64(k)*peak.Memory)
	if wants {
		hold.want(peak)
	}
	return k, detail, k < free, hold
}

// othersLimit is the CPU limit that others' use of the host set.
type othersLimit struct {
	text       string // the limit with its numbers, as admission.log gives it
	millicores int64  // the CPUs it leaves: changes only when the limit does
}

// OthersLimit says what others' use of the host's CPUs limited this
// worker's last admission decision to ("" when another limit bound it,
// or the worker has fixed slots), for a display; key changes only when
// the limit does, not as the use measured moves.
func (w *Worker) OthersLimit() (text string, key int64) {
	if l := w.othersLimit.Load(); l != nil {
		return l.text, l.millicores
	}
	return "", 0
}

// fairSlots is how many shards of class this worker may have in flight
// when other workers on the host wait for room: its equal share of the
// CPU budget among the active workers, less what its other classes hold,
// and at least one shard when it holds nothing. ok is false when nobody
// waits (the budget then goes to whoever has work) or the CPU budget is
// unknown.
func (w *Worker) fairSlots(budget plan.Budget, class string, inflight int, peak plan.Peak, o others) (int, bool) {
	cpu := budget["cpu"]
	if o.Wanting == 0 || !cpu.IsKnown() || peak.CPU <= 0 {
		return 0, false
	}
	fair := cpu.N / int64(1+o.Active)
	mine := w.holding(class, 0, peak, 0).CPU - int64(inflight)*peak.CPU // the other classes'
	n := int((fair - mine) / peak.CPU)
	if n < 1 && mine == 0 && inflight == 0 {
		n = 1 // more workers than room: each may take one shard (see yieldTo)
	}
	return max(n, 0), true
}

// yieldTo names the worker this one lets go first, admitting nothing new
// of a class with peak meanwhile: one that has wanted a shard while
// holding nothing for longer than this one (a worker whose shard just
// ended has not waited at all), whose shard fits the host's capacity once
// the others' shards end, and whom one more shard of this class would
// leave short of something this class takes (now: what is free). So
// workers take turns when there is room for fewer shards than workers
// want, and a worker whose shards are larger than the others' is not
// starved by them refilling each slot as it frees. Not waited for: a
// shard that does not fit even then, or one short now of what this class
// does not take (a shard waiting for a GPU does not stop CPU-only shards
// while the CPUs have room for both). "" when this worker goes ahead.
func (w *Worker) yieldTo(o others, now, capacity room, peak plan.Peak) string {
	mySince := time.Now().UnixNano()
	if w.ledger != nil && w.ledger.starvedSince() != 0 {
		mySince = w.ledger.starvedSince()
	}
	for _, s := range o.Starved {
		n := s.need
		if s.since >= mySince || n.cpu > capacity.cpu || n.memory > capacity.memory || n.gpus > capacity.gpus {
			continue
		}
		// Short of what this class does not take: yielding gives it nothing.
		if (peak.CPU == 0 && n.cpu > now.cpu) || (peak.Memory == 0 && n.memory > now.memory) || (peak.GPUs == 0 && n.gpus > now.gpus) {
			continue
		}
		if (peak.CPU > 0 && n.cpu > now.cpu-peak.CPU) || (peak.Memory > 0 && n.memory > now.memory-peak.Memory) || (peak.GPUs > 0 && n.gpus > now.gpus-peak.GPUs) {
			return fmt.Sprintf("%s, waiting %s for a shard of %s, %s and %d GPU(s)", s.who,
				time.Duration(time.Now().UnixNano()-s.since).Round(time.Millisecond), showMillicores(n.cpu), stream.FormatSize(n.memory), n.gpus)
		}
	}
	return ""
}

// inflightMemory is the peak memory of every shard this worker has in
// flight.
func (w *Worker) inflightMemory() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var m int64
	for c, g := range w.gates {
		m += int64(g.count()) * w.peaks[c].Memory
	}
	return m
}

func showMillicores(m int64) string { return fmt.Sprintf("%.2f CPUs", float64(m)/1000) }

// hasBacklog reports whether class may have more shards queued.
func (w *Worker) hasBacklog(class string) bool {
	g := w.gate(class)
	return !g.dry()
}

// gate is class's gate while its fetch loop runs, else nil.
func (w *Worker) gate(class string) *gate {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gates[class]
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
	peaks, gpu, scratch := map[string]plan.Peak{}, map[string]bool{}, map[string][]scratchDecl{}
	runs := map[string][]runBase{}
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
			if v := r.MeasuredVRAM[c]; v > d.VRAM && d.GPUs > 0 {
				d.VRAM = v
			}
			runs[c] = append(runs[c], runBase{run: r.Name, fp: r.Fingerprint, memory: d.Memory, source: d.Source, seen: r.PeaksSeen[c]})
			cur := peaks[c]
			cur.CPU, cur.Memory, cur.GPUs, cur.VRAM = max(cur.CPU, d.CPU), max(cur.Memory, d.Memory), max(cur.GPUs, d.GPUs), max(cur.VRAM, d.VRAM)
			cur.Source = d.Source
			peaks[c] = cur
			gpu[c] = gpu[c] || d.GPUs > 0
			if d := declOf(r, c); d.declared > 0 || d.staged != "" {
				scratch[c] = append(scratch[c], d)
			}
		}
	}
	w.mu.Lock()
	w.applyLearned(peaks, runs)
	w.peaks, w.gpuClass, w.scratchNeed = peaks, gpu, scratch
	w.pruneStagedLocked()
	w.mu.Unlock()
	// Fetch loops held back for want of a run, or for scratch a run no
	// longer declares, look again.
	w.wakeAll()
	classes := make([]string, 0, len(peaks))
	for c := range peaks {
		classes = append(classes, c)
	}
	return classes
}

// runChanged reports whether a run record's update can change what
// refreshPeaks finds: a run not seen before, a new generation or settings
// (measured peaks among them), a run completed or deleted. The tracker
// rewrites records for their counters many times a second; those updates
// change nothing here. seen holds the last signature of each run; r is
// the update's record, nil where it was deleted or does not decode.
func runChanged(seen map[string]string, key string, op jetstream.KeyValueOp, r *stream.RunRecord) bool {
	sig := "deleted"
	switch {
	case op == jetstream.KeyValuePut && r == nil:
		sig = "undecodable"
	case op == jetstream.KeyValuePut:
		// With the peaks its shards reached, which admission learns from
		// (learn.go): a new largest one is rare.
		sig = fmt.Sprintf("%s/%d/%v/%v", r.Fingerprint, r.Settings, r.State == stream.RunComplete, r.PeaksSeen)
	}
	if seen[key] == sig {
		return false
	}
	seen[key] = sig
	return true
}

// liveShard is a running child: its process group and its class's peak;
// seq tells apart two shards that had the same process group id.
type liveShard struct {
	class string
	peak  int64
	seq   uint64
	// run, fp and id name the shard's run, job and shard, for what is
	// learned of its peak (learn.go).
	run, fp, id string
	// seen, where the shard has no cgroup to measure it, is the largest
	// RSS of its process group sampled so far (notePeaks), under w.mu;
	// since is when the command started.
	seen  *int64
	since time.Time
	// sampled is when a scan last sampled it (notePeaks), zero before
	// the first.
	sampled time.Time
}

// trackLive returns an onStart hook that registers a running shard's
// process group with its class's peak for the growth estimate. With
// sample (a shard without a cgroup) its group's RSS is also sampled while
// it runs (sampleLive), and seen returns the largest sum found: the
// kernel's peak RSS of a child is not told apart from the worker's own
// below the worker's size, and a command that runs liveFirstSample or
// more is measured this way instead (short peaks between samples are
// missed).
func (w *Worker) trackLive(shard liveShard, sample bool) (onStart func(int) func(), seen func() int64) {
	var got int64
	onStart = func(pgid int) func() {
		s := shard
		s.since = time.Now()
		if sample {
			s.seen = &got
		}
		w.mu.Lock()
		w.liveSeq++
		s.seq = w.liveSeq
		w.live[pgid] = s
		w.mu.Unlock()
		return func() { w.liveEnd(pgid) }
	}
	seen = func() int64 {
		w.mu.Lock()
		defer w.mu.Unlock()
		return got
	}
	return onStart, seen
}

func (w *Worker) liveEnd(pgid int) {
	w.mu.Lock()
	delete(w.live, pgid)
	w.mu.Unlock()
}

// notePeaks records rss, one scan's sum per process group, as the peak
// of each sampled shard of live that is still the one running there, and
// the scan as the shard's last sample (sampleLive) once it has run
// liveFirstSample: an earlier one (an admission decision's, as it starts)
// sees it before its size. Every running shard of live is a peak to learn
// from (learnLocked).
func (w *Worker) notePeaks(live map[int]liveShard, rss map[int]int64) {
	w.mu.Lock()
	now := time.Now()
	var news []learnedNews
	for pgid, s := range live {
		cur, ok := w.live[pgid]
		if !ok || cur.seq != s.seq {
			continue
		}
		// Any running shard, sampled or with a cgroup, that already holds
		// well more than its run's peak teaches admission now, not at its
		// end, which may be hours away.
		if n := w.learnLocked(s.run, s.fp, s.class, s.id, rss[pgid]); n.msg != "" {
			news = append(news, n)
		}
		if s.seen != nil {
			*s.seen = max(*s.seen, rss[pgid])
			if now.Sub(cur.since) >= liveFirstSample {
				cur.sampled = now
				w.live[pgid] = cur
			}
		}
	}
	w.mu.Unlock()
	for _, n := range news {
		w.sayLearned(n)
	}
}

// A shard without a cgroup has its process group's RSS sampled once it
// has run liveFirstSample, then every liveSampleEvery (one scan of /proc
// for all the shards due): a command of half a second is measured, one
// shorter costs nothing. On a host of many processes the scans are
// spaced further, to stay within 1% of a CPU (12 µs a process here:
// 2,000 processes would take 25 ms a scan). Until the sixty-seventh
// session the first sample came after a second, and shards of 0.3 to 1
// s went unmeasured ("peak memory not measured").
const (
	liveFirstSample = 250 * time.Millisecond
	liveSampleEvery = time.Second
)

// sampleLive samples the RSS of the process groups of sampled shards
// (trackLive) until ctx ends. A shard an admission decision's scan
// sampled within the period (growthRoom) is not due again.
func (w *Worker) sampleLive(ctx context.Context) error {
	t := time.NewTimer(liveFirstSample)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		now := time.Now()
		due := map[int]liveShard{}
		w.mu.Lock()
		for pgid, s := range w.live {
			if s.seen == nil {
				continue
			}
			if s.sampled.IsZero() && now.Sub(s.since) >= liveFirstSample || !s.sampled.IsZero() && now.Sub(s.sampled) >= liveSampleEvery {
				due[pgid] = s
			}
		}
		w.mu.Unlock()
		next := liveFirstSample
		if len(due) > 0 {
			w.notePeaks(due, groupRSS(w.cfg.ProcRoot, due))
			next = max(next, 100*time.Since(now))
		}
		t.Reset(next)
	}
}

// growthRoom is how much running shards may still grow (for each, its
// peak minus what its process group holds now; one scan of /proc), with
// the registry of running shards it was computed for. The scan counts as
// a sample of their peaks, too.
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
	w.notePeaks(live, rss)
	var g int64
	w.mu.Lock()
	for pgid, s := range live {
		g += max(w.livePeak(s)-rss[pgid], 0)
	}
	w.mu.Unlock()
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

// hostLogPath is the host admission.log this worker writes (hostLog),
// which its reports name.
func (w *Worker) hostLogPath() string {
	return filepath.Join(w.cfg.StateDir, w.evidenceFile("admission.log"))
}

// hostLog appends a worker-level admission decision (fetch or wait, per
// class, with its numbers) to <state>/admission.log (evidenceFile).
func (w *Worker) hostLog(class, decision, detail string) {
	line := fmt.Sprintf("%s worker=%s class=%s decision=%s %s\n", time.Now().UTC().Format(time.RFC3339Nano), w.cfg.Name, class, decision, detail)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hostLogF == nil {
		if err := os.MkdirAll(w.cfg.StateDir, 0o755); err != nil {
			return
		}
		f, err := os.OpenFile(w.hostLogPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return
		}
		w.hostLogF = f
	}
	w.hostLogF.WriteString(line)
}
