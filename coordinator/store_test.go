package coordinator_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestStoreFullIsReported: when the file system under the store fills up
// (here a filler file on a small tmpfs), the coordinator says so in its
// info answer (and so in `shardpool status`), and stops saying so once
// space is free again.
func TestStoreFullIsReported(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	testenv.SmallTmpfs(t, data, "16m")
	c, err := coordinator.New(coordinator.Config{DataDir: data, Listen: "127.0.0.1:0", StoreEvery: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
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
