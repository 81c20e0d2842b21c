package probe

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// fakeStatFS answers statfs by the fixture's mount points.
type fakeStatFS struct {
	root  string
	types map[string]int64 // guest mount point -> magic
}

var _ StatFS = (*fakeStatFS)(nil)

func (f *fakeStatFS) Statfs(p string) (Statfs, error) {
	rel, _ := filepath.Rel(f.root, p)
	guest := "/" + rel
	best, magic := "", int64(0xEF53)
	for mp, m := range f.types {
		if (guest == mp || strings.HasPrefix(guest, mp+"/")) && len(mp) > len(best) {
			best, magic = mp, m
		}
	}
	return Statfs{Type: magic, Bsize: 4096, Blocks: 1 << 20, Bavail: 1 << 19, Files: 1000, Ffree: 900}, nil
}

// fakeGPUs returns fixture devices or an error.
type fakeGPUs struct {
	devs []GPU
	err  error
}

var _ GPUSource = (*fakeGPUs)(nil)

func (f *fakeGPUs) Devices(context.Context) ([]GPU, error) { return f.devs, f.err }

func fixture(t *testing.T, name string, gpus GPUSource, env map[string]string) *Snapshot {
	t.Helper()
	root, _ := filepath.Abs(filepath.Join("testdata", name))
	if gpus == nil {
		gpus = &fakeGPUs{err: ErrNVMLMissing}
	}
	p, err := New(Config{Root: root, GPUs: gpus, Users: true,
		StatFS:     &fakeStatFS{root: root, types: map[string]int64{"/home": 0x6969, "/dev/shm": 0x01021994, "/mnt/my data": 0x65735546, "/mnt/lxc": 0x65735546, "/scratch": 0x58465342}},
		Getenv:     func(k string) string { return env[k] },
		PolicyPath: env["POLICY"]})
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.Snapshot(context.Background(), map[string]string{"inputs": "/data", "scratch": "/scratch", "shm": "/dev/shm", "spaced": "/mnt/my data/set", "lxc": "/mnt/lxc"})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestCgroupFixtures(t *testing.T) {
	cases := []struct {
		name, version, memBinds string
		memLimit                int64
		cpuQuota                int64 // millicores, -1 unlimited
		cpuset                  int64
		workingSet, oomKills    int64
	}{
		// v2: user.slice (8GiB) is tighter than the session scope (16GiB) below it.
		{"v2", "v2", "/user.slice", 8 << 30, 4000, 6, 2 << 30, 2},
		// v1 (Slurm): job_42 (4GiB, 2 CPUs) is tighter than its step and task.
		{"v1", "v1", "/slurm/uid_1000/job_42", 4 << 30, 2000, 4, 1<<30 - 256<<20, 1},
		// hybrid: v1 memory controller, empty cgroup2 hierarchy.
		{"hybrid", "hybrid", "/process_api", 2 << 30, -1, 16, 104857600 - 4857600, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := fixture(t, c.name, nil, nil)
			cg := s.Cgroups
			if cg.Version != c.version {
				t.Errorf("version: got %s, want %s", cg.Version, c.version)
			}
			if !cg.MemoryLimit.IsKnown() || cg.MemoryLimit.N != c.memLimit || cg.MemoryBinds != c.memBinds {
				t.Errorf("memory limit: got %+v binding at %q, want %d at %q", cg.MemoryLimit, cg.MemoryBinds, c.memLimit, c.memBinds)
			}
			if c.cpuQuota < 0 {
				if !cg.CPUQuota.Unlimited {
					t.Errorf("cpu quota: got %+v, want unlimited", cg.CPUQuota)
				}
			} else if cg.CPUQuota.N != c.cpuQuota {
				t.Errorf("cpu quota: got %+v, want %d millicores", cg.CPUQuota, c.cpuQuota)
			}
			if cg.Cpuset.N != c.cpuset {
				t.Errorf("cpuset: got %+v, want %d", cg.Cpuset, c.cpuset)
			}
			if cg.WorkingSet.N != c.workingSet || cg.OOMKills.N != c.oomKills {
				t.Errorf("working set %+v oom %+v, want %d and %d", cg.WorkingSet, cg.OOMKills, c.workingSet, c.oomKills)
			}
			// The budget names the binding limit.
			if s.Budget.Memory.Effective.N != c.memLimit || !strings.Contains(s.Budget.Memory.Binding, c.memBinds) {
				t.Errorf("memory budget: %+v binding %q, want %d bound by %s", s.Budget.Memory.Effective, s.Budget.Memory.Binding, c.memLimit, c.memBinds)
			}
		})
	}
}

