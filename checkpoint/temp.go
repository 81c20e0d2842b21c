package checkpoint

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// TempPrefix begins the name of every temporary directory a commit makes
// beside its destination.
const TempPrefix = ".tmp-"

// A commit's temporary directory is locked (flock on the directory) from
// the moment it is made until it is renamed into place or removed, and
// made under a shared lock of its parent, so that SweepTemps, which takes
// the parent's lock exclusively, sees every live commit's directory
// locked and removes only what a dead process left (flocks end with their
// process, and with the host). Where the file system has no flock (some
// NFS mounts), commits go unlocked and SweepTemps removes nothing.

// newTemp makes parent/name locked against SweepTemps; close the returned
// file (which holds the lock) once the directory is renamed or removed.
func newTemp(parent, name string) (string, *os.File, error) {
	tmp := filepath.Join(parent, name)
	p, err := Open(parent)
	if err != nil {
		return "", nil, err
	}
	defer p.Close() // and with it the shared lock
	shared := Flock(p, unix.LOCK_SH) == nil
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return "", nil, err
	}
	if !shared {
		return tmp, nil, nil
	}
	lock, err := Open(tmp)
	if err != nil {
		os.Remove(tmp)
		return "", nil, err
	}
	if err := Flock(lock, unix.LOCK_EX|unix.LOCK_NB); err != nil {
		lock.Close()
		os.Remove(tmp)
		return "", nil, err
	}
	return tmp, lock, nil
}

// SweepTemps removes the temporary directories under dir that commits of
// processes no longer running left (a crash, SIGKILL, or power loss
// between a commit's first write and its rename), and returns their
// names. A live commit's directory is locked and stays.
func SweepTemps(dir string) ([]string, error) {
	p, err := os.Open(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	defer p.Close()
	if err := Flock(p, unix.LOCK_EX); err != nil {
		return nil, nil // no flock here: nothing can be told stale
	}
	ents, err := p.ReadDir(-1)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), TempPrefix) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		d, err := os.Open(path)
		if err != nil {
			continue
		}
		if Flock(d, unix.LOCK_EX|unix.LOCK_NB) == nil {
			if err := os.RemoveAll(path); err == nil {
				removed = append(removed, e.Name())
			}
		}
		d.Close()
	}
	return removed, nil
}

// Flock is flock(2) on f, tried again where a signal interrupted it.
func Flock(f *os.File, how int) error {
	for {
		err := unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			return err
		}
	}
}

func closeLock(f *os.File) {
	if f != nil {
		f.Close()
	}
}

// Writable makes and removes a directory in dir: nil where both worked.
// An error wrapping EROFS is a file system that refuses writes, which
// access(2) and statfs(2) may not tell (ext4's errors=remount-ro since
// Linux 6.12 leaves the mount read-write). The directory's name is a
// commit's temporary one, so that SweepTemps removes it where a crash
// left it.
func Writable(dir string) error {
	p := filepath.Join(dir, TempPrefix+"writable-"+randSuffix())
	if err := os.Mkdir(p, 0o700); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// Room looks whether dir's file system takes a commit of bytes in files
// now: nil where it does; an error that IsNoRoom where it does not (or
// one of the look's own). statfs(2) is read first: too few free blocks,
// or inodes where the file system counts them, answer without a write.
// Where it shows the room, a file of bytes is allocated there
// (fallocate(2)) and removed, as a quota or the blocks kept for root
// count it as they would the commit; a file system that allocates no
// such file (EOPNOTSUPP) is taken at statfs(2)'s word. The file is in a
// directory named as a commit's temporary one, which SweepTemps removes
// where a crash left it.
func Room(dir string, bytes int64, files int) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return err
	}
	if free := int64(st.Bavail) * int64(st.Bsize); free < bytes {
		return fmt.Errorf("%d bytes free of %d needed: %w", free, bytes, unix.ENOSPC)
	}
	if st.Files > 0 && st.Ffree < uint64(files)+2 {
		return fmt.Errorf("%d inodes free of %d needed: %w", st.Ffree, files+2, unix.ENOSPC)
	}
	p := filepath.Join(dir, TempPrefix+"room-"+randSuffix())
	if err := os.Mkdir(p, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(p)
	f, err := os.OpenFile(filepath.Join(p, "room"), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if bytes <= 0 {
		return nil
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, bytes)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOSYS) {
		return nil // statfs(2) said so above
	}
	return err
}
