package probe

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"
)

// CPUUse reports the CPU that others use on the host, in millicores: a
// budget limit that only a measurement over time can give (Config.CPUUse).
type CPUUse interface {
	Others() Value
}

var _ CPUUse = (*CPUMeter)(nil)

// ScopeOthers begins the scope of the CPU limit that CPUUse adds to the
// budget; the rest of the scope has the numbers.
const ScopeOthers = "host CPUs not in use by others"

// CPUMeter measures the CPU time used on the host by everything but
// shardpool's own work: the busy time of /proc/stat (steal included: a
// hypervisor's other guests) less what this process and its descendants
// used, and the other processes SetRoots names with theirs (the worker's
// coordinator on this host, the host ledger's other workers), over a
// sliding window.
// Other users, this user's other processes (a notebook, a build, a second
// job started by hand) and system daemons count; shardpool's processes do
// not, nor do the kernel's threads, whose work is mostly the I/O of what
// runs, the run's own included (measured: a tenth of a CPU under a run of
// short shards), and which are no one's job. Root is no exception: its
// daemons and its containers are not its shards.
//
// Only this uid's processes are read and counted. A descendant of another
// uid (a shard that changed its uid, another user's process started by a
// test) counts as others' while it runs; its CPU comes back to the tree
// when a process of the tree reaps it (add limits what one interval can
// move).
//
// A process's CPU goes to its parent when it is reaped (cutime, cstime),
// so the tree's short-lived processes are counted through their parents:
// the sum over the tree's live processes of their own and their reaped
// children's CPU grows by exactly what the tree used, as long as its
// processes are reaped within it. A process that leaves the tree (a
// command's daemon, reparented to init) takes its CPU with it; add
// counts such an interval as others' in full, erring towards fewer
// slots. Per-process sampling of other users would miss their
// short-lived processes (a compiler run by make) that start and end
// between two samples; the host's busy time misses nothing. With hidepid
// on /proc only this user's processes are listed, which is all the meter
// reads per process.
//
// Samples are taken when Others is called and the last one is older than
// Every: no goroutine of its own.
type CPUMeter struct {
	p                    *Prober
	uid                  int
	self                 int // the pid whose tree is shardpool's
	every, window, least time.Duration
	now                  func() time.Time
	sleep                func(time.Duration)

	mu      sync.Mutex
	samples []cpuSample     // oldest first; guarded by mu
	roots   func() []ProcID // guarded by mu
	nroots  int             // roots in the last sample; guarded by mu
}

// ProcID names a process across pid reuse: its pid and its start time
// (clock ticks since boot, as /proc/<pid>/stat has it).
type ProcID struct {
	PID   int
	Start int64 // 0: whichever process has the pid
}

// SetRoots names, through fn, other processes whose trees are
// shardpool's own: the other live workers of this user on this host that
// share this one's budget (whose shards the host ledger counts), and the
// worker's coordinator where it runs on this host. fn is called under the
// meter's lock at each sample; it must not block.
func (m *CPUMeter) SetRoots(fn func() []ProcID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.roots = fn
}

// CPUMeterConfig configures a CPUMeter. Zero values mean the defaults.
type CPUMeterConfig struct {
	// Probe is where /proc is read from (Root, ProcRoot, PID).
	Probe Config
	// Every is the least time between samples. Default 2s.
	Every time.Duration
	// Window is what the use is averaged over. Default 10s.
	Window time.Duration
	// Least is the shortest window worth an answer: with less history
	// (the first call, or after a pause longer than twice Window) Others
	// waits for it. Default 250ms: 25 clock ticks per CPU.
	Least time.Duration
	// Now and Sleep are the clock. Default: the real one.
	Now   func() time.Time
	Sleep func(time.Duration)
}

type cpuSample struct {
	at     time.Time
	busy   int64 // host busy ticks, all CPUs
	mine   int64 // ticks of shardpool's processes and the children they reaped
	others int64 // ticks of others since the meter's first sample
}

