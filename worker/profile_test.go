package worker_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

func profileJob(t *testing.T, command []string, extra string) (*stream.Spec, *stream.Manifest) {
	t.Helper()
	path := testenv.WriteJob(t, testenv.Job{Shards: 5, Command: command, Extra: extra,
		Line: func(i int, in string) string {
			return fmt.Sprintf(`{"id":"p%d","inputs":[%q],"cost":%d,"params":{"mib":"%d"}}`, i, in, (i+1)*10, (i+1)*10)
		}})
	return testenv.LoadJob(t, path)
}

func runProfile(t *testing.T, spec *stream.Spec, man *stream.Manifest, sweep bool) (*worker.ProfileReport, error) {
	t.Helper()
	return worker.Profile(context.Background(), worker.ProfileConfig{Spec: spec, Manifest: man, Scratch: t.TempDir(), LogDir: t.TempDir(), Sweep: sweep})
}

// The largest shard allocates 50 MiB: the class's measured peak must see it.
func TestProfileMeasuresPeaksAndSweeps(t *testing.T) {
	spec, man := profileJob(t, []string{"sh", "-c", `head -c "${SHARDPOOL_PARAM_MIB}M" /dev/zero | tail -n 1 > /dev/null; echo ok > "$1/r"`, "sh", "{out}"}, "")
	rep, err := runProfile(t, spec, man, true)
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]worker.Sample{}
	for _, s := range rep.Samples {
		kinds[s.Kind] = s
	}
	if kinds["smallest"].ID != "p0" || kinds["median"].ID != "p2" || kinds["largest"].ID != "p4" {
		t.Fatalf("samples by cost: got %v/%v/%v, want p0/p2/p4", kinds["smallest"].ID, kinds["median"].ID, kinds["largest"].ID)
	}
	if p := rep.Classes["cpu"].Memory; p < 40<<20 {
		t.Fatalf("measured peak %d, want at least 40 MiB (the largest shard holds 50 MiB) via %s", p, kinds["largest"].PeakSource)
	}
	if kinds["largest"].OutputBytes != 3 || kinds["largest"].CPUSeconds <= 0 {
		t.Fatalf("largest sample: %+v", kinds["largest"])
	}
	if rep.Sustained == nil || rep.Sustained.Shards != 4 || rep.Overhead == nil {
		t.Fatalf("sustained %+v overhead %+v", rep.Sustained, rep.Overhead)
	}
	if len(rep.Sweep) == 0 || rep.Knee < 1 || rep.SweepStop == "" {
		t.Fatalf("sweep: %+v knee %d (%s)", rep.Sweep, rep.Knee, rep.SweepStop)
	}
	if rep.Job == "" || rep.Job != plan.JobFingerprint(spec) {
		t.Fatalf("profile's job fingerprint %q, want the spec's %q", rep.Job, plan.JobFingerprint(spec))
	}
	if len(rep.Notes) != 0 {
		t.Errorf("shards of five costs: notes %q, want none", rep.Notes)
	}
}

// TestProfileSaysWhenCostsCannotPickTheLargest: shards of one cost (a
// parameter sweep without inputs or costs) give profile no largest
// shard; it says so, with what to do, since the class's measured peak
// may then be far below the largest shard's and admission would go by
// it.
func TestProfileSaysWhenCostsCannotPickTheLargest(t *testing.T) {
	path := testenv.WriteJob(t, testenv.Job{Shards: 5, Command: []string{"sh", "-c", `echo ok > "$1/r"`, "sh", "{out}"},
		Line: func(i int, in string) string {
			return fmt.Sprintf(`{"id":"p%d","inputs":[],"params":{"n":"%d"}}`, i, i)
		}})
	spec, man := testenv.LoadJob(t, path)
	rep, err := runProfile(t, spec, man, false)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Notes) != 1 || !strings.Contains(rep.Notes[0], `class cpu: its 5 shards have one cost (0: no input bytes and no "cost" in the manifest)`) ||
		!strings.Contains(rep.Notes[0], `give each manifest line a "cost"`) {
		t.Errorf("notes %q, want one saying class cpu's shards have one cost and how to give them theirs", rep.Notes)
	}
}

