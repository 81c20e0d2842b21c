package probe

import (
	"context"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
)

// Config configures a Prober. Zero values mean the real host.
type Config struct {
	// Root is where the host's files are read from (fixtures set a
	// testdata tree). Default "/".
	Root string
	// ProcRoot and SysRoot are /proc and /sys inside Root.
	ProcRoot, SysRoot string
	// PID is whose cgroups and affinity are read: "self" by default.
	PID string
	// GPUs lists devices. Default: DefaultGPUs() of this build.
	GPUs GPUSource
	// StatFS answers statfs(2). Default: the real syscall.
	StatFS StatFS
	// PathTimeout bounds each storage probe. Default 2s.
	PathTimeout time.Duration
	// Getenv reads SLURM_* and XDG variables. Default os.Getenv.
	Getenv func(string) string
	// PolicyPath is the policy file. Default: DefaultPolicyPath.
	PolicyPath string
	// Users turns on the per-user load scan (the full snapshot); the
	// worker's periodic report leaves it off.
	Users bool
	// SlurmJob reads a Slurm job's record, for its memory allocation where
	// no SLURM_MEM_* variable gives it. Default Scontrol.
	SlurmJob SlurmJob
	// CPUUse measures the CPU others use on the host (a CPUMeter); the
	// CPU budget is then also bounded by the CPUs they leave, where no
	// allocation of its own bounds it. Nil: not measured, as for a
	// one-off look (plan, preflight), which has no window to average over.
	CPUUse CPUUse
}

// Prober takes snapshots.
type Prober struct {
	cfg      Config
	slurmMem slurmMemory
}

// New validates cfg; it does no I/O.
func New(cfg Config) (*Prober, error) {
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.ProcRoot == "" {
		cfg.ProcRoot = "/proc"
	}
	if cfg.SysRoot == "" {
		cfg.SysRoot = "/sys"
	}
	if cfg.PID == "" {
		cfg.PID = "self"
	}
	if cfg.GPUs == nil {
		cfg.GPUs = DefaultGPUs()
	}
	if cfg.StatFS == nil {
		cfg.StatFS = SysStatFS{}
	}
	if cfg.PathTimeout <= 0 {
		cfg.PathTimeout = 2 * time.Second
	}
	if cfg.Getenv == nil {
		cfg.Getenv = os.Getenv
	}
	if cfg.SlurmJob == nil {
		cfg.SlurmJob = Scontrol
	}
	if cfg.PolicyPath == "" {
		cfg.PolicyPath = DefaultPolicyPath(cfg.Getenv)
	}
	return &Prober{cfg: cfg}, nil
}

// Snapshot is one timestamped look at the host. See docs/preflight.md.
type Snapshot struct {
	V        int        `json:"v"`
	Host     Host       `json:"host"`
	Hostname string     `json:"hostname"`
	BootID   string     `json:"boot_id"`
	Time     time.Time  `json:"time"`
	Seconds  float64    `json:"seconds"`
	Cgroups  Cgroups    `json:"cgroups"`
	PSI      PSI        `json:"pressure"`
	Users    []UserLoad `json:"users,omitempty"`
	UsersSec float64    `json:"users_window_seconds,omitempty"`
	Procs    int        `json:"processes,omitempty"`
	GPUs     GPUs       `json:"gpus"`
	Storage  []PathInfo `json:"storage"`
	Slurm    *Slurm     `json:"slurm,omitempty"`
	Policy   Policy     `json:"policy"`
	Budget   Budget     `json:"budget"`
	Errors   []string   `json:"errors,omitempty"`
}

// PolicyPath is the policy file this prober reads.
func (p *Prober) PolicyPath() string { return p.cfg.PolicyPath }

