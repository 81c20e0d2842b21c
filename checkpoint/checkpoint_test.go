package checkpoint

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func writeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for p, c := range files {
		full := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestCommitDirVerifyAndDetectDamage(t *testing.T) {
	src := writeTree(t, map[string]string{"a.txt": "alpha", "sub/b.bin": "beta", "empty": ""})
	dst := filepath.Join(t.TempDir(), "shard-1")
	mk, err := CommitDir(context.Background(), dst, src, Options{Owner: "w1", Fingerprint: "fp"}, "")
	if err != nil {
		t.Fatal(err)
	}
	if mk.Files != 3 || mk.Bytes != 9 || mk.Fingerprint != "fp" {
		t.Fatalf("marker: got %+v, want 3 files, 9 bytes, fp", mk)
	}
	if _, err := Verify(dst); err != nil {
		t.Fatalf("verify fresh commit: %v", err)
	}
	damage := []struct {
		name string
		do   func(dir string)
		want error
	}{
		{"flipped byte", func(d string) { os.WriteFile(filepath.Join(d, "a.txt"), []byte("alphA"), 0o644) }, ErrCorrupt},
		{"truncated", func(d string) { os.Truncate(filepath.Join(d, "sub/b.bin"), 2) }, ErrCorrupt},
		{"extra file", func(d string) { os.WriteFile(filepath.Join(d, "new"), nil, 0o644) }, ErrCorrupt},
		{"missing file", func(d string) { os.Remove(filepath.Join(d, "empty")) }, ErrCorrupt},
		{"no marker", func(d string) { os.Remove(filepath.Join(d, MarkerName)) }, ErrIncomplete},
		{"edited file list", func(d string) {
			b, _ := os.ReadFile(filepath.Join(d, MarkerName))
			os.WriteFile(filepath.Join(d, MarkerName), []byte(strings.Replace(string(b), `"size": 5`, `"size": 6`, 1)), 0o644)
		}, ErrCorrupt},
		{"file dropped from the list", func(d string) {
			b, _ := os.ReadFile(filepath.Join(d, MarkerName))
			os.WriteFile(filepath.Join(d, MarkerName), []byte(strings.Replace(string(b), `"files": 3`, `"files": 2`, 1)), 0o644)
		}, ErrCorrupt},
		{"stray MANIFEST", func(d string) { os.WriteFile(filepath.Join(d, ManifestName), []byte("{}"), 0o644) }, ErrCorrupt},
	}
	for _, d := range damage {
		t.Run(d.name, func(t *testing.T) {
			dst := filepath.Join(t.TempDir(), "x")
			if _, err := CommitDir(context.Background(), dst, src, Options{}, ""); err != nil {
				t.Fatal(err)
			}
			d.do(dst)
			if _, err := Verify(dst); !errors.Is(err, d.want) {
				t.Fatalf("got %v, want %v", err, d.want)
			}
		})
	}
}

func TestCommitDirReplacesAtomicallyAndKeepsUnverifiedAside(t *testing.T) {
	parent := t.TempDir()
	dst := filepath.Join(parent, "s")
	if _, err := CommitDir(context.Background(), dst, writeTree(t, map[string]string{"v": "1"}), Options{Fingerprint: "a"}, ""); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dst, "v"), []byte("tampered"), 0o644)
	keep := filepath.Join(parent, ".replaced")
	if _, err := CommitDir(context.Background(), dst, writeTree(t, map[string]string{"v": "2"}), Options{Fingerprint: "b"}, keep); err != nil {
		t.Fatal(err)
	}
	mk, err := Verify(dst)
	if err != nil || mk.Fingerprint != "b" {
		t.Fatalf("after replace: %v fingerprint %s, want b", err, mk.Fingerprint)
	}
	aside, _ := os.ReadDir(keep)
	if len(aside) != 1 {
		t.Fatalf("replaced content kept aside: %d entries, want 1", len(aside))
	}
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp-") {
			t.Fatalf("temporary %s left behind", e.Name())
		}
	}
}