func TestPSIPresentAbsentUnreadable(t *testing.T) {
	s := fixture(t, "v2", nil, nil)
	if s.PSI.MemorySome10.F != 12.25 || s.PSI.MemoryFull10.F != 4.75 || s.PSI.CPUSome10.Unknown != "" {
		t.Errorf("host PSI: got %+v", s.PSI)
	}
	if s.Cgroups.PSI.MemorySome10.F != 20 {
		t.Errorf("cgroup PSI: got %+v, want memory some 20", s.Cgroups.PSI.MemorySome10)
	}
	s = fixture(t, "v1", nil, nil)
	if !strings.Contains(s.PSI.MemorySome10.Unknown, "absent") {
		t.Errorf("absent PSI: got %+v, want unknown (absent)", s.PSI.MemorySome10)
	}
	s = fixture(t, "hybrid", nil, nil)
	if s.PSI.MemorySome10.Unknown == "" || strings.Contains(s.PSI.MemorySome10.Unknown, "absent") {
		t.Errorf("unreadable PSI: got %+v, want unknown with the read error", s.PSI.MemorySome10)
	}
	if s.PSI.CPUSome10.Unknown != "" || s.PSI.CPUSome10.F != 1.5 {
		t.Errorf("readable cpu PSI next to an unreadable one: got %+v", s.PSI.CPUSome10)
	}
}

func TestStorageTypes(t *testing.T) {
	s := fixture(t, "v2", nil, nil)
	got := map[string]PathInfo{}
	for _, p := range s.Storage {
		got[p.Name] = p
	}
	cases := []struct {
		name, resolved, typ, sub, loc, mount string
	}{
		{"inputs", "/home/alice/data", "nfs4", "", Network, "/home"}, // a symlink that lands on NFS
		{"scratch", "/scratch", "xfs", "", Local, "/scratch"},
		{"shm", "/dev/shm", "tmpfs", "", Local, "/dev/shm"},
		{"spaced", "/mnt/my data/set", "fuse", "sshfs", Network, "/mnt/my data"}, // escaped space in mountinfo
		{"lxc", "/mnt/lxc", "fuse", "lxcfs", Local, "/mnt/lxc"},
	}
	for _, c := range cases {
		p := got[c.name]
		if p.Resolved != c.resolved || p.Type != c.typ || p.Subtype != c.sub || p.Locality != c.loc || p.MountPoint != c.mount {
			t.Errorf("%s: got resolved %q type %q.%q locality %s mount %q; want %q %q.%q %s %q",
				c.name, p.Resolved, p.Type, p.Subtype, p.Locality, p.MountPoint, c.resolved, c.typ, c.sub, c.loc, c.mount)
		}
		if p.BytesFree.N != (1<<19)*4096 || p.InodesFree.N != 900 {
			t.Errorf("%s: free %+v inodes %+v", c.name, p.BytesFree, p.InodesFree)
		}
	}
}

// blockingStatFS never answers, like statfs on a dead NFS server.
type blockingStatFS struct{ release chan struct{} }

func (b *blockingStatFS) Statfs(string) (Statfs, error) {
	<-b.release
	return Statfs{}, errors.New("released")
}

