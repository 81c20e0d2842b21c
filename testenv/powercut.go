package testenv

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// PowerCutFS is an ext4 file system (with its journal, as ext4 is made by
// default) on a loop device, whose power a test can cut: Cut keeps what
// had reached the device and drops everything else, as a host that loses
// power does. What a program made durable (fsync, syncfs) survives a cut;
// what sat in the page cache does not.
//
// The model: the test SIGKILLs the processes that use the file system,
// then Cut copies the device as it is (a read that bypasses the page
// cache), repeated until no write reached the device during the copy, and
// mounts the copy in place of the file system, replaying its journal. The
// kernel may still write back some dirty data between the kill and the
// copy (its writeback timers run 5 and 30 s apart, and the file system is
// mounted with commit=600 so that the journal does not commit on its own);
// that only makes more survive, never less.
type PowerCutFS struct {
	t   testing.TB
	Dir string // the mount point
	img string
	n   int
}

// NewPowerCutFS makes and mounts a file system of size bytes at a new
// directory; it is unmounted at cleanup. It needs root, a kernel with loop
// devices, and mkfs.ext4; without loop devices the test is skipped (as a
// test that needs a GPU is), naming why.
func NewPowerCutFS(t testing.TB, size int64) *PowerCutFS {
	t.Helper()
	RequireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("this kernel has no loop devices (%v): a power cut cannot be simulated here", err)
	}
	base := t.TempDir()
	p := &PowerCutFS{t: t, Dir: filepath.Join(base, "mnt"), img: filepath.Join(base, "disk0.img")}
	if err := os.Mkdir(p.Dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(p.img, size); err != nil {
		t.Fatal(err)
	}
	// Inode tables and the journal initialised now: the lazy init thread
	// would write to the device in the background, during a Cut's copy.
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0", p.img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v %s", err, out)
	}
	p.mount()
	t.Cleanup(p.unmount)
	return p
}

func (p *PowerCutFS) mount() {
	p.t.Helper()
	if out, err := exec.Command("mount", "-o", "loop,commit=600", p.img, p.Dir).CombinedOutput(); err != nil {
		p.t.Fatalf("mount %s: %v %s", p.img, err, out)
	}
}

func (p *PowerCutFS) unmount() {
	// A loop device that mount set up is freed with its last unmount.
	_ = exec.Command("umount", p.Dir).Run()
}

// device is the loop device under the mount.
func (p *PowerCutFS) device() string {
	p.t.Helper()
	out, err := exec.Command("findmnt", "-n", "-o", "SOURCE", "--mountpoint", p.Dir).Output()
	if err != nil {
		p.t.Fatalf("findmnt %s: %v", p.Dir, err)
	}
	return strings.TrimSpace(string(out))
}

// Cut cuts the power: the device's content becomes the file system at
// Dir, and everything only in the page cache is gone. Kill every process
// that uses Dir first.
func (p *PowerCutFS) Cut() {
	p.t.Helper()
	dev := p.device()
	p.n++
	snap := filepath.Join(filepath.Dir(p.img), fmt.Sprintf("disk%d.img", p.n))
	for try := 0; ; try++ {
		before := deviceWrites(p.t, dev)
		copyDevice(p.t, dev, snap)
		if deviceWrites(p.t, dev) == before {
			break
		}
		if try == 20 {
			p.t.Fatalf("%s kept being written to during 20 copies", dev)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The old mount goes with its page cache; its late writeback reaches
	// only the old image.
	if out, err := exec.Command("umount", "-l", p.Dir).CombinedOutput(); err != nil {
		p.t.Fatalf("umount %s: %v %s", p.Dir, err, out)
	}
	p.img = snap
	p.mount()
}

// deviceWrites is the count of writes the block device has completed and
// has in flight (/sys/block/<dev>/stat).
func deviceWrites(t testing.TB, dev string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "stat"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) < 9 {
		t.Fatalf("%s stat: %q", dev, b)
	}
	return f[4] + " " + f[8] // writes completed, I/Os in flight
}

// copyDevice copies dev to a sparse file with direct reads, which bypass
// the page cache and see what the device holds.
func copyDevice(t testing.TB, dev, to string) {
	t.Helper()
	in, err := os.OpenFile(dev, os.O_RDONLY|unix.O_DIRECT, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	// O_DIRECT needs an aligned buffer: a page-aligned slice of an mmap.
	buf, err := unix.Mmap(-1, 0, 1<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(buf)
	zero := make([]byte, len(buf))
	var off int64
	for {
		n, err := in.Read(buf)
		if n > 0 && !bytes.Equal(buf[:n], zero[:n]) {
			if _, err := out.WriteAt(buf[:n], off); err != nil {
				t.Fatal(err)
			}
		}
		off += int64(n)
		if err == io.EOF || n == 0 {
			break
		}
		if err != nil {
			t.Fatalf("read %s: %v", dev, err)
		}
	}
	if err := out.Truncate(off); err != nil {
		t.Fatal(err)
	}
}
