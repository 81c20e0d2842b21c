package testenv

import (
	"os"
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

// NewPowerCutFS makes and mounts a file system of size bytes at a new
// directory; it is unmounted at cleanup. It needs root (RequireRoot),
// mkfs.ext4 (which .ci/run installs) and a kernel with loop devices;
// without loop devices the test is skipped (as a test that needs a GPU
// is), naming why.
func NewPowerCutFS(t testing.TB, size int64) *PowerCutFS {
	t.Helper()
	RequireRoot(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skipf("a power cut cannot be simulated here: this kernel has no loop devices (%v)", err)
	}
	if err := powercut.Available(); err != nil {
		t.Fatalf("a power cut cannot be simulated here: %v", err)
	}
	fs, err := powercut.New(t.TempDir(), size)
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
