package worker

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/worker/probe"
)

// scratchPool hands out the {out} and {scratch} directory pairs of
// attempts and takes them back emptied, so that a short shard neither
// creates nor deletes a directory. Directory churn was the largest CPU cost
// of a short shard: ext4 skips recently deleted inodes when it allocates a
// new one (linearly, for a minute after each deletion on a file system
// without a journal), so every deletion made later creations slower.
//
// A pair is <scratch>/<run>/p<pid>-<n>.out and .tmp: the pid keeps two
// workers that share a scratch directory apart. An attempt whose inputs
// came as one pack unpacks them into a third, .in, made and removed by the
// attempt. The pool is emptied and
// removed when the worker exits; a pair whose emptying fails is dropped.
type scratchPool struct {
	root string
	pid  int

	mu    sync.Mutex
	free  map[string][]string // run -> bases whose .out and .tmp are empty
	all   map[string]bool     // every base handed out, for removal at exit
	taken map[string]int      // run -> bases handed out and not yet put back
	used  map[string]time.Time
	n     int

	// dropping is set while dropUnused's removal runs, which bg waits
	// for; closed keeps it from starting once close has. Both under mu.
	dropping, closed bool
	bg               sync.WaitGroup
}

func newScratchPool(root string, pid int) *scratchPool {
	return &scratchPool{root: root, pid: pid, free: map[string][]string{}, all: map[string]bool{}, taken: map[string]int{}, used: map[string]time.Time{}}
}

// take returns a base path whose base.out and base.tmp exist and are empty.
func (p *scratchPool) take(run string) (string, error) {
	p.mu.Lock()
	p.taken[run]++
	p.used[run] = time.Now()
	if free := p.free[run]; len(free) > 0 {
		base := free[len(free)-1]
		p.free[run] = free[:len(free)-1]
		p.mu.Unlock()
		return base, nil
	}
	p.n++
	base := filepath.Join(p.root, run, pairPrefix(p.pid)+strconv.Itoa(p.n))
	p.all[base] = true
	p.mu.Unlock()
	for _, d := range []string{base + ".out", base + ".tmp"} {
		// A directory left by an earlier process of the same pid (after a
		// reboot) is emptied rather than trusted.
		if err := os.MkdirAll(d, 0o755); err != nil {
			p.drop(base)
			p.untake(run)
			return "", err
		}
		if err := emptyDir(d); err != nil {
			p.drop(base)
			p.untake(run)
			return "", err
		}
	}
	return base, nil
}

// put empties base's directories and returns them to the pool.
func (p *scratchPool) put(run, base string) {
	defer p.untake(run)
	for _, d := range []string{base + ".out", base + ".tmp"} {
		if err := emptyDir(d); err != nil {
			p.drop(base)
			return
		}
	}
	p.mu.Lock()
	p.free[run] = append(p.free[run], base)
	p.mu.Unlock()
}

// scratchIdle is how long a run's pairs stay after its last shard here.
const scratchIdle = 10 * time.Minute

// untake counts a base of run back (put, or a take that failed).
func (p *scratchPool) untake(run string) {
	p.mu.Lock()
	p.taken[run]--
	p.used[run] = time.Now()
	p.mu.Unlock()
}

// dropIdle removes the pairs of each run none of whose pairs has been
// taken for idle, and the run's directory when that leaves it empty: a
// worker serving run after run for months would otherwise keep every
// run's pairs until it exits. A later shard of the run makes new ones.
func (p *scratchPool) dropIdle(idle time.Duration) {
	p.mu.Lock()
	var bases []string
	dirs := map[string]bool{}
	for run, at := range p.used {
		if p.taken[run] > 0 || time.Since(at) < idle {
			continue
		}
		for _, b := range p.free[run] {
			bases = append(bases, b)
			delete(p.all, b)
			dirs[filepath.Dir(b)] = true
		}
		delete(p.free, run)
		delete(p.taken, run)
		delete(p.used, run)
	}
	p.mu.Unlock()
	for _, b := range bases {
		removePair(b)
	}
	for d := range dirs {
		os.Remove(d) // only if empty
	}
}

// dropUnused removes, in the background, the pairs of every run none of
// whose pairs is taken: for a worker with nothing in hand and nothing
// queued. At the end of a run this overlaps the removal, which waits for
// the disk (close), with the coordinator's check of the outputs. A later
// shard makes new pairs.
func (p *scratchPool) dropUnused() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dropping || p.closed {
		return
	}
	p.dropping = true
	p.bg.Go(func() {
		p.dropIdle(0)
		p.mu.Lock()
		p.dropping = false
		p.mu.Unlock()
	})
}

