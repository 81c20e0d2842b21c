package staging_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestFleetLimitBoundsCopiesAcrossHosts: two stagers, four copies each
// allowed locally, share a fleet limit of one copy at once.
func TestFleetLimitBoundsCopiesAcrossHosts(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	kv, err := env.JS.KeyValue(context.Background(), stream.BucketStagers)
	if err != nil {
		t.Fatal(err)
	}
	src := t.TempDir()
	var stagers []*staging.Stager
	var files [][]stream.InputFile
	for h := range 2 {
		stagers = append(stagers, newStager(t, staging.Config{Concurrency: 4, BytesPerSec: 16 << 20,
			Fleet: &staging.Fleet{KV: kv, Slots: 1, Owner: fmt.Sprint("host", h), TTL: 3 * time.Second}}))
		var paths []string
		for i := range 3 {
			paths = append(paths, testenv.RandomFile(t, src, fmt.Sprintf("h%d-f%d", h, i), 4<<20))
		}
		files = append(files, describe(t, paths...))
	}
	ctx, cancel := context.WithCancel(context.Background())
	maxHeld := 0
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		for ctx.Err() == nil {
			if l, err := kv.ListKeys(ctx); err == nil {
				n := 0
				for range l.Keys() {
					n++
				}
				maxHeld = max(maxHeld, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	var wg sync.WaitGroup
	start := time.Now()
	for h := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := stagers[h].Stage(context.Background(), files[h], 0)
			if err != nil {
				t.Errorf("host %d: %v", h, err)
				return
			}
			st.Release()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	cancel()
	<-watched
	if maxHeld != 1 {
		t.Fatalf("fleet slots held at once: up to %d, want exactly 1", maxHeld)
	}
	// Six 4 MiB copies one at a time at 16 MiB/s take about 1.5 s.
	if elapsed < 1200*time.Millisecond {
		t.Fatalf("six copies took %s: they did not run one at a time", elapsed)
	}
}
