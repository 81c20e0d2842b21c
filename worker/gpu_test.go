package worker_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker/probe"
)

// fixtureGPUs serves the probe's GPU fixture: an idle H100, a busy A100
// (another user's process, 70 GiB free), a MIG A100 and a lost GPU, plus a
// second idle H100.
type fixtureGPUs struct {
	mu   sync.Mutex
	devs []probe.GPU
}

var _ probe.GPUSource = (*fixtureGPUs)(nil)

func (f *fixtureGPUs) Devices(context.Context) ([]probe.GPU, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]probe.GPU, len(f.devs))
	copy(out, f.devs)
	for i := range out {
		out[i].Processes = append([]probe.GPUProcess(nil), f.devs[i].Processes...)
	}
	return out, nil
}

func loadGPUs(t *testing.T) []probe.GPU {
	t.Helper()
	b, err := os.ReadFile("probe/testdata/gpus.json")
	if err != nil {
		t.Fatal(err)
	}
	var devs []probe.GPU
	if err := json.Unmarshal(b, &devs); err != nil {
		t.Fatal(err)
	}
	second := devs[0]
	second.Index, second.UUID = 4, "GPU-00000000-1111-2222-3333-444444444444"
	// Drop the lost GPU: with it the usable count is unknown and nothing runs
	// (covered in package probe).
	return append(devs[:3], second)
}

