package worker

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
)

// TestUnstartedDeliveriesSpendNoAttempt: a delivery that reaches a worker
// as it shuts down goes back to the queue at once and is counted in the
// shard's record as interrupted, so a shard with retries = 0 handed back
// twice still runs, as delivery 3.
func TestUnstartedDeliveriesSpendNoAttempt(t *testing.T) {
	ctx := context.Background()
	w := workerOnServer(t, Config{StateDir: t.TempDir()})
	js := w.cfg.JetStream
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "m.jsonl"), []byte(`{"id":"a"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	toml := "name = \"u\"\nmanifest = \"m.jsonl\"\noutput = \"out\"\ncommand = [\"true\"]\nretries = 0\ncode_rev = \"test\"\n"
	if err := os.WriteFile(filepath.Join(dir, "shardpool.toml"), []byte(toml), 0o644); err != nil {
		t.Fatal(err)
	}
	spec, err := stream.LoadSpec(filepath.Join(dir, "shardpool.toml"))
	if err != nil {
		t.Fatal(err)
	}
	man, err := stream.LoadManifest(spec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := coordinator.Submit(ctx, js, spec, man, coordinator.SubmitOptions{}); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, stream.StreamShards, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	for want := uint64(1); want <= 2; want++ {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		msg, ok := <-batch.Messages()
		if !ok {
			t.Fatalf("delivery %d: none within 2 s of the hand-back", want)
		}
		if meta, _ := msg.Metadata(); meta == nil || meta.NumDelivered != want {
			t.Fatalf("got delivery %+v, want number %d", meta, want)
		}
		w.handBackUnstarted(msg)
		rec := readShard(t, w, "u", "a")
		if rec.State != stream.ShardPending || rec.Interrupted != int(want) {
			t.Fatalf("record after hand-back %d: state %s, interrupted %d; want pending, %d", want, rec.State, rec.Interrupted, want)
		}
	}
	run, err := New(Config{JetStream: js, Name: "w2", Slots: map[string]int{"cpu": 1}, StateDir: t.TempDir(),
		Scratch: t.TempDir(), FetchWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run.Run(rctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rec := readShard(t, w, "u", "a")
		if rec.State == stream.ShardValidated {
			if len(rec.Attempts) != 1 || rec.Attempts[0].N != 3 {
				t.Fatalf("attempts %+v; want one, on delivery 3", rec.Attempts)
			}
			return
		}
		if rec.State == stream.ShardFailed || time.Now().After(deadline) {
			t.Fatalf("shard %s (%s); want it run and validated", rec.State, rec.Reason)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func readShard(t *testing.T, w *Worker, run, id string) stream.ShardRecord {
	t.Helper()
	e, err := w.b.Shards.Get(context.Background(), stream.ShardKey(run, id))
	if err != nil {
		t.Fatal(err)
	}
	var rec stream.ShardRecord
	if err := stream.Decode(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	return rec
}
