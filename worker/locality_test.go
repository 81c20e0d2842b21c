package worker_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestLocalityHandsAShardOnceWithoutSpendingAnAttempt: a peer advertises
// the shard's input as staged, with a free slot, but never fetches. The
// worker hands the shard to it once (recorded, logged), then runs it on
// the next delivery itself. With retries = 0 the shard would fail if the
// deferral counted as an attempt.
func TestLocalityHandsAShardOnceWithoutSpendingAnAttempt(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0, Extra: "stage = true\n",
		Command: []string{"cp", "{input}", "{out}/"}})
	in := filepath.Join(filepath.Dir(spec), "in", "s0000.txt")
	f, err := staging.LoadHashes("").Describe(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	kv, _ := env.JS.KeyValue(context.Background(), stream.BucketWorkers)
	advertise := func() uint64 {
		r := stream.WorkerReport{Name: "peer", Host: "elsewhere", Slots: map[string]int{"cpu": 1}, Running: map[string]int{},
			Staged: []string{staging.Key(f)}, Reported: time.Now().UTC()}
		data, _ := stream.Encode(&r)
		rev, _ := kv.Put(context.Background(), "peer", data)
		return rev
	}
	since := advertise()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			advertise()
			time.Sleep(200 * time.Millisecond)
		}
	}()
	// The worker reads its peers just before each report it writes: two
	// reports written after the peer's mean one read that saw it (a fixed
	// wait was too short on a loaded machine).
	for range 2 {
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			e, err := kv.Get(context.Background(), "w1")
			if err != nil || e.Revision() <= since {
				return false, "the worker has not reported since the peer did"
			}
			since = e.Revision()
			return true, ""
		})
	}
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	rec, _ := env.Shard("t", "s0000")
	if rec.Deferred != 1 || len(rec.Attempts) != 1 || rec.Attempts[0].N != 2 {
		t.Fatalf("record: deferred %d, attempts %+v; want one deferral, then the run on delivery 2", rec.Deferred, rec.Attempts)
	}
	log, _ := os.ReadFile(filepath.Join(env.Data, "runs", "t", "admission.log"))
	if !strings.Contains(string(log), "decision=defer inputs staged on worker peer") {
		t.Fatalf("admission.log lacks the locality deferral:\n%s", log)
	}
}
