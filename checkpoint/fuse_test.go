package checkpoint_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/testenv"
)

// TestCommitOnFuse: outputs on a FUSE file system (sshfs, s3fs, gcsfuse
// mounts) commit as on a local disk. FUSE takes RENAME_NOREPLACE but
// refuses RENAME_EXCHANGE, so an output that replaces another goes
// through swapIn's fallback: the old one renamed aside, the new one
// renamed in, the old one removed or, when it did not verify, kept under
// keepReplaced. Files moved from a local source cross file systems
// (EXDEV) and are copied. A sweep leaves a live commit's temporary directory alone:
// flock holds on the mount.
func TestCommitOnFuse(t *testing.T) {
	ctx := context.Background()
	out := testenv.FuseDir(t)
	// The premise: without it the fallback below is not what runs.
	a, b := filepath.Join(out, "x"), filepath.Join(out, "y")
	for _, d := range []string{a, b} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); !errors.Is(err, unix.EINVAL) {
		t.Fatalf("RENAME_EXCHANGE on the FUSE mount: %v, want EINVAL (the fallback this test is about would not run)", err)
	}
	os.Remove(a)
	os.Remove(b)

	dst := filepath.Join(out, "s")
	keep := filepath.Join(out, ".shardpool", "replaced")
	commit := func(fp, content string) {
		t.Helper()
		src := t.TempDir() // local: every move crosses to the mount
		if err := os.WriteFile(filepath.Join(src, "v"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(src, "sub"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, "sub", "w"), []byte(content+content), 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := checkpoint.Prepare(ctx, dst, src, checkpoint.Options{Fingerprint: fp, Move: true})
		if err != nil {
			t.Fatalf("prepare %s: %v", fp, err)
		}
		// A sweep meanwhile, as a worker starting beside this one makes.
		if removed, err := checkpoint.SweepTemps(out); err != nil || len(removed) > 0 {
			t.Fatalf("a sweep during the commit of %s removed %v (%v): the commit's lock did not hold", fp, removed, err)
		}
		if ok, err := p.PublishIfAbsent(); err != nil {
			t.Fatalf("publish %s: %v", fp, err)
		} else if !ok {
			// As a worker does: the output there is kept aside only
			// when it does not verify.
			k := ""
			if _, err := checkpoint.VerifyQuick(dst); err != nil {
				k = keep
			}
			if err := p.Publish(k); err != nil {
				t.Fatalf("publish %s over the output there: %v", fp, err)
			}
		}
		mk, err := checkpoint.Verify(dst)
		if err != nil || mk.Fingerprint != fp {
			t.Fatalf("after the commit of %s: %v, fingerprint %q", fp, err, mk.Fingerprint)
		}
		if got, _ := os.ReadFile(filepath.Join(dst, "sub", "w")); string(got) != content+content {
			t.Fatalf("after the commit of %s: sub/w holds %q", fp, got)
		}
	}
	names := func() []string {
		var n []string
		ents, _ := os.ReadDir(out)
		for _, e := range ents {
			n = append(n, e.Name())
		}
		return n
	}

	commit("a", "1") // nothing there: RENAME_NOREPLACE
	commit("b", "2") // a sound output there: replaced, not kept
	if kept, _ := os.ReadDir(keep); len(kept) != 0 {
		t.Fatalf("a sound output replaced was kept aside: %d entries in %s", len(kept), keep)
	}
	if err := os.WriteFile(filepath.Join(dst, "v"), []byte("tampered"), 0o644); err != nil {
		t.Fatal(err)
	}
	commit("c", "3") // a damaged output there: kept aside
	kept, _ := os.ReadDir(keep)
	if len(kept) != 1 {
		t.Fatalf("the damaged output replaced: %d entries in %s, want 1", len(kept), keep)
	}
	if got, _ := os.ReadFile(filepath.Join(keep, kept[0].Name(), "v")); string(got) != "tampered" {
		t.Errorf("kept aside: v holds %q, want the damaged output's", got)
	}
	if n := names(); len(n) != 2 || n[0] != ".shardpool" || n[1] != "s" {
		t.Errorf("left in the output directory: %v, want only .shardpool and s", n)
	}

	// A sweep between the fallback's two renames leaves the damaged
	// copy, renamed aside, alone.
	sub := filepath.Join(out, "sweep")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	sweepDuringReplace(t, sub)
}
