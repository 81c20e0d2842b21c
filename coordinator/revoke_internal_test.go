package coordinator

import (
	"context"
	"testing"

	"github.com/shardpool/shardpool/stream"
)

// TestRevokeIsOnce: revoking a shard's commit twice (two verification
// passes that found the same damaged output before its failed record
// reached the tracker) writes one revoked record, not two: the drill
// counts one live commit per shard as commits minus revocations, and a
// busy host made it count none.
func TestRevokeIsOnce(t *testing.T) {
	c, ctx := startInternal(t)
	key := stream.ShardKey("r", "s1")
	data, err := stream.Encode(&stream.CommitRecord{Run: "r", ID: "s1", Fingerprint: "f", State: stream.CommitCommitted, Checksum: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.b.Checkpoints.Create(ctx, key, data); err != nil {
		t.Fatal(err)
	}
	tr := newTracker(c)
	tr.revokeCommit(ctx, "r", "s1", "damaged")
	tr.revokeCommit(ctx, "r", "s1", "damaged")
	hist, err := c.b.Checkpoints.History(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	revoked := 0
	for _, e := range hist {
		var r stream.CommitRecord
		if stream.Decode(e.Value(), &r) == nil && r.State == stream.CommitRevoked {
			revoked++
		}
	}
	if len(hist) != 2 || revoked != 1 {
		t.Fatalf("history: %d records, %d revoked; want the commit and one revocation", len(hist), revoked)
	}
}

// startInternal starts a coordinator on loopback for a test of its
// internals, closed when the test ends.
func startInternal(t *testing.T) (*Coordinator, context.Context) {
	t.Helper()
	c, err := New(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, ctx
}
