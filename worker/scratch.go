package worker

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// scratchPool hands out the {out} and {scratch} directory pairs of
// attempts and takes them back emptied, so that a short shard neither
// creates nor deletes a directory. Directory churn was the largest CPU cost
// of a short shard: ext4 skips recently deleted inodes when it allocates a
// new one (linearly, for a minute after each deletion on a file system
// without a journal), so every deletion made later creations slower.
//
// A pair is <scratch>/<run>/p<pid>-<n>.out and .tmp: the pid keeps two
// workers that share a scratch directory apart. The pool is emptied and
// removed when the worker exits; a pair whose emptying fails is dropped.
type scratchPool struct {
	root string
	pid  int

	mu   sync.Mutex
	free map[string][]string // run -> bases whose .out and .tmp are empty
	all  map[string]bool     // every base handed out, for removal at exit
	n    int
}

func newScratchPool(root string, pid int) *scratchPool {
	return &scratchPool{root: root, pid: pid, free: map[string][]string{}, all: map[string]bool{}}
}

// take returns a base path whose base.out and base.tmp exist and are empty.
func (p *scratchPool) take(run string) (string, error) {
	p.mu.Lock()
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
			return "", err
		}
		if err := emptyDir(d); err != nil {
			p.drop(base)
			return "", err
		}
	}
	return base, nil
}

// put empties base's directories and returns them to the pool.
func (p *scratchPool) put(run, base string) {
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

// drop removes base's directories and forgets it.
func (p *scratchPool) drop(base string) {
	os.RemoveAll(base + ".out")
	os.RemoveAll(base + ".tmp")
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
	bases := make([]string, 0, len(p.all))
	for b := range p.all {
		bases = append(bases, b)
	}
	p.all, p.free = map[string]bool{}, map[string][]string{}
	p.mu.Unlock()
	dirs := map[string]bool{}
	for _, b := range bases {
		os.RemoveAll(b + ".out")
		os.RemoveAll(b + ".tmp")
		dirs[filepath.Dir(b)] = true
	}
	for d := range dirs {
		os.Remove(d) // only if empty
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
		if strings.HasSuffix(d, ".out") || strings.HasSuffix(d, ".tmp") {
			os.RemoveAll(d)
		}
	}
}

// emptyDir removes everything inside dir, keeping dir. An empty directory
// costs one open and one read.
func emptyDir(dir string) error {
	f, err := os.Open(dir)
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
