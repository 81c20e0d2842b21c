package testenv

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// ErrorFS is an ext4 file system on a loop device, mounted with
// errors=remount-ro (as a disk's file systems usually are), on which a
// test can raise a file-system error: the kernel then refuses every
// write there with EROFS, as after a disk's I/O error or a corruption
// found. Since Linux 6.12 the mount stays listed read-write
// (emergency_ro), so that access(2) and statfs(2) call it writable.
type ErrorFS struct {
	t   testing.TB
	img string
	dev string // the loop device's name, as /sys/fs/ext4 lists it
	// Dir is the mount point.
	Dir string
}

// NewErrorFS makes and mounts an ext4 file system of size bytes at a new
// directory; it is unmounted at cleanup. It needs root (RequireRoot),
// mkfs.ext4 and e2fsck (e2fsprogs) and a kernel with loop devices;
// without loop devices, or without ext4's trigger_fs_error, the test is
// skipped, naming why.
func NewErrorFS(t testing.TB, size int64) *ErrorFS {
	t.Helper()
	RequireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("a failing file system cannot be made here: this kernel has no loop devices (%v)", err)
	}
	base := t.TempDir()
	img, dir := filepath.Join(base, "disk.img"), filepath.Join(base, "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4 %s: %v %s", img, err, bytes.TrimSpace(out))
	}
	e := &ErrorFS{t: t, img: img, Dir: dir}
	e.mount()
	t.Cleanup(func() {
		if out, err := exec.Command("umount", dir).CombinedOutput(); err != nil {
			if out2, err2 := exec.Command("umount", "-l", dir).CombinedOutput(); err2 != nil {
				t.Errorf("umount %s: %v %s; %s", dir, err, bytes.TrimSpace(out), bytes.TrimSpace(out2))
			}
		}
	})
	if _, err := os.Stat(e.trigger()); err != nil {
		t.Skipf("a file-system error cannot be raised here: this kernel's ext4 has no %s (%v)", e.trigger(), err)
	}
	return e
}

// mount mounts the image at Dir and notes its loop device.
func (e *ErrorFS) mount() {
	e.t.Helper()
	if out, err := exec.Command("mount", "-t", "ext4", "-o", "loop,errors=remount-ro", e.img, e.Dir).CombinedOutput(); err != nil {
		e.t.Fatalf("mount %s: %v %s", e.img, err, bytes.TrimSpace(out))
	}
	out, err := exec.Command("findmnt", "-n", "-o", "SOURCE", "--mountpoint", e.Dir).Output()
	if err != nil {
		e.t.Fatalf("findmnt %s: %v", e.Dir, err)
	}
	e.dev = filepath.Base(string(bytes.TrimSpace(out)))
}

// Repair does what an administrator does after such an error: unmounts
// the file system, checks it (e2fsck -fy), and mounts it again at Dir.
// What had not reached the disk is lost. Nothing may hold a file there
// open (a worker holds its staging cache's lock in its scratch
// directory): a lazy unmount would leave the broken mount alive, and
// mounting the image again would give it back.
func (e *ErrorFS) Repair() {
	e.t.Helper()
	if out, err := exec.Command("umount", e.Dir).CombinedOutput(); err != nil {
		e.t.Fatalf("umount %s: %v %s", e.Dir, err, bytes.TrimSpace(out))
	}
	// 1: errors corrected; more is a check that failed.
	if out, err := exec.Command("e2fsck", "-fy", e.img).CombinedOutput(); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() > 1 {
			e.t.Fatalf("e2fsck %s: %v %s", e.img, err, bytes.TrimSpace(out))
		}
	}
	e.mount()
}

func (e *ErrorFS) trigger() string { return filepath.Join("/sys/fs/ext4", e.dev, "trigger_fs_error") }

// Fail raises an error in the file system: from now on it refuses every
// write.
func (e *ErrorFS) Fail() {
	e.t.Helper()
	if err := os.WriteFile(e.trigger(), []byte("1\n"), 0o200); err != nil {
		e.t.Fatalf("raise an error in %s: %v", e.Dir, err)
	}
}
