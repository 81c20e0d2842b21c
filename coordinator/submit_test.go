package coordinator_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestSubmitManyShards publishes more shards than the client allows
// outstanding async publishes (4,000), with SyncAlways acks.
func TestSubmitManyShards(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	dir := t.TempDir()
	var m strings.Builder
	for i := range 5000 {
		fmt.Fprintf(&m, "{\"id\":\"s%05d\"}\n", i)
	}
	os.WriteFile(filepath.Join(dir, "manifest.jsonl"), []byte(m.String()), 0o644)
	os.WriteFile(filepath.Join(dir, "shardpool.toml"), []byte("name = \"many\"\nmanifest = \"manifest.jsonl\"\noutput = \"out\"\ncommand = [\"true\"]\ncode_rev = \"x\"\n"), 0o644)
	res := env.Submit(filepath.Join(dir, "shardpool.toml"), coordinator.SubmitOptions{})
	if res.Published != 5000 {
		t.Fatalf("published %d, want 5000", res.Published)
	}
	s, _ := env.JS.Stream(context.Background(), stream.StreamShards)
	info, _ := s.Info(context.Background())
	if info.State.Msgs != 5000 {
		t.Fatalf("stream holds %d messages, want 5000", info.State.Msgs)
	}
}
