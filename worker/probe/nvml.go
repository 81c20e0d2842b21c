//go:build nvml

package probe

import (
	"context"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// DefaultGPUs is the NVML adapter of this build (tag nvml): it loads
// libnvidia-ml at run time, so the binary also runs where there is none.
func DefaultGPUs() GPUSource { return nvmlSource{} }

type nvmlSource struct{}

var _ GPUSource = nvmlSource{}

// Devices reads every device. A library that cannot be loaded is
// ErrNVMLMissing; a device that answers with an error is returned with
// Error set so that it counts as unknown, not idle. Calls that a device
// does not support (ECC on consumer cards, remapping on older ones) are
// left at their zero value.
func (nvmlSource) Devices(ctx context.Context) ([]GPU, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, fmt.Errorf("%w: %s", ErrNVMLMissing, nvml.ErrorString(ret))
		}
		return nil, fmt.Errorf("nvml init: %s", nvml.ErrorString(ret))
	}
	defer nvml.Shutdown()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device count: %s", nvml.ErrorString(ret))
	}
	out := make([]GPU, 0, n)
	for i := range n {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		g := GPU{Index: i, Processes: []GPUProcess{}}
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			g.Error = nvml.ErrorString(ret)
			out = append(out, g)
			continue
		}
		g.UUID, _ = dev.GetUUID()
		g.Name, _ = dev.GetName()
		mem, ret := dev.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			g.Error = "memory info: " + nvml.ErrorString(ret)
			out = append(out, g)
			continue
		}
		g.MemTotal, g.MemFree, g.MemUsed = int64(mem.Total), int64(mem.Free), int64(mem.Used)
		if u, ret := dev.GetUtilizationRates(); ret == nvml.SUCCESS {
			g.UtilGPU, g.UtilMem = int(u.Gpu), int(u.Memory)
		}
		for _, k := range []struct {
			kind string
			get  func() ([]nvml.ProcessInfo, nvml.Return)
		}{{"compute", dev.GetComputeRunningProcesses}, {"graphics", dev.GetGraphicsRunningProcesses}, {"mps", dev.GetMPSComputeRunningProcesses}} {
			ps, ret := k.get()
			if ret != nvml.SUCCESS {
				continue
			}
			for _, p := range ps {
				g.Processes = append(g.Processes, GPUProcess{PID: int(p.Pid), Mem: int64(p.UsedGpuMemory), Kind: k.kind})
			}
		}
		if v, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC); ret == nvml.SUCCESS {
			g.ECCVolatile = int64(v)
		}
		if v, ret := dev.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.AGGREGATE_ECC); ret == nvml.SUCCESS {
			g.ECCAggregate = int64(v)
		}
		if pages, ret := dev.GetRetiredPages(nvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR); ret == nvml.SUCCESS {
			g.RetiredPages = len(pages)
		}
		if st, ret := dev.GetRetiredPagesPendingStatus(); ret == nvml.SUCCESS {
			g.RetirePend = st == nvml.FEATURE_ENABLED
		}
		if _, _, pending, failed, ret := dev.GetRemappedRows(); ret == nvml.SUCCESS {
			g.RemapPending, g.RemapFailed = pending, failed
		}
		if st, ret := dev.GetPersistenceMode(); ret == nvml.SUCCESS {
			g.Persistence = st == nvml.FEATURE_ENABLED
		}
		if cur, _, ret := dev.GetMigMode(); ret == nvml.SUCCESS && cur == nvml.DEVICE_MIG_ENABLE {
			g.MIG = true
			if max, ret := dev.GetMaxMigDeviceCount(); ret == nvml.SUCCESS {
				for j := range max {
					mig, ret := dev.GetMigDeviceHandleByIndex(j)
					if ret != nvml.SUCCESS {
						continue
					}
					md := MIGDevice{}
					md.UUID, _ = mig.GetUUID()
					if mm, ret := mig.GetMemoryInfo(); ret == nvml.SUCCESS {
						md.MemTotal, md.MemUsed = int64(mm.Total), int64(mm.Used)
					}
					g.MIGDevices = append(g.MIGDevices, md)
				}
			}
		}
		out = append(out, g)
	}
	return out, nil
}
