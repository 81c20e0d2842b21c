package worker

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// ErrProfile means a sample failed its correctness check; nothing scales
// after that.
var ErrProfile = errors.New("profile stopped")

// ProfileConfig configures Profile.
type ProfileConfig struct {
	Spec     *stream.Spec
	Manifest *stream.Manifest
	// Scratch holds the samples' {out} and {scratch} (removed after).
	Scratch string
	// LogDir receives each sample's stdout and stderr.
	LogDir string
	// Sweep raises concurrency 1, 2, 4, ... while throughput improves by
	// more than SweepGain (default 0.1), up to the budget's slots.
	Sweep     bool
	SweepGain float64
	// Probe gives the budget for the sweep's ceiling. Default: real host.
	Probe  *probe.Prober
	Logger *slog.Logger
	// AdoptOrphans: as Config's (the shardpool binary's profile).
	AdoptOrphans bool
	// HostLedger is the directory of the host ledger, where the host's
	// workers say which GPUs their shards hold: a sample is not placed
	// on them. Default: DefaultLedgerDir().
	HostLedger string
}

// Sample is one measured run of the command.
type Sample struct {
	Kind        string  `json:"kind"`
	ID          string  `json:"id"`
	Class       string  `json:"class"`
	Cost        int64   `json:"cost"`
	Seconds     float64 `json:"seconds"`
	ItemsPerSec float64 `json:"items_per_sec"`
	PeakMemory  int64   `json:"peak_memory"`
	PeakSource  string  `json:"peak_memory_source"`
	PeakVRAM    string  `json:"peak_vram"` // bytes, or "unknown: why"
	// PeakVRAMDevice is the most the shard held on one of its devices
	// (bytes; 0 where unknown or none).
	PeakVRAMDevice int64   `json:"peak_vram_device,omitempty"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	CPUDuty        float64 `json:"cpu_duty"`
	GPUDuty        string  `json:"gpu_duty"` // mean utilization of its GPUs, or "unknown: why"
	ReadBytes      int64   `json:"read_bytes"`
	WriteBytes     int64   `json:"write_bytes"`
	OutputBytes    int64   `json:"output_bytes"`
	ScratchBytes   int64   `json:"scratch_bytes"`
	Outcome        string  `json:"outcome"`
	Reason         string  `json:"reason,omitempty"`
	Log            string  `json:"log"`
	// LeftRunning: what the command left running outside its process
	// group, killed when it ended (as a run's attempt records it).
	LeftRunning string `json:"left_running,omitempty"`
	// noGPU: its class asks for GPUs and none could be given it here.
	noGPU bool
}

// SweepPoint is one concurrency level of the sweep.
type SweepPoint struct {
	Concurrency int     `json:"concurrency"`
	Shards      int     `json:"shards"`
	Seconds     float64 `json:"seconds"`
	Throughput  float64 `json:"items_per_sec"`
}

// ProfileReport is profile.json.
type ProfileReport struct {
	Run       string               `json:"run"`
	Time      time.Time            `json:"time"`
	Samples   []Sample             `json:"samples"`
	Sustained *Sustained           `json:"sustained,omitempty"`
	Overhead  *Overhead            `json:"profiler_overhead,omitempty"`
	Sweep     []SweepPoint         `json:"sweep,omitempty"`
	Knee      int                  `json:"knee,omitempty"`
	SweepStop string               `json:"sweep_stop,omitempty"`
	Classes   map[string]plan.Peak `json:"classes"`
	// Job is plan.JobFingerprint of the spec measured: plans use these
	// peaks only for the same job.
	Job string `json:"job_fingerprint"`
	// Spec is the spec file measured; absent from older files.
	Spec   string `json:"spec,omitempty"`
	Limits string `json:"limits"`
	Error  string `json:"error,omitempty"`
	// Notes say what the samples cannot tell, such as a class whose
	// shards all have one cost (its "largest" is then no extreme).
	Notes []string `json:"notes,omitempty"`
}

// Sustained is several shards in a row after a warm-up.
type Sustained struct {
	Shards   int     `json:"shards"`
	P50      float64 `json:"p50_seconds"`
	P95      float64 `json:"p95_seconds"`
	Overhead float64 `json:"overhead_between_shards_seconds"`
}

// Overhead compares the median shard with and without sampling.
type Overhead struct {
	With    float64 `json:"with_sampling_seconds"`
	Without float64 `json:"without_sampling_seconds"`
	Diff    float64 `json:"difference_seconds"`
}

// Profile measures the command on the smallest, a typical (median) and the
// largest shard of each class, the malformed inputs the spec names, a
// sustained sample, and optionally a concurrency sweep. It runs the command
// exactly as a worker would (environment, thread variables, per-shard
// cgroup where the host allows). A sample that fails or leaves invalid
// output stops the profile with that reason: nothing scales after a failed
// correctness check.
func Profile(ctx context.Context, cfg ProfileConfig) (*ProfileReport, error) {
	if cfg.SweepGain <= 0 {
		cfg.SweepGain = 0.1
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Probe == nil {
		p, err := probe.New(probe.Config{})
		if err != nil {
			return nil, err
		}
		cfg.Probe = p
	}
	w := &Worker{cfg: Config{Grace: 5 * time.Second, ProcRoot: "/proc", Probe: cfg.Probe, Binary: selfPath(), HostLedger: cmp.Or(cfg.HostLedger, DefaultLedgerDir())},
		log: cfg.Logger, env: environ(), live: map[int]liveShard{}, gpuRes: map[string]string{}}
	for _, c := range cfg.Spec.Classes {
		if c.GPUs > 0 {
			if w.ledgerErr = w.openProfileLedger(); w.ledgerErr == nil {
				defer w.ledger.close()
			}
			break
		}
	}
	w.cgroups = detectCgroups("/")
	w.limits = w.cgroups.describe()
	w.enforce = w.cgroups.mode != ""
	defer w.cgroups.close()
	if cfg.AdoptOrphans {
		w.adopter, _ = adopt()
	}
	spec, man := cfg.Spec, cfg.Manifest
	rep := &ProfileReport{Run: spec.Name, Time: time.Now().UTC(), Classes: map[string]plan.Peak{}, Job: plan.JobFingerprint(spec), Spec: spec.SpecPath, Limits: w.limits}
	if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return rep, err
	}
	fail := func(s Sample, why string) (*ProfileReport, error) {
		rep.Samples = append(rep.Samples, s)
		rep.Error = why
		return rep, fmt.Errorf("%w: %s", ErrProfile, why)
	}
	byClass := map[string][]stream.Shard{}
	for _, sh := range man.Shards {
		byClass[sh.Class] = append(byClass[sh.Class], sh)
	}
	var median stream.Shard
	for _, class := range slices.Sorted(maps.Keys(byClass)) {
		shards := append([]stream.Shard(nil), byClass[class]...)
		sort.SliceStable(shards, func(i, j int) bool { return shards[i].Cost < shards[j].Cost })
		picks := []struct {
			kind string
			sh   stream.Shard
		}{{"smallest", shards[0]}, {"median", shards[len(shards)/2]}, {"largest", shards[len(shards)-1]}}
		if class == stream.DefaultClass || median.ID == "" {
			median = shards[len(shards)/2]
		}
		if len(shards) > len(picks) && shards[0].Cost == shards[len(shards)-1].Cost {
			// Sorted by one cost, the picks are the manifest's first,
			// middle and last lines: the measured peak may be below
			// the largest shard's, and admission would go by it.
			rep.Notes = append(rep.Notes, fmt.Sprintf("class %s: its %d shards have one cost (%d%s), so its smallest, median and largest samples are the manifest's first, middle and last lines, not its extremes, and its measured peak may be below what its largest shard needs: where shards differ in the work they do, give each manifest line a \"cost\" (its relative size) and profile again",
				class, len(shards), shards[0].Cost, costKind(shards[0].Cost)))
		}
		seen := map[string]bool{}
		// CPU stays the declared allocation (the thread variables follow it;
		// using more time-slices rather than fails); memory is measured. An
		// outlier's peak belongs to the outlier class plan.SplitOutliers
		// makes, not to the normal shards'.
		costs := make([]int64, len(shards))
		for i, sh := range shards {
			costs[i] = sh.Cost
		}
		outlier := map[string]bool{}
		for _, i := range plan.Outliers(costs, plan.OutlierFactor) {
			outlier[shards[i].ID] = true
		}
		peak := plan.Declared(spec.Classes[class])
		peak.Memory, peak.Source = 0, "measured (profile.json)"
		for _, p := range picks {
			if seen[p.sh.ID] {
				continue
			}
			seen[p.sh.ID] = true
			s := w.sample(ctx, cfg, p.kind, p.sh, true)
			if s.Outcome != stream.OutcomeOK {
				then := "fix it before scaling"
				if s.noGPU {
					then = "profile class " + class + " on a host with a GPU it can have (until then, plan and admission take its declared memory and vram)"
				}
				return fail(s, fmt.Sprintf("%s shard %s (line %d) failed: %s; %s", p.kind, p.sh.ID, p.sh.Line, s.Reason, then))
			}
			rep.Samples = append(rep.Samples, s)
			if outlier[p.sh.ID] {
				op := plan.Declared(spec.Classes[class])
				op.Memory, op.Source = s.PeakMemory, "measured (profile.json, largest shard)"
				op = withMeasuredVRAM(op, s)
				rep.Classes[class+plan.OutlierSuffix] = op
				continue
			}
			peak.Memory = max(peak.Memory, s.PeakMemory)
			peak = withMeasuredVRAM(peak, s)
		}
		rep.Classes[class] = peak
	}
	for i, bad := range spec.Profile.Malformed {
		sh := stream.Shard{ID: fmt.Sprintf("malformed-%d", i), Inputs: []string{bad}, Class: stream.DefaultClass}
		s := w.sample(ctx, cfg, "malformed", sh, true)
		switch s.Outcome {
		case stream.OutcomeOK:
			return fail(s, fmt.Sprintf("malformed input %s was accepted (exit 0): the command must reject bad input", bad))
		case stream.OutcomeTimeout:
			return fail(s, fmt.Sprintf("malformed input %s hung until the time limit: the command must fail cleanly", bad))
		}
		rep.Samples = append(rep.Samples, s)
	}
	// Sustained: a warm-up, then shards in a row.
	n := min(spec.Profile.Sustained, len(man.Shards))
	var durs []float64
	var gaps float64
	last := time.Time{}
	for i := range n + 1 {
		sh := man.Shards[i%len(man.Shards)]
		start := time.Now()
		if !last.IsZero() {
			gaps += start.Sub(last).Seconds()
		}
		s := w.sample(ctx, cfg, "sustained", sh, false)
		last = time.Now()
		if s.Outcome != stream.OutcomeOK {
			return fail(s, fmt.Sprintf("sustained sample %s failed: %s", sh.ID, s.Reason))
		}
		if i > 0 {
			durs = append(durs, s.Seconds)
		}
	}
	if len(durs) > 0 {
		sort.Float64s(durs)
		rep.Sustained = &Sustained{Shards: len(durs), P50: stream.NearestRank(durs, 0.5), P95: stream.NearestRank(durs, 0.95), Overhead: gaps / float64(n)}
	}
	// Profiler overhead: the median shard without sampling.
	with := w.sample(ctx, cfg, "median-sampled", median, true)
	without := w.sample(ctx, cfg, "median-unsampled", median, false)
	rep.Overhead = &Overhead{With: with.Seconds, Without: without.Seconds, Diff: with.Seconds - without.Seconds}
	if cfg.Sweep {
		w.sweep(ctx, cfg, rep)
	}
	return rep, nil
}

// costKind says where a cost of a class's shards came from, for its note.
func costKind(cost int64) string {
	if cost == 0 {
		return ": no input bytes and no \"cost\" in the manifest"
	}
	return ""
}

// sample runs one shard's command; with measure, its process tree's peak
// memory is sampled (a cgroup's peak where one can be made, else polling).
func (w *Worker) sample(ctx context.Context, cfg ProfileConfig, kind string, sh stream.Shard, measure bool) Sample {
	spec := cfg.Spec
	cls := spec.Classes[sh.Class]
	s := Sample{Kind: kind, ID: sh.ID, Class: sh.Class, Cost: sh.Cost}
	base, err := os.MkdirTemp(cfg.Scratch, "sample-")
	if err != nil {
		s.Outcome, s.Reason = stream.OutcomeStart, err.Error()
		return s
	}
	defer os.RemoveAll(base)
	v := stream.Vars{ID: sh.ID, Inputs: sh.Inputs, Out: filepath.Join(base, "out"), Scratch: filepath.Join(base, "tmp"), Ckpt: filepath.Join(base, "ckpt"), Attempt: 1}
	for _, d := range []string{v.Out, v.Scratch, v.Ckpt} {
		os.MkdirAll(d, 0o755)
	}
	argv, err := stream.Expand(spec.Command, v)
	if err != nil {
		s.Outcome, s.Reason = stream.OutcomeStart, err.Error()
		return s
	}
	env, err := childEnv(w.cfg.Binary, w.env, spec, cls, &stream.ShardMsg{Run: spec.Name, ID: sh.ID, Params: sh.Params}, v)
	if err != nil {
		s.Outcome, s.Reason = stream.OutcomeStart, err.Error()
		return s
	}
	if cls.GPUs > 0 {
		// As a worker places a shard: devices that are healthy, free of
		// other jobs' processes and with the class's VRAM free, named in
		// CUDA_VISIBLE_DEVICES. Without it the command saw every GPU of
		// the host and took the first, busy or not; on a host with none
		// it ran without one, where a job may fall back to its CPU and
		// the figures would not be a GPU run's.
		uuids, err := w.sampleGPUs(ctx, cfg.Probe, base, cls)
		if err != nil {
			s.Outcome, s.Reason, s.noGPU = stream.OutcomeStart, err.Error(), true
			return s
		}
		defer w.releaseGPUs(base)
		env = append(env, "CUDA_VISIBLE_DEVICES="+uuids)
	}
	s.Log = filepath.Join(cfg.LogDir, fmt.Sprintf("%s-%s.log", kind, sh.ID))
	var cg *shardCgroup
	var onStart func(int) func()
	var peak int64
	var mu sync.Mutex
	var gm *gpuMeter
	if measure {
		gm = &gpuMeter{w: w}
	}
	if measure {
		if w.enforce {
			if c, err := w.cgroups.newShard("profile-"+sh.ID, 0, 0); err == nil {
				cg = c
				defer w.cgroups.release(cg)
				s.PeakSource = "the peak of the shard's own cgroup (" + w.cgroups.mode + ")"
			}
		}
		if cg == nil {
			s.PeakSource = "polling the process group's RSS in /proc every 20 ms (short peaks can be missed)"
			onStart = func(pgid int) func() {
				stopGPU := gm.start(ctx, pgid)
				stop := make(chan struct{})
				done := make(chan struct{})
				go func() {
					defer close(done)
					t := time.NewTicker(20 * time.Millisecond)
					defer t.Stop()
					for {
						r := groupRSS("/proc", map[int]liveShard{pgid: {}})[pgid]
						mu.Lock()
						peak = max(peak, r)
						mu.Unlock()
						select {
						case <-stop:
							return
						case <-t.C:
						}
					}
				}()
				return func() { close(stop); <-done; stopGPU() }
			}
		} else {
			onStart = func(pgid int) func() { return gm.start(ctx, pgid) }
		}
	}
	timeout := spec.TimeoutFor(sh.Class)
	if timeout == 0 {
		timeout = 10 * time.Minute
	}
	// A profile's sample log replaces the previous profile's.
	_ = os.Remove(s.Log)
	logPath := s.Log
	res := w.execute(argv, env, spec.Dir, logPath, timeout, nil, nil, nil, onStart, cg, nil)
	if !res.logged {
		s.Log = "" // the sample printed nothing
	}
	s.Seconds, s.CPUSeconds, s.ReadBytes, s.WriteBytes = res.duration.Seconds(), res.cpuSeconds, res.readBytes, res.writeBytes
	s.Outcome, s.Reason, s.LeftRunning = res.outcome, res.reason, res.left
	if cg != nil {
		peak = cg.peak()
	}
	mu.Lock()
	s.PeakMemory = max(peak, res.peakRSS)
	mu.Unlock()
	if gm != nil && res.outcome != stream.OutcomeStart {
		// A command that never started held no VRAM to measure: a zero
		// there put GPU columns in a CPU job's table.
		s.PeakVRAM, s.GPUDuty = gm.result()
		s.PeakVRAMDevice = gm.devicePeak()
	}
	if s.Seconds > 0 {
		s.ItemsPerSec = float64(sh.Cost) / s.Seconds
		s.CPUDuty = s.CPUSeconds / s.Seconds / float64(max(cls.CPUs, 1))
	}
	s.OutputBytes, s.ScratchBytes = dirBytes(v.Out), dirBytes(v.Scratch)
	if s.Outcome == stream.OutcomeOK {
		// Judged as a run judges it before committing (not measured).
		if why := w.invalidOutput(spec, v, env, logPath, timeout, nil, nil, nil); why != "" {
			s.Outcome, s.Reason = stream.OutcomeInvalid, why
		}
	}
	if s.Outcome == stream.OutcomeOK {
		// The output must be committable: no symlinks, devices or reserved names.
		if p, err := checkpoint.Prepare(ctx, filepath.Join(base, "check"), v.Out, checkpoint.Options{}); err != nil {
			s.Outcome, s.Reason = stream.OutcomeInvalid, err.Error()
		} else {
			p.Discard()
		}
	}
	return s
}

// ProfileShare is the budget a profile's record in the host ledger
// names (HostWorker.Share): no worker's. Its devices count for every
// worker of the host (a device is the host's), but the record is not a
// worker sharing their budget, whose processes their CPU meters would
// count as shardpool's with nothing held for them.
const ProfileShare = "profile"

// openProfileLedger writes the profile's record in the host ledger, where
// its samples' devices are held while they run. An error is kept for the
// GPU samples to report: a profile of a CPU class needs no ledger.
func (w *Worker) openProfileLedger() error {
	l, err := openLedger(w.cfg.HostLedger, "/proc", ownRecord("shardpool profile"))
	if err != nil {
		return err
	}
	l.me.Share = ProfileShare
	w.ledger = l
	return nil
}

// sampleGPUs reserves the GPUs of class cls for the sample with scratch
// base (its key: the sweep runs one shard more than once at a time) and
// returns their UUIDs, or why none can be given here. Devices the host's
// workers hold for their shards (the host ledger) are not given: a shard
// that has not yet allocated shows no process on its device, and a
// sample placed there shared it. The sample's devices are written to
// the profile's own record in the same step, so that the workers leave
// them alone before its process allocates (releaseGPUs gives them back).
func (w *Worker) sampleGPUs(ctx context.Context, pr *probe.Prober, base string, cls stream.Class) (string, error) {
	devs, err := pr.GPUDevices(ctx)
	if err != nil {
		return "", fmt.Errorf("its class asks for %d GPU(s), and this host has none to give: %v", cls.GPUs, err)
	}
	if w.ledger == nil {
		return "", fmt.Errorf("its class asks for %d GPU(s), and which of them this host's workers hold is unknown: %v", cls.GPUs, w.ledgerErr)
	}
	o, err := w.ledger.begin(ProfileShare)
	if err != nil {
		return "", fmt.Errorf("its class asks for %d GPU(s), and which of them this host's workers hold is unknown: %v", cls.GPUs, err)
	}
	vramEach := cls.VRAM / int64(cls.GPUs)
	snap := &probe.Snapshot{GPUs: probe.GPUs{Devices: devs}}
	uuids, err := w.pickGPUs(snap, base, cls.GPUs, vramEach, w.visibleGPUs(), o.HostGPUs)
	if cerr := w.ledger.recommit(w.holding("", 0, plan.Peak{}, 0)); cerr != nil && err == nil {
		w.releaseGPUs(base)
		return "", fmt.Errorf("its class asks for %d GPU(s), and the host ledger could not say which this sample holds: %v", cls.GPUs, cerr)
	}
	if err == nil {
		return uuids, nil
	}
	free, _ := w.gpuView(snap, vramEach)
	free, _ = withoutGPUs(free, 0, o.HostGPUs)
	return "", fmt.Errorf("its class asks for %s, and %d of this host's %d can be given: %s",
		gpuNeed(cls.GPUs, vramEach), len(free), len(devs), w.gpusTaken(devs, free, vramEach, "another sample", o.HostGPUs))
}

func dirBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

// sweep raises concurrency in powers of two while throughput improves by
// more than the threshold, up to the slots the budget allows for the
// measured peak.
func (w *Worker) sweep(ctx context.Context, cfg ProfileConfig, rep *ProfileReport) {
	spec, man := cfg.Spec, cfg.Manifest
	ceiling := len(man.Shards)
	if snap, err := cfg.Probe.Snapshot(ctx, nil); err == nil {
		for c, peak := range rep.Classes {
			sl := plan.Compute(plan.FromProbe(snap.Budget), plan.Peak{}, peak, spec.Classes[c].GPUs > 0)
			ceiling = min(ceiling, max(sl.N, 1))
		}
	}
	best := 0.0
	for k := 1; k <= ceiling; k *= 2 {
		shards := make([]stream.Shard, 2*k)
		var cost int64
		for i := range shards {
			shards[i] = man.Shards[i%len(man.Shards)]
			cost += max(shards[i].Cost, 1)
		}
		start := time.Now()
		sem := make(chan struct{}, k)
		var wg sync.WaitGroup
		for _, sh := range shards {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				w.sample(ctx, cfg, fmt.Sprintf("sweep-%d", k), sh, false)
			}()
		}
		wg.Wait()
		secs := time.Since(start).Seconds()
		pt := SweepPoint{Concurrency: k, Shards: len(shards), Seconds: secs, Throughput: float64(cost) / secs}
		rep.Sweep = append(rep.Sweep, pt)
		if pt.Throughput <= best*(1+cfg.SweepGain) {
			rep.SweepStop = fmt.Sprintf("throughput at %d (%.0f/s) is not %.0f%% better than at %d: the knee", k, pt.Throughput, 100*cfg.SweepGain, rep.Knee)
			return
		}
		best, rep.Knee = pt.Throughput, k
	}
	rep.SweepStop = fmt.Sprintf("reached the budget's ceiling of %d slot(s)", ceiling)
}

// withMeasuredVRAM raises a GPU class's VRAM, a shard's over all its GPUs
// as the spec's vram is (admission divides it among them), to what the
// sample was seen to need, where that is above the declared vram:
// admission must not place the shard on devices with less free memory
// than it was seen to use. What it needs is its peak summed over its
// GPUs, or the most it held on one device times its GPUs where that is
// more: admission gives each device an even share, and a shard that
// holds more on one device than on the others (a pipeline's first
// stage, say) needs its largest share on every device it may be given
// (until the fifty-sixth session the sum alone was taken: 30 GiB on one
// device and 10 on the other asked for devices with 20 GiB free). A
// declared vram above it stays, as the reservation the job may grow
// into. (Until the fifty-fourth session it compared the peak divided by
// the GPUs with the whole vram: a class of 2 GPUs declaring 16 GiB and
// seen to use 24 kept its 16, and admission looked for 8 GiB free on
// each device.)
func withMeasuredVRAM(p plan.Peak, s Sample) plan.Peak {
	v, err := strconv.ParseInt(s.PeakVRAM, 10, 64)
	if p.GPUs <= 0 || err != nil {
		return p
	}
	uneven := s.PeakVRAMDevice*p.GPUs > v
	v = max(v, s.PeakVRAMDevice*p.GPUs)
	if v > p.VRAM {
		p.VRAM = v
		if !strings.Contains(p.Source, "vram") {
			p.Source += "; vram measured above the declared"
			if uneven {
				p.Source += " (the most on one device times its GPUs)"
			}
		}
	}
	return p
}
