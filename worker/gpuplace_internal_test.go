package worker

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

type staticGPUs []probe.GPU

func (s staticGPUs) Devices(context.Context) ([]probe.GPU, error) { return s, nil }

// TestPlaceGPUsHandsBackWhatTheHostCannotGiveNow: a shard whose devices
// are busy at its start (another job took one since admission looked) is
// handed back uncharged, as under memory pressure; one on a host whose
// devices cannot take it at all (MIG mode) is a start error, charged,
// unless it was fetched with no look at the devices (before a run of its
// class was seen), which is the fetch's doing; an idle device is given.
// On the probe's GPU fixture: an idle H100, a busy A100, a MIG A100.
func TestPlaceGPUsHandsBackWhatTheHostCannotGiveNow(t *testing.T) {
	devs := GPUFixture(t)
	root, _ := filepath.Abs("probe/testdata/v2")
	for _, c := range []struct {
		name    string
		dev     probe.GPU
		blind   bool
		outcome string
		says    string
	}{
		{"idle", devs[0], false, "", ""},
		{"busy", devs[1], false, stream.OutcomePreempted, "GPU 1: busy: 1 process(es) of other jobs hold 9.5GiB); the devices are busy, not the shard's failure"},
		{"mig", devs[2], false, stream.OutcomeStart, "assign GPUs: needs 1 GPU(s), and 0 of this host's 1 can be given now (GPU 2: MIG mode"},
		{"mig, fetched blind", devs[2], true, stream.OutcomePreempted, "fetched before this worker had seen a run of class gpu, with no look at its devices: handed back, not the shard's failure"},
	} {
		t.Run(c.name, func(t *testing.T) {
			pr, err := probe.New(probe.Config{Root: root, GPUs: staticGPUs{c.dev}, PolicyPath: "/nonexistent"})
			if err != nil {
				t.Fatal(err)
			}
			w := &Worker{cfg: Config{Probe: pr}, gpuRes: map[string]string{}}
			a := &attemptState{key: "r.s1", m: stream.ShardMsg{Run: "r", ID: "s1", Class: "gpu"}, blind: c.blind}
			uuids, res := w.placeGPUs(context.Background(), a, stream.Class{GPUs: 1})
			if res.outcome != c.outcome || !strings.Contains(res.reason, c.says) {
				t.Fatalf("outcome %q, reason %q; want %q saying %q", res.outcome, res.reason, c.outcome, c.says)
			}
			if c.outcome == "" {
				if uuids != c.dev.UUID {
					t.Fatalf("CUDA_VISIBLE_DEVICES %q, want the idle device %s", uuids, c.dev.UUID)
				}
				w.releaseGPUs(a.key)
			} else if len(w.gpuRes) != 0 {
				t.Fatalf("a shard without its devices left reservations: %v", w.gpuRes)
			}
		})
	}
}
