package checkpoint

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Replica reports one replication.
type Replica struct {
	Source   string        `json:"source"`
	Path     string        `json:"path"`
	Bytes    int64         `json:"bytes"`
	Duration time.Duration `json:"-"`
	Seconds  float64       `json:"seconds"`
}

// Replicate copies the verified committed directory src to dst (for example
// a generation from local scratch to NFS): the files first, each hashed
// while copied and fsynced (a format 1 MANIFEST among them), then the
// source's COMPLETE marker last; the copy is verified in place before it
// is renamed to dst. A source that does not verify is refused; an existing
// dst that verifies with the same file list checksum is left as it is.
func Replicate(ctx context.Context, src, dst string) (Replica, error) {
	start := time.Now()
	mk, err := Verify(src)
	if err != nil {
		return Replica{}, fmt.Errorf("replicate %s: %w", src, err)
	}
	if have, err := Verify(dst); err == nil && have.Manifest == mk.Manifest {
		return Replica{Source: src, Path: dst, Duration: time.Since(start), Seconds: time.Since(start).Seconds()}, nil
	}
	parent := filepath.Dir(dst)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return Replica{}, fmt.Errorf("replicate %s: %w", src, err)
	}
	tmp, lock, err := newTemp(parent, TempPrefix+filepath.Base(dst)+"-"+randSuffix())
	if err != nil {
		return Replica{}, fmt.Errorf("replicate %s: %w", src, err)
	}
	defer closeLock(lock)
	fail := func(err error) (Replica, error) {
		os.RemoveAll(tmp)
		return Replica{}, fmt.Errorf("replicate %s to %s: %w", src, dst, err)
	}
	var total int64
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel == "." || rel == MarkerName {
			return nil
		}
		out := filepath.Join(tmp, rel)
		if d.IsDir() {
			return os.MkdirAll(out, 0o755)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		f, err := place(entry{src: p, rel: filepath.ToSlash(rel), mode: info.Mode().Perm()}, out, false, true)
		total += f.Size
		return err
	})
	if err != nil {
		return fail(err)
	}
	marker, err := os.ReadFile(filepath.Join(src, MarkerName))
	if err != nil {
		return fail(err)
	}
	if err := writeFileSync(filepath.Join(tmp, MarkerName), marker); err != nil {
		return fail(err)
	}
	if err := syncDir(tmp); err != nil {
		return fail(err)
	}
	if _, err := Verify(tmp); err != nil {
		return fail(err)
	}
	replaced, err := swapIn(tmp, dst)
	if err != nil {
		return fail(err)
	}
	if err := syncDir(parent); err != nil {
		return Replica{}, err
	}
	if replaced != "" {
		os.RemoveAll(replaced)
	}
	d := time.Since(start)
	return Replica{Source: src, Path: dst, Bytes: total, Duration: d, Seconds: d.Seconds()}, nil
}
