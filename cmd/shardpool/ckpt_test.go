package main

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardpool/shardpool/testenv"
)

// TestCkptLatestJSON: `ckpt latest --json` names the newest generation that
// verifies and the newer ones it skipped, with why; with none verifying it
// prints generation 0 and exits 4.
func TestCkptLatestJSON(t *testing.T) {
	bin := testenv.Binary(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "state.bin")
	if err := os.WriteFile(src, []byte("step 1"), 0o644); err != nil {
		t.Fatal(err)
	}
	ck := filepath.Join(dir, "ck")
	for range 2 {
		if out, err := exec.Command(bin, "ckpt", "commit", ck, src).CombinedOutput(); err != nil {
			t.Fatalf("ckpt commit: %v\n%s", err, out)
		}
	}
	if err := os.WriteFile(filepath.Join(ck, "gen-2", "state.bin"), []byte("torn"), 0o644); err != nil {
		t.Fatal(err)
	}
	latest := func() (latestReport, int) {
		t.Helper()
		out, err := exec.Command(bin, "ckpt", "latest", "--json", ck).Output()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		var rep latestReport
		if err := json.Unmarshal(out, &rep); err != nil {
			t.Fatalf("ckpt latest --json: %v\n%s", err, out)
		}
		return rep, code
	}
	rep, code := latest()
	if code != 0 || rep.Generation != 1 || rep.Path != filepath.Join(ck, "gen-1") || rep.Files != 1 || rep.Bytes != 6 || rep.Checksum == "" {
		t.Fatalf("exit %d, report %+v; want generation 1 of 1 file, 6 bytes", code, rep)
	}
	if len(rep.Skipped) != 1 || rep.Skipped[0].N != 2 || !strings.Contains(rep.Skipped[0].Reason, "state.bin") {
		t.Fatalf("skipped %+v; want generation 2, naming state.bin", rep.Skipped)
	}
	if err := os.Remove(filepath.Join(ck, "gen-1", "state.bin")); err != nil {
		t.Fatal(err)
	}
	rep, code = latest()
	if code != 4 || rep.Generation != 0 || rep.Path != "" || len(rep.Skipped) != 2 {
		t.Fatalf("exit %d, report %+v; want exit 4, no generation, both skipped", code, rep)
	}
}
