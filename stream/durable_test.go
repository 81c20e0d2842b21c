package stream

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestGroupSharesRunsButNeverAnEarlierOne: callers that arrive while Fn
// runs share the next run; none is served by a run that began before it
// called (that run may not cover its writes).
func TestGroupSharesRunsButNeverAnEarlierOne(t *testing.T) {
	var runs atomic.Int64
	var began atomic.Int64 // UnixNano of the current run's start
	release := make(chan struct{})
	g := &Group{Fn: func() error {
		began.Store(time.Now().UnixNano())
		n := runs.Add(1)
		if n == 1 {
			<-release // hold the first run until the others queued
		}
		return nil
	}}
	first := make(chan error, 1)
	go func() { first <- g.Do(context.Background()) }()
	for runs.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	calls := make([]int64, 20)
	served := make([]int64, 20)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			calls[i] = time.Now().UnixNano()
			if err := g.Do(context.Background()); err != nil {
				t.Error(err)
			}
			served[i] = began.Load()
		}()
	}
	time.Sleep(50 * time.Millisecond)
	close(release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if n := runs.Load(); n != 2 {
		t.Fatalf("runs: got %d, want 2 (one for the first caller, one shared by the 20 that queued)", n)
	}
	for i := range calls {
		if served[i] < calls[i] {
			t.Fatalf("caller %d was served by a run that began before it called", i)
		}
	}
}

func TestGroupReturnsFnError(t *testing.T) {
	boom := errors.New("boom")
	g := &Group{Fn: func() error { return boom }}
	if err := g.Do(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("got %v, want boom", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	slow := &Group{Fn: func() error { time.Sleep(100 * time.Millisecond); return nil }}
	if err := slow.Do(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: got %v, want context.Canceled", err)
	}
}

// TestGroupGatherJoinsLateCallers: with Gather, callers that arrive shortly
// after the first share its run instead of waiting for the next one.
func TestGroupGatherJoinsLateCallers(t *testing.T) {
	var runs atomic.Int64
	g := &Group{Fn: func() error { runs.Add(1); return nil }, Gather: 200 * time.Millisecond}
	var wg sync.WaitGroup
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := g.Do(context.Background()); err != nil {
				t.Error(err)
			}
		}()
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	if n := runs.Load(); n != 1 {
		t.Fatalf("runs: got %d, want 1 shared by callers 50 ms apart at most", n)
	}
}