func TestProfileStopsOnCorrectness(t *testing.T) {
	// The median shard fails: nothing after it runs.
	spec, man := profileJob(t, []string{"sh", "-c", `[ "$SHARDPOOL_SHARD_ID" != p2 ] || { echo broken >&2; exit 4; }`}, "")
	rep, err := runProfile(t, spec, man, true)
	if !errors.Is(err, worker.ErrProfile) || !strings.Contains(err.Error(), "median shard p2") || len(rep.Sweep) != 0 {
		t.Fatalf("failing sample: got %v (sweep %v), want a stop naming the median shard and no sweep", err, rep.Sweep)
	}
	// A malformed input that the command accepts is a failed check.
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.txt")
	os.WriteFile(bad, []byte("\x00\x01garbage"), 0o644)
	spec, man = profileJob(t, []string{"true"}, fmt.Sprintf("[profile]\nmalformed = [%q]\n", bad))
	if _, err := runProfile(t, spec, man, false); !errors.Is(err, worker.ErrProfile) || !strings.Contains(err.Error(), "was accepted") {
		t.Fatalf("accepted malformed input: got %v", err)
	}
	// One that hangs is a failed check too, bounded by the timeout.
	spec, man = profileJob(t, []string{"sh", "-c", `case "$1" in *bad.txt) sleep 30;; esac`, "sh", "{input}"}, fmt.Sprintf("timeout = \"500ms\"\n[profile]\nmalformed = [%q]\n", bad))
	if _, err := runProfile(t, spec, man, false); !errors.Is(err, worker.ErrProfile) || !strings.Contains(err.Error(), "hung") {
		t.Fatalf("hanging on malformed input: got %v", err)
	}
	// A sample whose output the run would refuse stops the profile: a
	// declared output missing, or the validator failing.
	spec, man = profileJob(t, []string{"sh", "-c", `echo r > "$1/result.txt"`, "sh", "{out}"}, "outputs = [\"{id}.out\"]\n")
	if _, err := runProfile(t, spec, man, false); !errors.Is(err, worker.ErrProfile) || !strings.Contains(err.Error(), `nothing in {out} matches the spec's outputs ["p0.out"] ({out} held ["result.txt"])`) {
		t.Fatalf("a declared output missing: got %v", err)
	}
	spec, man = profileJob(t, []string{"sh", "-c", `echo r > "$1/result.txt"`, "sh", "{out}"}, "validator = [\"grep\", \"-q\", \"expected\", \"{out}/result.txt\"]\n")
	if _, err := runProfile(t, spec, man, false); !errors.Is(err, worker.ErrProfile) || !strings.Contains(err.Error(), "validator: exit status 1") {
		t.Fatalf("a validator that refuses the output: got %v", err)
	}
	spec, man = profileJob(t, []string{"sh", "-c", `echo expected > "$1/$2.out"`, "sh", "{out}", "{id}"}, "outputs = [\"{id}.out\"]\nvalidator = [\"grep\", \"-q\", \"expected\", \"{out}/{id}.out\"]\n")
	if _, err := runProfile(t, spec, man, false); err != nil {
		t.Fatalf("declared output present and validated: %v", err)
	}
	// One that fails cleanly passes.
	spec, man = profileJob(t, []string{"sh", "-c", `case "$1" in *bad.txt) exit 2;; esac`, "sh", "{input}"}, fmt.Sprintf("[profile]\nmalformed = [%q]\n", bad))
	if _, err := runProfile(t, spec, man, false); err != nil {
		t.Fatalf("clean rejection of a malformed input: %v", err)
	}
}