// Snapshot reads everything once. paths names the storage to probe
// (inputs, scratch, output, checkpoints).
func (p *Prober) Snapshot(ctx context.Context, paths map[string]string) (*Snapshot, error) {
	start := time.Now()
	s := &Snapshot{V: 1, Time: start.UTC()}
	var before map[int]procSample
	if p.cfg.Users {
		before, _ = p.sampleProcs()
	}
	pol, err := LoadPolicy(p.cfg.PolicyPath)
	if err != nil {
		return nil, err
	}
	s.Policy = pol
	s.Hostname, _ = os.Hostname()
	if b, err := p.read(path.Join(p.cfg.ProcRoot, "sys/kernel/random/boot_id")); err == nil {
		s.BootID = strings.TrimSpace(string(b))
	}
	mounts, err := p.mounts()
	if err != nil {
		s.Errors = append(s.Errors, err.Error())
	}
	s.Host = p.host()
	if p.cfg.CPUUse != nil {
		o := p.cfg.CPUUse.Others()
		s.Host.OthersCPU = &o
	}
	s.Cgroups = p.cgroups(mounts)
	s.PSI = p.hostPSI()
	s.GPUs = p.gpus(ctx, pol)
	s.Storage = p.storage(ctx, mounts, paths)
	s.Slurm = p.slurm(ctx, s.Cgroups)
	if p.cfg.Users {
		if before == nil {
			s.Errors = append(s.Errors, "per-user load: /proc unreadable")
		} else {
			// A short window gives every user's CPU rate a denominator.
			if wait := 25*time.Millisecond - time.Since(start); wait > 0 {
				time.Sleep(wait)
			}
			after, err := p.sampleProcs()
			if err == nil {
				win := time.Since(start).Seconds()
				s.Users, s.UsersSec, s.Procs = usersLoad(before, after, win), win, len(after)
			}
		}
	}
	s.Budget = p.budget(s)
	s.Seconds = time.Since(start).Seconds()
	return s, nil
}

// read reads a file below Root.
// mounts reads the probed process's mountinfo. On error the mounts read so
// far come back with it; storage types then rest on statfs alone.
func (p *Prober) mounts() ([]Mount, error) {
	mi := path.Join(p.procDir(), "mountinfo")
	f, err := os.Open(p.hostPath(mi))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", mi, err)
	}
	defer f.Close()
	mounts, err := parseMountinfo(f)
	if err != nil {
		return mounts, fmt.Errorf("%s: %w", mi, err)
	}
	return mounts, nil
}

func (p *Prober) read(name string) ([]byte, error) { return os.ReadFile(p.hostPath(name)) }

// hostPath maps an absolute path of the probed host to a path here.
func (p *Prober) hostPath(name string) string {
	if p.cfg.Root == "/" {
		return name
	}
	return filepath.Join(p.cfg.Root, name)
}

// guestPath maps back a path found here to the probed host's.
func (p *Prober) guestPath(name string) string {
	if p.cfg.Root == "/" {
		return name
	}
	rel, err := filepath.Rel(p.cfg.Root, name)
	if err != nil || strings.HasPrefix(rel, "..") {
		return name
	}
	return "/" + rel
}

func (p *Prober) procDir() string { return path.Join(p.cfg.ProcRoot, p.cfg.PID) }

// real reports whether the probe looks at this very process on this host.
func (p *Prober) real() bool { return p.cfg.Root == "/" && p.cfg.PID == "self" }

// Full is a prober like p that also scans other users' load: the whole
// snapshot, as `shardpool preflight` takes it, for evidence.
func (p *Prober) Full() *Prober {
	cfg := p.cfg
	cfg.Users = true
	return &Prober{cfg: cfg}
}

// Existing replaces each path that does not exist (yet: an output
// directory before the first commit) with its nearest existing ancestor,
// whose storage it will be on.
func Existing(paths map[string]string) {
	for name, p := range paths {
		for p != "/" && p != "." {
			if _, err := os.Stat(p); err == nil {
				break
			}
			p = filepath.Dir(p)
		}
		paths[name] = p
	}
}
