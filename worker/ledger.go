package worker

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// The host ledger lets the workers of one user on one host share the
// host's budget. Without it every worker (a `shardpool run` in each of two
// terminals, a daemon worker and a `run`) admitted against the whole host:
// two of them on 2 CPUs ran 4 one-CPU shards, and each counted only its
// own shards' memory still to grow.
//
// The ledger is one file of fixed-size records, one per worker, each
// saying what that worker's shards in flight hold: CPU millicores, memory
// they may still grow by, GPUs held by UUID and GPUs admitted but not yet
// placed, and whether it waits for room. Every admission decision of an
// auto-mode worker takes the file's lock, reads the other records, decides
// with what they hold counted as shared, writes its own record with what
// it now holds, and unlocks: two workers never admit into the same room.
// A worker with fixed slots only writes. A record counts only while its worker's process is
// alive (pid and start time, this boot and pid namespace) and only for a
// worker with the same budget (share): workers in different Slurm
// allocations or under different limiting cgroups have budgets of their
// own. A worker that dies leaves its record, which then counts for nothing.

// ledgerRecSize is the size of one record; a record is JSON padded with
// spaces, ending in a newline.
const ledgerRecSize = 1024

// ledgerVersion is the record format; a record of another version (or one
// torn by a worker killed while writing it) is left alone and counts for
// nothing.
const ledgerVersion = 1

// ledgerRec is one worker's record.
type ledgerRec struct {
	V     int    `json:"v"`
	Host  string `json:"host"`
	Boot  string `json:"boot"`
	PIDNS string `json:"pidns,omitempty"`
	PID   int    `json:"pid"`
	Start int64  `json:"start"` // process start (clock ticks since boot): tells a reused pid apart
	Name  string `json:"name"`
	// Share names the budget the worker admits against; workers with equal
	// shares split one budget.
	Share string `json:"share"`
	// At is when the record was written (unix nanoseconds). A worker that
	// wants writes at least every wantsRewrite; its wanting counts for
	// wantsFor after the last write, so that a worker that stopped
	// deciding (its run ended) is not waited for.
	At int64 `json:"at"`
	Hold
}

const (
	wantsRewrite = time.Second
	wantsFor     = 3 * time.Second
)

// Hold is what a worker's shards in flight hold of the host.
type Hold struct {
	CPU        int64    `json:"cpu_millicores"`
	Memory     int64    `json:"memory_growth"` // bytes they may still grow by
	GPUs       []string `json:"gpus,omitempty"`
	GPUPending int64    `json:"gpus_pending,omitempty"` // admitted, not yet placed on a device
	// Wants says the worker has shards queued that the shared budget held
	// back: the others then keep to their fair share.
	Wants bool `json:"wants,omitempty"`
	// StarvedSince is when the worker began to want while holding nothing
	// (unix nanoseconds; 0: it holds something, or wants nothing). With
	// more workers than room, the one starved longest goes first.
	StarvedSince int64 `json:"starved_since,omitempty"`
	// NeedCPU, NeedMemory and NeedGPUs are one shard of the class it wants.
	NeedCPU    int64 `json:"need_cpu_millicores,omitempty"`
	NeedMemory int64 `json:"need_memory,omitempty"`
	NeedGPUs   int64 `json:"need_gpus,omitempty"`
}

// want marks h as wanting one more shard of a class with peak.
func (h *Hold) want(peak plan.Peak) {
	h.Wants, h.NeedCPU, h.NeedMemory, h.NeedGPUs = true, peak.CPU, peak.Memory, peak.GPUs
}

// others is what the other workers sharing the budget hold.
type others struct {
	Hold
	Workers []string // "name (pid N)"
	// Active counts the workers holding something or wanting more;
	// Wanting those that want more.
	Active, Wanting int
	// Starved are those that want while holding nothing.
	Starved []starved
	// HostGPUs and HostGPUPending are what every other live worker of
	// the host holds of its GPUs, whatever budget it admits against (a
	// device is the host's, not a budget's): the devices its shards
	// hold, and how many more its shards fetched and not yet placed
	// will take.
	HostGPUs       []string
	HostGPUPending int64
}

