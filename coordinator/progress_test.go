package coordinator_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestProgressCountsTheLastRecordsBeforeAStop: shard records stored just
// before the coordinator stops (a `run` stops its worker first, then the
// coordinator) are counted in the progress.json it leaves, although its
// watch may not have delivered them yet when it is told to stop.
func TestProgressCountsTheLastRecordsBeforeAStop(t *testing.T) {
	const n = 200
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	spec := testenv.WriteJob(t, testenv.Job{Name: "p", Shards: n, Command: []string{"true"}})
	res := env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("p", 10*time.Second, stream.RunQueued)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		p, err := coordinator.ReadProgress(env.Coord.EvidenceDir("p"))
		return p != nil && p.State == stream.RunQueued, fmt.Sprintf("progress.json: %+v, %v", p, err)
	})
	ctx := context.Background()
	b := env.Buckets()
	for i := range n {
		id := fmt.Sprintf("s%04d", i)
		rec := stream.ShardRecord{V: 1, Run: "p", ID: id, Fingerprint: res.Fingerprint, Class: stream.DefaultClass, State: stream.ShardRunning}
		data, err := stream.Encode(&rec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Shards.Put(ctx, stream.ShardKey("p", id), data); err != nil {
			t.Fatal(err)
		}
	}
	env.Close()
	p, err := coordinator.ReadProgress(env.Coord.EvidenceDir("p"))
	if err != nil || p == nil {
		t.Fatalf("progress.json after the stop: %v, %v", p, err)
	}
	if p.Counts.Running != n || p.State != stream.RunRunning || p.Fingerprint != res.Fingerprint {
		t.Fatalf("progress.json after the stop: %s with %+v, want RUNNING with all %d shards running", p.State, p.Counts, n)
	}
}

// TestProgressIsWrittenOnceItCanBe: a progress.json the coordinator cannot
// write (here a directory stands at its path) is tried again, and written
// once the obstacle is gone, without a change of the run to prompt it.
func TestProgressIsWrittenOnceItCanBe(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	spec := testenv.WriteJob(t, testenv.Job{Name: "p", Shards: 3, Command: []string{"true"}})
	block := filepath.Join(env.Coord.EvidenceDir("p"), coordinator.ProgressName)
	if err := os.MkdirAll(filepath.Join(block, "in-the-way"), 0o755); err != nil {
		t.Fatal(err)
	}
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("p", 10*time.Second, stream.RunQueued)
	time.Sleep(500 * time.Millisecond) // a few of the tracker's flushes
	if _, err := coordinator.ReadProgress(env.Coord.EvidenceDir("p")); err == nil {
		t.Fatalf("progress.json read although a directory stands at its path")
	}
	if err := os.RemoveAll(block); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		p, err := coordinator.ReadProgress(env.Coord.EvidenceDir("p"))
		return err == nil && p != nil && p.State == stream.RunQueued && p.Counts.Total == 3, fmt.Sprintf("progress.json: %+v, %v", p, err)
	})
}
