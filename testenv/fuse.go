package testenv

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// FuseDir mounts a FUSE file system at a new directory and returns it:
// bindfs (Debian package bindfs, which .ci/run installs) passing through
// to a directory of its own. Such a mount is what an output directory on
// sshfs, s3fs or gcsfuse is to a worker: another file system kind
// ("fuse"), with what FUSE leaves out; bindfs, like sshfs, refuses
// renameat2's RENAME_EXCHANGE (EINVAL) while it takes RENAME_NOREPLACE.
// It is unmounted at cleanup. The test needs root (RequireRoot).
func FuseDir(t testing.TB) string {
	t.Helper()
	RequireRoot(t)
	if _, err := exec.LookPath("bindfs"); err != nil {
		t.Fatalf("bindfs is not installed (apt-get install bindfs; .ci/run installs it): %v", err)
	}
	if !kernelHas("fuse") {
		t.Fatalf("this kernel has no FUSE (no fuse in /proc/filesystems)")
	}
	if _, err := os.Stat("/dev/fuse"); errors.Is(err, fs.ErrNotExist) {
		// A container's /dev may lack it where the kernel has it.
		if err := unix.Mknod("/dev/fuse", unix.S_IFCHR|0o666, int(unix.Mkdev(10, 229))); err != nil {
			t.Fatalf("no /dev/fuse, and making it failed: %v", err)
		}
	}
	base := t.TempDir()
	back, mnt := filepath.Join(base, "back"), filepath.Join(base, "fuse")
	for _, d := range []string{back, mnt} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("bindfs", back, mnt).CombinedOutput(); err != nil {
		t.Fatalf("bindfs %s %s: %v %s", back, mnt, err, out)
	}
	// Registered after t.TempDir's removal, so it runs first.
	t.Cleanup(func() {
		for range 50 {
			// A test may have unmounted it (mountpoint(1) then fails).
			if exec.Command("mountpoint", "-q", mnt).Run() != nil || exec.Command("umount", mnt).Run() == nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = exec.Command("umount", "-l", mnt).Run()
	})
	return mnt
}

// FuseDaemon is the pid of the bindfs process that serves the FuseDir
// mount mnt. Stopped (SIGSTOP), it makes the mount hang as a hard NFS
// mount whose server is gone: every call under it waits until the
// process runs again (SIGCONT), which the test must see to before
// FuseDir's cleanup unmounts it.
func FuseDaemon(t testing.TB, mnt string) int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if len(args) >= 3 && filepath.Base(args[0]) == "bindfs" && args[len(args)-1] == mnt {
			return pid
		}
	}
	t.Fatalf("no bindfs process serves %s", mnt)
	return 0
}

// HangFuse stops the bindfs process daemon (FuseDaemon) with SIGSTOP: its
// mount hangs until the returned resume sends SIGCONT. Resume may be
// called more than once; it also runs at the test's cleanup, ahead of
// FuseDir's unmount (cleanups run last registered first).
func HangFuse(t testing.TB, daemon int) (resume func()) {
	t.Helper()
	if err := unix.Kill(daemon, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	resume = func() {
		once.Do(func() {
			if err := unix.Kill(daemon, unix.SIGCONT); err != nil {
				t.Errorf("SIGCONT bindfs: %v", err)
			}
		})
	}
	t.Cleanup(resume)
	return resume
}
