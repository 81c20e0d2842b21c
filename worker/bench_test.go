package worker_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// BenchmarkPoolTrue pushes b.N shards of /bin/true through one in-process
// coordinator and worker (default group sync). make bench compares the
// whole binary against GNU parallel; this is for profiling the pool.
func BenchmarkPoolTrue(b *testing.B) {
	env := testenv.New(b, testenv.Options{Slots: map[string]int{"cpu": 8}, LeaseTTL: 30 * time.Second})
	dir := b.TempDir()
	var m strings.Builder
	for i := range b.N {
		fmt.Fprintf(&m, "{\"id\":\"s%07d\"}\n", i)
	}
	os.WriteFile(filepath.Join(dir, "manifest.jsonl"), []byte(m.String()), 0o644)
	spec := filepath.Join(dir, "shardpool.toml")
	os.WriteFile(spec, []byte("name = \"bench\"\nmanifest = \"manifest.jsonl\"\noutput = \"out\"\ncommand = [\"/bin/true\"]\nretries = 0\ncode_rev = \"b\"\n"), 0o644)
	b.ResetTimer()
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("bench", 10*time.Minute, stream.RunComplete)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "shards/s")
}
