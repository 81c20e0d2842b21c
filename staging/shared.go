package staging

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/checkpoint"
)

// Stagers of several processes can share one cache directory: the
// default scratch is per user and worker name, so two `shardpool run`s
// of one user on one host stage into the same cache. Each keeps its own
// entries, so without a word between them one removed an input the
// other's command was reading (its shard's end, under --stage-cache 0),
// and both copied into one .part and renamed it (found by hand: two
// runs over the same three inputs, every shard of both failed). Locks
// on the disk, which end with their process, keep them apart:
//
//   - an entry is held shared (useLocks) while a shard of the process
//     uses it, from before its copy to its release: one byte of
//     <Dir>/.use, at an offset from the entry's name, locked through one
//     open file of the stager's (an open file description lock, fcntl
//     F_OFD_SETLK), however many entries its shards use;
//   - its copy, or the verification of a file found there, is made
//     holding <entry>/.copy exclusively (copyLock): a process that waits
//     for it then finds the file copied and verifies it;
//   - an entry is removed only by a process that holds its byte
//     exclusively (removeEntry, through a file of its own): one that
//     another process (or another shard of this one) uses stays, for
//     that one to remove when it is done with it.
//
// Until the sixty-seventh session each entry in use was its directory
// held open with flock: a shard of 20,000 small inputs held 20,000 open
// files and failed with "too many open files" (make bench's staging of
// small files).

// lockWait is how often a lock that another process holds is tried
// again (flock has no wait that a context can end).
const lockWait = 20 * time.Millisecond

// useLocks are the shared locks a stager holds on the entries its
// shards use, counted: two shards of the stager that use one entry hold
// one lock, let go when the last of them releases it.
type useLocks struct {
	path string // <Dir>/.use
	mu   sync.Mutex
	f    *os.File // open once, at the first use; nil before, or where it cannot be
	held map[string]*useRef
}

type useRef struct {
	n      int        // shards using the entry, under useLocks.mu
	mu     sync.Mutex // held while the lock is taken
	locked bool
}

const useLockName = ".use"

// useOffset is the byte of <Dir>/.use that stands for the entry named
// key. Two names that share one (one chance in 2^40) keep each other
// from being removed while either is used, no more.
func useOffset(key string) int64 { return int64(xxhash.Sum64String(key) & (1<<40 - 1)) }

// acquire holds the entry key shared for one more user (release), waiting
// while another process removes it: the user then makes its directory
// where missing. Its error is ctx's, with nothing held. Where the lock
// file cannot be opened or locked (a file system without locks) it goes
// on unlocked.
func (u *useLocks) acquire(ctx context.Context, key string) error {
	u.mu.Lock()
	if u.f == nil {
		if f, err := os.OpenFile(u.path, os.O_RDWR|os.O_CREATE, 0o644); err == nil {
			u.f = f
		}
	}
	f := u.f
	r := u.held[key]
	if r == nil {
		r = &useRef{}
		u.held[key] = r
	}
	r.n++
	u.mu.Unlock()
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.locked && f != nil {
		if err := rangePoll(ctx, f, unix.F_RDLCK, useOffset(key)); err != nil {
			u.release(key)
			return err
		}
		r.locked = true
	}
	return nil
}

// release lets go of one user of the entry key (acquire), and of its
// lock with the last.
func (u *useLocks) release(key string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	r := u.held[key]
	if r == nil {
		return
	}
	if r.n--; r.n > 0 {
		return
	}
	delete(u.held, key)
	// Under u.mu: an acquire of the same key after this one takes the
	// lock again only once it is let go here (one open file's locks on
	// a byte are one lock).
	if r.locked && u.f != nil {
		setRange(u.f, unix.F_UNLCK, useOffset(key))
	}
}

// close lets go of every lock (the stager's Close).
func (u *useLocks) close() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.f != nil {
		u.f.Close()
		u.f = nil
	}
}

// setRange sets the open file description lock how (F_RDLCK, F_WRLCK,
// F_UNLCK) on the byte at off of f, without waiting.
func setRange(f *os.File, how int16, off int64) error {
	lk := unix.Flock_t{Type: how, Whence: io.SeekStart, Start: off, Len: 1}
	return unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
}

// rangePoll takes the lock how on the byte at off of f, trying again
// every lockWait while another open file holds it, until ctx ends.
// Where the file system has no such locks, it goes on unlocked.
func rangePoll(ctx context.Context, f *os.File, how int16, off int64) error {
	return pollLock(ctx, func() bool { return busy(setRange(f, how, off)) })
}

// busy reports whether a lock was refused for another's (fcntl says
// EAGAIN or EACCES).
func busy(err error) bool {
	return errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EACCES)
}

// copyLock holds <dir>/.copy exclusively while the entry's file is
// copied or verified.
func copyLock(ctx context.Context, dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, copyLockName), os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := lockPoll(ctx, f, unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

const copyLockName = ".copy"

// removeEntry removes the entry directory dir (of the cache key) unless
// a stager holds it in use (useLocks: another process's, or a shard of
// this one), and reports whether it is gone. It is renamed aside first,
// so that a process about to use it finds it gone rather than half
// removed. The exclusive lock is taken through a file of its own: one
// stager's locks through one open file do not keep each other out.
func (u *useLocks) removeEntry(key, dir string) bool {
	if _, err := os.Lstat(dir); err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	if f, err := os.OpenFile(u.path, os.O_RDWR|os.O_CREATE, 0o644); err == nil {
		defer f.Close() // and with it the lock
		if err := setRange(f, unix.F_WRLCK, useOffset(key)); busy(err) {
			return false
		}
	}
	aside := filepath.Join(filepath.Dir(dir), removingPrefix+filepath.Base(dir))
	if err := os.Rename(dir, aside); err != nil {
		return os.RemoveAll(dir) == nil
	}
	return os.RemoveAll(aside) == nil
}

// removingPrefix names an entry directory being removed (removeEntry);
// one a crash left is removed by the next stager alone here (adopt).
const removingPrefix = ".rm-"

// lockPoll takes flock how on f, trying again every lockWait while
// another process holds it, until ctx ends. Where the file system has
// no flock, it goes on unlocked.
func lockPoll(ctx context.Context, f *os.File, how int) error {
	return pollLock(ctx, func() bool { return errors.Is(checkpoint.Flock(f, how|unix.LOCK_NB), unix.EWOULDBLOCK) })
}

// pollLock calls try, which takes a lock without waiting and reports
// whether another held it, again every lockWait until it did not, or
// until ctx ends (flock and fcntl have no wait that a context can end).
func pollLock(ctx context.Context, try func() (held bool)) error {
	for try() {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(lockWait):
		}
	}
	return nil
}

// lockName reports whether name, in the cache or an entry, is one of
// the stagers' own files (locks, a removal under way), not a staged
// input.
func lockName(name string) bool {
	return name == copyLockName || name == useLockName || name == copiesName || strings.HasPrefix(name, removingPrefix)
}