func TestCommitRefusesUnsafeSources(t *testing.T) {
	src := writeTree(t, map[string]string{"ok": "x"})
	os.Symlink("/etc/passwd", filepath.Join(src, "link"))
	dst := filepath.Join(t.TempDir(), "d")
	// Named by its path inside the output, with its target: the directory
	// the job wrote it to is gone when the error is read.
	if _, err := CommitDir(context.Background(), dst, src, Options{}, ""); !errors.Is(err, ErrUnsafe) ||
		!strings.Contains(err.Error(), "link is a symlink (to /etc/passwd)") || strings.Contains(err.Error(), src) {
		t.Fatalf("symlink: got %v, want ErrUnsafe naming link and its target, not %s", err, src)
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("destination exists after a refused commit")
	}
	src2 := writeTree(t, map[string]string{MarkerName: "forged"})
	if _, err := CommitDir(context.Background(), dst, src2, Options{}, ""); !errors.Is(err, ErrUnsafe) {
		t.Fatalf("reserved name: got %v, want ErrUnsafe", err)
	}
	src3 := writeTree(t, map[string]string{"sub/ok": "x"})
	if err := syscall.Mkfifo(filepath.Join(src3, "sub", "p"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := CommitDir(context.Background(), dst, src3, Options{}, ""); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), "sub/p is a named pipe (FIFO)") {
		t.Fatalf("FIFO: got %v, want ErrUnsafe naming sub/p as a named pipe", err)
	}
	// A name that is not UTF-8 (a Latin-1 é) cannot round-trip through
	// the marker's JSON file list: committed, it never verified.
	src4 := writeTree(t, map[string]string{"d\xe9j\xe0/f": "x", "ok": "y"})
	if _, err := CommitDir(context.Background(), dst, src4, Options{}, ""); !errors.Is(err, ErrUnsafe) || !strings.Contains(err.Error(), `"d\xe9j\xe0" is not a UTF-8 name`) {
		t.Fatalf("a name not in UTF-8: got %v, want ErrUnsafe naming it", err)
	}
	// Names with a newline, spaces and non-ASCII UTF-8 commit and verify.
	src5 := writeTree(t, map[string]string{"new\nline": "a", " lead/ü f": "b"})
	if _, err := CommitDir(context.Background(), dst, src5, Options{}, ""); err != nil {
		t.Fatalf("UTF-8 names: %v", err)
	}
	if _, err := Verify(dst); err != nil {
		t.Fatalf("UTF-8 names do not verify: %v", err)
	}
}

func TestGenerationsLatestSkipsCorruptAndRetains(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	for i := range 3 {
		f := filepath.Join(t.TempDir(), "state.bin")
		os.WriteFile(f, []byte{byte(i)}, 0o644)
		g, err := Commit(ctx, dir, []string{f}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if g.N != int64(i+1) {
			t.Fatalf("generation: got %d, want %d", g.N, i+1)
		}
	}
	os.Truncate(filepath.Join(dir, "gen-3", "state.bin"), 0)
	g, rejected, err := Latest(dir)
	if err != nil || g.N != 2 || len(rejected) != 1 || rejected[0].N != 3 {
		t.Fatalf("latest: got gen %d, rejected %+v, %v; want 2 with 3 rejected", g.N, rejected, err)
	}
	// A retained commit prunes verified old generations and quarantines the corrupt one.
	f := filepath.Join(t.TempDir(), "state.bin")
	os.WriteFile(f, []byte("new"), 0o644)
	g, err = Commit(ctx, dir, []string{f}, Options{Retain: 2})
	if err != nil || g.N != 4 {
		t.Fatalf("commit 4: %v (gen %d)", err, g.N)
	}
	ns, _ := numbers(dir)
	if len(ns) != 2 || ns[0] != 4 || ns[1] != 2 {
		t.Fatalf("generations after retain 2: got %v, want [4 2]", ns)
	}
	rej, _ := os.ReadDir(filepath.Join(dir, RejectedDir))
	if len(rej) != 1 || !strings.HasPrefix(rej[0].Name(), "gen-3-") {
		t.Fatalf("rejected: got %v, want gen-3 quarantined", rej)
	}
	if _, _, err := Latest(t.TempDir()); !errors.Is(err, ErrNoGeneration) || !strings.Contains(err.Error(), "holds no generation (gen-N) yet") {
		t.Fatalf("empty dir: got %v, want ErrNoGeneration saying it holds none", err)
	}
	if _, _, err := Latest(filepath.Join(t.TempDir(), "typo")); !errors.Is(err, ErrNoGeneration) || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("no such dir: got %v, want ErrNoGeneration saying the directory does not exist", err)
	}
}

