package worker

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/worker/probe"
)

// TestLedgerCountsOnlyLiveWorkersOfTheSameBudget: what another worker
// holds counts while its process lives and admits against the same
// budget; a dead worker's record counts for nothing and its slot is taken
// by the next worker; a closed worker's record is gone.
func TestLedgerCountsOnlyLiveWorkersOfTheSameBudget(t *testing.T) {
	dir := t.TempDir()
	self := ledgerRec{Host: "h1", Boot: "b1", PID: os.Getpid(), Start: processStart("/proc", os.Getpid())}
	open := func(name string, r ledgerRec) *hostLedger {
		t.Helper()
		r.Name = name
		l, err := openLedger(dir, "/proc", r)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	a, b := open("a", self), open("b", self)
	if a.slot == b.slot {
		t.Fatalf("two live workers in slot %d", a.slot)
	}
	const share = "memory host; cpu host; cpuset host"
	if _, err := b.begin(share); err != nil {
		t.Fatal(err)
	}
	if err := b.commit(Hold{CPU: 2000, Memory: 3 << 30, GPUs: []string{"GPU-1"}, GPUPending: 1}); err != nil {
		t.Fatal(err)
	}
	o, err := a.begin(share)
	a.abort()
	if err != nil || o.CPU != 2000 || o.Memory != 3<<30 || len(o.GPUs) != 1 || o.GPUPending != 1 || len(o.Workers) != 1 || !strings.HasPrefix(o.Workers[0], "b (pid ") {
		t.Fatalf("a sees %+v (%v), want b's 2000 millicores, 3 GiB, GPU-1 and one pending", o, err)
	}
	// b's process tree is shardpool's for a's CPU meter, not others' use.
	if got := a.workerRoots(); len(got) != 1 || got[0] != (probe.ProcID{PID: self.PID, Start: self.Start}) {
		t.Fatalf("roots for the CPU meter: %+v, want b's process %d started at %d", got, self.PID, self.Start)
	}
	// Another budget (a Slurm allocation of its own) is not shared.
	if o, _ := a.begin("slurm 42"); o.CPU != 0 || len(o.Workers) != 0 || len(a.workerRoots()) != 0 {
		t.Fatalf("a under another budget sees %+v and roots %+v, want nothing", o, a.workerRoots())
	} else {
		a.abort()
	}

	// A worker whose process is gone: its record stays in the file but
	// counts for nothing, and the next worker takes its slot.
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := open("dead", ledgerRec{Host: "h1", Boot: "b1", PID: cmd.Process.Pid, Start: 12345})
	if _, err := dead.begin(share); err != nil {
		t.Fatal(err)
	}
	if err := dead.commit(Hold{CPU: 8000}); err != nil {
		t.Fatal(err)
	}
	deadSlot := dead.slot
	dead.f.Close() // killed: no close of its record
	if o, _ := a.begin(share); o.CPU != 2000 {
		t.Fatalf("with a dead worker's record of 8000 millicores: a sees %d, want b's 2000", o.CPU)
	} else if roots := a.workerRoots(); len(roots) != 1 || roots[0].PID != self.PID {
		t.Fatalf("with a dead worker's record: roots %+v, want only b's", roots)
	} else {
		a.abort()
	}
	c := open("c", self)
	if c.slot != deadSlot {
		t.Errorf("new worker in slot %d, want the dead worker's %d", c.slot, deadSlot)
	}
	if _, err := c.begin(share); err != nil {
		t.Fatal(err)
	}
	if err := c.commit(Hold{}); err != nil {
		t.Fatal(err)
	}

	// A record of another host (a directory shared against advice) counts
	// for nothing, and its slot is left alone; one of an earlier boot of
	// this host is taken.
	other := open("other", ledgerRec{Host: "h2", Boot: "b2", PID: os.Getpid(), Start: self.Start})
	if _, err := other.begin(share); err == nil {
		other.commit(Hold{CPU: 5000})
	}
	if o, _ := a.begin(share); o.CPU != 2000 || len(o.Workers) != 2 || o.Active != 1 {
		t.Fatalf("with another host's record: a sees %+v, want b's 2000 and c (b active, c idle)", o)
	} else {
		a.abort()
	}
	if d := open("d", self); d.slot == other.slot {
		t.Errorf("new worker took the slot of another host's worker")
	}
	// A record left by an earlier boot, appended as that boot wrote it.
	fi, err := os.Stat(filepath.Join(dir, "ledger"))
	if err != nil {
		t.Fatal(err)
	}
	rebooted := &hostLedger{path: filepath.Join(dir, "ledger"), me: ledgerRec{Host: "h1", Boot: "b0", PID: 1, Start: 1, Name: "old"},
		f: a.f, slot: int(fi.Size() / ledgerRecSize)}
	if err := rebooted.write(Hold{CPU: 1000}); err != nil {
		t.Fatal(err)
	}
	if e := open("e", self); e.slot != rebooted.slot {
		t.Errorf("new worker in slot %d, want the earlier boot's %d", e.slot, rebooted.slot)
	}

	bSlot := b.slot
	b.close()
	if o, _ := a.begin(share); o.CPU != 0 || len(o.Workers) != 1 || !strings.HasPrefix(o.Workers[0], "c (pid ") {
		t.Fatalf("after b closed: a sees %+v, want only c, holding nothing (d and e never began)", o)
	} else {
		a.abort()
	}
	// The slot b emptied (all spaces, skipped unread) is the next one's.
	if f := open("f", self); f.slot != bSlot {
		t.Errorf("new worker in slot %d, want %d, emptied by b", f.slot, bSlot)
	}
}

// TestLedgerRefusesAForeignDirectory: in a shared temporary directory the
// ledger's directory must be this user's own, not a link someone put
// there.
func TestLedgerRefusesAForeignDirectory(t *testing.T) {
	base := t.TempDir()
	target := t.TempDir()
	link := filepath.Join(base, "ledger-dir")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := openLedger(link, "/proc", ledgerRec{Boot: "b"}); err == nil || !strings.Contains(err.Error(), "not a directory of this user") {
		t.Fatalf("ledger through a symlink: %v, want refused", err)
	}
}

// TestStarvedSinceIsKeptWhileStarving: a worker that wants a shard while
// holding nothing keeps the time it began to wait across its writes, a
// refresh between decisions included, so that its place in line holds;
// holding something, or wanting nothing, ends it.
func TestStarvedSinceIsKeptWhileStarving(t *testing.T) {
	self := ledgerRec{Host: "h", Boot: "b", Name: "w", PID: os.Getpid(), Start: processStart("/proc", os.Getpid())}
	l, err := openLedger(t.TempDir(), "/proc", self)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	w := &Worker{gates: map[string]*gate{}, peaks: map[string]plan.Peak{}, ledger: l}
	write := func(h Hold) int64 {
		t.Helper()
		if _, err := l.begin("s"); err != nil {
			t.Fatal(err)
		}
		if err := l.commit(h); err != nil {
			t.Fatal(err)
		}
		return l.last.StarvedSince
	}
	since := write(Hold{Wants: true, NeedCPU: 1000})
	if since == 0 {
		t.Fatal("wanting while holding nothing: not starved")
	}
	time.Sleep(time.Millisecond)
	if again := write(Hold{Wants: true, NeedCPU: 1000}); again != since {
		t.Fatalf("starved since %d, then %d: the first time must hold", since, again)
	}
	w.refreshHold()
	if l.last.StarvedSince != since || !l.last.Wants || l.last.NeedCPU != 1000 {
		t.Fatalf("after a refresh: %+v, want still starved since %d, wanting 1000 millicores", l.last, since)
	}
	// Another worker sees it starved, until its record is older than
	// wantsFor: a worker whose runs ended stops deciding and is not waited
	// for.
	other, err := openLedger(l.path[:len(l.path)-len("/ledger")], "/proc", ledgerRec{Host: "h", Boot: "b", Name: "o", PID: os.Getpid(), Start: self.Start})
	if err != nil {
		t.Fatal(err)
	}
	defer other.close()
	if o, _ := other.begin("s"); len(o.Starved) != 1 || o.Wanting != 1 {
		t.Fatalf("another worker sees %+v, want w starved and wanting", o)
	} else {
		other.abort()
	}
	if _, err := l.begin("s"); err != nil {
		t.Fatal(err)
	}
	stale := time.Now().Add(-2 * wantsFor)
	l.decidedAt = stale
	r := l.me
	r.V, r.At, r.Hold = ledgerVersion, stale.UnixNano(), l.last
	b, _ := json.Marshal(&r)
	rec := append(b, bytes.Repeat([]byte{' '}, ledgerRecSize-len(b))...)
	rec[ledgerRecSize-1] = '\n'
	l.f.WriteAt(rec, int64(l.slot)*ledgerRecSize)
	l.abort()
	if o, _ := other.begin("s"); len(o.Starved) != 0 || o.Wanting != 0 {
		t.Fatalf("another worker sees %+v in a record written %s ago, want nothing wanted", o, 2*wantsFor)
	} else {
		other.abort()
	}
	w.refreshHold()
	if l.last.Wants || l.last.StarvedSince != 0 {
		t.Fatalf("a refresh %s after the last decision: %+v, want wanting nothing", 2*wantsFor, l.last)
	}
	if got := write(Hold{Wants: true, CPU: 1000}); got != 0 {
		t.Fatalf("holding a shard: starved since %d, want 0", got)
	}
	if got := write(Hold{}); got != 0 {
		t.Fatalf("wanting nothing: starved since %d, want 0", got)
	}
}

// TestPublishTakesNoLockForAnUnchangedHold: a fixed-slots worker publishes
// at every fetch; where its hold is what its slot already says, nothing is
// written and the file's lock is not taken (another worker holding it
// delays nothing). A changed hold waits for the lock and is written.
func TestPublishTakesNoLockForAnUnchangedHold(t *testing.T) {
	dir := t.TempDir()
	me := ledgerRec{Name: "fixed", Host: "h1", Boot: "b1", PID: os.Getpid(), Start: processStart("/proc", os.Getpid())}
	l, err := openLedger(dir, "/proc", me)
	if err != nil {
		t.Fatal(err)
	}
	defer l.close()
	const share = "memory host; cpu host; cpuset host"
	h := Hold{CPU: 4000, Memory: 1 << 30}
	if err := l.publish(share, h); err != nil {
		t.Fatal(err)
	}
	other, err := os.Open(l.path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if err := unix.Flock(int(other.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- l.publish(share, h) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("publish of an unchanged hold waited for the ledger's lock")
	}
	changed := Hold{CPU: 3000, Memory: 1 << 30}
	go func() { done <- l.publish(share, changed) }()
	select {
	case err := <-done:
		t.Fatalf("publish of a changed hold returned (%v) while another held the lock", err)
	case <-time.After(100 * time.Millisecond):
	}
	unix.Flock(int(other.Fd()), unix.LOCK_UN)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(l.path)
	if err != nil {
		t.Fatal(err)
	}
	var got ledgerRec
	if err := json.Unmarshal(bytes.TrimSpace(b[l.slot*ledgerRecSize:(l.slot+1)*ledgerRecSize]), &got); err != nil || got.CPU != 3000 {
		t.Fatalf("slot after the change: %+v (%v), want 3000 millicores", got.Hold, err)
	}
}
