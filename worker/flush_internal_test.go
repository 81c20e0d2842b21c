package worker

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// TestFlushWaitsOnlyForWhoCanCome: a flush waits for company while
// someone could join it, and starts at once when nobody could: a lone
// shard, or every delivery in hand waiting with the queue dry. Once the
// queue runs dry under flushes already waiting, hurryFlushes starts them.
func TestFlushWaitsOnlyForWhoCanCome(t *testing.T) {
	w := &Worker{gates: map[string]*gate{}, outSyncs: map[string]*stream.FSSync{}}
	var barriers atomic.Int32
	w.durableNow = &stream.Group{Fn: func() error { barriers.Add(1); return nil }}

	w.handling.Store(1)
	last, done := w.joinFlush()
	if !last {
		t.Fatal("a lone shard's flush waits for company")
	}
	done()

	g := &gate{wake: make(chan struct{}, 1)}
	w.gates["cpu"] = g
	w.handling.Store(3)
	// No fetch has ended yet: more may be queued.
	var dones []func()
	for i := range 3 {
		last, done := w.joinFlush()
		if last {
			t.Fatalf("flush %d of 3 starts at once with the queue not known dry", i+1)
		}
		dones = append(dones, done)
	}
	for _, d := range dones {
		d()
	}
	if n := w.flushing.Load(); n != 0 {
		t.Fatalf("flushing %d after every done, want 0", n)
	}

	g.setBacklog(false) // the last fetch came back short
	first, done1 := w.joinFlush()
	second, done2 := w.joinFlush()
	third, done3 := w.joinFlush()
	if first || second || !third {
		t.Fatalf("queue dry, 3 in hand: last = %v, %v, %v; want only the third", first, second, third)
	}
	done1()
	done2()
	done3()

	// Flushes waiting with a long gather when the queue runs dry.
	s, err := stream.OpenFSSync(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w.outSyncs["out"] = s
	g.setBacklog(true)
	w.handling.Store(2)
	flushed := make(chan error, 2)
	for range 2 {
		_, done := w.joinFlush()
		defer done()
		s.Go(time.Hour, func(err error) { flushed <- err })
	}
	w.hurryFlushes() // the queue is not dry: nothing starts
	select {
	case <-flushed:
		t.Fatal("a flush started before the queue ran dry")
	case <-time.After(50 * time.Millisecond):
	}
	g.setBacklog(false)
	w.hurryFlushes()
	for range 2 {
		select {
		case err := <-flushed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("flushes waiting out their gather after hurryFlushes")
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for barriers.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if barriers.Load() == 0 {
		t.Fatal("no barrier asked of the coordinator")
	}
}
