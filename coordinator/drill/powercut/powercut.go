// Package powercut simulates a host losing power under a file system: an
// ext4 file system (with its journal, as ext4 is made by default) or an
// XFS one on a loop device, whose Cut keeps what had reached the device
// and drops everything else. What a program made durable (fsync, syncfs)
// survives a cut; what sat only in the page cache does not. The recovery
// drill and the tests use it; it needs root, a kernel with loop devices,
// and mkfs.ext4 (mkfs.xfs for XFS).
//
// The model: the caller SIGKILLs the processes that use the file system,
// then Cut copies the device as it is (direct reads, which bypass the page
// cache), repeated until no write reached the device during the copy, and
// mounts the copy in place of the file system, replaying its journal (its
// log, on XFS). The kernel may still write back some dirty data between
// the kill and the copy (its writeback timers run 5 and 30 s apart; ext4
// is mounted with commit=600 so that the journal does not commit on its
// own, and XFS flushes its log on a 30 s timer): that only makes more
// survive, never less.
package powercut

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// FS is a mounted file system whose power can be cut.
type FS struct {
	Dir  string // the mount point
	Kind string // Ext4 or XFS
	img  string
	n    int
}

// The kinds of file system NewKind makes.
const (
	Ext4 = "ext4"
	XFS  = "xfs"
)

// MinXFS is the smallest XFS file system mkfs.xfs makes (xfsprogs 5.19
// and later refuse less than 300 MiB).
const MinXFS = 300 << 20

// Available says why a power cut cannot be simulated here under an ext4
// file system, or nil.
func Available() error { return AvailableKind(Ext4) }

// AvailableKind says why a power cut cannot be simulated here under a
// file system of kind, or nil.
func AvailableKind(kind string) error {
	if kind != Ext4 && kind != XFS {
		return fmt.Errorf("no power cuts under %q file systems: %s or %s", kind, Ext4, XFS)
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root (to mount a loop device)")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fmt.Errorf("this kernel has no loop devices (%v)", err)
	}
	for _, tool := range []string{"mkfs." + kind, "mount", "umount", "findmnt"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("needs %s: %v", tool, err)
		}
	}
	return nil
}

// NewKind makes a file system of kind, Ext4 or XFS, of size bytes in an
// image file under base and mounts it at base/mnt; Close unmounts it. An
// XFS one is made at least MinXFS large, the least mkfs.xfs makes.
func NewKind(base string, size int64, kind string) (*FS, error) {
	if err := AvailableKind(kind); err != nil {
		return nil, err
	}
	if kind == XFS {
		size = max(size, MinXFS)
	}
	f := &FS{Dir: filepath.Join(base, "mnt"), Kind: kind, img: filepath.Join(base, "disk0.img")}
	if err := os.MkdirAll(f.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(f.img, nil, 0o600); err != nil {
		return nil, err
	}
	if err := os.Truncate(f.img, size); err != nil {
		return nil, err
	}
	// ext4: inode tables and the journal initialised now: the lazy init
	// thread would write to the device in the background, during a Cut's
	// copy. XFS allocates its inodes as they are needed.
	mkfs := exec.Command("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", f.img)
	if kind == XFS {
		mkfs = exec.Command("mkfs.xfs", "-q", "-f", f.img)
	}
	if out, err := mkfs.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%s %s: %v %s", mkfs.Args[0], f.img, err, bytes.TrimSpace(out))
	}
	return f, f.mount()
}

func (f *FS) mount() error {
	// XFS: nouuid, because the mount a Cut replaced may still be there,
	// detached, with the same UUID.
	opts := "loop,commit=600"
	if f.Kind == XFS {
		opts = "loop,nouuid"
	}
	if out, err := exec.Command("mount", "-t", f.Kind, "-o", opts, f.img, f.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("mount %s: %v %s", f.img, err, bytes.TrimSpace(out))
	}
	return nil
}

// Close unmounts the file system; the loop device that mount set up is
// freed with it. The image files stay under base.
func (f *FS) Close() error {
	if out, err := exec.Command("umount", f.Dir).CombinedOutput(); err != nil {
		// Something still uses it: detach now, free when it lets go.
		if out2, err2 := exec.Command("umount", "-l", f.Dir).CombinedOutput(); err2 != nil {
			return fmt.Errorf("umount %s: %v %s; %s", f.Dir, err, bytes.TrimSpace(out), bytes.TrimSpace(out2))
		}
	}
	return nil
}

// Cut cuts the power: the device's content becomes the file system at
// Dir, and everything only in the page cache is gone. Kill every process
// that uses Dir first.
func (f *FS) Cut() error {
	out, err := exec.Command("findmnt", "-n", "-o", "SOURCE", "--mountpoint", f.Dir).Output()
	if err != nil {
		return fmt.Errorf("findmnt %s: %v", f.Dir, err)
	}
	dev := strings.TrimSpace(string(out))
	f.n++
	snap := filepath.Join(filepath.Dir(f.img), fmt.Sprintf("disk%d.img", f.n))
	for try := 0; ; try++ {
		before, err := deviceWrites(dev)
		if err != nil {
			return err
		}
		if err := copyDevice(dev, snap); err != nil {
			return err
		}
		after, err := deviceWrites(dev)
		if err != nil {
			return err
		}
		if after == before {
			break
		}
		if try == 20 {
			return fmt.Errorf("%s kept being written to during 20 copies", dev)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The old mount goes with its page cache; its late writeback reaches
	// only the old image.
	if out, err := exec.Command("umount", "-l", f.Dir).CombinedOutput(); err != nil {
		return fmt.Errorf("umount %s: %v %s", f.Dir, err, bytes.TrimSpace(out))
	}
	f.img = snap
	return f.mount()
}

// deviceWrites is the count of writes the block device has completed and
// has in flight (/sys/block/<dev>/stat).
func deviceWrites(dev string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "stat"))
	if err != nil {
		return "", err
	}
	fields := strings.Fields(string(b))
	if len(fields) < 9 {
		return "", fmt.Errorf("%s stat: %q", dev, b)
	}
	return fields[4] + " " + fields[8], nil // writes completed, I/Os in flight
}

// copyDevice copies dev to a sparse file with direct reads, which bypass
// the page cache and see what the device holds.
func copyDevice(dev, to string) error {
	in, err := os.OpenFile(dev, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		return err
	}
	defer out.Close()
	// O_DIRECT needs an aligned buffer: a page-aligned slice of an mmap.
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return err
	}
	defer unix.Munmap(buf)
	zero := make([]byte, len(buf))
	var off int64
	for {
		n, err := in.Read(buf)
		if n > 0 && !bytes.Equal(buf[:n], zero[:n]) {
			if _, err := out.WriteAt(buf[:n], off); err != nil {
				return err
			}
		}
		off += int64(n)
		if err == io.EOF || n == 0 {
			break
		}
		if err != nil {
			return fmt.Errorf("read %s: %w", dev, err)
		}
	}
	if err := out.Truncate(off); err != nil {
		return err
	}
	return out.Close()
}