// add appends s, counting others' ticks since the previous sample: the
// host's busy ticks less shardpool's, which are at least none and at most
// all of them. A process that joins or leaves the tree moves its whole
// life's CPU between the two in one go (another user's process reaped by
// this worker; a command's daemon reparented to init): taken as it is,
// it would hide a window's worth of use or invent one.
func (m *CPUMeter) add(s cpuSample) {
	if n := len(m.samples); n > 0 {
		prev := m.samples[n-1]
		busy := s.busy - prev.busy
		s.others = prev.others + busy - min(max(s.mine-prev.mine, 0), busy)
	}
	m.samples = append(m.samples, s)
}

// NewCPUMeter validates cfg; it does no I/O beyond finding this process's
// uid in a fixture tree.
func NewCPUMeter(cfg CPUMeterConfig) (*CPUMeter, error) {
	p, err := New(cfg.Probe)
	if err != nil {
		return nil, err
	}
	if cfg.Every <= 0 {
		cfg.Every = 2 * time.Second
	}
	if cfg.Window <= 0 {
		cfg.Window = 10 * time.Second
	}
	if cfg.Least <= 0 {
		cfg.Least = 250 * time.Millisecond
	}
	if cfg.Window < cfg.Every || cfg.Window < cfg.Least {
		return nil, fmt.Errorf("cpu meter: Window %s is shorter than Every %s or Least %s", cfg.Window, cfg.Every, cfg.Least)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Sleep == nil {
		cfg.Sleep = time.Sleep
	}
	uid, self := os.Geteuid(), os.Getpid()
	if !p.real() {
		if uid = p.uidIn(p.procDir()); uid < 0 {
			return nil, fmt.Errorf("cpu meter: no Uid line in %s/status", p.procDir())
		}
		if self = p.statusField(p.procDir(), "Pid:"); self < 0 {
			return nil, fmt.Errorf("cpu meter: no Pid line in %s/status", p.procDir())
		}
	}
	return &CPUMeter{p: p, uid: uid, self: self, every: cfg.Every, window: cfg.Window, least: cfg.Least, now: cfg.Now, sleep: cfg.Sleep}, nil
}

// Start takes the first sample, if none was taken, so that the first
// Others waits for less of Least or none.
func (m *CPUMeter) Start() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.samples) == 0 {
		if s, err := m.sample(); err == nil {
			m.add(s)
		}
	}
}

// Others is the CPU, in millicores, that everything but shardpool's
// processes used over the last Window (at least Least), or over the last
// Every where that is more: unknown when /proc/stat or /proc cannot be
// read.
func (m *CPUMeter) Others() Value {
	m.mu.Lock()
	defer m.mu.Unlock()
	src := "/proc/stat"
	now := m.now()
	if n := len(m.samples); n == 0 || now.Sub(m.samples[n-1].at) >= m.every {
		s, err := m.sample()
		if err != nil {
			return Unknown(src, "%v", err)
		}
		m.add(s)
	}
	// Keep the newest sample at least Window old as the base, and nothing
	// older; after a pause a base older than twice Window would average
	// the pause in.
	last := m.samples[len(m.samples)-1]
	first := 0
	for i, s := range m.samples {
		if last.at.Sub(s.at) >= m.window {
			first = i
		}
	}
	if last.at.Sub(m.samples[first].at) > 2*m.window {
		first = len(m.samples) - 1
	}
	m.samples = append(m.samples[:0], m.samples[first:]...)
	if span := last.at.Sub(m.samples[0].at); span < m.least {
		m.sleep(m.least - span)
		s, err := m.sample()
		if err != nil {
			return Unknown(src, "%v", err)
		}
		m.add(s)
		last = m.samples[len(m.samples)-1]
	}
	// The window's average, or the last Every's where that is more: use
	// that others start is seen within seconds, use that ends only once
	// the window has passed it, so that a pause in a job does not let
	// the slots it left be taken for longer shards.
	rate := func(base cpuSample) (float64, float64) {
		secs := last.at.Sub(base.at).Seconds()
		return float64(last.others-base.others) / clockTicks / secs, secs
	}
	others, secs := rate(m.samples[0])
	recent := m.samples[0]
	for _, s := range m.samples {
		if last.at.Sub(s.at) >= m.every {
			recent = s
		}
	}
	how := fmt.Sprintf("over %.1fs", secs)
	if r, rs := rate(recent); r > others {
		others, how = r, fmt.Sprintf("over the last %.1fs (%.2f over %.1fs)", rs, others, secs)
	}
	whose := fmt.Sprintf("pid %d", m.self)
	if m.nroots > 0 {
		whose += fmt.Sprintf(" and %d other worker(s)", m.nroots)
	}
	return Known(int64(math.Round(others*1000)), fmt.Sprintf("%s busy less shardpool's processes (%s, with their descendants of uid %d) %s", src, whose, m.uid, how))
}