func TestHungMountIsUnknownNotAHang(t *testing.T) {
	root, _ := filepath.Abs("testdata/v2")
	b := &blockingStatFS{release: make(chan struct{})}
	defer close(b.release)
	p, _ := New(Config{Root: root, StatFS: b, GPUs: &fakeGPUs{err: ErrNVMLMissing}, PathTimeout: 100 * 1e6})
	s, err := p.Snapshot(context.Background(), map[string]string{"inputs": "/data"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Storage[0].Unknown == "" || !s.Storage[0].BytesFree.IsUnknown() {
		t.Fatalf("hung mount: got %+v, want unknown", s.Storage[0])
	}
	if s.Seconds > 2 {
		t.Fatalf("snapshot took %.1fs with a hung mount, want about the 100ms deadline", s.Seconds)
	}
}

func gpuFixture(t *testing.T) []GPU {
	t.Helper()
	b, err := os.ReadFile("testdata/gpus.json")
	if err != nil {
		t.Fatal(err)
	}
	var devs []GPU
	if err := json.Unmarshal(b, &devs); err != nil {
		t.Fatal(err)
	}
	return devs
}

func TestGPUs(t *testing.T) {
	devs := gpuFixture(t)
	s := fixture(t, "v2", &fakeGPUs{devs: devs[:3]}, nil)
	byUUID := map[string]GPU{}
	for _, d := range s.GPUs.Devices {
		byUUID[d.Name+"/"+d.UUID] = d
	}
	idle, busy, mig := s.GPUs.Devices[0], s.GPUs.Devices[1], s.GPUs.Devices[2]
	if !idle.Usable {
		t.Errorf("idle GPU: not usable: %s", idle.Why)
	}
	if busy.Usable || !strings.Contains(busy.Why, "busy") {
		t.Errorf("busy GPU with %s free: usable %v (%s), want not usable because busy", stream.FormatSize(busy.MemFree), busy.Usable, busy.Why)
	}
	if mig.Usable || !strings.Contains(mig.Why, "MIG") || len(mig.MIGDevices) != 2 {
		t.Errorf("MIG GPU: usable %v (%s) with %d instances", mig.Usable, mig.Why, len(mig.MIGDevices))
	}
	if s.GPUs.Usable.N != 1 || s.GPUs.VRAM.N != idle.MemFree || s.Budget.GPUs.Effective.N != 1 {
		t.Errorf("usable %+v vram %+v budget %+v, want 1 GPU with the idle one's free memory", s.GPUs.Usable, s.GPUs.VRAM, s.Budget.GPUs.Effective)
	}
	// A lost GPU makes the count of usable GPUs unknown, not smaller.
	s = fixture(t, "v2", &fakeGPUs{devs: devs}, nil)
	if !s.GPUs.Usable.IsUnknown() || !s.Budget.GPUs.Effective.IsUnknown() || s.Budget.VRAM.Effective.IsKnown() {
		t.Errorf("lost GPU: usable %+v budget %+v, want unknown", s.GPUs.Usable, s.Budget.GPUs.Effective)
	}
	// The policy may allow sharing: then the busy GPU counts.
	pol := filepath.Join(t.TempDir(), "policy.toml")
	os.WriteFile(pol, []byte("[gpu]\nshare = true\n[caps]\ngpus = 1\n"), 0o644)
	s = fixture(t, "v2", &fakeGPUs{devs: devs[:2]}, map[string]string{"POLICY": pol})
	if s.GPUs.Usable.N != 2 || s.Budget.GPUs.Effective.N != 1 || s.Budget.GPUs.Binding != "policy" {
		t.Errorf("shared: usable %+v budget %+v bound by %q, want 2 usable, budget 1 by policy", s.GPUs.Usable, s.Budget.GPUs.Effective, s.Budget.GPUs.Binding)
	}
}

func TestMissingNVMLWithAndWithoutDeviceNodes(t *testing.T) {
	s := fixture(t, "v2", &fakeGPUs{err: ErrNVMLMissing}, nil)
	if !s.GPUs.Count.IsKnown() || s.GPUs.Count.N != 0 || !strings.Contains(s.GPUs.Reason, "no /dev/nvidia") {
		t.Errorf("no library, no nodes: got %+v (%s), want 0 GPUs", s.GPUs.Count, s.GPUs.Reason)
	}
	root, _ := filepath.Abs("testdata/v2")
	dev := filepath.Join(t.TempDir(), "root")
	// A copy of the fixture root with a device node added.
	if err := os.CopyFS(dev, os.DirFS(root)); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dev, "dev"), 0o755)
	os.WriteFile(filepath.Join(dev, "dev", "nvidia0"), nil, 0o644)
	p, _ := New(Config{Root: dev, GPUs: &fakeGPUs{err: ErrNVMLMissing}})
	s, err := p.Snapshot(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !s.GPUs.Count.IsUnknown() || !s.Budget.GPUs.Effective.IsUnknown() {
		t.Errorf("no library but /dev/nvidia0: got count %+v budget %+v, want unknown", s.GPUs.Count, s.Budget.GPUs.Effective)
	}
}

func TestSlurmAllocationBinds(t *testing.T) {
	env := map[string]string{"SLURM_JOB_ID": "42", "SLURM_CPUS_ON_NODE": "2", "SLURM_MEM_PER_NODE": "3072", "SLURM_GPUS_ON_NODE": "0"}
	s := fixture(t, "v1", nil, env)
	if s.Slurm == nil || s.Slurm.JobID != "42" || s.Slurm.Memory.N != 3<<30 || s.Slurm.Cgroup == "" {
		t.Fatalf("slurm: got %+v", s.Slurm)
	}
	if s.Budget.Memory.Effective.N != 3<<30 || s.Budget.Memory.Binding != "Slurm job 42" {
		t.Errorf("memory budget %+v bound by %q, want 3GiB by the allocation", s.Budget.Memory.Effective, s.Budget.Memory.Binding)
	}
}

// A job that srun allocated itself has no SLURM_MEM_* variable; its
// memory comes from its record in slurmctld (fixtures: real `scontrol
// show job -o` output, testdata/slurm/README), read once per job.
func TestSlurmMemoryFromTheJobRecord(t *testing.T) {
	record := func(name string) SlurmJob {
		return func(_ context.Context, id string) ([]byte, error) {
			if id != "6" {
				return nil, fmt.Errorf("asked for job %s", id)
			}
			return os.ReadFile(filepath.Join("testdata", "slurm", name))
		}
	}
	failing := func(context.Context, string) ([]byte, error) {
		return nil, errors.New("exec: \"scontrol\": executable file not found in $PATH")
	}
	cases := []struct {
		name, cgroups, cpus string
		job                 SlurmJob
		mem                 Value
		binding             string
	}{
		{"mem per node", "v2", "1", record("scontrol-mem-per-node.txt"), Known(1536<<20, ""), "Slurm job 6"},
		{"mem per cpu", "v2", "2", record("scontrol-mem-per-cpu.txt"), Known(1400<<20, ""), "Slurm job 6"},
		{"no mem asked", "v2", "1", record("scontrol-no-mem.txt"), Unlimited(""), ""},
		// Unknown is not unlimited: no record and no job cgroup.
		{"no record, no job cgroup", "v2", "1", failing, Unknown("", "x"), ""},
		// The job's cgroup (found in v1's fixture) still bounds memory.
		{"no record, job cgroup", "v1", "1", failing, Unlimited(""), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			root, _ := filepath.Abs(filepath.Join("testdata", c.cgroups))
			calls := 0
			env := map[string]string{"SLURM_JOB_ID": "6", "SLURM_CPUS_ON_NODE": c.cpus}
			p, err := New(Config{Root: root, GPUs: &fakeGPUs{err: ErrNVMLMissing}, StatFS: &fakeStatFS{root: root},
				Getenv: func(k string) string { return env[k] }, PolicyPath: "/nonexistent",
				SlurmJob: func(ctx context.Context, id string) ([]byte, error) { calls++; return c.job(ctx, id) }})
			if err != nil {
				t.Fatal(err)
			}
			var s *Snapshot
			for range 3 {
				if s, err = p.Snapshot(context.Background(), nil); err != nil {
					t.Fatal(err)
				}
			}
			m := s.Slurm.Memory
			if m.IsKnown() != c.mem.IsKnown() || m.Unlimited != c.mem.Unlimited || m.IsUnknown() != c.mem.IsUnknown() || (c.mem.IsKnown() && m.N != c.mem.N) {
				t.Fatalf("slurm memory %+v, want %+v", m, c.mem)
			}
			if c.binding != "" && (s.Budget.Memory.Binding != c.binding || s.Budget.Memory.Effective.N != c.mem.N) {
				t.Errorf("memory budget %+v bound by %q, want %d by %q", s.Budget.Memory.Effective, s.Budget.Memory.Binding, c.mem.N, c.binding)
			}
			if c.mem.IsUnknown() && !s.Budget.Memory.Effective.IsUnknown() {
				t.Errorf("memory budget %+v with the allocation unknown, want unknown", s.Budget.Memory.Effective)
			}
			if calls != 1 {
				t.Errorf("the job's record was read %d times in 3 snapshots, want once", calls)
			}
		})
	}
}

