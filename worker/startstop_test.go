package worker_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
