package coordinator_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/testenv"
)

// TestLiveInListsServingCoordinators: a run's coordinator (store
// DIR/stores/<run>) and the daemon's (DIR/jetstream) are listed with the
// URL they serve while they hold their store, and not after; a second
// coordinator on a held store is refused naming the holder and its URL.
func TestLiveInListsServingCoordinators(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	start := func(store string) *coordinator.Coordinator {
		c, err := coordinator.New(coordinator.Config{DataDir: dir, StoreDir: store, Listen: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		return c
	}
	run := start(filepath.Join(dir, "stores", "r1"))
	daemon := start(filepath.Join(dir, "jetstream"))
	lives, err := coordinator.LiveIn(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(lives) != 2 || lives[0].Run != "" || lives[0].URL != daemon.ClientURL() || lives[1].Run != "r1" || lives[1].URL != run.ClientURL() ||
		!strings.HasPrefix(lives[1].Holder, "pid ") {
		t.Fatalf("live coordinators: got %+v, want the daemon at %s, then run r1 at %s", lives, daemon.ClientURL(), run.ClientURL())
	}
	second, err := coordinator.New(coordinator.Config{DataDir: dir, StoreDir: filepath.Join(dir, "stores", "r1"), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := second.Start(ctx); err == nil || !strings.Contains(err.Error(), "url "+run.ClientURL()) {
		second.Close()
		t.Fatalf("second coordinator on a held store: got %v, want refused naming the holder's URL %s", err, run.ClientURL())
	}
	run.Close()
	daemon.Close()
	if lives, err := coordinator.LiveIn(dir); err != nil || len(lives) != 0 {
		t.Fatalf("after Close: got %+v (%v), want none", lives, err)
	}
}

// TestStartWaitsOutALookAtItsLock: LiveIn takes a store's lock shared for
// a moment; a coordinator starting in that moment waits instead of
// refusing the store as in use.
func TestStartWaitsOutALookAtItsLock(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "stores", "r")
	f := testenv.LockStore(t, dir, "r", unix.LOCK_SH, "")
	// The test's end (its cleanup closes f) waits for the unlock: the
	// kernel's lock orders them, but the race detector cannot see that.
	unlocked := make(chan struct{})
	defer func() { <-unlocked }()
	time.AfterFunc(50*time.Millisecond, func() { unix.Flock(int(f.Fd()), unix.LOCK_UN); close(unlocked) })
	c, err := coordinator.New(coordinator.Config{DataDir: dir, StoreDir: store, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(context.Background()); err != nil {
		t.Fatalf("start while the lock is looked at: %v", err)
	}
	c.Close()
}