func TestWriteFileIsAtomic(t *testing.T) {
	p := filepath.Join(t.TempDir(), "final.json")
	if err := WriteFile(p, []byte("one")); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(p, []byte("two")); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	ents, _ := os.ReadDir(filepath.Dir(p))
	if string(b) != "two" || len(ents) != 1 {
		t.Fatalf("got %q with %d entries, want \"two\" alone", b, len(ents))
	}
}

// TestGroupSyncCommit: with Options.Sync the commit calls it once on the
// temporary directory (everything written, nothing visible yet) and once on
// the parent after the rename; a failing first call publishes nothing.
func TestGroupSyncCommit(t *testing.T) {
	src := writeTree(t, map[string]string{"a.txt": "alpha", "sub/b.txt": "beta"})
	dst := filepath.Join(t.TempDir(), "out", "s1")
	if err := os.Mkdir(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	var calls []string
	opt := Options{Fingerprint: "fp", Move: true, Sync: func(p string) error {
		// At the first call the marker is written but dst does not exist.
		if len(calls) == 0 {
			if _, err := os.Stat(filepath.Join(p, MarkerName)); err != nil {
				t.Errorf("first sync before the marker was written: %v", err)
			}
			if _, err := os.Stat(dst); !os.IsNotExist(err) {
				t.Errorf("first sync after dst appeared: %v", err)
			}
		}
		calls = append(calls, p)
		return nil
	}}
	if _, err := CommitDir(context.Background(), dst, src, opt, ""); err != nil {
		t.Fatal(err)
	}
	if len(calls) != 2 || filepath.Dir(calls[0]) != filepath.Dir(dst) || calls[1] != filepath.Dir(dst) {
		t.Fatalf("sync calls: got %q, want the temporary directory then %s", calls, filepath.Dir(dst))
	}
	if mk, err := Verify(dst); err != nil || mk.Files != 2 {
		t.Fatalf("verify: %+v %v", mk, err)
	}

	src2 := writeTree(t, map[string]string{"c.txt": "gamma"})
	dst2 := filepath.Join(filepath.Dir(dst), "s2")
	errGone := errors.New("disk gone")
	opt.Sync = func(string) error { return errGone }
	if _, err := CommitDir(context.Background(), dst2, src2, opt, ""); !errors.Is(err, errGone) {
		t.Fatalf("failing sync: got %v, want its error", err)
	}
	if _, err := os.Stat(dst2); !os.IsNotExist(err) {
		t.Fatalf("failing sync published %s: %v", dst2, err)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(dst), ".tmp-*"))
	if len(left) != 0 {
		t.Fatalf("temporary directories left: %q", left)
	}
}

