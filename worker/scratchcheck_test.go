package worker_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker"
)

// TestCheckScratchRefusesWhatIsNotTheUsersOwn: the default scratch lives
// in a shared /tmp, where the first user's directory was every user's:
// another user could not write in it, and every shard of theirs failed
// after its retries. A default directory must be the user's own and a
// directory; one given with --scratch only has to be writable.
func TestCheckScratchRefusesWhatIsNotTheUsersOwn(t *testing.T) {
	if got := worker.DefaultScratch("h1"); !strings.HasSuffix(got, fmt.Sprintf("shardpool-h1-%d", os.Getuid())) {
		t.Fatalf("DefaultScratch = %s, want it to name the user's uid", got)
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
