package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
)

// syncDir fsyncs a directory so that renames and creations inside it are durable.
func syncDir(dir string) error {
	d, err := Open(dir)
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}

// writeFileNoSync writes b to path (a new file) and closes it; the caller
// makes it durable.
func writeFileNoSync(path string, b []byte) error { return writeNew(path, b, false, 0o644) }

// writeFileSync writes b to path (a new file), fsyncs and closes it.
func writeFileSync(path string, b []byte) error { return writeNew(path, b, true, 0o644) }

func writeNew(path string, b []byte, sync bool, perm os.FileMode) error {
	return writeNewFrom(path, sync, perm, writeBytes(b))
}

// writeBytes is the write function of writeNewFrom and WriteFileFrom that
// writes b.
func writeBytes(b []byte) func(io.Writer) error {
	return func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	}
}

// writeNewFrom is writeNew of what write writes.
func writeNewFrom(path string, sync bool, perm os.FileMode, write func(io.Writer) error) error {
	f, err := OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("sync %s: %w", path, err)
		}
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}

// WriteFile replaces path with data durably: a temp file in the same
// directory, write, fsync, close, rename, fsync the directory. The temp file
// is removed on every error path.
func WriteFile(path string, data []byte) error { return WriteFilePerm(path, data, 0o644) }

// tmpBeside names a temporary file in path's directory, for path.
func tmpBeside(path string) string {
	return filepath.Join(filepath.Dir(path), TempPrefix+filepath.Base(path)+"-"+randSuffix())
}

// WriteFilePerm is WriteFile with the new file's permissions (before the
// umask): 0600 for what only its user may read.
func WriteFilePerm(path string, data []byte, perm os.FileMode) error {
	return WriteFileFrom(path, perm, writeBytes(data))
}

// WriteFileFrom is WriteFilePerm of what write writes to the temporary
// file, for a file too large to hold twice in memory (a run's final.json
// of 200,000 shards is 24 MB, and its encoding in one piece 78 MB).
func WriteFileFrom(path string, perm os.FileMode, write func(io.Writer) error) error {
	dir := filepath.Dir(path)
	tmp := tmpBeside(path)
	if err := writeNewFrom(tmp, true, perm, write); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return syncDir(dir)
}

// CreateFilePerm is WriteFilePerm for a file that must not be replaced:
// it links the durable temporary file into place, so that of several
// processes creating path at once exactly one succeeds (created) and the
// others find its content there.
func CreateFilePerm(path string, data []byte, perm os.FileMode) (created bool, err error) {
	dir := filepath.Dir(path)
	tmp := tmpBeside(path)
	defer os.Remove(tmp)
	if err := writeNew(tmp, data, true, perm); err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Link(tmp, path); err != nil {
		if errors.Is(err, os.ErrExist) {
			return false, nil
		}
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Remove(tmp); err != nil {
		return true, fmt.Errorf("write %s: %w", path, err)
	}
	return true, syncDir(dir)
}

// copyBufs holds the buffers copyFrom reads through. io.Copy from an
// *os.File goes through its WriteTo, which allocates 32 KiB for every file
// it copies to anything but a socket: for an output of 20,000 small files
// that was most of the commit's and the verification's allocation.
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 128<<10); return &b }}

// copyFrom copies r into w through a pooled buffer and returns the bytes
// copied.
func copyFrom(w io.Writer, r io.Reader) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	return io.CopyBuffer(w, struct{ io.Reader }{r}, *bp)
}