// Format 2 keeps the file list in COMPLETE: a commit holds its files and
// the marker, nothing else, and the marker's checksum is the one format 1
// recorded for the same content (a MANIFEST file beside it), which is
// still read: outputs committed before the change verify, and damage to
// their MANIFEST is still caught.
func TestFormatOneStillVerifies(t *testing.T) {
	src := writeTree(t, map[string]string{"a.txt": "alpha", "sub/b.bin": "beta"})
	dst := filepath.Join(t.TempDir(), "v2")
	mk, err := CommitDir(context.Background(), dst, src, Options{Fingerprint: "fp"}, "")
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(dst)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if strings.Join(names, " ") != "COMPLETE a.txt sub" || mk.V != 2 || len(mk.Contents) != 2 {
		t.Fatalf("format 2 commit holds %v (marker v%d, %d listed), want COMPLETE a.txt sub and 2 listed", names, mk.V, len(mk.Contents))
	}

	// The same content as format 1 wrote it.
	v1 := filepath.Join(t.TempDir(), "v1")
	os.MkdirAll(filepath.Join(v1, "sub"), 0o755)
	os.WriteFile(filepath.Join(v1, "a.txt"), []byte("alpha"), 0o644)
	os.WriteFile(filepath.Join(v1, "sub/b.bin"), []byte("beta"), 0o644)
	os.WriteFile(filepath.Join(v1, ManifestName), manifestBytes(mk.Contents), 0o644)
	old := mk
	old.V, old.Contents = 1, nil
	os.WriteFile(filepath.Join(v1, MarkerName), old.encode(), 0o644)
	got, err := Verify(v1)
	if err != nil {
		t.Fatalf("format 1 directory: %v", err)
	}
	if got.Manifest != mk.Manifest {
		t.Fatalf("format 1 checksum %s, format 2 %s for the same content", got.Manifest, mk.Manifest)
	}
	b, _ := os.ReadFile(filepath.Join(v1, ManifestName))
	os.WriteFile(filepath.Join(v1, ManifestName), []byte(strings.Replace(string(b), `"size": 5`, `"size": 6`, 1)), 0o644)
	if _, err := Verify(v1); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("format 1 with an edited MANIFEST: got %v, want ErrCorrupt", err)
	}
}

// TestEmptyGenerationIsRefused: a job whose writer failed before writing
// anything commits an empty directory. Committed, it would be the latest
// generation to resume from, and with --retain 1 it would remove the last
// good one; it is refused, and the good generation stays latest.
func TestEmptyGenerationIsRefused(t *testing.T) {
	dir, ctx := t.TempDir(), context.Background()
	f := filepath.Join(t.TempDir(), "state.bin")
	os.WriteFile(f, []byte("good"), 0o644)
	if _, err := Commit(ctx, dir, []string{f}, Options{Retain: 1}); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	os.MkdirAll(filepath.Join(empty, "sub"), 0o755)
	if _, err := Commit(ctx, dir, []string{empty}, Options{Retain: 1}); !errors.Is(err, ErrEmpty) || !strings.Contains(err.Error(), empty) {
		t.Fatalf("empty commit: %v, want ErrEmpty naming %s", err, empty)
	}
	g, _, err := Latest(dir)
	if err != nil || g.N != 1 {
		t.Fatalf("latest after the refused commit: gen %d, %v; want the good gen 1", g.N, err)
	}
}

// TestVerifyCommittedJudgesAnotherGenerationByItsMarker: an output of
// another fingerprint is refused from its marker alone, which is returned
// (it says whose output it is), without reading its files: a new
// generation of a job with large outputs read every byte of each old one
// before redoing it. Here a damaged file proves they were not read (a full
// check would report the damage, not the fingerprint); the same output
// checked for its own fingerprint reports the damage.
func TestVerifyCommittedJudgesAnotherGenerationByItsMarker(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "s")
	if _, err := CommitDir(context.Background(), dst, writeTree(t, map[string]string{"big": "0123456789"}), Options{Fingerprint: "old", Run: "r"}, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(dst, "big"), 3); err != nil {
		t.Fatal(err)
	}
	mk, err := VerifyCommitted(dst, "new", true)
	if err == nil || !strings.Contains(err.Error(), "output carries fingerprint old") || mk.Fingerprint != "old" || mk.Run != "r" {
		t.Fatalf("another generation's output: %+v, %v; want its marker and the fingerprint named", mk, err)
	}
	if _, err := VerifyCommitted(dst, "old", true); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("its own generation's damaged output: %v, want ErrCorrupt", err)
	}
}

