package probe

import (
	"fmt"
	"strings"
)

// Limit is one bound on a resource, with where it applies.
type Limit struct {
	Scope string `json:"scope"` // host, affinity, cgroup <path>, allocation, policy, headroom
	Value Value  `json:"value"`
}

// Line is the effective budget of one resource: the tightest limit, minus
// the reserve. Unknown anywhere makes it unknown.
type Line struct {
	Effective Value   `json:"effective"`
	Binding   string  `json:"binding"`
	Reserve   int64   `json:"reserve"`
	Limits    []Limit `json:"limits"`
}

// Budget is the effective budget per resource. CPU is in millicores.
// Hard is capacity rather than headroom (the CPUs whether others use them
// or not, MemTotal instead of MemAvailable,
// every healthy GPU whether busy or not, the largest device's memory): a
// shard beyond Hard can never run here, while one beyond the budget may run
// once other work ends.
type Budget struct {
	CPU    Line `json:"cpu_millicores"`
	Memory Line `json:"memory"`
	GPUs   Line `json:"gpus"`
	VRAM   Line `json:"vram"`
	Hard   struct {
		CPU    Line `json:"cpu_millicores"`
		Memory Line `json:"memory"`
		GPUs   Line `json:"gpus"`
		VRAM   Line `json:"vram_per_shard"`
	} `json:"hard"`
}

func line(reserve int64, limits ...Limit) Line {
	l := Line{Reserve: reserve, Limits: limits}
	eff := Unlimited("no limit found")
	for _, lim := range limits {
		before := eff
		eff = tighter(eff, lim.Value)
		if eff != before || (lim.Value.IsUnknown() && l.Binding == "") {
			l.Binding = lim.Scope
		}
		if eff.IsUnknown() {
			l.Binding = lim.Scope
			break
		}
	}
	if eff.IsKnown() {
		eff = Known(max(eff.N-reserve, 0), fmt.Sprintf("%s minus reserve %d", l.Binding, reserve))
	}
	l.Effective = eff
	return l
}

func times1000(v Value) Value {
	if v.IsKnown() {
		v.N *= 1000
	}
	return v
}

// policyLimit is a cap of the policy file, named "policy tier NAME"
// where this host's tier set it: status shows a fleet's workers each
// with what binds it, and which tier did is what differs among them.
func policyLimit(pol Policy, v Value) Limit {
	if pol.Tier != "" && strings.HasSuffix(v.Source, " tier "+pol.Tier) {
		return Limit{"policy tier " + pol.Tier, v}
	}
	return Limit{"policy", v}
}

func (p *Prober) budget(s *Snapshot) Budget {
	var b Budget
	cpu := []Limit{{"host online CPUs", times1000(s.Host.OnlineCPUs)}, {"affinity", times1000(s.Host.Affinity)},
		{"cgroup cpuset", times1000(s.Cgroups.Cpuset)}, {scoped("cgroup cpu quota", s.Cgroups.CPUBinds), s.Cgroups.CPUQuota}}
	mem := []Limit{{"host MemAvailable (physical headroom)", s.Host.MemAvailable}, {scoped("cgroup memory", s.Cgroups.MemoryBinds), s.Cgroups.MemoryLimit}}
	gpus := []Limit{{"usable GPUs", s.GPUs.Usable}}
	vram := []Limit{{"free VRAM of usable GPUs", s.GPUs.VRAM}}
	if s.Slurm != nil {
		job := "Slurm job " + s.Slurm.JobID
		cpu = append(cpu, Limit{job, times1000(s.Slurm.CPUs)})
		mem = append(mem, Limit{job, s.Slurm.Memory})
		gpus = append(gpus, Limit{job, s.Slurm.GPUs})
	}
	pol := s.Policy
	cpu = append(cpu, policyLimit(pol, pol.CPUs))
	b.Hard.CPU = line(pol.ReserveCPU, cpu...)
	if o := s.Host.OthersCPU; o != nil && !allocated(s) {
		cpu = append(cpu, othersLimit(s.Host.OnlineCPUs, *o))
	}
	mem = append(mem, policyLimit(pol, pol.Memory))
	gpus = append(gpus, policyLimit(pol, pol.GPUs))
	vram = append(vram, policyLimit(pol, pol.VRAM))
	b.CPU = line(pol.ReserveCPU, cpu...)
	b.Memory = line(pol.ReserveMemory, mem...)
	b.GPUs = line(0, gpus...)
	b.VRAM = line(pol.ReserveVRAM, vram...)
	hardMem := append([]Limit{{"host MemTotal", s.Host.MemTotal}}, mem[1:]...)
	b.Hard.Memory = line(pol.ReserveMemory, hardMem...)
	healthy, largest := s.GPUs.Count, s.GPUs.VRAM
	if healthy.IsKnown() {
		n, big := int64(0), int64(0)
		for _, d := range s.GPUs.Devices {
			if d.Error == "" && !d.RemapFailed {
				n++
				big = max(big, d.MemTotal)
			}
		}
		healthy, largest = Known(n, "nvml: healthy devices, busy or not"), Known(big, "nvml: largest healthy device")
	}
	b.Hard.GPUs = line(0, append([]Limit{{"healthy GPUs", healthy}}, gpus[1:]...)...)
	b.Hard.VRAM = line(pol.ReserveVRAM, Limit{"largest GPU", largest}, policyLimit(pol, pol.VRAM))
	return b
}

// allocated reports whether a cpuset, a CPU quota or a Slurm allocation
// gives fewer CPUs than the host has: CPUs set aside for this work, or
// shared by quota with whoever else the allocation holds, where the host's
// other users do not come into it.
func allocated(s *Snapshot) bool {
	online := s.Host.OnlineCPUs
	if !online.IsKnown() {
		return false
	}
	for _, v := range []Value{times1000(s.Cgroups.Cpuset), s.Cgroups.CPUQuota} {
		if v.IsKnown() && v.N < online.N*1000 {
			return true
		}
	}
	return s.Slurm != nil && s.Slurm.CPUs.IsKnown() && s.Slurm.CPUs.N < online.N
}

// othersLimit is the host's CPUs less what others use, counted in whole
// CPUs (to the nearest): the kernel's threads, daemons and an idle
// editor, a few tenths of a CPU, leave every CPU to shardpool, while a
// CPU-bound process of another user takes one.
func othersLimit(online, others Value) Limit {
	if others.IsUnknown() {
		return Limit{ScopeOthers, Unknown(others.Source, "CPU use of others: %s", others.Unknown)}
	}
	if !online.IsKnown() {
		return Limit{ScopeOthers, online}
	}
	counted := (others.N + 500) / 1000
	scope := fmt.Sprintf("%s: %d online less %.2f in use, counted as %d", ScopeOthers, online.N, float64(others.N)/1000, counted)
	return Limit{scope, Known(max(online.N-counted, 0)*1000, others.Source)}
}

func scoped(what, at string) string {
	if at == "" {
		return what
	}
	return what + " at " + at
}
