package coordinator_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// ran is a coordinator's Run in its goroutine: done closes when Run has
// returned, with its error in err; stop ends it (and waits), as the end
// of the test does.
type ran struct {
	done chan struct{}
	err  error
	stop func()
}

// runCoordinator starts a coordinator with cfg and runs it until it
// returns by itself or the test ends.
func runCoordinator(t *testing.T, cfg coordinator.Config) (*coordinator.Coordinator, *ran) {
	t.Helper()
	c, err := coordinator.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := c.Start(ctx); err != nil {
		cancel()
		t.Fatal(err)
	}
	r := &ran{done: make(chan struct{})}
	go func() { r.err = c.Run(ctx); close(r.done) }()
	r.stop = func() { cancel(); <-r.done }
	t.Cleanup(r.stop)
	return c, r
}

// TestStoreFullIsReported: when the file system under the store fills up
// (here a filler file on a small tmpfs), the coordinator says so in its
// info answer (and so in `shardpool status`), and stops saying so once
// space is free again.
func TestStoreFullIsReported(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	testenv.SmallTmpfs(t, data, "16m")
	c, _ := runCoordinator(t, coordinator.Config{DataDir: data, Listen: "127.0.0.1:0", StoreEvery: 50 * time.Millisecond})
	nc, err := nats.Connect(c.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	full := func() string {
		ictx, icancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer icancel()
		ci, err := stream.AskInfo(ictx, nc)
		if err != nil {
			t.Fatal(err)
		}
		return ci.StoreFull
	}
	if why := full(); why != "" {
		t.Fatalf("an empty store reported full: %s", why)
	}
	filler := filepath.Join(data, "filler")
	_ = exec.Command("sh", "-c", `head -c 32M /dev/zero > "$1"`, "sh", filler).Run() // stops at the tmpfs's end
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		why := full()
		return strings.Contains(why, "has 0B free") && strings.Contains(why, data), "store_full: " + why
	})
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		why := full()
		return why == "", "still full after the filler was removed: " + why
	})
}

// TestStoreWriteErrorIsReloaded: a write that meets a full disk leaves
// nats-server's stream refusing every write, also once space is freed. The
// coordinator reports it as full until then, with the error; with
// ReloadOnWriteError its Run returns ErrReload once the disk has room, and
// a new coordinator on the same data takes writes and kept what was
// written before.
func TestStoreWriteErrorIsReloaded(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	testenv.SmallTmpfs(t, data, "16m")
	cfg := coordinator.Config{DataDir: data, Listen: "127.0.0.1:0", StoreEvery: 50 * time.Millisecond, ReloadOnWriteError: true}
	// start runs a coordinator on the data and opens its runs bucket.
	start := func() (*coordinator.Coordinator, jetstream.KeyValue, *ran) {
		c, r := runCoordinator(t, cfg)
		kv, err := c.JetStream().KeyValue(context.Background(), stream.BucketRuns)
		if err != nil {
			t.Fatal(err)
		}
		return c, kv, r
	}
	put := func(kv jetstream.KeyValue, key string, value []byte) error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := kv.Put(ctx, key, value)
		return err
	}
	c, kv, r := start()
	if err := put(kv, "before", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	filler := filepath.Join(data, "filler")
	_ = exec.Command("sh", "-c", `head -c 32M /dev/zero > "$1"`, "sh", filler).Run() // stops at the tmpfs's end
	if err := put(kv, "during", make([]byte, 100_000)); err == nil {
		t.Fatal("a write on a full disk succeeded")
	}
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		why := c.StoreFull()
		return strings.Contains(why, "a write to the store failed") && strings.Contains(why, "no space left on device"), "store_full: " + why
	})
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.done:
		if !errors.Is(r.err, coordinator.ErrReload) {
			t.Fatalf("Run returned %v, want ErrReload", r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("Run did not return after the disk had room again; store_full: %s", c.StoreFull())
	}
	c2, kv2, _ := start()
	if err := put(kv2, "after", []byte("x")); err != nil {
		t.Fatalf("a write after the reload: %v", err)
	}
	if e, err := kv2.Get(context.Background(), "before"); err != nil || string(e.Value()) != "kept" {
		t.Fatalf("the value written before the full disk: %v", err)
	}
	if why := c2.StoreFull(); why != "" {
		t.Fatalf("the reloaded store reports full: %s", why)
	}
}

