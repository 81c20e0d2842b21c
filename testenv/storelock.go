package testenv

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// LockStore takes the flock (how: unix.LOCK_SH or unix.LOCK_EX) of the
// store of run under the state directory dir, as a coordinator holding it
// (LOCK_EX, with holder as the lock file's content) or a status looking
// at it (LOCK_SH) would. Closing the file, or the test's end, releases it.
func LockStore(t testing.TB, dir, run string, how int, holder string) *os.File {
	t.Helper()
	store := filepath.Join(dir, "stores", run)
	if err := os.MkdirAll(store, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(store, "coordinator.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		t.Fatal(err)
	}
	if holder != "" {
		if _, err := f.WriteString(holder); err != nil {
			t.Fatal(err)
		}
	}
	return f
}