func TestSlurmSizes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "700M": 700 << 20, "1.50G": 1536 << 20, "2048": 2048 << 20, "1T": 1 << 40, "512K": 512 << 10} {
		if got, err := slurmSize(in); err != nil || got != want {
			t.Errorf("slurmSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "G", "-1G", "NaN", "Inf", "1e30T", "12X"} {
		if got, err := slurmSize(in); err == nil {
			t.Errorf("slurmSize(%q) = %d, want an error", in, got)
		}
	}
}

func TestPolicyTightensAndReserves(t *testing.T) {
	pol := filepath.Join(t.TempDir(), "policy.toml")
	os.WriteFile(pol, []byte("[caps]\ncpus = 3\nmemory = \"64GiB\"\n[reserve]\ncpus = 0.5\nmemory = \"1GiB\"\n"), 0o644)
	s := fixture(t, "v2", nil, map[string]string{"POLICY": pol})
	// cpu: the cgroup quota (4) and cpuset (6) are looser than the policy's 3.
	if s.Budget.CPU.Effective.N != 2500 || s.Budget.CPU.Binding != "policy" {
		t.Errorf("cpu: %+v bound by %q, want 2500 millicores by policy", s.Budget.CPU.Effective, s.Budget.CPU.Binding)
	}
	// memory: a cap above the cgroup limit cannot relax it.
	if s.Budget.Memory.Effective.N != 7<<30 || !strings.Contains(s.Budget.Memory.Binding, "cgroup") {
		t.Errorf("memory: %+v bound by %q, want 8GiB-1GiB by the cgroup", s.Budget.Memory.Effective, s.Budget.Memory.Binding)
	}
	os.WriteFile(pol, []byte("[caps]\ncpus = 3\nmemroy = \"1G\"\n"), 0o644)
	p, _ := New(Config{Root: "testdata/v2", PolicyPath: pol, GPUs: &fakeGPUs{err: ErrNVMLMissing}})
	if _, err := p.Snapshot(context.Background(), nil); !errors.Is(err, ErrPolicy) || !strings.Contains(err.Error(), ":3:") || !strings.Contains(err.Error(), "memroy") {
		t.Errorf("bad policy: got %v, want file:line and the field", err)
	}
}

func TestUsersAreTotalsOnly(t *testing.T) {
	s := fixture(t, "v2", nil, nil)
	var u1000 *UserLoad
	for i := range s.Users {
		if s.Users[i].UID == 1000 {
			u1000 = &s.Users[i]
		}
	}
	if u1000 == nil || u1000.Processes != 1 || u1000.RSS != 200<<20 || u1000.CPUTime != 7.5 {
		t.Fatalf("user 1000: got %+v, want 1 process, 200MiB, 7.5 CPU seconds", u1000)
	}
	b, _ := json.Marshal(s)
	if strings.Contains(string(b), "python worker") {
		t.Fatal("the snapshot leaks a process name")
	}
}

func TestValueJSONIsThreeState(t *testing.T) {
	for _, v := range []Value{Known(0, "f"), Unlimited("f"), Unknown("f", "why")} {
		b, _ := json.Marshal(v)
		var back Value
		if err := json.Unmarshal(b, &back); err != nil || back != v {
			t.Errorf("round trip of %+v: %s -> %+v", v, b, back)
		}
	}
	b, _ := json.Marshal(Known(0, "f"))
	if !strings.Contains(string(b), `"value":0`) {
		t.Errorf("a known zero must carry its value: %s", b)
	}
}

func TestParseStat(t *testing.T) {
	// A command name with spaces and a parenthesis must not shift the fields.
	st, ok := ParseStat([]byte("4242 (my (odd) job) S 17 4200 4200 0 -1 4194560 0 0 0 0 500 250 30 12 20 0 1 0 100 123456789 51200 18446744073709551615\n"))
	if !ok || st.PPid != 17 || st.PGrp != 4200 || st.Ticks != 750 || st.Reaped != 42 || st.RSSPages != 51200 || st.Kernel {
		t.Fatalf("got %+v %v, want ppid 17, pgrp 4200, 750 ticks, 42 reaped, 51200 pages, not a kernel thread", st, ok)
	}
	// A kworker's line from this VM (its first 24 fields).
	if st, ok := ParseStat([]byte("30696 (kworker/u8:5-writeback) I 2 0 0 0 -1 69238880 0 0 0 0 0 165 0 0 20 0 1 0 3113941 0 0\n")); !ok || !st.Kernel || st.PPid != 2 {
		t.Fatalf("a kernel thread: got %+v %v, want Kernel", st, ok)
	}
	if _, ok := ParseStat([]byte("4242 (short) S 1")); ok {
		t.Fatal("a truncated line parsed")
	}
}

func TestSlurmKillWait(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "slurm", "scontrol-show-config.txt"))
	if err != nil {
		t.Fatal(err)
	}
	if d, err := killWait(string(b)); err != nil || d != 30*time.Second {
		t.Fatalf("KillWait of the real config: %s, %v; want 30s", d, err)
	}
	for _, bad := range []string{"", "KillWait = soon\n", "CompleteWait = 0 sec\n"} {
		if d, err := killWait(bad); err == nil {
			t.Errorf("killWait(%q) = %s, want an error", bad, d)
		}
	}
}

