package coordinator_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
)

// TestMain fails the package's tests when goroutines outlive them: a
// coordinator's Run must return only after everything it started has
// ended, and Close must stop the server.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The embedded server's file store has a background timer goroutine
		// that outlives Shutdown by design (as in the worker's tests).
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).expireMsgs"),
		goleak.IgnoreAnyFunction("time.Sleep"),
	)
}

// TestInfoAnswersAsSoonAsStartReturns: a client that connects the moment
// Start returns (a `shardpool status` right after the coordinator came up)
// gets the info answer, not "no responders". Several rounds, since the
// gap it guards against is a race.
func TestInfoAnswersAsSoonAsStartReturns(t *testing.T) {
	for i := 0; i < 10; i++ {
		c, err := coordinator.New(coordinator.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if err := c.Start(ctx); err != nil {
			cancel()
			t.Fatal(err)
		}
		nc, err := nats.Connect(c.ClientURL())
		if err != nil {
			cancel()
			c.Close()
			t.Fatal(err)
		}
		_, err = stream.AskInfo(ctx, nc)
		nc.Close()
		cancel()
		c.Close()
		if err != nil {
			t.Fatalf("round %d: %v", i, err)
		}
	}
}
