package probe

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/shardpool/shardpool/stream"
)

// ErrNVMLMissing means the NVML library could not be loaded.
var ErrNVMLMissing = errors.New("NVML library not found")

// ErrNVMLNotBuilt means this binary was built without the NVML adapter.
var ErrNVMLNotBuilt = errors.New("built without NVML support (build with -tags nvml)")

// GPUSource lists the host's NVIDIA devices. The real one uses NVML (build
// tag nvml); tests use a fake with fixture data from real devices. A device
// that fails is returned with Error set, never dropped.
type GPUSource interface {
	Devices(ctx context.Context) ([]GPU, error)
}

// GPU is one device as NVML reports it.
type GPU struct {
	Index        int          `json:"index"`
	UUID         string       `json:"uuid"`
	Name         string       `json:"name"`
	MemTotal     int64        `json:"mem_total"`
	MemFree      int64        `json:"mem_free"`
	MemUsed      int64        `json:"mem_used"`
	UtilGPU      int          `json:"util_gpu_percent"`
	UtilMem      int          `json:"util_mem_percent"`
	Processes    []GPUProcess `json:"processes"`
	ECCVolatile  int64        `json:"ecc_uncorrected_volatile"`
	ECCAggregate int64        `json:"ecc_uncorrected_aggregate"`
	RetiredPages int          `json:"retired_pages"`
	RetirePend   bool         `json:"retired_pages_pending"`
	RemapPending bool         `json:"remapped_rows_pending"`
	RemapFailed  bool         `json:"remapped_rows_failure"`
	MIG          bool         `json:"mig_enabled"`
	MIGDevices   []MIGDevice  `json:"mig_devices,omitempty"`
	Persistence  bool         `json:"persistence_mode"`
	Error        string       `json:"error,omitempty"`
	// Filled by the probe:
	Usable bool   `json:"usable"`
	Why    string `json:"why,omitempty"`
}

// GPUProcess is a process holding memory on a device.
type GPUProcess struct {
	PID  int    `json:"pid"`
	UID  int    `json:"uid"` // -1 when the process is not visible here (another container)
	Mem  int64  `json:"used_memory"`
	Kind string `json:"kind"` // compute, graphics, mps
}

// MIGDevice is one MIG instance.
type MIGDevice struct {
	UUID     string `json:"uuid"`
	MemTotal int64  `json:"mem_total"`
	MemUsed  int64  `json:"mem_used"`
}

// GPUs is the GPU part of a snapshot.
type GPUs struct {
	Count   Value  `json:"count"`
	Usable  Value  `json:"usable"`
	VRAM    Value  `json:"usable_vram_free"`
	Devices []GPU  `json:"devices"`
	Reason  string `json:"reason,omitempty"`
}

// GPUDevices lists the devices through the configured source, for callers
// that sample often (the profiler) and need no full snapshot.
func (p *Prober) GPUDevices(ctx context.Context) ([]GPU, error) {
	pol, err := LoadPolicy(p.cfg.PolicyPath)
	if err != nil {
		return nil, err
	}
	devs, err := p.cfg.GPUs.Devices(ctx)
	if err != nil {
		return nil, err
	}
	for i := range devs {
		p.judge(&devs[i], pol)
	}
	return devs, nil
}

func (p *Prober) gpus(ctx context.Context, pol Policy) GPUs {
	nodes, _ := filepath.Glob(p.hostPath("/dev/nvidia[0-9]*"))
	devs, err := p.cfg.GPUs.Devices(ctx)
	if err != nil {
		if len(nodes) > 0 {
			why := fmt.Sprintf("%v, but %d /dev/nvidia* device node(s) exist: GPUs are present and cannot be inspected", err, len(nodes))
			return GPUs{Count: Unknown("nvml", "%s", why), Usable: Unknown("nvml", "%s", why), VRAM: Unknown("nvml", "%s", why), Reason: why}
		}
		why := fmt.Sprintf("no GPUs: %v and no /dev/nvidia* device nodes", err)
		return GPUs{Count: Known(0, "/dev/nvidia*"), Usable: Known(0, "/dev/nvidia*"), VRAM: Known(0, "/dev/nvidia*"), Reason: why, Devices: []GPU{}}
	}
	g := GPUs{Count: Known(int64(len(devs)), "nvml"), Devices: devs}
	usable, vram, broken := 0, int64(0), 0
	for i := range devs {
		d := &g.Devices[i]
		p.judge(d, pol)
		if d.Error != "" {
			broken++
		}
		if d.Usable {
			usable++
			vram += d.MemFree
		}
	}
	if broken > 0 {
		why := fmt.Sprintf("%d device(s) answered with an error", broken)
		g.Usable, g.VRAM, g.Reason = Unknown("nvml", "%s", why), Unknown("nvml", "%s", why), why
		return g
	}
	g.Usable, g.VRAM = Known(int64(usable), "nvml"), Known(vram, "nvml memory info")
	return g
}

// judge decides whether a device may take shards. Free VRAM is not an idle
// GPU: another user's process on it makes it unusable unless the policy
// allows sharing.
func (p *Prober) judge(d *GPU, pol Policy) {
	for j := range d.Processes {
		d.Processes[j].UID = p.uidOf(d.Processes[j].PID)
	}
	switch {
	case d.Error != "":
		d.Why = "device error: " + d.Error + " (unknown, not idle)"
	case d.RemapFailed:
		d.Why = "row remapping failed: the device needs service"
	case d.RemapPending || d.RetirePend:
		d.Why = "page retirement or row remapping pending: reset required"
	case d.ECCVolatile > 0:
		d.Why = fmt.Sprintf("%d uncorrected ECC errors since boot", d.ECCVolatile)
	case d.MIG:
		d.Why = "MIG mode: schedule MIG instances by UUID, not the whole device"
	case len(d.Processes) > 0 && !pol.ShareGPUs:
		d.Why = fmt.Sprintf("busy: %d process(es) of other jobs hold %s", len(d.Processes), stream.FormatSize(sumMem(d.Processes)))
	default:
		d.Usable = true
	}
}

func sumMem(ps []GPUProcess) int64 {
	var n int64
	for _, p := range ps {
		n += p.Mem
	}
	return n
}

func (p *Prober) uidOf(pid int) int { return p.uidIn(filepath.Join(p.cfg.ProcRoot, strconv.Itoa(pid))) }

// uidIn is the real uid in the status file of a /proc/<pid> directory, or
// -1.
func (p *Prober) uidIn(dir string) int { return p.statusField(dir, "Uid:") }

// statusField is the first number of a line of the status file of a
// /proc/<pid> directory ("Uid:", "Pid:"), or -1.
func (p *Prober) statusField(dir, key string) int {
	b, err := p.read(filepath.Join(dir, "status"))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			if f := strings.Fields(v); len(f) > 0 {
				n, err := strconv.Atoi(f[0])
				if err == nil {
					return n
				}
			}
		}
	}
	return -1
}
