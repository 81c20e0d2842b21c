package worker

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// TestEnvironIdentityTellsAnExecUnderWay: /proc/PID/environ reads empty
// while PID is in the middle of an exec, and so does its cmdline (on this
// VM about one read in six of a process exec'ing `sleep` as it was polled);
// that is told apart from a process that cleared its environment, which
// keeps a command line, from one whose environment names an attempt, and
// from a zombie or a kernel thread, which read empty too on some kernels.
func TestEnvironIdentityTellsAnExecUnderWay(t *testing.T) {
	root := t.TempDir()
	vars := "SHARDPOOL_RUN=r\x00SHARDPOOL_SHARD_ID=s1\x00SHARDPOOL_FINGERPRINT=f\x00SHARDPOOL_ATTEMPT=2\x00PATH=/bin\x00"
	// stat as the kernel writes it: state, then flags as the 9th field.
	stat := func(pid, state string, flags int) string {
		return fmt.Sprintf("%s (sh) %s 1 %s %s 0 -1 %d 0 0 0 0 5 3 0 0 20 0 1 0 100 1000 10 0\n", pid, state, pid, pid, flags)
	}
	for pid, files := range map[string][3]string{
		"10": {"", "", stat("10", "R", 0x400000)},                 // environ, cmdline, stat: an exec under way
		"11": {"", "sleep\x00300\x00", stat("11", "S", 0x400000)}, // env -i
		"12": {vars, "sleep\x00300\x00", stat("12", "S", 0x400000)},
		"13": {"PATH=/bin\x00", "sleep\x00", stat("13", "S", 0x400000)},
		// Where a kernel lets their environ be opened (not this VM's, see
		// TestZombieIsNotTakenForAnExecUnderWay), these read empty too.
		"15": {"", "", stat("15", "Z", 0x400004)}, // exited
		"16": {"", "", stat("16", "I", 0x208040)}, // a kernel thread
	} {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		for i, name := range []string{"environ", "cmdline", "stat"} {
			if err := os.WriteFile(filepath.Join(root, pid, name), []byte(files[i]), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	want := attemptIdentity([]string{"SHARDPOOL_RUN=r", "SHARDPOOL_SHARD_ID=s1", "SHARDPOOL_FINGERPRINT=f", "SHARDPOOL_ATTEMPT=2"})
	if want == 0 {
		t.Fatal("the attempt's identity is 0")
	}
	for _, c := range []struct {
		pid     int
		ident   uint64
		midExec bool
	}{{10, 0, true}, {11, 0, false}, {12, want, false}, {13, 0, false}, {14, 0, false}, {15, 0, false}, {16, 0, false}} { // 14: gone
		ident, mid := environIdentity(root, c.pid)
		if ident != c.ident || mid != c.midExec {
			t.Errorf("pid %d: identity %x, mid-exec %v; want %x, %v", c.pid, ident, mid, c.ident, c.midExec)
		}
	}
}

// TestZombieIsNotTakenForAnExecUnderWay: a process that exited after the
// reaper's process snapshot (so not skipped as a zombie there) reads as
// gone, not as mid-exec: its environ cannot be opened (ESRCH), where an
// exec under way reads empty. Else killStrays would wait killRounds for
// each such process. Read from the live /proc: a child of this test that
// exited and is not waited for yet.
func TestZombieIsNotTakenForAnExecUnderWay(t *testing.T) {
	pid := zombieChild(t)
	if vars, mid := shardEnviron("/proc", pid); mid || vars != nil {
		t.Fatalf("a zombie: vars %q, mid-exec %v; want none, not mid-exec", vars, mid)
	}
}
