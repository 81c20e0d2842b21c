package worker

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/worker/probe"
)

// noDevices is a host without NVML.
type noDevices struct{}

var _ probe.GPUSource = noDevices{}

func (noDevices) Devices(context.Context) ([]probe.GPU, error) { return nil, probe.ErrNVMLMissing }

// autoWorkerOnFixture is a worker with measured admission on the fixture
// host probe/testdata/v2 (6 GiB of cgroup headroom, 4 CPUs), with no cap on
// its slots.
func autoWorkerOnFixture(t *testing.T) *Worker {
	t.Helper()
	root, _ := filepath.Abs("probe/testdata/v2")
	pr, err := probe.New(probe.Config{Root: root, GPUs: noDevices{}, PolicyPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	w := workerOnServer(t, Config{StateDir: t.TempDir(), Probe: pr, Auto: true})
	w.cfg.Slots = nil
	return w
}

// TestAdmissionViewIsSharedBriefly: decisions that admit share one look at
// the host for a moment, GPU classes and a forced look take their own, and
// shards that started after the look are charged their whole peak (the
// look's growth does not cover them), also one whose process group id
// repeats an ended shard's.
func TestAdmissionViewIsSharedBriefly(t *testing.T) {
	ctx := context.Background()
	w := autoWorkerOnFixture(t)
	w.viewFor = time.Minute // the cases below are about which looks are shared, not for how long
	const gib = int64(1) << 30
	onStart, _ := w.trackLive(liveShard{class: "cpu", peak: 2 * gib}, false)
	onStart(999_991) // running before the look; no such process, so it may grow by its whole peak

	v1, err := w.admissionView(ctx, false, false)
	if err != nil || !v1.fresh || v1.growth != 2*gib {
		t.Fatalf("first look: %+v (%v), want fresh with 2 GiB of growth", v1, err)
	}
	for _, tc := range []struct {
		name       string
		gpu, force bool
		fresh      bool
	}{{"shared", false, false, false}, {"gpu class", true, false, true}, {"forced", false, true, true}} {
		v, err := w.admissionView(ctx, tc.gpu, tc.force)
		if err != nil || v.fresh != tc.fresh {
			t.Fatalf("%s: fresh %v (%v), want %v", tc.name, v.fresh, err, tc.fresh)
		}
	}
	v, _ := w.admissionView(ctx, false, false) // the forced look, shared now
	if v.fresh || !v.at.After(v1.at) {
		t.Fatalf("after a forced look: fresh %v, at %v (first at %v); want the forced one shared", v.fresh, v.at, v1.at)
	}

	peak := plan.Peak{CPU: 1000, Memory: 2 * gib, Source: "declared"}
	onStart(999_992) // started after the look
	// 6 GiB - 2 GiB (the first shard's growth) - 2 GiB (the second's whole peak) leaves room for one.
	if k, detail, short, _ := w.decide(v, "cpu", 2, peak, false, others{}); k != 1 || !short {
		t.Fatalf("two running, one since the look: fetch %d (short %v), want 1 and short\n%s", k, short, detail)
	}
	// The first shard ends and a new one gets its process group id: it too
	// started after the look.
	w.liveEnd(999_991)
	onStart(999_991)
	if k, detail, _, _ := w.decide(v, "cpu", 2, peak, false, others{}); k != 0 {
		t.Fatalf("a reused process group id counted as the look's shard: fetch %d, want 0\n%s", k, detail)
	}
}

// TestOtherClassesInFlightAreCharged: a shard of another class that is in
// flight and not running yet (fetched, staging its inputs) will grow to its
// whole peak too, so it counts against this class's admission.
func TestOtherClassesInFlightAreCharged(t *testing.T) {
	ctx := context.Background()
	w := autoWorkerOnFixture(t)
	const gib = int64(1) << 30
	w.peaks = map[string]plan.Peak{"cpu": {CPU: 1000, Memory: gib}, "big": {CPU: 1000, Memory: 2 * gib}}
	v, err := w.admissionView(ctx, false, false)
	if err != nil {
		t.Fatal(err)
	}
	peak := w.peaks["cpu"]
	if k, detail, _, _ := w.decide(v, "cpu", 0, peak, false, others{}); k != 4 {
		t.Fatalf("nothing else in flight: fetch %d, want 4 (the CPU slots)\n%s", k, detail)
	}
	big := &gate{wake: make(chan struct{}, 1)}
	big.add(2) // two shards of class big fetched, not started
	w.gates["big"] = big
	// 6 GiB - 2 x 2 GiB leaves room for two 1 GiB shards.
	if k, detail, _, _ := w.decide(v, "cpu", 0, peak, false, others{}); k != 2 {
		t.Fatalf("two big shards in flight: fetch %d, want 2\n%s", k, detail)
	}
}

// TestYieldOnlyWhereItHelps: a worker lets a starved worker go first only
// when one more shard of its own class would leave that worker short of
// something the class takes, and never for what it does not take: CPU-only
// shards go on while a GPU shard waits for a device, unless the GPU shard
// also needs the CPUs they would take.
func TestYieldOnlyWhereItHelps(t *testing.T) {
	w := &Worker{gpuRes: map[string]string{}, gates: map[string]*gate{}}
	const gib = int64(1) << 30
	waiting := others{Starved: []starved{{who: "x (pid 1)", since: time.Now().Add(-time.Second).UnixNano(), need: room{cpu: 1000, memory: gib, gpus: 1}}}}
	capacity := room{cpu: 4000, memory: 12 * gib, gpus: 2}
	cpuOnly := plan.Peak{CPU: 1000, Memory: gib}
	gpuClass := plan.Peak{CPU: 1000, Memory: gib, GPUs: 1}
	for _, tc := range []struct {
		name  string
		o     others
		now   room
		peak  plan.Peak
		yield bool
	}{
		{"cpu-only shard, CPUs to spare, no GPU free", waiting, room{3000, 10 * gib, 0}, cpuOnly, false},
		{"cpu-only shard, CPUs tight, no GPU free", waiting, room{1000, 10 * gib, 0}, cpuOnly, false},
		{"cpu-only shard, CPUs tight, a GPU free", waiting, room{1000, 10 * gib, 1}, cpuOnly, true},
		{"cpu-only shard, CPUs to spare, a GPU free", waiting, room{3000, 10 * gib, 1}, cpuOnly, false},
		{"gpu shard, one GPU free", waiting, room{3000, 10 * gib, 1}, gpuClass, true},
		{"gpu shard, two GPUs free", waiting, room{3000, 10 * gib, 2}, gpuClass, false},
		{"needs more than the host", others{Starved: []starved{{who: "x", since: 1, need: room{cpu: 8000}}}}, room{0, 10 * gib, 0}, cpuOnly, false},
		{"waited less than this worker", others{Starved: []starved{{who: "x", since: time.Now().Add(time.Hour).UnixNano(), need: room{cpu: 1000}}}}, room{1000, 10 * gib, 0}, cpuOnly, false},
	} {
		if got := w.yieldTo(tc.o, tc.now, capacity, tc.peak) != ""; got != tc.yield {
			t.Errorf("%s: yield %v, want %v", tc.name, got, tc.yield)
		}
	}
}