// drop removes base's directories and forgets it.
func (p *scratchPool) drop(base string) {
	removePair(base)
	p.mu.Lock()
	delete(p.all, base)
	for run, free := range p.free {
		for i, b := range free {
			if b == base {
				p.free[run] = append(free[:i], free[i+1:]...)
				break
			}
		}
	}
	p.mu.Unlock()
}

// close removes every pair the pool made, and each run's directory if it
// is empty then.
func (p *scratchPool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.bg.Wait() // a run's directory goes once its pairs have
	p.mu.Lock()
	bases := make([]string, 0, len(p.all))
	for b := range p.all {
		bases = append(bases, b)
	}
	p.all, p.free = map[string]bool{}, map[string][]string{}
	p.mu.Unlock()
	// A few at a time: where freed blocks are discarded as they are freed
	// (ext4 mounted with discard and no journal, as on this VM), each
	// directory removed waits for the disk. One after another, the 54
	// pairs of a run of 5,000 short shards took 80 ms of its end, the
	// CPUs idle.
	dirs := map[string]bool{}
	var g errgroup.Group
	g.SetLimit(removers)
	for _, b := range bases {
		dirs[filepath.Dir(b)] = true
		g.Go(func() error {
			removePair(b)
			return nil
		})
	}
	g.Wait()
	for d := range dirs {
		os.Remove(d) // only if empty
	}
}

// removers is how many pairs close removes at once.
const removers = 8

// pairSuffixes are the directories of a base: {out}, {scratch} and the
// unpacked inputs.
var pairSuffixes = []string{".out", ".tmp", ".in"}

// removePair removes every directory of base.
func removePair(base string) {
	for _, s := range pairSuffixes {
		os.RemoveAll(base + s)
	}
}

// pairPrefix begins the names of a worker process's pairs.
func pairPrefix(pid int) string { return "p" + strconv.Itoa(pid) + "-" }

// removeDeadPairs removes the pairs a dead worker process left under its
// scratch root (its pool never closed).
func removeDeadPairs(root string, pid int) {
	if root == "" {
		return
	}
	pairs, _ := filepath.Glob(filepath.Join(root, "*", pairPrefix(pid)+"*"))
	for _, d := range pairs {
		for _, s := range pairSuffixes {
			if strings.HasSuffix(d, s) {
				os.RemoveAll(d)
			}
		}
	}
}

// emptyDir removes everything inside dir, keeping dir. An empty directory
// costs an open, two reads (the second says it ended) and a close.
func emptyDir(dir string) error {
	if empty, err := checkpoint.Empty(dir); err != nil || empty {
		return err
	}
	f, err := checkpoint.Open(dir)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	for _, n := range names {
		if err := os.RemoveAll(filepath.Join(dir, n)); err != nil {
			return err
		}
	}
	return nil
}

// ScratchBase is the directory in which the default scratch directories
// are made: the first directory of the policy's scratch list that exists
// on this host, or $TMPDIR where the policy lists none. One policy file
// (in a home directory every host mounts) can thus list the local disks
// of several kinds of host, "/tmp" last for hosts that have none. A list
// of which no directory exists here is an error, not a silent fall back
// to $TMPDIR: where a user listed scratch, /tmp is often the small disk
// (or memory) they meant to keep shards off.
func ScratchBase(pol probe.Policy) (string, error) {
	if len(pol.Scratch) == 0 {
		return os.TempDir(), nil
	}
	var why []string
	for _, d := range pol.Scratch {
		st, err := os.Stat(d)
		switch {
		case err == nil && st.IsDir():
			return d, nil
		case err == nil:
			why = append(why, d+" is not a directory")
		case errors.Is(err, os.ErrNotExist):
			why = append(why, d+" does not exist")
		default:
			why = append(why, err.Error())
		}
	}
	return "", fmt.Errorf("none of the scratch directories of policy %s is usable on this host (%s): make one, list one this host has, or pass --scratch DIR",
		pol.Path, strings.Join(why, "; "))
}

// DefaultScratchFor is the scratch directory of a worker named name when
// none is given: shardpool-<name>-<uid> in ScratchBase(pol) ($TMPDIR
// where the policy lists no scratch). The uid keeps the users of one host
// apart: without it the first user's directory was another's, who could
// not write in it (every shard failed) or, had it been open, could have
// read and changed the first user's work.
func DefaultScratchFor(pol probe.Policy, name string) (string, error) {
	base, err := ScratchBase(pol)
	if err != nil {
		return "", err
	}
	return filepath.Join(base, fmt.Sprintf("shardpool-%s-%d", name, os.Getuid())), nil
}

