package staging

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

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
//   - an entry's directory is held shared (useLock) while a shard of the
//     process uses it, from before its copy to its release;
//   - its copy, or the verification of a file found there, is made
//     holding <entry>/.copy exclusively (copyLock): a process that waits
//     for it then finds the file copied and verifies it;
//   - a directory is removed only by a process that holds it
//     exclusively (removeEntry): one that another process uses stays,
//     for that process to remove when it is done with it.

// lockWait is how often a lock that another process holds is tried
// again (flock has no wait that a context can end).
const lockWait = 20 * time.Millisecond

// useLock makes the entry directory dir where missing, opens it and
// holds it shared. A directory removed while the lock was awaited (its
// remover held it) is made again.
func useLock(ctx context.Context, dir string) (*os.File, error) {
	for {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		f, err := os.Open(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue // removed between the two
		}
		if err != nil {
			return nil, err
		}
		if err := lockPoll(ctx, f, unix.LOCK_SH); err != nil {
			f.Close()
			return nil, err
		}
		if sameFile(f, dir) {
			return f, nil
		}
		f.Close()
	}
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

// removeEntry removes the entry directory dir unless another process
// holds it (useLock), and reports whether it is gone. It is renamed
// aside first, so that a process about to use it finds it gone rather
// than half removed.
func removeEntry(dir string) bool {
	f, err := os.Open(dir)
	if err != nil {
		return errors.Is(err, fs.ErrNotExist)
	}
	defer f.Close()
	if err := checkpoint.Flock(f, unix.LOCK_EX|unix.LOCK_NB); errors.Is(err, unix.EWOULDBLOCK) {
		return false
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
	for {
		err := checkpoint.Flock(f, how|unix.LOCK_NB)
		if err == nil || !errors.Is(err, unix.EWOULDBLOCK) {
			return nil
		}
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(lockWait):
		}
	}
}

// sameFile reports whether f is still what path names.
func sameFile(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

// lockName reports whether name, in the cache or an entry, is one of
// the stagers' own files (locks, a removal under way), not a staged
// input.
func lockName(name string) bool {
	return name == copyLockName || strings.HasPrefix(name, removingPrefix)
}
