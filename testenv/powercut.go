package testenv

import (
	"os"
	"strings"
	"testing"

	"github.com/shardpool/shardpool/coordinator/drill/powercut"
)

// PowerCutFS is a file system whose power a test can cut
// (coordinator/drill/powercut): Cut keeps what had reached the device and
// drops everything else, as a host that loses power does.
type PowerCutFS struct {
	t  testing.TB
	fs *powercut.FS
	// Dir is the mount point.
	Dir string
}

// PowerCutKinds are the file systems power-cut tests run under: ext4
// (with its journal) and XFS, whose metadata log and delayed allocation
// order what reaches the disk differently.
var PowerCutKinds = []string{powercut.Ext4, powercut.XFS}

// NewPowerCutFSKind makes and mounts a file system of kind and size bytes
// at a new directory; it is unmounted at cleanup. kind is powercut.Ext4
// (mkfs.ext4) or powercut.XFS (mkfs.xfs from xfsprogs; powercut.NewKind
// makes it at least powercut.MinXFS large), both of which .ci/run
// installs. It needs root (RequireRoot) and a kernel with loop devices;
// without loop devices the test is skipped (as a test that needs a GPU
// is), naming why.
func NewPowerCutFSKind(t testing.TB, size int64, kind string) *PowerCutFS {
	t.Helper()
	RequireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("a power cut cannot be simulated here: this kernel has no loop devices (%v)", err)
	}
	if err := powercut.AvailableKind(kind); err != nil {
		t.Fatalf("a power cut cannot be simulated here: %v", err)
	}
	fs, err := powercut.NewKind(t.TempDir(), size, kind)
	if err != nil && !kernelHas(kind) {
		// As without loop devices: the kernel, not a missing install. (A
		// module that exists is loaded by the mount, and listed after it.)
		t.Skipf("a power cut under %s cannot be simulated here: this kernel has no %s in /proc/filesystems (%v)", kind, kind, err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = fs.Close() })
	return &PowerCutFS{t: t, fs: fs, Dir: fs.Dir}
}

// Cut cuts the power. Kill every process that uses Dir first.
func (p *PowerCutFS) Cut() {
	p.t.Helper()
	if err := p.fs.Cut(); err != nil {
		p.t.Fatalf("power cut: %v", err)
	}
}

// kernelHas reports whether /proc/filesystems lists the file system kind.
func kernelHas(kind string) bool {
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil {
		return true // unknown: let the error stand
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] == kind {
			return true
		}
	}
	return false
}
