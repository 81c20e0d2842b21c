package worker

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
)

// TestAdmissionLearnsALargerPeak: a class whose profile measured 32 MiB
// on a host with 512 MiB of headroom (a fixture) and 4 CPUs admits 4
// shards at once. A real shard of it that holds 200 MiB while it runs is
// seen in the next look at the host: admission reserves its peak from
// then on (2 more shards, not 3), for its run and job only, and says so
// in the run's admission.log and the host's; a new job of the run (another
// fingerprint) starts again from its own figure.
func TestAdmissionLearnsALargerPeak(t *testing.T) {
	ctx := context.Background()
	const mib = int64(1) << 20
	pr := FixtureWithHeadroom(t, 512)
	state := t.TempDir()
	w := workerOnServer(t, Config{StateDir: state, Probe: pr, Auto: true})
	w.cfg.Slots = nil
	measured := plan.Peak{CPU: 1000, Memory: 32 * mib, Source: "measured (profile.json)"}
	setRuns := func(fp string) {
		w.mu.Lock()
		peaks := map[string]plan.Peak{"cpu": measured}
		w.applyLearned(peaks, map[string][]runBase{"cpu": {{run: "t", fp: fp, memory: measured.Memory, source: measured.Source}}})
		w.peaks = peaks
		w.mu.Unlock()
	}
	setRuns("f1")

	look := func() *admitView {
		t.Helper()
		v, err := w.admissionView(ctx, false, true)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	peak, _, _ := w.peakFor("cpu")
	if k, detail, _, _ := w.decide(look(), "cpu", 0, peak, false, others{}); k != 4 {
		t.Fatalf("before any shard ran: fetch %d, want 4 (the CPU slots; 512 MiB / 32 MiB is more)\n%s", k, detail)
	}

	// tail holds its one line, all 200 MiB of it, until sleep ends.
	cmd := exec.Command("sh", "-c", `{ head -c 200M /dev/zero; sleep 60; } | tail -n 1 > /dev/null`)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	onStart, _ := w.trackLive(liveShard{class: "cpu", peak: measured.Memory, run: "t", fp: "f1", id: "s7"}, true)
	defer onStart(cmd.Process.Pid)()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		rss := groupRSS("/proc", map[int]liveShard{cmd.Process.Pid: {}})[cmd.Process.Pid]
		if rss >= 200*mib {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the shard holds %s after 20 s, not 200 MiB", stream.FormatSize(rss))
		}
	}

	v := look() // its scan of the running shards sees the 200 MiB
	peak, _, _ = w.peakFor("cpu")
	if peak.Memory < 200*mib || peak.Memory > 240*mib || !strings.HasPrefix(peak.Source, "learned from shard s7, above the 32.0MiB measured (profile.json)") {
		t.Fatalf("after a shard held 200 MiB: class peak %s (%s), want about 200 MiB learned from s7", stream.FormatSize(peak.Memory), peak.Source)
	}
	// One running (grown: no growth left); 512 MiB / ~201 MiB leaves room for 2.
	if k, detail, _, _ := w.decide(v, "cpu", 1, peak, false, others{}); k != 2 || !strings.Contains(detail, "(learned from shard s7") {
		t.Fatalf("after learning: fetch %d, want 2 of the 3 free slots, by the learned peak\n%s", k, detail)
	}
	for _, f := range []string{filepath.Join(state, "runs", "t", "admission.log"), filepath.Join(state, "admission.log")} {
		b, _ := os.ReadFile(f)
		if n := strings.Count(string(b), "decision=peak-learned"); n != 1 || !strings.Contains(string(b), "admission on this worker reserves 2") {
			t.Errorf("%s has %d peak-learned line(s), want 1 saying what admission reserves now:\n%s", f, n, b)
		}
	}

	// A look at the runs (as refreshPeaks makes) keeps it for the same job.
	setRuns("f1")
	if peak, _, _ := w.peakFor("cpu"); peak.Memory < 200*mib {
		t.Errorf("after the runs were read again: class peak %s, want the learned one kept", stream.FormatSize(peak.Memory))
	}
	// Another job under the run's name: its own figure, nothing learned,
	// and the old job's shard still running teaches it nothing.
	setRuns("f2")
	if peak, _, _ := w.peakFor("cpu"); peak.Memory != measured.Memory || peak.Source != measured.Source {
		t.Errorf("a new job of the run: class peak %s (%s), want the measured 32 MiB", stream.FormatSize(peak.Memory), peak.Source)
	}
	look()
	if peak, _, _ := w.peakFor("cpu"); peak.Memory != measured.Memory {
		t.Errorf("a shard of the old job taught the new one: class peak %s, want 32 MiB", stream.FormatSize(peak.Memory))
	}

	// A peak learned above the host's memory budget (8 GiB here) counts as
	// the budget: one slot, which waits for headroom, not none for good.
	huge := plan.Peak{CPU: 1000, Memory: 100 << 30, Source: "learned from shard s9, above the 32.0MiB measured (profile.json)"}
	if _, detail, _, _ := w.decide(look(), "cpu", 0, huge, false, others{}); !strings.Contains(detail, "slots 1 (memory binds") || !strings.Contains(detail, "capped at the memory budget") {
		t.Errorf("a learned peak of 100 GiB: want 1 slot, the peak capped at the budget\n%s", detail)
	}
	declared := plan.Peak{CPU: 1000, Memory: 100 << 30, Source: "declared (spec)"}
	if _, detail, _, _ := w.decide(look(), "cpu", 0, declared, false, others{}); !strings.Contains(detail, "all 0 slot(s)") {
		t.Errorf("a declared peak of 100 GiB: want no slot, as before\n%s", detail)
	}
}
