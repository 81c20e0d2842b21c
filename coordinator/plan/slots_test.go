package plan

import (
	"strings"
	"testing"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

func TestCompute(t *testing.T) {
	gib := int64(1 << 30)
	full := Budget{"cpu": probe.Known(16000, "cgroup"), "memory": probe.Known(64*gib, "cgroup"), "gpus": probe.Known(4, "nvml"), "vram": probe.Known(320*gib, "nvml")}
	cases := []struct {
		name    string
		b       Budget
		shared  Peak
		peak    Peak
		gpu     bool
		want    int
		binding string
		reason  string
	}{
		{"memory binds", full, Peak{}, Peak{CPU: 1000, Memory: 10 * gib}, false, 6, "memory", "memory binds"},
		{"cpu binds", full, Peak{}, Peak{CPU: 4000, Memory: gib}, false, 4, "cpu", "cpu binds: (16.00 CPUs - 0.00 CPUs shared) / 4.00 CPUs peak = 4"},
		{"shared use counts", full, Peak{Memory: 34 * gib}, Peak{CPU: 1000, Memory: 10 * gib}, false, 3, "memory", "memory binds: (64.0GiB - 34.0GiB shared) / 10.0GiB peak = 3"},
		{"gpus bind", full, Peak{}, Peak{CPU: 1000, Memory: gib, GPUs: 1, VRAM: 40 * gib}, true, 4, "gpus", "gpus binds"},
		{"vram binds", full, Peak{}, Peak{CPU: 1000, Memory: gib, GPUs: 1, VRAM: 100 * gib}, true, 3, "vram", "vram binds"},
		{"gpu budget ignored for a cpu class", Budget{"cpu": probe.Known(2000, ""), "memory": probe.Known(8*gib, ""), "gpus": probe.Unknown("nvml", "lost GPU")}, Peak{}, Peak{CPU: 1000, Memory: gib}, false, 2, "cpu", ""},
		{"unknown memory admits nothing", Budget{"cpu": probe.Known(16000, ""), "memory": probe.Unknown("cgroup", "memory.max unreadable")}, Peak{}, Peak{CPU: 1000, Memory: gib}, false, 0, "", "memory budget unknown (memory.max unreadable)"},
		{"unknown gpus admit nothing for a gpu class", Budget{"cpu": probe.Known(16000, ""), "memory": probe.Known(64*gib, ""), "gpus": probe.Unknown("nvml", "library missing"), "vram": probe.Unknown("nvml", "library missing")}, Peak{}, Peak{CPU: 1000, Memory: gib, GPUs: 1}, true, 0, "", "gpus budget unknown"},
		{"no peak is not a guess", full, Peak{}, Peak{CPU: 1000}, false, 0, "", "no measured or declared memory peak"},
		{"unlimited memory, cpu binds", Budget{"cpu": probe.Known(3000, ""), "memory": probe.Unlimited("")}, Peak{}, Peak{CPU: 1000, Memory: gib}, false, 3, "cpu", ""},
		{"over-committed budget gives 0, not negative", full, Peak{Memory: 70 * gib}, Peak{CPU: 1000, Memory: gib}, false, 0, "memory", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Compute(c.b, c.shared, c.peak, c.gpu)
			if got.N != c.want || (c.binding != "" && got.Binding != c.binding) || !strings.Contains(got.Reason, c.reason) {
				t.Fatalf("got %d bound by %q (%s), want %d by %q with %q", got.N, got.Binding, got.Reason, c.want, c.binding, c.reason)
			}
		})
	}
}