// starved is a worker that wants a shard while holding nothing.
type starved struct {
	who   string
	since int64
	need  room // one shard of the class it wants
}

// room is an amount of each resource: CPU millicores, memory bytes, GPUs.
type room struct{ cpu, memory, gpus int64 }

// hostLedger is this worker's handle on the ledger file.
type hostLedger struct {
	path     string
	procRoot string
	me       ledgerRec

	mu           sync.Mutex // held from begin to commit or abort
	f            *os.File
	slot         int
	buf          []byte    // read's
	last         Hold      // the hold last written
	writtenShare string    // the share it was written under
	writtenAt    time.Time // zero: nothing written yet
	decidedAt    time.Time // the last commit of an admission decision
	rootsAt      time.Time // the last begin (roots)

	// roots are the live workers of the last begin's share, whose process
	// trees the CPU meter counts as shardpool's (probe.CPUMeter.SetRoots):
	// read at each sample without the ledger's lock, so one decision old.
	roots atomic.Pointer[[]probe.ProcID]
}

// workerRoots is the last begin's live workers of the same share.
func (l *hostLedger) workerRoots() []probe.ProcID {
	if r := l.roots.Load(); r != nil {
		return *r
	}
	return nil
}

// DefaultLedgerDir is where the workers of this user on this host keep
// their ledger: $SHARDPOOL_HOST_LEDGER, else /tmp/shardpool-ledger-<uid>.
// Not $TMPDIR, which two shells of one user may set apart, nor
// $XDG_RUNTIME_DIR, which goes away at the user's last logout under a
// worker left running. It must be local to the host: on a directory
// shared by a cluster, records of other hosts would be read (they count
// for nothing, but the lock is shared).
func DefaultLedgerDir() string {
	if d := os.Getenv("SHARDPOOL_HOST_LEDGER"); d != "" {
		return d
	}
	return filepath.Join("/tmp", fmt.Sprintf("shardpool-ledger-%d", os.Getuid()))
}

// StageHostDir is where the stagers of this user on this host share
// their copy slots and bandwidth (staging.Config.HostDir): the host
// ledger's directory dir, where it is this user's; "" (each stager's
// own directory) where it is not.
func StageHostDir(dir string) string {
	if why, err := ownDir(dir); err != nil || why != "" {
		return ""
	}
	return dir
}

// ownRecord is the record of this process, under name, for a ledger
// handle that is not a worker's (a profile's, or a test's).
func ownRecord(name string) ledgerRec {
	pid := os.Getpid()
	host, _ := os.Hostname()
	return ledgerRec{Host: host, Boot: stream.BootID("/proc"), PIDNS: stream.PIDNamespace(), PID: pid,
		Start: processStart("/proc", pid), Name: name}
}

// openLedger opens (creating) the ledger in dir and writes this worker's
// empty record in a free slot: the slot of a dead worker, or a new one.
func openLedger(dir, procRoot string, me ledgerRec) (*hostLedger, error) {
	if why, err := ownDir(dir); err != nil {
		return nil, fmt.Errorf("host ledger: %w", err)
	} else if why != "" {
		return nil, fmt.Errorf("host ledger: %s is not a directory of this user", dir)
	}
	path := filepath.Join(dir, "ledger")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("host ledger: %w", err)
	}
	l := &hostLedger{path: path, procRoot: procRoot, me: me, f: f, slot: -1}
	if err := l.lock(); err != nil {
		f.Close()
		return nil, err
	}
	defer l.unlock()
	recs, err := l.read()
	if err != nil {
		f.Close()
		return nil, err
	}
	for i, r := range recs {
		if r == nil || l.reusable(r) {
			l.slot = i
			break
		}
	}
	if l.slot < 0 {
		l.slot = len(recs)
	}
	if err := l.write(Hold{}); err != nil {
		f.Close()
		return nil, err
	}
	return l, nil
}

