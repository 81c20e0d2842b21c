package worker_test

import (
	"context"
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

func foreignLease(t *testing.T, env *testenv.Env, key string) uint64 {
	t.Helper()
	kv, err := env.JS.KeyValue(context.Background(), stream.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	l := stream.Lease{Owner: stream.Owner{Worker: "other", Host: "elsewhere", BootID: "b", PID: 1, Attempt: 1}, Taken: time.Now()}
	data, _ := stream.Encode(&l)
	e, err := kv.Get(context.Background(), key)
	if err != nil {
		rev, err := kv.Create(context.Background(), key, data)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	rev, err := kv.Update(context.Background(), key, data, e.Revision())
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// A live lease held by an owner on another host is never taken over: the
// shard runs only after that lease expired.
func TestLiveForeignLeaseIsNotTakenOver(t *testing.T) {
	env := testenv.New(t, testenv.Options{LeaseTTL: 2 * time.Second})
	spec, runs := copyJob(t, 1, 2, "")
	foreignLease(t, env, "t.s0000")
	held := time.Now()
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	b, _ := os.ReadFile(runs)
	if strings.Count(string(b), "s0000") != 1 {
		t.Fatalf("shard ran %d times, want 1", strings.Count(string(b), "s0000"))
	}
	rec, _ := env.Shard("t", "s0000")
	if len(rec.Attempts) != 1 || rec.Attempts[0].N != 1 {
		t.Fatalf("attempts %+v: waiting on another owner's lease must not spend a delivery", rec.Attempts)
	}
	if started := rec.Attempts[len(rec.Attempts)-1].Start; started.Sub(held) < 1500*time.Millisecond {
		t.Fatalf("shard started %s after the foreign lease was taken, want after it expired (2s TTL)", started.Sub(held))
	}
	log, _ := os.ReadFile(filepath.Join(env.Data, "runs", "t", "admission.log"))
	if !strings.Contains(string(log), "decision=defer") || !strings.Contains(string(log), "lease held by another owner") {
		t.Fatalf("admission.log does not record the deferral:\n%s", log)
	}
}

// A worker whose lease is taken away mid-shard stops the child and does
// not commit; the shard is committed once, later, by a valid owner.
func TestLostLeaseStopsChildWithoutCommit(t *testing.T) {
	env := testenv.New(t, testenv.Options{LeaseTTL: 2 * time.Second, Grace: 200 * time.Millisecond})
	marker := filepath.Join(t.TempDir(), "started")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 3,
		Command: []string{"sh", "-c", `echo x >> "$1"; sleep 3; echo done > "$2/result"`, "sh", marker, "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		_, err := os.Stat(marker)
		return err == nil, "shard not started"
	})
	foreignLease(t, env, "t.s0000") // another owner now holds it
	env.WaitState("t", 40*time.Second, stream.RunComplete)
	rec, _ := env.Shard("t", "s0000")
	if rec.Attempts[0].Outcome != stream.OutcomeLeaseLost && rec.Attempts[0].Outcome != stream.OutcomeLost {
		t.Fatalf("first attempt: got %s (%s), want lease-lost", rec.Attempts[0].Outcome, rec.Attempts[0].Reason)
	}
	kv, _ := env.JS.KeyValue(context.Background(), stream.BucketCheckpoint)
	hist, err := kv.History(context.Background(), "t.s0000")
	if err != nil || len(hist) != 1 {
		t.Fatalf("commit history: %d entries (%v), want exactly 1", len(hist), err)
	}
}

// A shard that runs for several lease TTLs keeps its lease: the heartbeat
// renews it, so nobody else takes the shard and it runs once.
func TestHeartbeatsKeepALongShardsLease(t *testing.T) {
	env := testenv.New(t, testenv.Options{LeaseTTL: time.Second})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 2,
		Command: []string{"sh", "-c", `sleep 4; echo done > "$1/result"`, "sh", "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	kv, err := env.JS.KeyValue(context.Background(), stream.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		e, err := kv.Get(context.Background(), "t.s0000")
		if err != nil {
			return false, "lease: " + err.Error()
		}
		var l stream.Lease
		if err := stream.Decode(e.Value(), &l); err != nil {
			return false, err.Error()
		}
		spans := l.Renewed.Sub(l.Taken)
		return spans >= 2*time.Second, fmt.Sprintf("lease renewed %s after it was taken, want 2 TTLs", spans)
	})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	rec, err := env.Shard("t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeOK {
		t.Fatalf("attempts: got %+v, want one, ok", rec.Attempts)
	}
}