func TestUnmeasuredRunsOneAtATime(t *testing.T) {
	gib := int64(1 << 30)
	full := Budget{"cpu": probe.Known(16000, "cgroup"), "memory": probe.Known(64*gib, "cgroup")}
	s, one := Unmeasured(Compute(full, Peak{}, Peak{CPU: 1000}, false), Peak{CPU: 1000})
	if !one || s.N != 1 || !strings.HasPrefix(s.Reason, "one shard at a time: no measured or declared memory peak") {
		t.Fatalf("no memory peak, budget known: got %v %d %q, want one at a time", one, s.N, s.Reason)
	}
	unknown := Budget{"cpu": probe.Known(16000, ""), "memory": probe.Unknown("cgroup", "memory.max unreadable")}
	if s, one := Unmeasured(Compute(unknown, Peak{}, Peak{CPU: 1000}, false), Peak{CPU: 1000}); one || s.N != 0 {
		t.Fatalf("unknown budget: got %v %d, want nothing admitted", one, s.N)
	}
	if s, one := Unmeasured(Compute(full, Peak{}, Peak{CPU: 1000, Memory: gib}, false), Peak{CPU: 1000, Memory: gib}); one || s.N != 16 {
		t.Fatalf("declared peak: got %v %d, want the formula's 16", one, s.N)
	}
	// A GPU class on a host with no GPU: one at a time would still not
	// fit, and the plan said "one shard at a time" (1 slot) beside its
	// BLOCKED line; a worker there took a slot for it.
	noGPU := Budget{"cpu": probe.Known(16000, ""), "memory": probe.Known(64*gib, ""), "gpus": probe.Known(0, "nvml"), "vram": probe.Known(0, "nvml")}
	gpuPeak := Peak{CPU: 1000, GPUs: 1, VRAM: 10 * gib}
	if s, one := Unmeasured(Compute(noGPU, Peak{}, gpuPeak, true), gpuPeak); one || s.N != 0 ||
		!strings.Contains(s.Reason, "no measured or declared memory peak") || !strings.Contains(s.Reason, "gpus: (0 GPU(s) - 0 GPU(s) shared) / 1 GPU(s) peak = 0") {
		t.Fatalf("GPU class, no GPU, no memory peak: got %v %d %q, want nothing admitted, saying both", one, s.N, s.Reason)
	}
}

func TestFitsAndOutliers(t *testing.T) {
	b := Budget{"cpu": probe.Known(4000, "host"), "memory": probe.Known(8<<30, "cgroup")}
	if ok, why := Fits(b, Peak{CPU: 1000, Memory: 16 << 30}, false); ok || !strings.Contains(why, "needs 16.0GiB of memory, the budget is 8.0GiB") {
		t.Fatalf("16GiB shard on an 8GiB budget: fits %v (%s)", ok, why)
	}
	if ok, _ := Fits(b, Peak{CPU: 4000, Memory: 8 << 30}, false); !ok {
		t.Fatal("a shard exactly the size of the budget must fit")
	}
	got := Outliers([]int64{10, 12, 9, 11, 500, 10, 13}, 4)
	if len(got) != 1 || got[0] != 4 {
		t.Fatalf("outliers: got %v, want [4]", got)
	}
}

func TestSplitOutliersMovesThemToTheirOwnClass(t *testing.T) {
	spec := &stream.Spec{Classes: map[string]stream.Class{"cpu": {CPUs: 1, Memory: 1 << 30}}}
	man := &stream.Manifest{}
	for i, c := range []int64{10, 12, 9, 11, 5000, 10, 13} {
		man.Shards = append(man.Shards, stream.Shard{ID: string(rune('a' + i)), Class: "cpu", Cost: c})
	}
	made := SplitOutliers(spec, man)
	if len(made) != 1 || made[0] != "cpu-outlier" {
		t.Fatalf("made %v, want [cpu-outlier]", made)
	}
	if man.Shards[4].Class != "cpu-outlier" || man.Shards[0].Class != "cpu" {
		t.Fatalf("classes: %s and %s, want the 5000-cost shard alone in cpu-outlier", man.Shards[4].Class, man.Shards[0].Class)
	}
	if spec.Classes["cpu-outlier"] != spec.Classes["cpu"] {
		t.Fatalf("outlier class request %+v, want the parent's %+v", spec.Classes["cpu-outlier"], spec.Classes["cpu"])
	}
	// Deterministic: a second split changes nothing.
	if again := SplitOutliers(spec, man); len(again) != 0 {
		t.Fatalf("second split made %v", again)
	}
}