// markerGPUs is a fake NVML whose one GPU runs every process-group leader
// carrying a marker in its command line, with 3 GiB and 80% utilization:
// the real child process of a profiled shard, seen through the GPUSource
// seam. (Leaders only: a shell's child carries the parent's command line
// for a moment between fork and exec.)
// With n above 1, n such GPUs, each showing the leaders at 3 GiB, or at
// mem[i] on device i where mem is set.
type markerGPUs struct {
	marker string
	n      int
	mem    []int64
}

func (m markerGPUs) Devices(context.Context) ([]probe.GPU, error) {
	var out []probe.GPU
	for i := range max(m.n, 1) {
		mem := int64(3 << 30)
		if i < len(m.mem) {
			mem = m.mem[i]
		}
		d := m.device(mem)
		d.Index, d.UUID = i, fmt.Sprintf("GPU-fake-%d", i)
		out = append(out, d)
	}
	return out, nil
}

func (m markerGPUs) device(mem int64) probe.GPU {
	d := probe.GPU{Name: "fake", MemTotal: 80 << 30, UtilGPU: 80}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), m.marker) {
			continue
		}
		var pid int
		fmt.Sscan(e.Name(), &pid)
		if pgid, err := syscall.Getpgid(pid); err != nil || pgid != pid {
			continue
		}
		d.Processes = append(d.Processes, probe.GPUProcess{PID: pid, Mem: mem, Kind: "compute"})
	}
	d.MemUsed = int64(len(d.Processes)) * mem
	d.MemFree = d.MemTotal - d.MemUsed
	return d
}