// TestMovedCommitRenamesWholeDirectories: a commit that may move its
// source (a worker's {out}) renames each directory at the top of it
// whole, not each file inside (an output of 20,000 small files committed
// in a third of the time); the output holds every file with its
// checksum and verifies, and the source is left empty.
func TestMovedCommitRenamesWholeDirectories(t *testing.T) {
	src := writeTree(t, map[string]string{"top.txt": "top", "parts/a/1": "one", "parts/a/2": "two", "parts/b/3": "three", "logs/x": ""})
	var before syscall.Stat_t
	if err := syscall.Stat(filepath.Join(src, "parts", "a"), &before); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "s1")
	mk, err := CommitDir(context.Background(), dst, src, Options{Move: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	if mk.Files != 5 || mk.Bytes != 14 {
		t.Fatalf("marker: %d files, %d bytes; want 5 and 14", mk.Files, mk.Bytes)
	}
	if _, err := Verify(dst); err != nil {
		t.Fatalf("verify: %v", err)
	}
	var after syscall.Stat_t
	if err := syscall.Stat(filepath.Join(dst, "parts", "a"), &after); err != nil {
		t.Fatal(err)
	}
	if after.Ino != before.Ino {
		t.Errorf("parts/a has inode %d in the output, %d in the source: the directory was made anew, not renamed", after.Ino, before.Ino)
	}
	if left, _ := os.ReadDir(src); len(left) != 0 {
		t.Errorf("the source still holds %d entries after a moved commit", len(left))
	}
}

// TestMovedCommitCopiesWhatAMountInsideItHolds: a directory inside the
// source that is another file system's mount point cannot be renamed
// (EBUSY, EXDEV); its files are copied instead, and the rest still moves.
// It needs root to mount a tmpfs, as on this project's machines and CI.
func TestMovedCommitCopiesWhatAMountInsideItHolds(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatalf("this test needs root (CI runs as root)")
		}
		t.Skip("needs root to mount a tmpfs inside the source: run as root or in CI")
	}
	src := writeTree(t, map[string]string{"kept/a": "alpha"})
	mnt := filepath.Join(src, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", mnt, "tmpfs", 0, "size=1m"); err != nil {
		t.Fatalf("mount tmpfs at %s: %v", mnt, err)
	}
	t.Cleanup(func() { syscall.Unmount(mnt, syscall.MNT_DETACH) })
	if err := os.MkdirAll(filepath.Join(mnt, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "d", "b"), []byte("beta"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "s1")
	mk, err := CommitDir(context.Background(), dst, src, Options{Move: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Verify(dst); err != nil || mk.Files != 2 {
		t.Fatalf("verify: %v, %d files; want it to verify with 2", err, mk.Files)
	}
	if b, err := os.ReadFile(filepath.Join(dst, "mnt", "d", "b")); err != nil || string(b) != "beta" {
		t.Fatalf("mnt/d/b in the output: %q (%v)", b, err)
	}
	if _, err := os.Stat(filepath.Join(src, "kept")); !os.IsNotExist(err) {
		t.Errorf("kept/ is still in the source (%v): the rest should have moved", err)
	}
}

// TestCommitStoppedByItsContextLeavesNothing: files are placed several at
// a time; a commit whose context ends stops with that error and leaves
// neither a temporary directory nor a destination.
func TestCommitStoppedByItsContextLeavesNothing(t *testing.T) {
	files := map[string]string{}
	for i := range 50 {
		files[filepath.Join("d", string(rune('a'+i%26))+strings.Repeat("x", i))] = strings.Repeat("y", i)
	}
	src := writeTree(t, files)
	parent := t.TempDir()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := CommitDir(ctx, filepath.Join(parent, "s1"), src, Options{}, "")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("commit with its context ended: %v, want context.Canceled", err)
	}
	if left, _ := os.ReadDir(parent); len(left) != 0 {
		t.Fatalf("the destination's parent holds %d entries after a stopped commit, want none", len(left))
	}
	// And with the context alive, the same files commit and verify, their
	// list in order.
	mk, err := CommitDir(context.Background(), filepath.Join(parent, "s1"), src, Options{}, "")
	if err != nil || mk.Files != 50 {
		t.Fatalf("commit: %v, %d files; want 50", err, mk.Files)
	}
	for i := 1; i < len(mk.Contents); i++ {
		if mk.Contents[i-1].Path >= mk.Contents[i].Path {
			t.Fatalf("the file list is out of order at %d: %s, %s", i, mk.Contents[i-1].Path, mk.Contents[i].Path)
		}
	}
	if _, err := Verify(filepath.Join(parent, "s1")); err != nil {
		t.Fatal(err)
	}
}

// TestEmptyOutputCommitsAndVerifies: a command that writes nothing into
// {out} commits an empty output that verifies, with the file list
// checksum outputs committed so far have ("2b37a3d2213e3fea", that of an
// absent list): a list made empty rather than absent was written as []
// and read back as absent, so the output never verified.
func TestEmptyOutputCommitsAndVerifies(t *testing.T) {
	for _, move := range []bool{false, true} {
		dst := filepath.Join(t.TempDir(), "s1")
		mk, err := CommitDir(context.Background(), dst, t.TempDir(), Options{Move: move}, "")
		if err != nil {
			t.Fatal(err)
		}
		if mk.Files != 0 || mk.Manifest != "2b37a3d2213e3fea" {
			t.Fatalf("move %v: %d files, list checksum %s; want 0 and 2b37a3d2213e3fea", move, mk.Files, mk.Manifest)
		}
		if _, err := Verify(dst); err != nil {
			t.Fatalf("move %v: %v", move, err)
		}
	}
}

// TestPublishIfAbsent: a prepared commit lands where nothing is, and
// changes nothing where something is (an output, or an empty directory
// that a plain rename would have replaced without a word), so that
// Publish can decide what to keep of it.
func TestPublishIfAbsent(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	dst := filepath.Join(parent, "s")
	p, err := Prepare(ctx, dst, writeTree(t, map[string]string{"v": "1"}), Options{Fingerprint: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := p.PublishIfAbsent(); !ok || err != nil {
		t.Fatalf("publish where nothing is: %v %v, want true", ok, err)
	}
	if mk, err := Verify(dst); err != nil || mk.Fingerprint != "a" {
		t.Fatalf("after publish: %v fingerprint %s, want a", err, mk.Fingerprint)
	}

	for _, existing := range []string{"output", "empty directory"} {
		if existing == "empty directory" {
			os.RemoveAll(dst)
			if err := os.Mkdir(dst, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		p, err := Prepare(ctx, dst, writeTree(t, map[string]string{"v": "2"}), Options{Fingerprint: "b"})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := p.PublishIfAbsent(); ok || err != nil {
			t.Fatalf("%s at dst: %v %v, want false and nothing changed", existing, ok, err)
		}
		if _, err := os.Stat(p.tmp); err != nil {
			t.Fatalf("%s at dst: the prepared directory is gone: %v", existing, err)
		}
		if existing == "output" {
			if mk, err := Verify(dst); err != nil || mk.Fingerprint != "a" {
				t.Fatalf("%s at dst: it became %v fingerprint %s, want a", existing, err, mk.Fingerprint)
			}
		}
		if err := p.Publish(""); err != nil {
			t.Fatal(err)
		}
		if mk, err := Verify(dst); err != nil || mk.Fingerprint != "b" {
			t.Fatalf("%s at dst, then Publish: %v fingerprint %s, want b", existing, err, mk.Fingerprint)
		}
	}
	ents, _ := os.ReadDir(parent)
	for _, e := range ents {
		if e.Name() != "s" {
			t.Errorf("left in the output directory: %s", e.Name())
		}
	}
}

// TestPrepareMakesNoParent: a commit whose destination's directory is
// gone fails and makes nothing. A file system unmounted under a worker
// leaves its mount point behind: a commit that made the output directory
// again there would publish on the disk beneath, hidden once the file
// system is back.
func TestPrepareMakesNoParent(t *testing.T) {
	mnt := t.TempDir()
	dst := filepath.Join(mnt, "out", "s1")
	_, err := Prepare(context.Background(), dst, writeTree(t, map[string]string{"v": "1"}), Options{Fingerprint: "a"})
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("prepare under a missing directory: %v, want not exist", err)
	}
	if ents, _ := os.ReadDir(mnt); len(ents) != 0 {
		t.Fatalf("prepare under a missing directory made %s", ents[0].Name())
	}
}