// TestPolicyErrorsNameTheirLine: a policy value that parses but is wrong
// (a size without a unit, a relative scratch directory) names the file's
// line as well as the field, as a TOML syntax error does.
func TestPolicyErrorsNameTheirLine(t *testing.T) {
	pol := filepath.Join(t.TempDir(), "policy.toml")
	for _, tc := range []struct{ src, want string }{
		{"[caps]\ncpus = 2\n\n[reserve]\nmemory = \"lots\"\n", pol + `:5: field "reserve.memory"`},
		{"# mine\nscratch = [\"/local\", \"scratch\"]\n", pol + `:2: field "scratch": invalid policy file: entry 1 ("scratch"): want an absolute path`},
		{"scratch = [\"~/scratch\"]\n", `entry 0 ("~/scratch"): want an absolute path`},
	} {
		os.WriteFile(pol, []byte(tc.src), 0o644)
		if _, err := LoadPolicy(pol); !errors.Is(err, ErrPolicy) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.src, err, tc.want)
		}
	}
	os.WriteFile(pol, []byte("scratch = [\"/local/scratch/\", \"/tmp\"]\n"), 0o644)
	if p, err := LoadPolicy(pol); err != nil || len(p.Scratch) != 2 || p.Scratch[0] != "/local/scratch" {
		t.Errorf("scratch list: got %v, %v; want [/local/scratch /tmp]", p.Scratch, err)
	}
}