func (l *hostLedger) lock() error {
	if err := unix.Flock(int(l.f.Fd()), unix.LOCK_EX); err != nil {
		return fmt.Errorf("host ledger %s: lock: %w", l.path, err)
	}
	return nil
}

func (l *hostLedger) unlock() { _ = unix.Flock(int(l.f.Fd()), unix.LOCK_UN) }

// read returns every slot's record but this worker's own: nil for an
// empty slot (and for its own), a record with V != ledgerVersion for one
// that does not parse as this version's.
func (l *hostLedger) read() ([]*ledgerRec, error) {
	// One pread into a buffer kept for the next decision; it grows while
	// the file fills it. A ledger of one worker parses nothing.
	n := 0
	for {
		if len(l.buf) == 0 {
			l.buf = make([]byte, 16*ledgerRecSize)
		}
		k, err := l.f.ReadAt(l.buf, 0)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("host ledger %s: %w", l.path, err)
		}
		if n = k; k < len(l.buf) {
			break
		}
		l.buf = make([]byte, 2*len(l.buf))
	}
	buf := l.buf[:n]
	recs := make([]*ledgerRec, (len(buf)+ledgerRecSize-1)/ledgerRecSize)
	for i := range recs {
		if i == l.slot {
			continue
		}
		b := buf[i*ledgerRecSize : min((i+1)*ledgerRecSize, len(buf))]
		if len(b) == 0 || b[0] == ' ' {
			// Emptied by close (all spaces): write puts a record at
			// the start of its slot. Not trimmed: a fixed-slots worker
			// reads the ledger at every fetch, and trimming the empty
			// slots of workers gone was 2% of a short shard's CPU.
			continue
		}
		b = bytes.TrimSpace(b)
		r := &ledgerRec{}
		if json.Unmarshal(b, r) != nil {
			r.V = -1
		}
		recs[i] = r
	}
	return recs, nil
}

// write puts this worker's record, holding h, in its slot, unless the
// slot already says so.
func (l *hostLedger) write(h Hold) error {
	now := time.Now()
	if l.written(l.me.Share, h, now) {
		return nil
	}
	r := l.me
	r.V, r.Hold, r.At = ledgerVersion, h, now.UnixNano()
	b, err := json.Marshal(&r)
	if err != nil {
		return err
	}
	if len(b) >= ledgerRecSize {
		// Only a long list of GPUs gets here: keep their number.
		r.GPUPending += int64(len(r.GPUs))
		r.GPUs = nil
		if b, err = json.Marshal(&r); err != nil || len(b) >= ledgerRecSize {
			return fmt.Errorf("host ledger %s: record of %d bytes does not fit", l.path, len(b))
		}
	}
	rec := bytes.Repeat([]byte{' '}, ledgerRecSize)
	copy(rec, b)
	rec[ledgerRecSize-1] = '\n'
	if _, err := l.f.WriteAt(rec, int64(l.slot)*ledgerRecSize); err != nil {
		return fmt.Errorf("host ledger %s: %w", l.path, err)
	}
	l.last, l.writtenShare, l.writtenAt = h, l.me.Share, now
	return nil
}

// written reports whether this worker's slot already says that it holds
// h under share (a record that wants is rewritten now and then, so that
// it does not read as stale).
func (l *hostLedger) written(share string, h Hold, now time.Time) bool {
	return !l.writtenAt.IsZero() && l.writtenShare == share && sameHold(l.last, h) && (!h.Wants || now.Sub(l.writtenAt) < wantsRewrite)
}

func sameHold(a, b Hold) bool {
	return a.CPU == b.CPU && a.Memory == b.Memory && a.GPUPending == b.GPUPending && a.Wants == b.Wants &&
		a.StarvedSince == b.StarvedSince && a.NeedCPU == b.NeedCPU && a.NeedMemory == b.NeedMemory && a.NeedGPUs == b.NeedGPUs && slices.Equal(a.GPUs, b.GPUs)
}

