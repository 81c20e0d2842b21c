package probe

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// procTree is a fixture /proc that a test moves forward in time: the
// host's busy ticks and each process's uid, own ticks and reaped ticks.
// This process (self) is pid 10; every other process is its child unless
// parents says otherwise, and starts at tick 100 unless starts does.
type procTree struct {
	t       *testing.T
	root    string
	parents map[int]int
	starts  map[int]int64
}

type fakeProc struct {
	uid          int
	ticks, reaps int64
}

func newProcTree(t *testing.T) *procTree {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "proc/self"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "proc/self/status"), []byte("Name:\tshardpool\nPid:\t10\nUid:\t1000\t1000\t1000\t1000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return &procTree{t: t, root: root, parents: map[int]int{10: 1}, starts: map[int]int64{}}
}

// set writes the host's busy ticks (split over user, system, softirq and
// steal, with idle and iowait around them) and the processes, removing
// those not given.
func (p *procTree) set(busy int64, procs map[int]fakeProc) {
	p.t.Helper()
	user, system, softirq, steal := busy/2, busy/4, busy/8, busy-busy/2-busy/4-busy/8
	stat := fmt.Sprintf("cpu  %d 0 %d 999999 5555 0 %d %d 77 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n", user, system, softirq, steal)
	if err := os.WriteFile(filepath.Join(p.root, "proc/stat"), []byte(stat), 0o644); err != nil {
		p.t.Fatal(err)
	}
	ents, _ := os.ReadDir(filepath.Join(p.root, "proc"))
	for _, e := range ents {
		if e.IsDir() && e.Name() != "self" {
			os.RemoveAll(filepath.Join(p.root, "proc", e.Name()))
		}
	}
	for pid, pr := range procs {
		dir := filepath.Join(p.root, "proc", fmt.Sprint(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			p.t.Fatal(err)
		}
		ppid, ok := p.parents[pid]
		if !ok {
			ppid = 10
		}
		start, ok := p.starts[pid]
		if !ok {
			start = 100
		}
		st := fmt.Sprintf("%d (job) S %d %d %d 0 -1 0 0 0 0 0 %d 0 %d 0 20 0 1 0 %d 1000 10 0\n", pid, ppid, pid, pid, pr.ticks, pr.reaps, start)
		status := fmt.Sprintf("Name:\tjob\nUid:\t%d\t%d\t%d\t%d\n", pr.uid, pr.uid, pr.uid, pr.uid)
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(st), 0o644); err != nil {
			p.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
			p.t.Fatal(err)
		}
	}
}

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time          { return c.t }
func (c *fakeClock) sleep(d time.Duration)   { c.t = c.t.Add(d) }
func (c *fakeClock) advance(d time.Duration) { c.t = c.t.Add(d) }

