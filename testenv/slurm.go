package testenv

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/worker/probe"
)

// Slurm is a Slurm cluster of this host: munged, slurmctld and slurmd
// (Debian's slurm-wlm and munge) with their own key, config, ports and
// state in a temporary directory, stopped at cleanup. Jobs run as root,
// without cgroups (proctrack/linuxproc, task/none) or, with
// SlurmOptions.Cgroups, in the cgroups of Slurm's task/cgroup plugin.
type Slurm struct {
	// Conf is the slurm.conf that srun, sbatch and scontrol take through
	// SLURM_CONF (Env).
	Conf string
	// Nodes are the names of the cluster's nodes: this host's short name,
	// or spn1, spn2... with SlurmOptions.Nodes above 1.
	Nodes []string
	dir   string
}

// SlurmOptions configure StartSlurm.
type SlurmOptions struct {
	// Cgroups confines each job as sites usually do: proctrack/cgroup and
	// task/cgroup (cgroup v1) with ConstrainRAMSpace and ConstrainCores,
	// so that a job's memory and CPUs are its cgroup's.
	Cgroups bool
	// KillWait is Slurm's KillWait, the time between the SIGTERM and the
	// SIGKILL of a job's processes when it ends. Default Slurm's (30s).
	KillWait time.Duration
	// Nodes above 1 make a cluster of that many nodes on this host: one
	// slurmd each, named spn1, spn2..., each in a UTS namespace of its
	// own whose host name is the node's (what a job's processes see as
	// their host), on a port of its own. The nodes split this host's
	// CPUs and memory between them; they share its file systems, network
	// and processes, as nodes of a cluster share a file system. Default
	// 1: one node, this host under its own name.
	Nodes int
	// KillOnBadExit ends a whole job step when one of its tasks exits
	// non-zero, as sites set it (Slurm's KillOnBadExit=1).
	KillOnBadExit bool
}

