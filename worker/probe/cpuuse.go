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

// CPUMeter measures the CPU time used on the host by everything but this
// user's processes: the busy time of /proc/stat (steal included: a
// hypervisor's other guests) less what this uid's processes used, over a
// sliding window. Other users, system daemons and the kernel's threads
// count; this user's processes (its shards, its other workers, which the
// host ledger counts) do not.
//
// A process's CPU goes to its parent when it is reaped (cutime, cstime),
// so this user's short-lived processes are counted through their parents:
// the sum over this uid's live processes of their own and their reaped
// children's CPU grows by exactly what the uid used, as long as its
// processes are reaped by its own. Per-process sampling of other users
// would miss their short-lived processes (a compiler run by make) that
// start and end between two samples; the host's busy time misses nothing.
// With hidepid on /proc only this user's processes are listed, which is
// all the meter reads per process.
//
// Samples are taken when Others is called and the last one is older than
// Every: no goroutine of its own.
type CPUMeter struct {
	p                    *Prober
	uid                  int
	every, window, least time.Duration
	now                  func() time.Time
	sleep                func(time.Duration)

	mu      sync.Mutex
	samples []cpuSample // oldest first; guarded by mu
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
	mine   int64 // ticks of this uid's processes and the children they reaped
	others int64 // ticks of others since the meter's first sample
}

// add appends s, counting others' ticks since the previous sample: the
// host's busy ticks less this user's, which are at least none and at most
// all of them. A process reaped by a parent of another uid moves its whole
// life's CPU between the two in one go (another user's job ended under a
// root shell of this user; this user's worker under sudo): taken as it
// is, it would hide a window's worth of use or invent one.
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
	uid := os.Geteuid()
	if !p.real() {
		if uid = p.uidIn(p.procDir()); uid < 0 {
			return nil, fmt.Errorf("cpu meter: no Uid line in %s/status", p.procDir())
		}
	}
	return &CPUMeter{p: p, uid: uid, every: cfg.Every, window: cfg.Window, least: cfg.Least, now: cfg.Now, sleep: cfg.Sleep}, nil
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

// Others is the CPU, in millicores, that everything but this user's
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
	return Known(int64(math.Round(others*1000)), fmt.Sprintf("%s busy less uid %d's processes %s", src, m.uid, how))
}

func (m *CPUMeter) sample() (cpuSample, error) {
	at := m.now()
	busy, err := m.p.hostBusy()
	if err != nil {
		return cpuSample{}, err
	}
	mine, err := m.p.uidTicks(m.uid)
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

// uidTicks sums the CPU ticks, their own and their reaped children's, of
// the processes of uid. A process that exits between the listing and
// the read is left out: its parent has its ticks, or will once it reaps.
func (p *Prober) uidTicks(uid int) (int64, error) {
	var sum int64
	err := p.eachProc(func(u int) bool { return u == uid }, func(_, _ int, st Stat, ok bool) {
		if ok {
			sum += st.Ticks + st.Reaped
		}
	})
	return sum, err
}