func TestFleetBlocked(t *testing.T) {
	spec := &stream.Spec{Classes: map[string]stream.Class{"cpu": {CPUs: 1, Memory: 8 << 30}}}
	man := &stream.Manifest{Shards: []stream.Shard{{ID: "a", Class: "cpu"}}}
	peaks := map[string]Peak{"cpu": Declared(spec.Classes["cpu"])}
	small := Worker{Name: "small", Hard: Budget{"cpu": probe.Known(4000, ""), "memory": probe.Known(4<<30, "MemTotal")}}
	big := Worker{Name: "big", Hard: Budget{"cpu": probe.Known(4000, ""), "memory": probe.Known(64<<30, "MemTotal")}}
	if why := FleetBlocked(spec, man, peaks, nil); why != "" {
		t.Fatalf("no live workers: got %q, want no verdict (a worker may join)", why)
	}
	if why := FleetBlocked(spec, man, peaks, []Worker{small}); !strings.Contains(why, "small: needs") {
		t.Fatalf("only a small worker: got %q, want blocked naming it", why)
	}
	if why := FleetBlocked(spec, man, peaks, []Worker{small, big}); why != "" {
		t.Fatalf("a big worker is live: got %q, want no block", why)
	}

	// Declared scratch: judged against the size of each worker's scratch
	// file system, where it reports one; the worker must fit both.
	spec.Classes["cpu"] = stream.Class{CPUs: 1, Memory: 8 << 30, Scratch: 100 << 30}
	peaks["cpu"] = Declared(spec.Classes["cpu"])
	big.Hard["scratch"] = probe.Known(50<<30, "statfs /scratch")
	roomy := Worker{Name: "roomy", Hard: Budget{"cpu": probe.Known(4000, ""), "memory": probe.Known(4<<30, "MemTotal"), "scratch": probe.Known(1<<40, "statfs /big")}}
	if why := FleetBlocked(spec, man, peaks, []Worker{small, big, roomy}); !strings.Contains(why, "big: declares 100.0GiB of scratch, more than the whole file system of its scratch directory holds (50.0GiB, statfs /scratch)") ||
		!strings.Contains(why, "roomy: needs 8.0GiB of memory") {
		t.Fatalf("no worker with both the memory and the scratch: got %q, want blocked, naming what each lacks", why)
	}
	unreported := Worker{Name: "older", Hard: Budget{"memory": probe.Known(64<<30, "MemTotal")}}
	unknown := Worker{Name: "unknown", Hard: Budget{"memory": probe.Known(64<<30, "MemTotal"), "scratch": probe.Unknown("statfs /s", "permission denied")}}
	for _, w := range []Worker{unreported, unknown} {
		if why := FleetBlocked(spec, man, peaks, []Worker{w}); why != "" {
			t.Fatalf("worker %s, its scratch size not known: got %q, want no block", w.Name, why)
		}
	}
	big.Hard["scratch"] = probe.Known(200<<30, "statfs /scratch")
	if why := FleetBlocked(spec, man, peaks, []Worker{small, big}); why != "" {
		t.Fatalf("a big worker with room for the scratch: got %q, want no block", why)
	}
}

// TestEnforcedLimitsNameClassesWithoutDeclaredMemory: on a host that
// enforces per-shard limits, a class whose memory is only measured gets
// no hard limit, and the plan says so instead of "enforced" alone.
func TestEnforcedLimitsNameClassesWithoutDeclaredMemory(t *testing.T) {
	spec := &stream.Spec{Name: "r", Classes: map[string]stream.Class{"cpu": {CPUs: 1}, "big": {CPUs: 1, Memory: 4 << 30}}}
	man := &stream.Manifest{Shards: []stream.Shard{{ID: "a", Class: "cpu"}, {ID: "b", Class: "big"}}}
	b := Budget{"cpu": probe.Known(4000, "test"), "memory": probe.Known(16<<30, "test")}
	for _, tc := range []struct{ limits, want, not string }{
		{"enforced: a cgroup per shard", "not for class cpu, which declares no memory", "class big"},
		{"watched: no cgroup here", "watched: no cgroup here", "not for class"},
	} {
		p := Make(spec, man, "h", b, b, nil, tc.limits)
		if !strings.Contains(p.Enforced, tc.want) || strings.Contains(p.Enforced, tc.not) {
			t.Errorf("limits %q: got %q, want it to contain %q and not %q", tc.limits, p.Enforced, tc.want, tc.not)
		}
	}
}

