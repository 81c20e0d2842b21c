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

func TestGPUAssignmentByUUIDAvoidsBusyAndShared(t *testing.T) {
	root, _ := filepath.Abs("probe/testdata/v2")
	devs := loadGPUs(t)
	pr, err := probe.New(probe.Config{Root: root, GPUs: &fixtureGPUs{devs: devs}, PolicyPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	env := testenv.New(t, testenv.Options{Auto: true, Slots: map[string]int{}, Probe: pr})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 6,
		Extra:   "[class.gpu]\ncpus = 1\nmemory = \"1GiB\"\ngpus = 1\nvram = \"40GiB\"\n",
		Line:    func(i int, in string) string { return fmt.Sprintf(`{"id":"g%d","inputs":[%q],"class":"gpu"}`, i, in) },
		Command: []string{"sh", "-c", `echo "$CUDA_VISIBLE_DEVICES" > "$1/gpu"; date +%s%N > "$1/start"; sleep 0.4; date +%s%N > "$1/end"`, "sh", "{out}"}})
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
