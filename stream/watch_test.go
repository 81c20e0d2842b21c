package stream_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestStopWatchEndsAWatchNobodyReads: a status listing reads a watcher's
// first pass and stops reading; records rewritten meanwhile fill the
// watcher's channel, and nats.go's delivering goroutine then waits in its
// send. Stop alone left it there for good (a goroutine per status request
// of a busy run, in a coordinator that runs for weeks); StopWatch ends it.
func TestStopWatchEndsAWatchNobodyReads(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	b := env.Buckets()
	if _, err := b.Shards.Put(ctx, "r.a", []byte("0")); err != nil {
		t.Fatal(err)
	}
	w, err := b.Shards.WatchFiltered(ctx, []string{"r.*"})
	if err != nil {
		t.Fatal(err)
	}
	for e := range w.Updates() {
		if e == nil {
			break // the first pass is over; the reader stops here
		}
	}
	// The bucket keeps 5 revisions of a key: revisions written faster than
	// the watcher is served are gone before it gets to them, and are never
	// delivered (6 in 40 runs filled the channel with only 124 to 252 of
	// 400 writes). So write until it is full.
	i := 0
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		for range 50 {
			if _, err := b.Shards.Put(ctx, "r.a", fmt.Appendf(nil, "%d", i)); err != nil {
				t.Fatal(err)
			}
			i++
		}
		n := len(w.Updates())
		return n == cap(w.Updates()), fmt.Sprintf("after %d writes the watcher's channel holds %d of %d entries", i, n, cap(w.Updates()))
	})
	stream.StopWatch(w)
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		n := watchGoroutines()
		return n == 0, fmt.Sprintf("%d watcher goroutine(s) still delivering after StopWatch", n)
	})
}

// watchGoroutines counts the goroutines in a KV watcher's delivery.
func watchGoroutines() int {
	buf := make([]byte, 1<<22)
	all := string(buf[:runtime.Stack(buf, true)])
	return strings.Count(all, "jetstream.(*kvs).WatchFiltered.func")
}