// TestStoreOnAFileSystemThatRefusesWritesIsReported: the store's ext4
// meets an error and, mounted errors=remount-ro, refuses every write,
// with free space left and (Linux 6.12 and later) its mount still listed
// read-write. The coordinator says so, as one reason that does not
// change from look to look, and one with ReloadOnWriteError does not
// reload a store that a write has failed on while it stays so: the free
// space alone would have it reload at every look.
func TestStoreOnAFileSystemThatRefusesWritesIsReported(t *testing.T) {
	efs := testenv.NewErrorFS(t, 64<<20) // first: unmounted after the coordinator stops
	c, r := runCoordinator(t, coordinator.Config{DataDir: filepath.Join(efs.Dir, "data"), Listen: "127.0.0.1:0", StoreEvery: 50 * time.Millisecond, ReloadOnWriteError: true})
	kv, err := c.JetStream().KeyValue(context.Background(), stream.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	if why := c.StoreFull(); why != "" {
		t.Fatalf("a writable store reported: %s", why)
	}
	efs.Fail()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err = kv.Put(ctx, "during", []byte("x"))
	cancel()
	if err == nil {
		t.Fatal("a write on the failed file system succeeded")
	}
	want := "the file system of " + c.StoreDir() + " refuses writes: read-only file system"
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		why := c.StoreFull()
		return strings.Contains(why, want), fmt.Sprintf("store_full %q, want it to say %q", why, want)
	})
	first := c.StoreFull()
	time.Sleep(time.Second) // 20 looks
	select {
	case <-r.done:
		t.Fatalf("Run returned (%v) while the store's file system refuses writes, want no reload", r.err)
	default:
	}
	if why := c.StoreFull(); why != first {
		t.Errorf("the reason changed from %q to %q between looks", first, why)
	}
}

// TestStoreLimitIsRaisedWhenSpaceIsFreed: the store's limit is set from the
// free space at start. A store that reached it while another user's file
// filled the disk takes writes again, without a restart, once that file is
// gone: the coordinator raises the limit. The raise is an options reload
// of nats-server, which must keep the listener's TLS (`coordinator
// --listen 0.0.0.0:...` serves TLS by default): so with TLS too.
func TestStoreLimitIsRaisedWhenSpaceIsFreed(t *testing.T) {
	for _, tls := range []bool{false, true} {
		t.Run(fmt.Sprintf("tls=%v", tls), func(t *testing.T) { storeLimitIsRaised(t, tls) })
	}
}

func storeLimitIsRaised(t *testing.T, tls bool) {
	data := filepath.Join(t.TempDir(), "data")
	testenv.SmallTmpfs(t, data, "32m")
	filler := filepath.Join(data, "filler")
	if err := os.WriteFile(filler, make([]byte, 24<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	c, _ := runCoordinator(t, coordinator.Config{DataDir: data, Listen: "127.0.0.1:0", StoreEvery: 50 * time.Millisecond, TLS: tls, Auth: tls})
	kv, err := c.JetStream().KeyValue(context.Background(), stream.BucketRuns)
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string) error {
		pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer pcancel()
		_, err := kv.Put(pctx, key, make([]byte, 100_000))
		return err
	}
	var refused error
	for i := 0; i < 200 && refused == nil; i++ {
		refused = put(fmt.Sprintf("k%d", i))
	}
	if refused == nil {
		t.Fatal("20 MB of writes fit in a store limited to three quarters of 8 MB")
	}
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		why := c.StoreFull()
		return strings.Contains(why, "of its limit of"), "store_full: " + why
	})
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		why := c.StoreFull()
		return why == "", "still full after the filler was removed: " + why
	})
	if err := put("after"); err != nil {
		t.Fatalf("a write after the limit was raised: %v (the first refusal: %v)", err, refused)
	}
	if tls {
		// A client over the network still gets in, over TLS.
		pinned, err := coordinator.ClientTLS(c.CAFile())
		if err != nil {
			t.Fatal(err)
		}
		tok, _ := coordinator.ReadToken(c.TokenFile())
		nc, err := nats.Connect(c.ClientURL(), nats.Token(tok), nats.Secure(pinned))
		if err != nil {
			t.Fatalf("a TLS client after the limit was raised: %v", err)
		}
		nc.Close()
	}
}