// alive reports whether r is a record of a running worker of this boot.
func (l *hostLedger) alive(r *ledgerRec) bool {
	if r.Boot != l.me.Boot || r.PIDNS != l.me.PIDNS {
		return false // another host sharing the directory, or another namespace: unprovable
	}
	if r.PID == l.me.PID && r.Start == l.me.Start {
		return true // this process (several workers in one, as in tests)
	}
	return pidAlive(r.PID) && processStart(l.procRoot, r.PID) == r.Start
}

// reusable reports whether r's slot may be taken: a record of this host
// whose worker is gone (an earlier boot, or a dead process of this one).
// A record of another host (a directory shared against advice) or of
// another pid namespace is left alone.
func (l *hostLedger) reusable(r *ledgerRec) bool {
	if r.V != ledgerVersion || r.Host != l.me.Host {
		return false
	}
	return r.Boot != l.me.Boot || (r.PIDNS == l.me.PIDNS && !l.alive(r))
}

// begin locks the ledger and returns what the other live workers of
// share hold. The caller must end with commit or abort.
func (l *hostLedger) begin(share string) (others, error) {
	if err := l.acquire(); err != nil {
		return others{}, err
	}
	recs, err := l.read()
	if err != nil {
		l.unlock()
		l.mu.Unlock()
		return others{}, err
	}
	l.me.Share = share
	var o others
	var roots []probe.ProcID
	for _, r := range recs {
		if r == nil || r.V != ledgerVersion || !l.alive(r) {
			continue // read leaves this worker's own slot nil
		}
		o.HostGPUs = append(o.HostGPUs, r.GPUs...)
		o.HostGPUPending += r.GPUPending
		if r.Share != share {
			continue
		}
		roots = append(roots, probe.ProcID{PID: r.PID, Start: r.Start})
		who := fmt.Sprintf("%s (pid %d)", r.Name, r.PID)
		o.CPU += r.CPU
		o.Memory += r.Memory
		o.GPUs = append(o.GPUs, r.GPUs...)
		o.GPUPending += r.GPUPending
		o.Workers = append(o.Workers, who)
		if time.Since(time.Unix(0, r.At)) > wantsFor {
			r.Wants, r.StarvedSince = false, 0 // it stopped deciding
		}
		if r.Wants {
			o.Wanting++
		}
		if r.StarvedSince != 0 {
			o.Starved = append(o.Starved, starved{who: who, since: r.StarvedSince, need: room{cpu: r.NeedCPU, memory: r.NeedMemory, gpus: r.NeedGPUs}})
		}
		if r.Wants || r.CPU > 0 || r.Memory > 0 || len(r.GPUs) > 0 || r.GPUPending > 0 {
			o.Active++
		}
	}
	l.roots.Store(&roots)
	l.rootsAt = time.Now()
	return o, nil
}

// rootsFor is how long publish goes without reading the other workers'
// records: workerRoots is at most this old for a worker with fixed slots.
const rootsFor = time.Second

// publish writes h as what this worker holds under share, and unlocks,
// like begin then commit, but reads the other workers' records only when
// workerRoots is older than rootsFor: a worker with fixed slots admits by
// its own count, and reading the ledger at each of its fetches was 1% of
// a short shard's CPU (forty-fourth session).
func (l *hostLedger) publish(share string, h Hold) error {
	l.mu.Lock()
	stale := time.Since(l.rootsAt) >= rootsFor
	l.mu.Unlock()
	if stale {
		if _, err := l.begin(share); err != nil {
			return err
		}
		return l.commit(h)
	}
	// Most fetches of a busy worker leave its hold as it was: nothing to
	// write, and no lock to take for it (two flock calls a fetch).
	l.mu.Lock()
	now := time.Now()
	if hs, ok := l.starving(h); ok && l.written(share, hs, now) {
		l.me.Share, l.decidedAt = share, now
		l.mu.Unlock()
		return nil
	}
	l.mu.Unlock()
	if err := l.acquire(); err != nil {
		return err
	}
	l.me.Share = share
	return l.commit(h)
}