// StartSlurm starts the cluster. It skips t where it cannot run (not
// root, or no slurm-wlm and munge installed) except under CI, where .ci/run
// installs them and a missing one is a failure.
func StartSlurm(t testing.TB, opts SlurmOptions) *Slurm {
	t.Helper()
	RequireRoot(t)
	for _, tool := range []string{"munged", "slurmctld", "slurmd", "srun", "scontrol", "sinfo"} {
		if _, err := lookPath(tool); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("needs %s (Debian slurm-wlm and munge; .ci/run installs them): %v", tool, err)
			}
			t.Skipf("needs %s (apt-get install slurm-wlm munge): %v", tool, err)
		}
	}
	// A short path: munge's socket path must fit a sockaddr_un.
	dir, err := os.MkdirTemp("", "sp-slurm-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// munged wants every user able to reach its socket.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := &Slurm{Conf: filepath.Join(dir, "slurm.conf"), dir: dir}
	for _, d := range []string{"state", "spool", "log"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	key := make([]byte, 1024)
	rand.Read(key)
	if err := os.WriteFile(filepath.Join(dir, "munge.key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ = strings.Cut(host, ".")
	// The node as the probe sees the host: slurmd drains a node that
	// claims more CPUs or memory than it has.
	pr, err := probe.New(probe.Config{PolicyPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := pr.Snapshot(context.Background(), nil)
	if err != nil || !snap.Host.OnlineCPUs.IsKnown() || !snap.Host.MemTotal.IsKnown() {
		t.Fatalf("the host's CPUs and memory for slurm.conf: %+v, %+v, %v", snap.Host.OnlineCPUs, snap.Host.MemTotal, err)
	}
	memMiB := snap.Host.MemTotal.N >> 20
	nodes := max(opts.Nodes, 1)
	ports := FreePorts(t, 2+nodes)
	ctldPort, slurmdPort := ports[0], ports[1]
	// One node: this host. Several: spnN, each on a port of its own, in
	// its own UTS namespace (below), with its share of the host.
	nodeLines := fmt.Sprintf("NodeName=%s NodeAddr=127.0.0.1 CPUs=%d RealMemory=%d State=UNKNOWN\n", host, snap.Host.OnlineCPUs.N, memMiB-512)
	s.Nodes = []string{host}
	if nodes > 1 {
		nodeLines, s.Nodes = "", nil
		for i := range nodes {
			name := fmt.Sprintf("spn%d", i+1)
			s.Nodes = append(s.Nodes, name)
			nodeLines += fmt.Sprintf("NodeName=%s NodeHostname=%[1]s NodeAddr=127.0.0.1 Port=%s CPUs=%d RealMemory=%d State=UNKNOWN\n",
				name, portOf(ports[2+i]), max(1, snap.Host.OnlineCPUs.N/int64(nodes)), (memMiB-512)/int64(nodes))
		}
	}
	proctrack, task := "linuxproc", "none"
	if opts.Cgroups {
		proctrack, task = "cgroup", "cgroup"
		cg := "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nConstrainRAMSpace=yes\nConstrainCores=yes\nConstrainSwapSpace=no\n"
		if err := os.WriteFile(filepath.Join(dir, "cgroup.conf"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	conf := fmt.Sprintf(`ClusterName=sptest
SlurmctldHost=%[1]s(127.0.0.1)
SlurmctldPort=%[2]s
SlurmdPort=%[3]s
AuthType=auth/munge
AuthInfo=socket=%[4]s/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=%[4]s/state
SlurmdSpoolDir=%[4]s/spool/%%n
SlurmctldPidFile=%[4]s/slurmctld.pid
SlurmdPidFile=%[4]s/slurmd-%%n.pid
SlurmctldLogFile=%[4]s/log/slurmctld.log
SlurmdLogFile=%[4]s/log/slurmd-%%n.log
ProctrackType=proctrack/%[7]s
TaskPlugin=task/%[8]s
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
%[5]sPartitionName=test Nodes=%[6]s Default=YES MaxTime=INFINITE State=UP
`, host, portOf(ctldPort), portOf(slurmdPort), dir, nodeLines, strings.Join(s.Nodes, ","), proctrack, task)
	if opts.KillWait > 0 {
		conf += fmt.Sprintf("KillWait=%d\n", int(opts.KillWait.Seconds()))
	}
	if opts.KillOnBadExit {
		conf += "KillOnBadExit=1\n"
	}
	if err := os.WriteFile(s.Conf, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	s.daemon(t, "munged", "", "-F", "--socket="+filepath.Join(dir, "munge.sock"), "--key-file="+filepath.Join(dir, "munge.key"),
		"--pid-file="+filepath.Join(dir, "munged.pid"), "--log-file="+filepath.Join(dir, "log", "munged.log"), "--seed-file="+filepath.Join(dir, "munge.seed"))
	Eventually(t, 10*time.Second, func() (bool, string) {
		_, err := os.Stat(filepath.Join(dir, "munge.sock"))
		return err == nil, fmt.Sprintf("munged's socket: %v\n%s", err, s.logs())
	})
	if opts.Cgroups {
		// Registered before the daemons, so run after they are stopped:
		// the empty cgroups slurmd leaves (slurm_<node>/uid_<uid>).
		t.Cleanup(func() {
			for _, node := range s.Nodes {
				removeEmptyCgroups("slurm_" + node)
			}
		})
	}
	s.daemon(t, "slurmctld", "", "-D", "-i", "-f", s.Conf)
	for _, node := range s.Nodes {
		uts := ""
		if nodes > 1 {
			uts = node
		}
		s.daemon(t, "slurmd", uts, "-D", "-N", node, "-f", s.Conf)
	}
	Eventually(t, 60*time.Second, func() (bool, string) {
		out, err := s.Command("sinfo", "-h", "-N", "-o", "%T").CombinedOutput()
		states := strings.Fields(string(out))
		idle := err == nil && len(states) == len(s.Nodes)
		for _, st := range states {
			idle = idle && st == "idle"
		}
		return idle, fmt.Sprintf("sinfo: %q %v\n%s", out, err, s.logs())
	})
	return s
}

// Command is a Slurm client command (srun, sbatch, scontrol...) of this
// cluster.
func (s *Slurm) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "SLURM_CONF="+s.Conf)
	return cmd
}

// daemon starts a daemon in the foreground of a child process, killed at
// cleanup. With uts set, the daemon runs in a UTS namespace of its own
// whose host name is uts: a shell made in that namespace sets the name
// and execs the daemon (the path and arguments are its positional
// parameters, never interpolated).
func (s *Slurm) daemon(t testing.TB, name, uts string, args ...string) {
	t.Helper()
	path, err := lookPath(name)
	if err != nil {
		t.Fatal(err)
	}
	log := name
	if uts != "" {
		log += "-" + uts
	}
	out, err := os.Create(filepath.Join(s.dir, "log", log+".out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	if uts != "" {
		cmd = exec.Command("/bin/sh", append([]string{"-c", `printf %s "$0" > /proc/sys/kernel/hostname && exec "$@"`, uts, path}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUTS}
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Env = append(os.Environ(), "SLURM_CONF="+s.Conf)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		out.Close()
	})
}

// logs are the daemons' logs, for a failure's message.
func (s *Slurm) logs() string {
	var b strings.Builder
	files, _ := filepath.Glob(filepath.Join(s.dir, "log", "*"))
	for _, f := range files {
		data, _ := os.ReadFile(f)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		fmt.Fprintf(&b, "== %s (last lines)\n%s\n", filepath.Base(f), strings.Join(lines[max(0, len(lines)-8):], "\n"))
	}
	return b.String()
}

// lookPath finds a tool on PATH or in the sbin directories, which a
// non-login root shell may not have on its PATH.
func lookPath(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		p := filepath.Join(d, name)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found on PATH or in the sbin directories", name)
}

func portOf(hostport string) string { return hostport[strings.LastIndexByte(hostport, ':')+1:] }

// removeEmptyCgroups removes the cgroup directories named name at the top
// of each cgroup v1 hierarchy, with every empty one below them (rmdir
// refuses a cgroup that has a process or a child).
func removeEmptyCgroups(name string) {
	tops, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", name))
	for _, top := range tops {
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			_ = os.Remove(dirs[i])
		}
	}
}
