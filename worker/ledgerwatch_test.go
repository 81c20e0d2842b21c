package worker

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWatchLedgerSeesAnotherWritersWrite: a write to the ledger through
// another open file (another worker's) is seen, and the watch ends with
// its context.
func TestWatchLedgerSeesAnotherWritersWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	changed, done := make(chan struct{}, 16), make(chan error, 1)
	go func() {
		done <- watchLedger(ctx, path, func() { changed <- struct{}{} })
	}()
	other, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	deadline := time.After(5 * time.Second)
	for seen := false; !seen; {
		// The watch may start after a first write: write until seen.
		if _, err := other.WriteAt([]byte("record"), 0); err != nil {
			t.Fatal(err)
		}
		select {
		case <-changed:
			seen = true
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("a write to the ledger was not seen within 5s")
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("watch ended with %v, want nil at cancel", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch did not end with its context")
	}
	if err := watchLedger(context.Background(), filepath.Join(t.TempDir(), "missing"), func() {}); err == nil {
		t.Fatal("watch of a missing ledger: got nil, want an error (the recheck then polls)")
	}
}