func (m *CPUMeter) sample() (cpuSample, error) {
	at := m.now()
	busy, err := m.p.hostBusy()
	if err != nil {
		return cpuSample{}, err
	}
	var roots []ProcID
	if m.roots != nil {
		roots = m.roots()
	}
	m.nroots = len(roots)
	mine, err := m.p.treeTicks(m.uid, m.self, roots)
	if err != nil {
		return cpuSample{}, err
	}
	return cpuSample{at: at, busy: busy, mine: mine}, nil
}

// hostBusy is the CPU time of every CPU that was not idle or waiting for
// I/O, in clock ticks: user, nice, system, irq, softirq and steal of the
// "cpu" line of /proc/stat (guest time is already in user and nice).
func (p *Prober) hostBusy() (int64, error) {
	file := path.Join(p.cfg.ProcRoot, "stat")
	b, err := p.read(file)
	if err != nil {
		return 0, err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return 0, fmt.Errorf("%s: first line is not the cpu total: %q", file, line)
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system [idle iowait] irq softirq steal
		n, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s: cpu field %d: %w", file, i, err)
		}
		busy += n
	}
	return busy, nil
}

// kthreadd is the kernel's thread that starts the others: its children
// are the kernel's threads (kworkers, writeback, ksoftirqd).
const kthreadd = 2

// treeTicks sums the CPU ticks, their own and their reaped children's, of
// the processes of uid that are self or one of roots or descend from one
// of them through processes of uid, and of the kernel's threads (kthreadd,
// pid 2, and its children, where this pid namespace shows them). A process
// that exits between the listing and the read is left out: its parent has
// its ticks, or will once it reaps.
func (p *Prober) treeTicks(uid, self int, roots []ProcID) (int64, error) {
	type proc struct {
		ppid, uid    int
		ticks, start int64
	}
	procs := map[int]proc{}
	err := p.eachProc(func(u int) bool { return u == uid || u == 0 }, func(pid, u int, st Stat, ok bool) {
		if ok && (u == uid || pid == kthreadd || st.PPid == kthreadd) {
			procs[pid] = proc{ppid: st.PPid, uid: u, ticks: st.Ticks + st.Reaped, start: st.Start}
		}
	})
	if err != nil {
		return 0, err
	}
	isRoot := func(pid int, start int64) bool {
		if pid == self {
			return true
		}
		for _, r := range roots {
			if r.PID == pid && (r.Start == 0 || r.Start == start) {
				return true
			}
		}
		return false
	}
	// Walk up from each process until a root, a process already judged,
	// or one not listed (another uid's, gone, or init's parent), and
	// judge the whole path.
	mine := make(map[int]bool, len(procs))
	var path []int
	var sum int64
	for pid, pr := range procs {
		in, cur := false, pid
		path = path[:0]
		for {
			if v, ok := mine[cur]; ok {
				in = v
				break
			}
			c, ok := procs[cur]
			if !ok || len(path) > len(procs) { // the second: a cycle of reused pids
				break
			}
			path = append(path, cur)
			if isRoot(cur, c.start) {
				in = true
				break
			}
			cur = c.ppid
		}
		for _, q := range path {
			mine[q] = in
		}
		if (in && pr.uid == uid) || pid == kthreadd || pr.ppid == kthreadd {
			sum += pr.ticks
		}
	}
	return sum, nil
}
