package worker

import (
	"os"
	"path/filepath"
	"testing"
)

// TestEnvironIdentityTellsAnExecUnderWay: /proc/PID/environ reads empty
// while PID is in the middle of an exec, and so does its cmdline (on this
// VM about one read in six of a process exec'ing `sleep` as it was polled);
// that is told apart from a process that cleared its environment, which
// keeps a command line, and from one whose environment names an attempt.
func TestEnvironIdentityTellsAnExecUnderWay(t *testing.T) {
	root := t.TempDir()
	vars := "SHARDPOOL_RUN=r\x00SHARDPOOL_SHARD_ID=s1\x00SHARDPOOL_FINGERPRINT=f\x00SHARDPOOL_ATTEMPT=2\x00PATH=/bin\x00"
	for pid, files := range map[string][2]string{
		"10": {"", ""},                 // environ, cmdline: an exec under way
		"11": {"", "sleep\x00300\x00"}, // env -i
		"12": {vars, "sleep\x00300\x00"},
		"13": {"PATH=/bin\x00", "sleep\x00"},
	} {
		if err := os.MkdirAll(filepath.Join(root, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		for i, name := range []string{"environ", "cmdline"} {
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
	}{{10, 0, true}, {11, 0, false}, {12, want, false}, {13, 0, false}, {14, 0, false}} { // 14: gone
		ident, mid := environIdentity(root, c.pid)
		if ident != c.ident || mid != c.midExec {
			t.Errorf("pid %d: identity %x, mid-exec %v; want %x, %v", c.pid, ident, mid, c.ident, c.midExec)
		}
	}
}
