package stream_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestWorkerReportsSeesAReportBeingRewritten: every worker rewrites its
// report on a timer, and a listing that misses one while it is rewritten
// hides a live worker from status and from its peers' locality choice.
// With one report rewritten every millisecond, no listing misses it; a
// deleted report (a worker that stopped) is not listed.
func TestWorkerReportsSeesAReportBeingRewritten(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	b := env.Buckets()
	put := func(name string) {
		data, _ := stream.Encode(&stream.WorkerReport{Name: name})
		if _, err := b.Workers.Put(ctx, name, data); err != nil {
			t.Error(err)
		}
	}
	put("a")
	put("b")
	put("stopped")
	if err := b.Workers.Delete(ctx, "stopped"); err != nil {
		t.Fatal(err)
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			put("busy")
			time.Sleep(time.Millisecond)
		}
	}()
	defer func() { close(stop); <-done }()
	time.Sleep(10 * time.Millisecond)
	for i := range 300 {
		rs, err := b.WorkerReports(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, r := range rs {
			names = append(names, r.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, []string{"a", "b", "busy"}) {
			t.Fatalf("listing %d: %v, want a, b and busy (the one being rewritten), not the stopped one", i, names)
		}
	}
}

// TestPurgeRunKeepsARecordWrittenMeanwhile: forget purges a run's record
// only at the revision it judged finished. A record written since (a
// submission of the run at the same moment) is kept, and the purge says
// so; at the current revision the record goes.
func TestPurgeRunKeepsARecordWrittenMeanwhile(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	b := env.Buckets()
	judged, err := b.Runs.Put(ctx, "r", []byte(`{"v":1,"name":"r","state":"COMPLETE"}`))
	if err != nil {
		t.Fatal(err)
	}
	// PREPARED with nothing queued: as the coordinator's tracker judges
	// it, so it writes nothing over it.
	now, err := b.Runs.Put(ctx, "r", []byte(`{"v":1,"name":"r","state":"PREPARED"}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.PurgeRun(ctx, "r", judged); !errors.Is(err, stream.ErrRunChanged) {
		t.Fatalf("purge at the judged revision: %v, want ErrRunChanged", err)
	}
	if _, err := b.Runs.Get(ctx, "r"); err != nil {
		t.Fatalf("the record written meanwhile: %v, want it kept", err)
	}
	if _, err := b.PurgeRun(ctx, "r", now); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Runs.Get(ctx, "r"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("after the purge at the current revision: %v, want the record gone", err)
	}
}
