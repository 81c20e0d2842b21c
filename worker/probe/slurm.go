package probe

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Slurm is the allocation this process runs in, from SLURM_* variables,
// the job's record in slurmctld (scontrol) and the job's cgroup.
type Slurm struct {
	JobID  string `json:"job_id"`
	CPUs   Value  `json:"cpus"`
	Memory Value  `json:"memory"`
	GPUs   Value  `json:"gpus"`
	Cgroup string `json:"cgroup,omitempty"`
}

var slurmJobRE = regexp.MustCompile(`/job_(\d+)(/|$)`)

// SlurmJob returns the one-line record of a Slurm job, as `scontrol show
// job -o ID` prints it.
type SlurmJob func(ctx context.Context, id string) ([]byte, error)

// Scontrol runs `scontrol show job -o ID`.
func Scontrol(ctx context.Context, id string) ([]byte, error) {
	return scontrol(ctx, "show", "job", "-o", id)
}

// scontrol runs scontrol with args (argv, no shell) for at most 5 s; an
// error carries what it said on stderr.
func scontrol(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "scontrol", args...).Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok && len(ee.Stderr) > 0 {
			return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(string(ee.Stderr)))
		}
		return nil, err
	}
	return out, nil
}

// slurmMemory is the job's memory allocation per node, read from its
// record once (it does not change while the job runs) and remembered; a
// failed read is tried again after a minute.
type slurmMemory struct {
	mu     sync.Mutex
	job    string
	v      Value
	failed time.Time
}

func (p *Prober) slurm(ctx context.Context, cg Cgroups) *Slurm {
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
	for _, path := range []string{cg.MemoryPath, cg.CPUPath} {
		if m := slurmJobRE.FindStringSubmatch(path); m != nil {
			s.Cgroup = path
			break
		}
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
		// sbatch and salloc set SLURM_MEM_*; a job that srun allocated
		// itself (`srun --mem=4G shardpool worker`) has none: its record
		// in slurmctld says.
		s.Memory = p.slurmJobMemory(ctx, id, s)
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
	return s
}

// slurmJobMemory reads the job's memory per node from its record
// (remembered per job, see slurmMemory).
func (p *Prober) slurmJobMemory(ctx context.Context, id string, s *Slurm) Value {
	m := &p.slurmMem
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.job == id && (m.failed.IsZero() || time.Since(m.failed) < time.Minute) {
		return m.v
	}
	out, err := p.cfg.SlurmJob(ctx, id)
	var v Value
	if err == nil {
		v, err = jobMemory(string(out), s.CPUs)
	}
	m.job, m.failed = id, time.Time{}
	switch {
	case err == nil:
		m.v = v
	case s.Cgroup != "":
		// The job's cgroup is found and bounds memory where the site
		// constrains it (the cgroup limit is in the budget on its own).
		m.v, m.failed = Unlimited(fmt.Sprintf("no SLURM_MEM_* variable and scontrol show job %s: %v; the job cgroup applies", id, err)), time.Now()
	default:
		m.v, m.failed = Unknown("scontrol show job "+id, "no SLURM_MEM_* variable, no job cgroup found, and the job's record unreadable: %v", err), time.Now()
	}
	return m.v
}

// jobMemory reads the memory per node of a job from its `scontrol show
// job -o` record: MinMemoryNode, or MinMemoryCPU times the CPUs on this
// node. MinMemoryNode=0 is a job that asked for no memory: where memory is
// a consumable resource it may use the node's, and where it is not,
// Slurm does not limit it.
func jobMemory(record string, cpus Value) (Value, error) {
	fields := map[string]string{}
	for _, f := range strings.Fields(record) {
		if k, v, ok := strings.Cut(f, "="); ok {
			fields[k] = v
		}
	}
	if v, ok := fields["MinMemoryNode"]; ok {
		b, err := slurmSize(v)
		switch {
		case err != nil:
			return Value{}, fmt.Errorf("MinMemoryNode=%s: %v", v, err)
		case b == 0:
			return Unlimited("scontrol show job: MinMemoryNode=0, no memory asked for (the node's)"), nil
		}
		return Known(b, "scontrol show job: MinMemoryNode="+v), nil
	}
	if v, ok := fields["MinMemoryCPU"]; ok {
		b, err := slurmSize(v)
		if err != nil {
			return Value{}, fmt.Errorf("MinMemoryCPU=%s: %v", v, err)
		}
		if !cpus.IsKnown() {
			return Unknown("scontrol show job", "MinMemoryCPU=%s and SLURM_CPUS_ON_NODE unknown", v), nil
		}
		return Known(b*cpus.N, "scontrol show job: MinMemoryCPU="+v+" x SLURM_CPUS_ON_NODE"), nil
	}
	if _, ok := fields["JobId"]; !ok {
		return Value{}, fmt.Errorf("not a job record: %.80q", record)
	}
	return Value{}, fmt.Errorf("the record has neither MinMemoryNode nor MinMemoryCPU")
}

// slurmSize reads a Slurm memory size: a number of MiB, or with a binary
// suffix K, M, G, T or P ("1.50G", "700M", "0").
func slurmSize(s string) (int64, error) {
	mult := float64(1 << 20)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'K', 'k':
			mult, s = 1<<10, s[:n-1]
		case 'M', 'm':
			mult, s = 1<<20, s[:n-1]
		case 'G', 'g':
			mult, s = 1<<30, s[:n-1]
		case 'T', 't':
			mult, s = 1<<40, s[:n-1]
		case 'P', 'p':
			mult, s = 1<<50, s[:n-1]
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || !(f >= 0) || f*mult > 1<<62 {
		return 0, fmt.Errorf("not a size")
	}
	return int64(f * mult), nil
}

// SlurmKillWait is how long Slurm waits between the SIGTERM and the
// SIGKILL of a job's processes when it ends the job (scancel, preemption,
// time limit): KillWait of `scontrol show config`.
func SlurmKillWait(ctx context.Context) (time.Duration, error) {
	out, err := scontrol(ctx, "show", "config")
	if err != nil {
		return 0, fmt.Errorf("scontrol show config: %w", err)
	}
	return killWait(string(out))
}

// killWait reads KillWait ("KillWait = 30 sec") from `scontrol show
// config`.
func killWait(config string) (time.Duration, error) {
	for _, line := range strings.Split(config, "\n") {
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.TrimSpace(k) != "KillWait" {
			continue
		}
		f := strings.Fields(v)
		if len(f) > 0 {
			if n, err := strconv.Atoi(f[0]); err == nil && n >= 0 {
				return time.Duration(n) * time.Second, nil
			}
		}
		return 0, fmt.Errorf("scontrol show config: KillWait %q is not a number of seconds", strings.TrimSpace(v))
	}
	return 0, fmt.Errorf("scontrol show config: no KillWait")
}
