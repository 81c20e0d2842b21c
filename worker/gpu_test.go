package worker_test

import (
	"context"
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
	"github.com/shardpool/shardpool/worker"
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
	devs := worker.GPUFixture(t)
	second := devs[0]
	second.Index, second.UUID = 4, "GPU-00000000-1111-2222-3333-444444444444"
	// Drop the lost GPU: with it the usable count is unknown and nothing runs
	// (covered in package probe).
	return append(devs[:3], second)
}

// gpuRun starts a coordinator for workers on the fixture host with gpus
// as its GPUs (measured admission where slots is nil, else those fixed
// slots) and writes a job of n shards of class gpu (1 CPU, 1 GiB, 1 GPU,
// and the class lines extra) whose command writes its
// CUDA_VISIBLE_DEVICES to {out}/gpu, then runs then (a shell's lines,
// with {out} as $1 and args after it). start starts a worker: after the
// submission, so that its first fetch knows the class (before a run of
// it is seen, a worker keeps one fetch open, which takes the first shard
// without a look at the devices).
func gpuRun(t *testing.T, gpus *fixtureGPUs, slots map[string]int, n int, extra, then string, args ...string) (env *testenv.Env, spec string, start func(name string)) {
	t.Helper()
	root, _ := filepath.Abs("probe/testdata/v2")
	pr, err := probe.New(probe.Config{Root: root, GPUs: gpus, PolicyPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	opts := testenv.Options{NoWorkers: true, Probe: pr}
	if slots == nil {
		opts.Auto, slots = true, map[string]int{}
	}
	env = testenv.New(t, opts)
	spec = testenv.WriteJob(t, testenv.Job{Shards: n,
		Extra:   "[class.gpu]\ncpus = 1\nmemory = \"1GiB\"\ngpus = 1\n" + extra,
		Line:    func(i int, in string) string { return fmt.Sprintf(`{"id":"g%d","inputs":[%q],"class":"gpu"}`, i, in) },
		Command: append([]string{"sh", "-c", `echo "$CUDA_VISIBLE_DEVICES" > "$1/gpu"; ` + then, "sh", "{out}"}, args...)})
	return env, spec, func(name string) { env.StartWorker(name, slots) }
}

func TestGPUAssignmentByUUIDAvoidsBusyAndShared(t *testing.T) {
	devs := loadGPUs(t)
	env, spec, start := gpuRun(t, &fixtureGPUs{devs: devs}, nil, 6, "vram = \"40GiB\"\n", `date +%s%N > "$1/start"; sleep 0.4; date +%s%N > "$1/end"`)
	env.Submit(spec, coordinator.SubmitOptions{})
	start("w1")
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
			env, spec, start := gpuRun(t, &fixtureGPUs{devs: []probe.GPU{small, big}}, nil, 3, "vram = \"8GiB\"\n", "")
			opt := coordinator.SubmitOptions{}
			if measured {
				opt.MeasuredVRAM = map[string]int64{"gpu": 20 << 30}
			}
			env.Submit(spec, opt)
			start("w1")
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

// TestFixedSlotsFetchWhatTheGPUsCanTake: a worker with fixed slots
// fetched a GPU class's shards whatever its devices, and a shard whose
// device was busy, in MIG mode or missing failed at its start, charged.
// It fetches only what its devices can take now, as measured admission
// does, and says why it waits; the shards stay queued, unspent, for it
// or another host.
func TestFixedSlotsFetchWhatTheGPUsCanTake(t *testing.T) {
	fixture := loadGPUs(t)
	for _, c := range []struct {
		name string
		dev  probe.GPU
		says string
	}{{"mig", fixture[2], "GPU 2: MIG mode"}, {"busy", fixture[1], "GPU 1: busy"}} {
		t.Run(c.name, func(t *testing.T) {
			gpus := &fixtureGPUs{devs: []probe.GPU{c.dev}}
			env, spec, start := gpuRun(t, gpus, map[string]int{"gpu": 1}, 1, "", "") // retries = 0
			env.Submit(spec, coordinator.SubmitOptions{})
			start("w1")
			testenv.Eventually(t, 30*time.Second, func() (bool, string) {
				reps, _ := env.Buckets().WorkerReports(context.Background())
				for _, r := range reps {
					if strings.Contains(r.Waiting["gpu"], c.says) {
						return true, ""
					}
				}
				return false, fmt.Sprintf("worker reports %+v: want class gpu waiting, saying %q", reps, c.says)
			})
			if rec, err := env.Shard("t", "g0"); err == nil && len(rec.Attempts) > 0 {
				t.Fatalf("shard g0 was taken while no device could run it: %s %+v", rec.State, rec.Attempts)
			}
			if c.name == "busy" {
				gpus.mu.Lock()
				gpus.devs[0].Processes = nil // the other job ended
				gpus.mu.Unlock()
				env.WaitState("t", 60*time.Second, stream.RunComplete)
				if rec, _ := env.Shard("t", "g0"); len(rec.Attempts) != 1 {
					t.Fatalf("shard g0 attempts %+v, want one", rec.Attempts)
				}
			}
		})
	}
}

// TestAShardFetchedBeforeItsClassWasSeenIsHandedBack: a fixed-slots
// worker keeps one fetch open before it has seen a run of its class,
// with no look at the class's GPUs; the first shard of a run submitted
// meanwhile (workers started first, the distributed form's order) came
// to it whatever its devices. On a host with none to give (here a MIG
// A100) the start was charged: with retries = 0 the shard failed, and
// the run was BLOCKED by a host that should never have fetched it. It
// is handed back uncharged, the worker then waits naming its devices,
// and the shard runs once in all when a device can take it.
func TestAShardFetchedBeforeItsClassWasSeenIsHandedBack(t *testing.T) {
	fixture := loadGPUs(t)
	gpus := &fixtureGPUs{devs: []probe.GPU{fixture[2]}}
	env, spec, start := gpuRun(t, gpus, map[string]int{"gpu": 1}, 1, "", "") // retries = 0
	// The class's consumer exists before the run, as after an earlier
	// run of the class: the worker's fetch is open when the shard comes.
	ctx := context.Background()
	if _, err := stream.EnsureConsumer(ctx, env.JS, "gpu", stream.MaxDeliver(0), 0, 0); err != nil {
		t.Fatal(err)
	}
	start("w1")
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		reps, _ := env.Buckets().WorkerReports(ctx)
		return len(reps) == 1, fmt.Sprintf("%d worker reports, want w1's", len(reps))
	})
	env.Submit(spec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		if rec, err := env.Shard("t", "g0"); err == nil && rec.State == stream.ShardFailed {
			t.Fatalf("shard g0 failed on a host whose only GPU is in MIG mode: %s", rec.Reason)
		}
		reps, _ := env.Buckets().WorkerReports(ctx)
		for _, r := range reps {
			if strings.Contains(r.Waiting["gpu"], "GPU 2: MIG mode") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("worker reports %+v: want class gpu waiting on the MIG GPU", reps)
	})
	rec, err := env.Shard("t", "g0")
	if err == nil && rec.Interrupted > 0 && !strings.Contains(rec.Reason, "fetched before this worker had seen a run of class gpu, with no look at its devices: handed back, not the shard's failure") {
		t.Fatalf("shard g0 handed back saying %q, want why", rec.Reason)
	}
	if err == nil && rec.Interrupted == 0 {
		t.Logf("the worker saw the run before its open fetch took g0 (%s): no hand-back this time", rec.State)
	}
	gpus.mu.Lock()
	gpus.devs[0] = fixture[0] // an idle H100 in its place
	gpus.mu.Unlock()
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	rec, _ = env.Shard("t", "g0")
	charged := 0
	for _, at := range rec.Attempts {
		if at.Outcome != stream.OutcomePreempted {
			charged++
		}
	}
	if charged != 1 {
		t.Fatalf("shard g0 attempts %+v, want one charged", rec.Attempts)
	}
}

// TestFixedWorkersOfOneHostTakeTurnsAtAGPU: two fixed-slots workers of
// one host (one host ledger) and its one GPU. The second's look at the
// devices did not read the ledger: it fetched the shard the first
// worker's held device could not take, met the device at the start and
// handed the shard back, again and again with delays of up to a minute.
// It now waits, naming the worker that holds the device, and takes the
// shard once the device is free: no hand-back, one attempt each. (A
// start that finds its devices busy is handed back uncharged,
// TestPlaceGPUsHandsBackWhatTheHostCannotGiveNow.)
func TestFixedWorkersOfOneHostTakeTurnsAtAGPU(t *testing.T) {
	idle := loadGPUs(t)[0]
	gate := testenv.NewGate(t)
	env, spec, start := gpuRun(t, &fixtureGPUs{devs: []probe.GPU{idle}}, map[string]int{"gpu": 1}, 2, "", `while [ ! -e "$2" ]; do sleep 0.05; done`, gate.Path)
	env.Submit(spec, coordinator.SubmitOptions{})
	start("w1")
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		n := runningShards(env, "t", "g0", "g1")
		return n == 1, fmt.Sprintf("%d shard(s) running, want w1's one", n)
	})
	start("w2") // the same host ledger
	ctx := context.Background()
	want := fmt.Sprintf("GPU %d is held by another worker on this host", idle.Index)
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		reps, _ := env.Buckets().WorkerReports(ctx)
		for _, r := range reps {
			if r.Name == "w2" && strings.Contains(r.Waiting["gpu"], want) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("worker reports %+v: want w2 waiting, saying %q", reps, want)
	})
	gate.Open()
	env.WaitState("t", 60*time.Second, stream.RunComplete)
	oneAttemptEach := func(id string) {
		rec, _ := env.Shard("t", id)
		if len(rec.Attempts) != 1 || rec.Interrupted != 0 {
			t.Errorf("shard %s: attempts %+v, %d handed back; want one attempt and none handed back", id, rec.Attempts, rec.Interrupted)
		}
	}
	oneAttemptEach("g0")
	oneAttemptEach("g1")
}