func newMeter(t *testing.T, tree *procTree, clk *fakeClock, sleep func(time.Duration)) *CPUMeter {
	t.Helper()
	if sleep == nil {
		sleep = clk.sleep
	}
	m, err := NewCPUMeter(CPUMeterConfig{Probe: Config{Root: tree.root}, Now: clk.now, Sleep: sleep})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCPUMeterCountsOthersNotThisUser(t *testing.T) {
	tree := newProcTree(t)
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	// uid 1000 is this user: a worker (pid 10) and a shard (pid 11).
	// uid 2000 is another user; its processes are not read, the host's
	// busy time covers them.
	tree.set(10_000, map[int]fakeProc{10: {1000, 300, 0}, 11: {1000, 200, 0}, 20: {2000, 5000, 0}})
	m := newMeter(t, tree, clk, nil)
	// The first call has no history: it takes Least (250ms) of it. Nothing
	// moved in the fixture meanwhile.
	if got := m.Others(); !got.IsKnown() || got.N != 0 {
		t.Fatalf("others with nothing moving: got %+v, want 0", got)
	}
	// 10 s on 2 CPUs, both busy: 2,000 ticks. This user: the worker ran
	// 400 ticks, the shard 150 more and then ended, reaped by the worker
	// (its 350 ticks in the worker's reaped), and a short child came and
	// went, reaped by the worker with 250 ticks. So this user used 400 +
	// 150 + 250 = 800; the rest, 1,200 ticks in 10 s, is others': 1.2 CPUs.
	clk.advance(10 * time.Second)
	tree.set(12_000, map[int]fakeProc{10: {1000, 700, 350 + 250}, 20: {2000, 5000, 0}})
	got := m.Others()
	if !got.IsKnown() || got.N != 1200 {
		t.Fatalf("others: got %+v, want 1200 millicores", got)
	}
	if !strings.Contains(got.Source, "uid 1000") || !strings.Contains(got.Source, "10.0s") {
		t.Errorf("source %q should name the uid and the window", got.Source)
	}
}

// TestCPUMeterCountsThisUsersOtherWork: what is shardpool's is this
// process's tree and the trees of the other workers SetRoots names, of
// this uid; this user's other processes are others' use like anyone's,
// and so is a process that merely has a root's pid (reused).
func TestCPUMeterCountsThisUsersOtherWork(t *testing.T) {
	tree := newProcTree(t)
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	// 10: this worker; 11 its shard, 12 the shard's child. 30: a notebook
	// of this user, 31 its kernel. 40: another worker of this user on the
	// host (started at tick 555), 41 its shard. 50: a process with the pid
	// of a worker that is gone (the ledger says it started at 777). 2 and
	// 3: kthreadd and a kworker, no one's job. 70: a daemon of root.
	for pid, ppid := range map[int]int{2: 0, 3: 2, 12: 11, 30: 1, 31: 30, 40: 1, 41: 40, 50: 1, 70: 1} {
		tree.parents[pid] = ppid
	}
	tree.starts[40] = 555
	procs := func(t10, t11, t12, t30, t31, t40, t41, t50 int64) map[int]fakeProc {
		return map[int]fakeProc{10: {1000, t10, 0}, 11: {1000, t11, 0}, 12: {1000, t12, 0}, 30: {1000, t30, 0},
			31: {1000, t31, 0}, 40: {1000, t40, 0}, 41: {1000, t41, 0}, 50: {1000, t50, 0}, 60: {2000, 999, 0},
			2: {0, t10 / 10, 0}, 3: {0, t10, 0}, 70: {0, t10, 0}}
	}
	tree.set(10_000, procs(0, 0, 0, 0, 0, 0, 0, 0))
	m := newMeter(t, tree, clk, nil)
	m.SetRoots(func() []ProcID { return []ProcID{{PID: 40, Start: 555}, {PID: 50, Start: 777}} })
	if got := m.Others(); !got.IsKnown() || got.N != 0 {
		t.Fatalf("others with nothing moving: got %+v, want 0", got)
	}
	// 10 s on 2 CPUs, both busy: 2,000 ticks. shardpool's: 100 + 200 + 100
	// here and 50 + 150 in the other worker, 600; the kernel's threads
	// 110. The notebook's 400, the stray's 200, root's daemon's 100 and
	// another user's 590 are others': 1.29 CPUs.
	clk.advance(10 * time.Second)
	tree.set(12_000, procs(100, 200, 100, 300, 100, 50, 150, 200))
	got := m.Others()
	if !got.IsKnown() || got.N != 1290 {
		t.Fatalf("others: got %+v, want 1290 millicores: 2,000 busy ticks less shardpool's 400 here and 200 in the other worker, less the kernel threads' 110", got)
	}
	for _, want := range []string{"pid 10 and 2 other worker(s)", "uid 1000", "10.0s"} {
		if !strings.Contains(got.Source, want) {
			t.Errorf("source %q should say %q", got.Source, want)
		}
	}
}

func TestCPUMeterAveragesOverItsWindow(t *testing.T) {
	tree := newProcTree(t)
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	busy := int64(0)
	tree.set(busy, map[int]fakeProc{10: {1000, 0, 0}})
	m := newMeter(t, tree, clk, nil)
	m.Others()
	// Others keep one CPU busy for 10 s (100 ticks a second), sampled
	// every 2 s, then stop. (The first 2 s window is 2.25 s: the first
	// call's 250 ms are in it, idle.)
	for i := 0; i < 5; i++ {
		clk.advance(2 * time.Second)
		busy += 200
		tree.set(busy, map[int]fakeProc{10: {1000, 0, 0}})
		if got := m.Others(); got.N < 880 || got.N > 1000 {
			t.Fatalf("at %d s: got %+v, want about 1000 millicores", 2*(i+1), got)
		}
	}
	// 4 s after they stopped, 6 of the last 10 s were busy.
	for i := 0; i < 2; i++ {
		clk.advance(2 * time.Second)
		tree.set(busy, map[int]fakeProc{10: {1000, 0, 0}})
		m.Others()
	}
	if got := m.Others(); got.N != 600 {
		t.Fatalf("4 s after others stopped: got %+v, want 600 millicores", got)
	}
	// A minute with no call: the old samples would average the pause in;
	// the meter takes a fresh window instead.
	clk.advance(time.Minute)
	tree.set(busy+6_000, map[int]fakeProc{10: {1000, 0, 0}}) // one CPU busy through the pause
	var during int64
	m.sleep = func(d time.Duration) {
		clk.sleep(d)
		during += 50 // 2 CPUs busy for the 250 ms the meter waits
		tree.set(busy+6_000+during, map[int]fakeProc{10: {1000, 0, 0}})
	}
	if got := m.Others(); got.N != 2000 {
		t.Fatalf("after a pause: got %+v, want 2000 millicores, measured since the call", got)
	}
}

// TestCPUMeterSeesUseStartAtOnce: others' use that starts shows within
// one Every, not diluted by the idle rest of the window; use that ends
// stays counted until the window passes it (TestCPUMeterAveragesOverItsWindow).
func TestCPUMeterSeesUseStartAtOnce(t *testing.T) {
	tree := newProcTree(t)
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	busy := int64(0)
	tree.set(busy, nil)
	m := newMeter(t, tree, clk, nil)
	for i := 0; i < 6; i++ {
		m.Others()
		clk.advance(2 * time.Second)
		tree.set(busy, nil)
	}
	m.Others()
	clk.advance(2 * time.Second)
	busy += 300 // one and a half CPUs for 2 s
	tree.set(busy, nil)
	if got := m.Others(); got.N != 1500 || !strings.Contains(got.Source, "0.30 over 10.0s") {
		t.Fatalf("got %+v, want 1500 millicores (0.30 over the window)", got)
	}
}

func TestCPUMeterReapAcrossUsers(t *testing.T) {
	tree := newProcTree(t)
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	busy, mine := int64(0), int64(0)
	tree.set(busy, map[int]fakeProc{10: {1000, mine, 0}})
	m := newMeter(t, tree, clk, nil)
	m.Others()
	// Another user keeps one CPU busy throughout. In the third 2 s, a
	// root shell of this user reaps another user's job that had run for
	// 50 s: this user's reaped ticks jump by 5,000 while the host was
	// busy for 200.
	for i := 0; i < 6; i++ {
		clk.advance(2 * time.Second)
		busy += 200
		reaped := int64(0)
		if i >= 2 {
			reaped = 5000
		}
		tree.set(busy, map[int]fakeProc{10: {1000, mine, reaped}})
		m.Others()
	}
	// 4 of the window's 5 intervals count; the one with the jump counts
	// none, instead of the jump cancelling the whole window. (The last
	// 2 s, at one CPU, are what Others gives.)
	if got := m.Others(); got.N != 1000 || !strings.Contains(got.Source, "0.80 over 10.0s") {
		t.Fatalf("got %+v, want 1000 millicores and 0.80 over the window", got)
	}
}

func TestCPUMeterUnknownWithoutProcStat(t *testing.T) {
	tree := newProcTree(t)
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	m := newMeter(t, tree, clk, nil)
	if got := m.Others(); !got.IsUnknown() || !strings.Contains(got.Unknown, "stat") {
		t.Fatalf("without /proc/stat: got %+v, want unknown naming it", got)
	}
	if err := os.WriteFile(filepath.Join(tree.root, "proc/stat"), []byte("intr 1 2 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := m.Others(); !got.IsUnknown() || !strings.Contains(got.Unknown, "cpu total") {
		t.Fatalf("with a /proc/stat that has no cpu line: got %+v, want unknown", got)
	}
}

// othersSnapshot is a 4-CPU host with no cgroup limit and others using
// others (nil: not measured).
func othersSnapshot(others *Value) *Snapshot {
	pol, _ := LoadPolicy("")
	return &Snapshot{
		Host:    Host{OnlineCPUs: Known(4, "online"), Affinity: Known(4, "affinity"), OthersCPU: others},
		Cgroups: Cgroups{CPUQuota: Unlimited("no quota"), Cpuset: Unlimited("no cpuset"), MemoryLimit: Unlimited("none")},
		Policy:  pol,
	}
}

func TestOthersCPULimitsTheBudget(t *testing.T) {
	p, _ := New(Config{})
	val := func(n int64) *Value {
		v := Known(n, "/proc/stat busy less shardpool's processes (pid 1, with their descendants of uid 0) over 10.0s")
		return &v
	}
	for _, c := range []struct {
		name     string
		others   *Value
		cpuset   Value
		want     int64
		binding  string
		hardWant int64
	}{
		{"not measured", nil, Unlimited("none"), 4000, "host online CPUs", 4000},
		{"a few tenths: daemons and kernel threads", val(400), Unlimited("none"), 4000, "host online CPUs", 4000},
		{"one CPU-bound process", val(1000), Unlimited("none"), 3000, ScopeOthers, 4000},
		{"most of three CPUs", val(2600), Unlimited("none"), 1000, ScopeOthers, 4000},
		{"more than the host", val(5000), Unlimited("none"), 0, ScopeOthers, 4000},
		{"a cpuset of our own", val(3000), Known(2, "cpuset"), 2000, "cgroup cpuset", 2000},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := othersSnapshot(c.others)
			s.Cgroups.Cpuset = c.cpuset
			b := p.budget(s)
			if got := b.CPU.Effective; !got.IsKnown() || got.N != c.want || !strings.HasPrefix(b.CPU.Binding, c.binding) {
				t.Errorf("cpu budget: got %+v bound by %q, want %d bound by %q", got, b.CPU.Binding, c.want, c.binding)
			}
			if got := b.Hard.CPU.Effective; got.N != c.hardWant {
				t.Errorf("cpu capacity: got %+v, want %d", got, c.hardWant)
			}
		})
	}
	// The binding names the numbers it came from.
	b := p.budget(othersSnapshot(val(1830)))
	if want := "host CPUs not in use by others: 4 online less 1.83 in use, counted as 2"; !strings.Contains(b.CPU.Binding, want) {
		t.Errorf("binding %q, want it to say %q", b.CPU.Binding, want)
	}
	// Unknown use is an unknown budget, never an idle host.
	u := Unknown("/proc/stat", "read: permission denied")
	b = p.budget(othersSnapshot(&u))
	if !b.CPU.Effective.IsUnknown() || !strings.Contains(b.CPU.Effective.Unknown, "permission denied") {
		t.Errorf("cpu budget with others' use unknown: got %+v, want unknown", b.CPU.Effective)
	}
	if !b.Hard.CPU.Effective.IsKnown() {
		t.Errorf("capacity does not depend on others' use: got %+v", b.Hard.CPU.Effective)
	}
}