// TestProfileOfAnotherJobIsNotUsed: a plan uses profile.json's measured
// peaks only for the job it measured (JobFingerprint, which a manifest
// and the outlier split leave as it is); for an edited job, or a profile
// that does not say, the declared peak stands and the plan says why.
func TestProfileOfAnotherJobIsNotUsed(t *testing.T) {
	gib := int64(1 << 30)
	spec := &stream.Spec{SpecPath: "/job/shardpool.toml", Command: []string{"./job.sh"}, Files: map[string]string{"./job.sh": "0123"},
		Classes: map[string]stream.Class{"cpu": {CPUs: 1, Memory: gib}}}
	man := &stream.Manifest{}
	for i, c := range []int64{10, 12, 9, 11, 5000, 10, 13} {
		man.Shards = append(man.Shards, stream.Shard{ID: string(rune('a' + i)), Class: "cpu", Cost: c})
	}
	measured := &Profile{Job: JobFingerprint(spec), Classes: map[string]Peak{"cpu": {CPU: 1000, Memory: 100 << 20}}}
	SplitOutliers(spec, man)
	if JobFingerprint(spec) != measured.Job {
		t.Fatalf("the outlier split changed the job fingerprint")
	}
	b := Budget{"cpu": probe.Known(8000, ""), "memory": probe.Known(8*gib, ""), "gpus": probe.Known(0, ""), "vram": probe.Known(0, "")}
	memoryOf := func(p *Plan) int64 {
		for _, c := range p.Classes {
			if c.Class == "cpu" {
				return c.Peak.Memory
			}
		}
		return -1
	}
	if p := Make(spec, man, "h", b, b, measured, "watched"); memoryOf(p) != 100<<20 || p.ProfileUnused != "" {
		t.Fatalf("same job: peak %d, unused %q; want the measured 100 MiB", memoryOf(p), p.ProfileUnused)
	}
	edited := *spec
	edited.Files = map[string]string{"./job.sh": "4567"}
	if p := Make(&edited, man, "h", b, b, measured, "watched"); memoryOf(p) != gib || !strings.Contains(p.ProfileUnused, "another version of this job") {
		t.Fatalf("edited job: peak %d, unused %q; want the declared 1 GiB and why", memoryOf(p), p.ProfileUnused)
	}
	// Profiles are kept per run name: one written by another project's
	// job of that name says whose it is.
	other := &Profile{Job: "0000", Spec: "/other/shardpool.toml", Classes: measured.Classes}
	if p := Make(spec, man, "h", b, b, other, "watched"); memoryOf(p) != gib || !strings.Contains(p.ProfileUnused, "it measured the job of another spec, /other/shardpool.toml") {
		t.Fatalf("another spec's profile: peak %d, unused %q; want the declared 1 GiB and whose it is", memoryOf(p), p.ProfileUnused)
	}
	old := &Profile{Classes: measured.Classes}
	if p := Make(spec, man, "h", b, b, old, "watched"); memoryOf(p) != gib || !strings.Contains(p.ProfileUnused, "does not say which version") {
		t.Fatalf("profile without a job fingerprint: peak %d, unused %q; want the declared 1 GiB and why", memoryOf(p), p.ProfileUnused)
	}
}

// TestWellAbove: a measured peak counts as well above a reserved one by
// a quarter and 16 MiB at least; nothing is above an unknown peak.
func TestWellAbove(t *testing.T) {
	const mib = int64(1) << 20
	for _, tc := range []struct {
		got, reserved int64
		want          bool
	}{
		{40 * mib, 4 * mib, true},
		{20 * mib, 4 * mib, true},       // exactly 16 MiB more
		{19 * mib, 4 * mib, false},      // a lot more, but under 16 MiB
		{1250 * mib, 1000 * mib, false}, // exactly a quarter more
		{1251 * mib, 1000 * mib, true},
		{100 * mib, 0, false},
	} {
		if got := WellAbove(tc.got, tc.reserved); got != tc.want {
			t.Errorf("WellAbove(%d MiB, %d MiB) = %v, want %v", tc.got/mib, tc.reserved/mib, got, tc.want)
		}
	}
}
