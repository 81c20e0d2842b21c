package checkpoint

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// On Linux os.OpenFile offers every file it opens to Go's poller, which
// refuses regular files and directories: each open costs four fcntl calls
// and an epoll_ctl besides the open. A commit opens several files and
// directories per shard, and a worker empties two directories per
// attempt; those opens go through OpenFile below, whose files never meet
// the poller (os.NewFile of a blocking descriptor: one fcntl). Measured
// in the forty-fourth session at about 4% of a short shard's CPU.

// OpenFile is os.OpenFile for regular files and directories, without the
// poller. Pipes, sockets and terminals need os.OpenFile: reads and writes
// on the returned file block their thread.
func OpenFile(name string, flag int, perm fs.FileMode) (*os.File, error) {
	fd, err := openFD(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// openFD opens name close-on-exec, again where a signal interrupted it.
func openFD(name string, flag int, perm fs.FileMode) (int, error) {
	for {
		fd, err := unix.Open(name, flag|unix.O_CLOEXEC, uint32(perm.Perm()))
		if err == nil {
			return fd, nil
		}
		if !errors.Is(err, unix.EINTR) {
			return -1, &fs.PathError{Op: "open", Path: name, Err: err}
		}
	}
}

// Open is os.Open through OpenFile.
func Open(name string) (*os.File, error) { return OpenFile(name, os.O_RDONLY, 0) }

// ReadDir is os.ReadDir through OpenFile: the entries of dir sorted by name.
func ReadDir(dir string) ([]fs.DirEntry, error) {
	f, err := OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ents, err := f.ReadDir(-1)
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return ents, err
}

// ReadFile is os.ReadFile through OpenFile.
func ReadFile(name string) ([]byte, error) {
	f, err := Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// walkDir is filepath.WalkDir through ReadDir for a root that is a
// directory: fn sees root first, then every entry below it in lexical
// order, each directory before what it holds. An error of fn, or of
// reading a directory, ends the walk and is returned.
func walkDir(root string, fn func(path string, d fs.DirEntry) error) error {
	info, err := os.Lstat(root)
	if err != nil {
		return err
	}
	if err := fn(root, fs.FileInfoToDirEntry(info)); err != nil || !info.IsDir() {
		return err
	}
	return walkBelow(root, fn)
}

func walkBelow(dir string, fn func(path string, d fs.DirEntry) error) error {
	ents, err := ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		if err := fn(p, e); err != nil {
			return err
		}
		if e.IsDir() {
			if err := walkBelow(p, fn); err != nil {
				return err
			}
		}
	}
	return nil
}

// Empty reports whether dir has no entries, reading it without an
// *os.File (whose setup costs a fcntl and a finalizer): the scratch pool
// checks two directories a shard, nearly always empty.
func Empty(dir string) (bool, error) {
	fd, err := openFD(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return false, err
	}
	defer unix.Close(fd)
	var buf [1024]byte
	for {
		n, err := unix.Getdents(fd, buf[:])
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return false, &fs.PathError{Op: "readdirent", Path: dir, Err: err}
		}
		if n <= 0 {
			return true, nil
		}
		if _, count, _ := unix.ParseDirent(buf[:n], 1, nil); count > 0 {
			return false, nil
		}
	}
}
