//go:build nvml

package probe

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestRealNVML runs only in the nvml build (make test-gpu), on a machine
// that may or may not have GPUs: with device nodes it must list devices
// with UUIDs and memory; without, it must say the library or the nodes are
// missing instead of reporting idle GPUs.
func TestRealNVML(t *testing.T) {
	nodes, _ := filepath.Glob("/dev/nvidia[0-9]*")
	devs, err := DefaultGPUs().Devices(context.Background())
	if len(nodes) == 0 {
		if err == nil && len(devs) > 0 {
			t.Fatalf("NVML lists %d devices but there are no /dev/nvidia* nodes", len(devs))
		}
		t.Logf("no device nodes; NVML says %v", err)
		return
	}
	if err != nil {
		if errors.Is(err, ErrNVMLMissing) {
			t.Fatalf("device nodes %v exist but libnvidia-ml is missing: %v", nodes, err)
		}
		t.Fatalf("NVML: %v", err)
	}
	if len(devs) == 0 {
		t.Fatalf("device nodes %v but NVML lists no devices", nodes)
	}
	for _, d := range devs {
		if d.Error != "" {
			t.Errorf("device %d: %s", d.Index, d.Error)
			continue
		}
		if d.UUID == "" || d.Name == "" || d.MemTotal <= 0 || d.MemFree > d.MemTotal {
			t.Errorf("device %d: implausible %+v", d.Index, d)
		}
		t.Logf("device %d: %s %s, %d of %d bytes free, util %d%%, %d processes, MIG %v, persistence %v",
			d.Index, d.Name, d.UUID, d.MemFree, d.MemTotal, d.UtilGPU, len(d.Processes), d.MIG, d.Persistence)
	}
	p, _ := New(Config{})
	s, err := p.Snapshot(context.Background(), map[string]string{"tmp": os.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if !s.GPUs.Count.IsKnown() || int(s.GPUs.Count.N) != len(devs) {
		t.Fatalf("snapshot GPU count %+v, want %d", s.GPUs.Count, len(devs))
	}
	t.Logf("budget: gpus %+v (%s), vram %+v (%s)", s.Budget.GPUs.Effective, s.Budget.GPUs.Binding, s.Budget.VRAM.Effective, s.Budget.VRAM.Binding)
}
