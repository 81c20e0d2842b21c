package probe

import (
	"regexp"
	"strconv"
	"strings"
)

// Slurm is the allocation this process runs in, from SLURM_* variables and
// the job's cgroup.
type Slurm struct {
	JobID  string `json:"job_id"`
	CPUs   Value  `json:"cpus"`
	Memory Value  `json:"memory"`
	GPUs   Value  `json:"gpus"`
	Cgroup string `json:"cgroup,omitempty"`
}

var slurmJobRE = regexp.MustCompile(`/job_(\d+)(/|$)`)

func (p *Prober) slurm(cg Cgroups) *Slurm {
	env := p.cfg.Getenv
	id := env("SLURM_JOB_ID")
	if id == "" {
		return nil
	}
	s := &Slurm{JobID: id}
	if n, err := strconv.Atoi(env("SLURM_CPUS_ON_NODE")); err == nil {
		s.CPUs = Known(int64(n), "SLURM_CPUS_ON_NODE")
	} else {
		s.CPUs = Unknown("SLURM_CPUS_ON_NODE", "not set in the allocation")
	}
	switch {
	case env("SLURM_MEM_PER_NODE") != "":
		if mb, err := strconv.ParseInt(env("SLURM_MEM_PER_NODE"), 10, 64); err == nil {
			s.Memory = Known(mb<<20, "SLURM_MEM_PER_NODE")
		} else {
			s.Memory = Unknown("SLURM_MEM_PER_NODE", "unparsable %q", env("SLURM_MEM_PER_NODE"))
		}
	case env("SLURM_MEM_PER_CPU") != "" && s.CPUs.IsKnown():
		if mb, err := strconv.ParseInt(env("SLURM_MEM_PER_CPU"), 10, 64); err == nil {
			s.Memory = Known(mb<<20*s.CPUs.N, "SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE")
		} else {
			s.Memory = Unknown("SLURM_MEM_PER_CPU", "unparsable")
		}
	default:
		s.Memory = Unlimited("no SLURM_MEM_* variable (the job cgroup still applies)")
	}
	switch g := env("SLURM_GPUS_ON_NODE"); {
	case g != "":
		if n, err := strconv.Atoi(g); err == nil {
			s.GPUs = Known(int64(n), "SLURM_GPUS_ON_NODE")
		} else {
			s.GPUs = Unknown("SLURM_GPUS_ON_NODE", "unparsable %q", g)
		}
	case env("SLURM_JOB_GPUS") != "":
		s.GPUs = Known(int64(len(strings.Split(env("SLURM_JOB_GPUS"), ","))), "SLURM_JOB_GPUS")
	default:
		s.GPUs = Known(0, "no SLURM_GPUS_ON_NODE or SLURM_JOB_GPUS: the allocation has no GPUs")
	}
	for _, path := range []string{cg.MemoryPath, cg.CPUPath} {
		if m := slurmJobRE.FindStringSubmatch(path); m != nil {
			s.Cgroup = path
			break
		}
	}
	return s
}