// gpuRun starts a coordinator and a worker on the fixture host with gpus
// as its GPUs (measured admission where slots is nil, else those fixed
// slots) and writes a job of n shards of class gpu (1 CPU, 1 GiB, 1 GPU,
// and the class lines extra) whose command writes its
// CUDA_VISIBLE_DEVICES to {out}/gpu, then runs then (a shell's lines,
// with {out} as $1).
func gpuRun(t *testing.T, gpus *fixtureGPUs, slots map[string]int, n int, extra, then string) (*testenv.Env, string) {
	t.Helper()
	root, _ := filepath.Abs("probe/testdata/v2")
	pr, err := probe.New(probe.Config{Root: root, GPUs: gpus, PolicyPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	opts := testenv.Options{Slots: slots, Probe: pr}
	if slots == nil {
		opts.Auto, opts.Slots = true, map[string]int{}
	}
	env := testenv.New(t, opts)
	spec := testenv.WriteJob(t, testenv.Job{Shards: n,
		Extra:   "[class.gpu]\ncpus = 1\nmemory = \"1GiB\"\ngpus = 1\n" + extra,
		Line:    func(i int, in string) string { return fmt.Sprintf(`{"id":"g%d","inputs":[%q],"class":"gpu"}`, i, in) },
		Command: []string{"sh", "-c", `echo "$CUDA_VISIBLE_DEVICES" > "$1/gpu"; ` + then, "sh", "{out}"}})
	return env, spec
}

func TestGPUAssignmentByUUIDAvoidsBusyAndShared(t *testing.T) {
	devs := loadGPUs(t)
	env, spec := gpuRun(t, &fixtureGPUs{devs: devs}, nil, 6, "vram = \"40GiB\"\n", `date +%s%N > "$1/start"; sleep 0.4; date +%s%N > "$1/end"`)
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	idle := map[string]bool{devs[0].UUID: true, devs[3].UUID: true}
	type span struct {
		gpu        string
		start, end int64
	}
	var spans []span
	for i := range 6 {
		dir := filepath.Join(filepath.Dir(spec), "out", fmt.Sprintf("g%d", i))
		var s span
		b, _ := os.ReadFile(filepath.Join(dir, "gpu"))
		s.gpu = strings.TrimSpace(string(b))
		b, _ = os.ReadFile(filepath.Join(dir, "start"))
		fmt.Sscan(string(b), &s.start)
		b, _ = os.ReadFile(filepath.Join(dir, "end"))
		fmt.Sscan(string(b), &s.end)
		if !idle[s.gpu] {
			t.Fatalf("shard g%d got CUDA_VISIBLE_DEVICES=%q, want one idle GPU's UUID (never the busy or the MIG one)", i, s.gpu)
		}
		spans = append(spans, s)
	}
	parallel := false
	for i := range spans {
		for j := range spans {
			overlap := i < j && spans[i].start < spans[j].end && spans[j].start < spans[i].end
			if overlap && spans[i].gpu == spans[j].gpu {
				t.Fatalf("shards %d and %d shared GPU %s at the same time", i, j, spans[i].gpu)
			}
			parallel = parallel || overlap
		}
	}
	if !parallel {
		t.Fatal("no two shards ran at once: the two idle GPUs were not both used")
	}
}

// TestMeasuredVRAMPlacesTheShard: a GPU class declaring less VRAM than its
// profile measured was placed by the declared figure: the run record
// carried the measured memory alone, and the worker picked the first
// device with the declared VRAM free. The measured VRAM (measured_vram)
// now decides: with 8 GiB declared and 20 GiB measured, the H100 with 10
// GiB free is passed over for the one with 70 GiB.
func TestMeasuredVRAMPlacesTheShard(t *testing.T) {
	fixture := loadGPUs(t)
	small, big := fixture[0], fixture[3] // idle H100s
	small.MemFree, big.MemFree = 10<<30, 70<<30
	for _, measured := range []bool{false, true} {
		t.Run(fmt.Sprintf("measured %v", measured), func(t *testing.T) {
			env, spec := gpuRun(t, &fixtureGPUs{devs: []probe.GPU{small, big}}, nil, 3, "vram = \"8GiB\"\n", "")
			opt := coordinator.SubmitOptions{}
			if measured {
				opt.MeasuredVRAM = map[string]int64{"gpu": 20 << 30}
			}
			env.Submit(spec, opt)
			if r := env.WaitState("t", 60*time.Second, stream.RunComplete, stream.RunBlocked); r.State != stream.RunComplete {
				for i := range 3 {
					rec, _ := env.Shard("t", fmt.Sprintf("g%d", i))
					t.Logf("g%d: %s %+v", i, rec.State, rec.Attempts)
				}
				t.Fatalf("run %s %+v, want COMPLETE", r.State, r.Counts)
			}
			on := map[string]int{}
			for i := range 3 {
				b, _ := os.ReadFile(filepath.Join(filepath.Dir(spec), "out", fmt.Sprintf("g%d", i), "gpu"))
				on[strings.TrimSpace(string(b))]++
				// Admitted only while a device was free for it: none of
				// them met its device taken by another at its start.
				if rec, err := env.Shard("t", fmt.Sprintf("g%d", i)); err != nil || len(rec.Attempts) != 1 || rec.Interrupted != 0 {
					t.Errorf("shard g%d: %d attempt(s), %d handed back (%v); want one attempt: %+v", i, len(rec.Attempts), rec.Interrupted, err, rec.Attempts)
				}
			}
			switch {
			case measured && on[big.UUID] != 3:
				t.Fatalf("20 GiB measured: shards on %v, want all 3 on %s (70 GiB free), none on %s (10 GiB)", on, big.UUID, small.UUID)
			case !measured && on[small.UUID] == 0:
				t.Fatalf("8 GiB declared, nothing measured: shards on %v, want %s (10 GiB free, the first) used too", on, small.UUID)
			}
		})
	}
}

// TestBusyGPUAtStartIsNotTheShardsFailure: a shard whose GPU cannot be
// had when its command is to start (another job took the device after
// admission looked, or a worker with fixed slots, which does not look)
// was charged a start error: with retries = 0 it failed for good, for
// its host's state. It is handed back uncharged now, as under memory
// pressure, and runs once a device is free. A host whose devices cannot
// serve the shard however long it waits (here the only one is in MIG
// mode) is a start error still, charged, which stops a worker that meets
// it again and again.
func TestBusyGPUAtStartIsNotTheShardsFailure(t *testing.T) {
	mig := loadGPUs(t)[2]
	env, spec := gpuRun(t, &fixtureGPUs{devs: []probe.GPU{mig}}, map[string]int{"gpu": 1}, 1, "", "")
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunBlocked)
	if rec, _ := env.Shard("t", "g0"); rec.State != stream.ShardFailed || rec.Interrupted != 0 || !strings.Contains(rec.Reason, "assign GPUs") ||
		len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeStart {
		t.Fatalf("shard g0 on a host whose only GPU is in MIG mode: %s %q, %d handed back, attempts %+v; want failed by a start error", rec.State, rec.Reason, rec.Interrupted, rec.Attempts)
	}

	busy := loadGPUs(t)[1] // an A100 another user's process holds
	gpus := &fixtureGPUs{devs: []probe.GPU{busy}}
	env, spec = gpuRun(t, gpus, map[string]int{"gpu": 1}, 1, "", "") // retries = 0
	env.Submit(spec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		rec, err := env.Shard("t", "g0")
		return err == nil && rec.Interrupted > 0, fmt.Sprintf("shard g0 %s, %d handed back (%v): want it handed back while its GPU is busy", rec.State, rec.Interrupted, err)
	})
	if rec, _ := env.Shard("t", "g0"); rec.State != stream.ShardPending || !strings.Contains(rec.Reason, "assign GPUs") {
		t.Fatalf("shard g0 while its GPU is busy: %s %q, want pending, saying its GPU could not be assigned", rec.State, rec.Reason)
	}
	gpus.mu.Lock()
	gpus.devs[0].Processes = nil // the other job ended
	gpus.mu.Unlock()
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	rec, _ := env.Shard("t", "g0")
	var charged int
	for _, at := range rec.Attempts {
		if at.Outcome != stream.OutcomePreempted {
			charged++
		}
	}
	if charged != 1 {
		t.Fatalf("shard g0 attempts %+v: want the handed-back ones and one that ran", rec.Attempts)
	}
	if b, _ := os.ReadFile(filepath.Join(filepath.Dir(spec), "out", "g0", "gpu")); strings.TrimSpace(string(b)) != busy.UUID {
		t.Fatalf("CUDA_VISIBLE_DEVICES %q, want %s", b, busy.UUID)
	}
}