// acquire takes the handle's mutex and the file's lock, both held until
// commit, recommit or abort.
func (l *hostLedger) acquire() error {
	l.mu.Lock()
	if err := l.lock(); err != nil {
		l.mu.Unlock()
		return err
	}
	return nil
}

// commit writes what this worker holds now, as an admission decision
// found it, and unlocks.
func (l *hostLedger) commit(h Hold) error {
	l.decidedAt = time.Now()
	return l.put(h)
}

// recommit writes what this worker holds now between decisions and
// unlocks: what it wants stays the last decision's while that is recent,
// and lapses when decisions stopped (its runs ended, its classes gone).
func (l *hostLedger) recommit(h Hold) error {
	if time.Since(l.decidedAt) < wantsFor {
		h.Wants, h.NeedCPU, h.NeedMemory, h.NeedGPUs = l.last.Wants, l.last.NeedCPU, l.last.NeedMemory, l.last.NeedGPUs
	}
	return l.put(h)
}

func (l *hostLedger) put(h Hold) error {
	defer l.mu.Unlock()
	defer l.unlock()
	h, ok := l.starving(h)
	if !ok {
		h.StarvedSince = time.Now().UnixNano()
	}
	return l.write(h)
}

// starving sets h's StarvedSince from the last record: none while it
// gets CPU or wants nothing, the last one's while it goes on starving. ok
// is false when h begins to starve: the caller sets the time.
func (l *hostLedger) starving(h Hold) (Hold, bool) {
	switch {
	case !h.Wants || h.CPU > 0:
		h.StarvedSince = 0
	case l.last.StarvedSince != 0:
		h.StarvedSince = l.last.StarvedSince
	default:
		return h, false
	}
	return h, true
}

// starvedSince is when this worker last began to starve (0: it is not
// starving); valid between begin and commit.
func (l *hostLedger) starvedSince() int64 { return l.last.StarvedSince }

// abort unlocks without writing.
func (l *hostLedger) abort() {
	l.unlock()
	l.mu.Unlock()
}

// close empties this worker's slot and closes the file.
func (l *hostLedger) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lock() == nil {
		_, _ = l.f.WriteAt(bytes.Repeat([]byte{' '}, ledgerRecSize), int64(l.slot)*ledgerRecSize)
		l.unlock()
	}
	l.f.Close()
}

// HostWorker is a live worker of this user on this host, as the host
// ledger has it.
type HostWorker struct {
	Name  string `json:"name"`
	PID   int    `json:"pid"`
	Start int64  `json:"start"` // process start, clock ticks since boot
	Share string `json:"share"`
	Hold
}

// HostWorkers lists the live workers in the host ledger of dir (none when
// there is no ledger there yet).
func HostWorkers(dir string) ([]HostWorker, error) {
	f, err := os.OpenFile(filepath.Join(dir, "ledger"), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("host ledger: %w", err)
	}
	defer f.Close()
	l := &hostLedger{path: f.Name(), procRoot: "/proc", f: f, slot: -1,
		me: ledgerRec{Boot: stream.BootID("/proc"), PIDNS: stream.PIDNamespace(), PID: -1}}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
		return nil, fmt.Errorf("host ledger %s: lock: %w", l.path, err)
	}
	recs, err := l.read()
	l.unlock()
	if err != nil {
		return nil, err
	}
	var out []HostWorker
	for _, r := range recs {
		if r != nil && r.V == ledgerVersion && l.alive(r) { // alive: of this boot, so of this host
			out = append(out, HostWorker{Name: r.Name, PID: r.PID, Start: r.Start, Share: r.Share, Hold: r.Hold})
		}
	}
	return out, nil
}