// PolicyScratch is DefaultScratchFor with the policy read from path ("":
// the user's, probe.DefaultPolicyPath).
func PolicyScratch(path, name string) (string, error) {
	if path == "" {
		path = probe.DefaultPolicyPath(os.Getenv)
	}
	pol, err := probe.LoadPolicy(path)
	if err != nil {
		return "", err
	}
	return DefaultScratchFor(pol, name)
}

// CheckScratch makes dir where it is missing (0700) and proves it usable
// by creating and removing a file in it. With own, the directory must also
// be this user's and not a symlink: the default one lives in a shared
// /tmp, where another user could have made it first. A directory given
// by the user may belong to someone else (a group's scratch space): there
// being able to write is enough.
func CheckScratch(dir string, own bool) error {
	const fix = "pass --scratch DIR for a local directory of your own"
	if !own {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("scratch directory %s: %w; %s", dir, err, fix)
		}
	} else if why, err := ownDir(dir); err != nil {
		return fmt.Errorf("scratch directory %s: %w; %s", dir, err, fix)
	} else if why != "" {
		return fmt.Errorf("scratch directory %s %s: remove it, or %s", dir, why, fix)
	}
	f, err := os.CreateTemp(dir, ".shardpool-check-*")
	if err != nil {
		return fmt.Errorf("scratch directory %s is not usable: %w; %s", dir, err, fix)
	}
	name := f.Name()
	f.Close()
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("scratch directory %s is not usable: %w; %s", dir, err, fix)
	}
	return nil
}

// ownDir makes dir (0700) where it is missing and says what keeps it from
// being a directory of this user alone: "" when nothing. In a shared
// temporary directory another user could have made it first, or a link in
// its place. err is a failure to make or look at it.
func ownDir(dir string) (why string, err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	info, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	switch {
	case info.Mode()&os.ModeSymlink != 0:
		return "is a symbolic link, not a directory (in a shared /tmp, anyone's)", nil
	case !info.IsDir():
		return "is not a directory", nil
	case ok && int(st.Uid) != os.Getuid():
		return fmt.Sprintf("belongs to uid %d, not to this user (uid %d)", st.Uid, os.Getuid()), nil
	}
	return "", nil
}

// scratchRecheck is how often a worker whose scratch directory failed
// looks at it again, fetching nothing meanwhile.
const scratchRecheck = 5 * time.Second

// scratchFault notes that the scratch directory failed an attempt: not the
// shard's failure but the host's, so the worker fetches nothing until the
// directory works again (scratchUsable), instead of spending every
// shard's retries on a full or removed /tmp. dir is the directory that
// failed (the run's, under the scratch directory): the recheck tries it.
func (w *Worker) scratchFault(err error, dir string) {
	w.scratchMu.Lock()
	first := w.scratchErr == nil
	w.scratchErr, w.scratchAt, w.scratchDir = err, time.Now(), dir
	w.scratchMu.Unlock()
	if first {
		w.log.Warn("scratch directory unusable: fetching nothing until it works again", "scratch", w.cfg.Scratch, "err", err)
		w.reportSoon()
	}
}

// scratchUsable is nil while the scratch directory works; after a fault,
// the fault, looked at again (CheckScratch) at most every scratchRecheck.
func (w *Worker) scratchUsable() error {
	w.scratchMu.Lock()
	defer w.scratchMu.Unlock()
	if w.scratchErr == nil || time.Since(w.scratchAt) < scratchRecheck {
		return w.scratchErr
	}
	err := CheckScratch(w.cfg.Scratch, w.defaultScratch)
	if err == nil && w.scratchDir != "" {
		err = CheckScratch(w.scratchDir, false)
	}
	if err != nil {
		w.scratchErr, w.scratchAt = err, time.Now()
		return err
	}
	w.log.Warn("scratch directory usable again", "scratch", w.cfg.Scratch)
	w.scratchErr = nil
	// The pool's pairs may be gone with the fault (removed under the
	// worker; a file system checked and mounted again keeps what it had
	// written out): new ones are made. Nothing is taken while the worker
	// holds, and nothing is fetched before this returns.
	w.scratch.dropIdle(0)
	w.reportSoon()
	return nil
}

// scratchBroken reports whether err, of a directory made in the scratch
// directory, says that the scratch cannot be used whatever the shard:
// read-only, gone, or a file system in error (EIO; ext4 also answers
// EUCLEAN and EBADMSG). Not a full one, which a command may have filled.
func scratchBroken(err error) bool {
	for _, e := range []error{unix.EROFS, unix.ENOENT, unix.EIO, unix.EUCLEAN, unix.EBADMSG} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
