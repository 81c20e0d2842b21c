package worker_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

// TestCheckScratchRefusesWhatIsNotTheUsersOwn: the default scratch lives
// in a shared /tmp, where the first user's directory was every user's:
// another user could not write in it, and every shard of theirs failed
// after its retries. A default directory must be the user's own and a
// directory; one given with --scratch only has to be writable.
func TestCheckScratchRefusesWhatIsNotTheUsersOwn(t *testing.T) {
	if got, err := worker.DefaultScratchFor(probe.Policy{}, "h1"); err != nil || got != filepath.Join(os.TempDir(), fmt.Sprintf("shardpool-h1-%d", os.Getuid())) {
		t.Fatalf("DefaultScratchFor without a policy's scratch = %s (%v), want it in $TMPDIR, naming the user's uid", got, err)
	}
	root := t.TempDir()
	fresh := filepath.Join(root, "a", "b")
	if err := worker.CheckScratch(fresh, true); err != nil {
		t.Fatalf("a missing directory: %v, want it made", err)
	}
	if info, err := os.Stat(fresh); err != nil || info.Mode().Perm() != 0o700 {
		t.Fatalf("made %v (%v), want mode 0700", info, err)
	}
	if ents, _ := os.ReadDir(fresh); len(ents) != 0 {
		t.Fatalf("the check left %v behind", ents)
	}
	file := filepath.Join(root, "file")
	os.WriteFile(file, nil, 0o644)
	if err := worker.CheckScratch(file, false); err == nil || !strings.Contains(err.Error(), file) || !strings.Contains(err.Error(), "--scratch") {
		t.Fatalf("a file: %v, want an error naming it and --scratch", err)
	}
	link := filepath.Join(root, "link")
	os.Symlink(fresh, link)
	if err := worker.CheckScratch(link, true); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Fatalf("a symlink as the default: %v, want it refused", err)
	}
	if err := worker.CheckScratch(link, false); err != nil {
		t.Fatalf("a symlink given by the user: %v, want it used", err)
	}

	testenv.RequireRoot(t)
	theirs := filepath.Join(root, "theirs")
	os.Mkdir(theirs, 0o777)
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := worker.CheckScratch(theirs, true); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Fatalf("another user's directory as the default: %v, want it refused", err)
	}
	if err := worker.CheckScratch(theirs, false); err != nil {
		t.Fatalf("another user's writable directory given by the user: %v, want it used", err)
	}
}

// TestScratchBaseTakesThePolicysFirstDirectoryHere: one policy file can
// serve hosts of several kinds, so its scratch list is read in order and
// the first directory this host has is taken; a list none of whose
// directories this host has is an error that names each, not $TMPDIR.
func TestScratchBaseTakesThePolicysFirstDirectoryHere(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o644)
	missing := filepath.Join(dir, "missing")
	if got, err := worker.ScratchBase(probe.Policy{}); err != nil || got != os.TempDir() {
		t.Errorf("no list: got %q, %v; want $TMPDIR", got, err)
	}
	if got, err := worker.ScratchBase(probe.Policy{Scratch: []string{missing, file, dir, "/tmp"}}); err != nil || got != dir {
		t.Errorf("got %q, %v; want %s, the first directory that exists", got, err, dir)
	}
	got, err := worker.DefaultScratchFor(probe.Policy{Scratch: []string{dir}}, "h1")
	if want := filepath.Join(dir, fmt.Sprintf("shardpool-h1-%d", os.Getuid())); err != nil || got != want {
		t.Errorf("DefaultScratchFor: got %q, %v; want %s", got, err, want)
	}
	_, err = worker.ScratchBase(probe.Policy{Path: "/p.toml", Scratch: []string{missing, file}})
	for _, want := range []string{"/p.toml", missing + " does not exist", file + " is not a directory", "--scratch DIR"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("none here: got %v, want it to say %q", err, want)
		}
	}
}