func TestProfileMeasuresVRAMAndGPUDuty(t *testing.T) {
	// This test process's own marker: the fake NVML scans every process
	// of the host, and another test binary's samples (two runs of the
	// package at once) showed on its GPU as other jobs' processes.
	marker := fmt.Sprintf("fake-gpu-job-%d", os.Getpid())
	spec, man := profileJob(t, []string{"sh", "-c", `sleep 0.3`, marker}, "[profile]\nsustained = 1\n")
	root, _ := filepath.Abs("probe/testdata/v2")
	pr, _ := probe.New(probe.Config{Root: root, GPUs: markerGPUs{marker: marker}, PolicyPath: "/nonexistent"})
	rep, err := worker.Profile(context.Background(), worker.ProfileConfig{Spec: spec, Manifest: man, Scratch: t.TempDir(), LogDir: t.TempDir(), Probe: pr, HostLedger: testenv.LedgerDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	s := rep.Samples[0]
	if s.PeakVRAM != fmt.Sprint(int64(3<<30)) || s.GPUDuty != "0.80" {
		t.Fatalf("sample %s: peak VRAM %q, GPU duty %q; want 3 GiB and 0.80", s.ID, s.PeakVRAM, s.GPUDuty)
	}
	// A GPU class that declares less VRAM than its shards were seen to use
	// is planned with the measured peak; one that declares more keeps it.
	// vram is a shard's over all its GPUs: on 2 GPUs at 3 GiB each it was
	// seen to use 6 GiB, above a declared 4 GiB (the peak divided by the
	// GPUs, 3 GiB, was compared with the 4 GiB, which stayed). A shard
	// that holds 5 GiB on one device and 1 on the other needs 5 on each
	// device admission may give it (an even share each): 10 GiB, not the
	// 6 of its sum.
	for _, c := range []struct {
		gpus     int
		mem      []int64
		declared string
		want     int64
	}{{1, nil, "1GiB", 3 << 30}, {1, nil, "8GiB", 8 << 30}, {2, nil, "4GiB", 6 << 30}, {2, nil, "8GiB", 8 << 30},
		{2, []int64{5 << 30, 1 << 30}, "4GiB", 10 << 30}, {2, []int64{1 << 30, 5 << 30}, "12GiB", 12 << 30}} {
		pr, _ := probe.New(probe.Config{Root: root, GPUs: markerGPUs{marker, c.gpus, c.mem}, PolicyPath: "/nonexistent"})
		spec, man := profileJob(t, []string{"sh", "-c", `sleep 0.3`, marker}, fmt.Sprintf("[class.cpu]\ncpus = 1\ngpus = %d\nvram = %q\n[profile]\nsustained = 1\n", c.gpus, c.declared))
		rep, err := worker.Profile(context.Background(), worker.ProfileConfig{Spec: spec, Manifest: man, Scratch: t.TempDir(), LogDir: t.TempDir(), Probe: pr, HostLedger: testenv.LedgerDir(t)})
		if err != nil {
			t.Fatal(err)
		}
		if p := rep.Classes["cpu"]; p.VRAM != c.want {
			t.Fatalf("%d GPU(s) holding %v (nil: 3 GiB each), declared vram %s: class peak %d (%s), want %d", c.gpus, c.mem, c.declared, p.VRAM, p.Source, c.want)
		}
		if c.mem != nil {
			if s := rep.Samples[0]; s.PeakVRAMDevice != 5<<30 || s.PeakVRAM != fmt.Sprint(int64(6<<30)) {
				t.Fatalf("sample on 2 GPUs holding %v: peak VRAM %s, %d on one device; want 6 GiB and 5 GiB", c.mem, s.PeakVRAM, s.PeakVRAMDevice)
			}
		}
	}
	// Without NVML they are unknown, with the reason.
	pr, _ = probe.New(probe.Config{Root: root, GPUs: noGPUs{}, PolicyPath: "/nonexistent"})
	rep, err = worker.Profile(context.Background(), worker.ProfileConfig{Spec: spec, Manifest: man, Scratch: t.TempDir(), LogDir: t.TempDir(), Probe: pr})
	if err != nil {
		t.Fatal(err)
	}
	if s := rep.Samples[0]; !strings.HasPrefix(s.PeakVRAM, "unknown: ") || !strings.Contains(s.GPUDuty, "NVML") {
		t.Fatalf("without NVML: peak VRAM %q, duty %q; want unknown with the reason", s.PeakVRAM, s.GPUDuty)
	}
}

// TestProfilePlacesAGPUClassAsAWorkerWould: a sample of a class with GPUs
// ran with no CUDA_VISIBLE_DEVICES, so it saw every GPU of the host and
// took the first, another job's busy one included, and on a host without
// GPUs it ran without one (a job may fall back to its CPU: figures of
// another run than a GPU one). Now each sample gets devices as a worker's
// shard does (healthy, free of other jobs, the class's VRAM free), and a
// class that cannot have them here stops the profile, saying why, before
// its command runs.
func TestProfilePlacesAGPUClassAsAWorkerWould(t *testing.T) {
	root, _ := filepath.Abs("probe/testdata/v2")
	devs := loadGPUs(t) // idle H100 (0), busy A100 (1), MIG A100 (2), idle H100 (4)
	seen, held := filepath.Join(t.TempDir(), "seen"), filepath.Join(t.TempDir(), "held")
	ledger := testenv.LedgerDir(t)
	// Each sample notes its devices, and the devices the profile's record
	// in the host ledger holds while it runs.
	job := func(gpus int) (*stream.Spec, *stream.Manifest) {
		return profileJob(t, []string{"sh", "-c", `echo "$CUDA_VISIBLE_DEVICES" >> "$1"; echo $(grep -a -o '"name":"shardpool profile"[^}]*' "$2" | grep -o 'GPU-[0-9a-f-]*') >> "$3"`,
			"sh", seen, filepath.Join(ledger, "ledger"), held},
			fmt.Sprintf("[class.cpu]\ncpus = 1\ngpus = %d\nvram = \"40GiB\"\n[profile]\nsustained = 1\n", gpus))
	}
	profile := func(spec *stream.Spec, man *stream.Manifest, gpus probe.GPUSource) (*worker.ProfileReport, error) {
		pr, err := probe.New(probe.Config{Root: root, GPUs: gpus, PolicyPath: "/nonexistent"})
		if err != nil {
			t.Fatal(err)
		}
		return worker.Profile(context.Background(), worker.ProfileConfig{Spec: spec, Manifest: man, Scratch: t.TempDir(), LogDir: t.TempDir(), Probe: pr, HostLedger: ledger})
	}

	spec, man := job(1)
	if _, err := profile(spec, man, &fixtureGPUs{devs: devs}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(seen)
	lines := strings.Fields(string(b))
	if len(lines) < 4 {
		t.Fatalf("the samples saw CUDA_VISIBLE_DEVICES %q; want a line for each of at least 4 samples", b)
	}
	for _, l := range lines {
		if l != devs[0].UUID && l != devs[3].UUID {
			t.Fatalf("a sample saw CUDA_VISIBLE_DEVICES=%q; want one idle H100 (%s or %s), never the busy or MIG A100:\n%s", l, devs[0].UUID, devs[3].UUID, b)
		}
	}
	// While a sample runs, the profile's record holds its device, so that
	// the host's workers leave it alone before the sample allocates; the
	// record is gone with the profile.
	h, _ := os.ReadFile(held)
	heldLines := strings.Split(strings.TrimSpace(string(h)), "\n")
	if len(heldLines) != len(lines) {
		t.Fatalf("the profile's record in the host ledger held %q while the samples ran; want a device for each of the %d samples", h, len(lines))
	}
	for i, l := range heldLines {
		if !strings.Contains(l, lines[i]) {
			t.Fatalf("sample %d ran on %s while the profile's record held %q; want its device held", i, lines[i], l)
		}
	}
	if ws, err := worker.HostWorkers(ledger); err != nil || len(ws) != 0 {
		t.Fatalf("after the profile the host ledger holds %+v (%v); want no record", ws, err)
	}

	// A device a worker of the host holds for its shard (which may not
	// have allocated yet: NVML shows it idle) is not given to a sample.
	os.Remove(seen)
	os.Remove(held)
	release, err := worker.HoldGPUsInLedger(ledger, "w9", devs[0].UUID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := profile(spec, man, &fixtureGPUs{devs: devs}); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(seen)
	for _, l := range strings.Fields(string(b)) {
		if l != devs[3].UUID {
			t.Fatalf("a sample saw CUDA_VISIBLE_DEVICES=%q while a worker of the host holds %s; want the other idle H100, %s:\n%s", l, devs[0].UUID, devs[3].UUID, b)
		}
	}
	spec2, man2 := job(2)
	_, err = profile(spec2, man2, &fixtureGPUs{devs: devs})
	if err == nil || !strings.Contains(err.Error(), "and 1 of this host's 4 can be given") || !strings.Contains(err.Error(), "GPU 0 is held by another worker on this host") {
		t.Errorf("2 GPUs while a worker holds one of the two idle: %v; want the profile stopped, naming the held device", err)
	}
	release()

	// More GPUs than the host can give: stopped before the command, each
	// device's reason named.
	os.Remove(seen)
	spec, man = job(3)
	_, err = profile(spec, man, &fixtureGPUs{devs: devs})
	for _, want := range []string{"asks for 3 GPU(s) with 13.3GiB of VRAM free each, and 2 of this host's 4 can be given", "GPU 1: busy", "GPU 2: MIG mode",
		"profile class cpu on a host with a GPU it can have"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("3 GPUs of a host with 2 to give: %v; want %q in it", err, want)
		}
	}
	// Without NVML: nothing to give, and NVML's reason.
	spec, man = job(1)
	if _, err := profile(spec, man, noGPUs{}); err == nil || !strings.Contains(err.Error(), "this host has none to give: "+probe.ErrNVMLMissing.Error()) {
		t.Errorf("a GPU class where NVML is missing: %v; want the profile stopped, saying so", err)
	}
	if b, err := os.ReadFile(seen); err == nil {
		t.Errorf("a command ran without the GPUs its class asks for (CUDA_VISIBLE_DEVICES %q)", b)
	}
}