// TestPolicyTiersApplyByHostName: one policy file in a home directory
// that every host mounts serves hosts of several kinds. A [tier.NAME]
// whose hosts match this host's name (or its short name) replaces the
// top level's settings that it sets, and only those; every tier is
// checked on every host; a host that two tiers claim is an error.
func TestPolicyTiersApplyByHostName(t *testing.T) {
	pol := filepath.Join(t.TempDir(), "policy.toml")
	os.WriteFile(pol, []byte(`scratch = ["/tmp"]

[caps]
cpus = 8
memory = "16GiB"

[reserve]
cpus = 1

[tier.box]
hosts = ["Box", "box.lab.example.org"]
scratch = ["/data/scratch"]
[tier.box.caps]
cpus = 16
[tier.box.gpu]
share = true

[tier.login]
hosts = ["login[0-9]*"]
[tier.login.caps]
cpus = 1
memory = "2GiB"
[tier.login.reserve]
cpus = 0
`), 0o644)
	for _, tc := range []struct {
		host, tier   string
		cpus, memory int64
		reserveCPU   int64
		scratch      string
		share        bool
	}{
		{"other", "", 8000, 16 << 30, 1000, "/tmp", false},
		{"box", "box", 16000, 16 << 30, 1000, "/data/scratch", true},
		{"box.lab.example.org", "box", 16000, 16 << 30, 1000, "/data/scratch", true},
		{"BOX.Lab.Example.Org", "box", 16000, 16 << 30, 1000, "/data/scratch", true},
		{"login3.cluster.example.org", "login", 1000, 2 << 30, 0, "/tmp", false},
		{"login", "", 8000, 16 << 30, 1000, "/tmp", false},
	} {
		p, err := LoadPolicyFor(pol, tc.host)
		if err != nil {
			t.Fatalf("%s: %v", tc.host, err)
		}
		if p.Tier != tc.tier || p.CPUs.N != tc.cpus || p.Memory.N != tc.memory || p.ReserveCPU != tc.reserveCPU ||
			len(p.Scratch) != 1 || p.Scratch[0] != tc.scratch || p.ShareGPUs != tc.share {
			t.Errorf("%s: got tier %q, cpus %d, memory %d, reserve cpus %d, scratch %v, share %v; want %q, %d, %d, %d, [%s], %v",
				tc.host, p.Tier, p.CPUs.N, p.Memory.N, p.ReserveCPU, p.Scratch, p.ShareGPUs, tc.tier, tc.cpus, tc.memory, tc.reserveCPU, tc.scratch, tc.share)
		}
		if tc.tier != "" && !strings.Contains(p.CPUs.Source, "tier "+tc.tier) {
			t.Errorf("%s: the cpu cap's source %q does not name the tier", tc.host, p.CPUs.Source)
		}
		// What binds is named with the tier that set it, and a cap the
		// tier left to the top level is the policy's alone.
		cpu, mem := policyLimit(p, p.CPUs), policyLimit(p, p.Memory)
		if want := map[bool]string{true: "policy tier " + tc.tier, false: "policy"}[tc.tier != ""]; cpu.Scope != want {
			t.Errorf("%s: cpu cap named %q, want %q", tc.host, cpu.Scope, want)
		}
		if tc.tier == "box" && mem.Scope != "policy" {
			t.Errorf("%s: memory cap (top level's) named %q, want policy", tc.host, mem.Scope)
		}
	}

	for _, tc := range []struct{ src, want string }{
		{"[tier.a]\nhosts = [\"x*\"]\n[tier.b]\nhosts = [\"*y\"]\n", `host xy matches the hosts of tiers a and b`},
		{"[caps]\ncpus = 2\n[tier.a]\nhosts = []\n", pol + `:3: field "tier.a": invalid policy file: no hosts`},
		{"[tier.a]\nhosts = [\"gpu[\"]\n", `field "tier.a.hosts": invalid policy file: entry 0 ("gpu[") is not a host name or shell pattern`},
		// A tier for other hosts is checked all the same.
		{"[tier.a]\nhosts = [\"elsewhere\"]\n\n[tier.a.caps]\nmemory = \"lots\"\n", pol + `:5: field "tier.a.caps.memory"`},
		{"[tier.a]\nhosts = [\"x\"]\n[tier.a.fleet]\ngpu = 1\n", "belong to the top level"},
		{"[tier.a]\nhosts = [\"x\"]\nscratch = [\"tmp\"]\n", `field "tier.a.scratch": invalid policy file: entry 0 ("tmp"): want an absolute path`},
	} {
		os.WriteFile(pol, []byte(tc.src), 0o644)
		if _, err := LoadPolicyFor(pol, "xy"); !errors.Is(err, ErrPolicy) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want an error containing %q", tc.src, err, tc.want)
		}
	}
}
