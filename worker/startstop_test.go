package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker"
)

// TestStoppedWhileWaitingForTheCoordinator: a worker stopped (SIGTERM)
// while it waits for the coordinator's buckets, before it has served
// anything, ends as a stopped worker does: Run returns nil. It returned
// "open bucket shardpool-runs: context canceled", and `shardpool worker`
// exited as interrupted rather than 0.
func TestStoppedWhileWaitingForTheCoordinator(t *testing.T) {
	// A JetStream server that no coordinator has set up: no buckets yet.
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true, JetStream: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	defer srv.Shutdown()
	if !srv.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	w, err := worker.New(worker.Config{JetStream: js, Name: "early", Slots: map[string]int{"cpu": 1},
		Scratch: filepath.Join(dir, "scratch"), StateDir: dir, HostLedger: testenv.LedgerDir(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("worker returned before it was stopped, with no buckets to serve: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("worker stopped while waiting for the coordinator: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("worker still waiting 10s after it was stopped")
	}
}

// TestAStoppingWorkerKeepsReporting: a worker stopped while a command
// runs (one that ignores SIGTERM: it runs the whole grace period) goes on
// reporting until its shards have settled, and says it stops. It fell
// silent at once: status showed a report growing old with nothing said,
// and after three report periods another worker could take its name,
// whose report this one's exit then removed (that a worker started
// under the name meanwhile is refused: TestStatusSaysAWorkerIsStopping).
// Once the stopping worker has exited its report is gone.
func TestAStoppingWorkerKeepsReporting(t *testing.T) {
	env := testenv.New(t, testenv.Options{Grace: 4 * time.Second, Slots: map[string]int{"cpu": 1}})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 1,
		Command: []string{"sh", "-c", `trap '' TERM; sleep 30`}})
	env.Submit(spec, coordinator.SubmitOptions{})
	report := func() (stream.WorkerReport, error) { return env.WorkerReport("w1") }
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, err := report()
		return err == nil && r.Running["cpu"] == 1, fmt.Sprintf("report %+v (%v)", r, err)
	})
	stopped := make(chan error, 1)
	stopAt := time.Now()
	go func() { stopped <- env.StopWorker("w1") }()
	var first stream.WorkerReport
	testenv.Eventually(t, 2*time.Second, func() (bool, string) {
		r, err := report()
		first = r
		return err == nil && r.Stopping == "stopped" && !r.StoppingSince.Before(stopAt.Add(-time.Second)) && r.Running["cpu"] == 1,
			fmt.Sprintf("report %+v (%v)", r, err)
	})
	// Reports go on while the command has its grace (500ms apart here).
	testenv.Eventually(t, 3*time.Second, func() (bool, string) {
		r, err := report()
		return err == nil && r.Reported.After(first.Reported) && r.Stopping == "stopped",
			fmt.Sprintf("report %+v (%v), the first while stopping at %s", r, err, first.Reported)
	})
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("stopped worker: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stopping worker did not exit")
	}
	if d := time.Since(stopAt); d < 3*time.Second {
		t.Fatalf("the worker exited %s after its stop: the command had its grace of 4s?", d)
	}
	if r, err := report(); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the report of a worker that has exited: %+v (%v), want none", r, err)
	}
}

// TestAWorkerStoppedAtOnceWarnsOfNothing: a worker stopped moments after
// it started (`shardpool run` of a run already COMPLETE, or of a few
// shards of a millisecond) says nothing of the lookups its stop cut
// short. One in three such runs ended with `WARN consumer lookup ...
// context canceled` under its verdict.
func TestAWorkerStoppedAtOnceWarnsOfNothing(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Command: []string{"true"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	var logged testenv.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelWarn}))
	for i := range 40 {
		dir := t.TempDir()
		w, err := worker.New(worker.Config{JetStream: env.JS, Name: fmt.Sprintf("brief%d", i), Slots: map[string]int{"cpu": 1},
			Scratch: filepath.Join(dir, "scratch"), StateDir: dir, HostLedger: testenv.LedgerDir(t), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		// Stopped at points spread over its first lookups.
		time.Sleep(time.Duration(i%10) * 300 * time.Microsecond)
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("worker %d stopped: %v, want nil", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("worker %d still running 10s after it was stopped", i)
		}
	}
	if s := logged.String(); strings.Contains(s, "context canceled") {
		t.Fatalf("workers stopped at once warned of their own stop:\n%s", s)
	}
}
