package stream

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
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

// TestGroupCallersGiveTheirOwnGather: a caller that may not wait starts
// a run at once, and callers that would wait longer share it; where none
// is in a hurry, a run waits its callers' gather after the previous run
// ended, so that callers that queued behind a run gather too.
func TestGroupCallersGiveTheirOwnGather(t *testing.T) {
	var runs atomic.Int64
	var mu sync.Mutex
	var starts, ends []time.Time
	g := &Group{Fn: func() error {
		mu.Lock()
		starts = append(starts, time.Now())
		mu.Unlock()
		runs.Add(1)
		time.Sleep(30 * time.Millisecond)
		mu.Lock()
		ends = append(ends, time.Now())
		mu.Unlock()
		return nil
	}}
	patient := make(chan error, 1)
	go func() { patient <- g.DoWithin(context.Background(), time.Hour) }()
	time.Sleep(20 * time.Millisecond)
	if n := runs.Load(); n != 0 {
		t.Fatalf("runs: %d before the only caller's gather ended, want 0", n)
	}
	if err := g.DoWithin(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-patient:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the caller gathering for an hour was not served by the run a caller in a hurry started")
	}
	if n := runs.Load(); n != 1 {
		t.Fatalf("runs: %d, want 1 shared by both callers", n)
	}

	// One caller, then another while its run runs, both gathering 50 ms:
	// the second run starts no sooner than 50 ms after the first ended.
	const gather = 50 * time.Millisecond
	first := make(chan error, 1)
	go func() { first <- g.DoWithin(context.Background(), gather) }()
	for runs.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	if err := g.DoWithin(context.Background(), gather); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(starts) != 3 {
		t.Fatalf("runs: %d, want 3", len(starts))
	}
	if d := starts[2].Sub(ends[1]); d < gather {
		t.Fatalf("the third run began %s after the second ended, want at least the callers' gather, %s", d, gather)
	}
}

// TestFSSyncIsOnePerFileSystem: directories on one file system share one
// FSSync (one syncfs serves them all), another file system has its own,
// and the last Close closes its file.
func TestFSSyncIsOnePerFileSystem(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	sa, err := OpenFSSync(a)
	if err != nil {
		t.Fatal(err)
	}
	sb, err := OpenFSSync(b)
	if err != nil {
		t.Fatal(err)
	}
	if sa != sb {
		t.Fatalf("two directories of one file system got two FSSyncs")
	}
	sp, err := OpenFSSync("/proc")
	if err != nil {
		t.Fatal(err)
	}
	defer sp.Close()
	if sp == sa {
		t.Fatalf("/proc and %s share an FSSync", a)
	}
	if err := sa.Do(context.Background(), 0); err != nil {
		t.Fatalf("syncfs: %v", err)
	}
	// The wait for company follows what a syncfs took, within its bounds.
	if g := sa.Gather(1, 0, time.Hour); g <= 0 {
		t.Errorf("Gather after a syncfs: %s, want what it took", g)
	}
	if g := sa.Gather(1<<20, 0, 7*time.Millisecond); g != 7*time.Millisecond {
		t.Errorf("Gather above its most: %s, want 7ms", g)
	}
	if g := sa.Gather(0, 3*time.Millisecond, 10*time.Millisecond); g != 3*time.Millisecond {
		t.Errorf("Gather below its least: %s, want 3ms", g)
	}
	sa.Close()
	if err := sb.Do(context.Background(), 0); err != nil {
		t.Fatalf("syncfs after one of two users closed: %v", err)
	}
	sb.Close()
	if err := sb.Do(context.Background(), 0); err == nil {
		t.Fatalf("syncfs after the last user closed: no error, want its file closed")
	}
	again, err := OpenFSSync(a)
	if err != nil {
		t.Fatal(err)
	}
	defer again.Close()
	if again == sa {
		t.Fatalf("an FSSync closed by all its users was handed out again")
	}
}

// TestSettleBarrierMayWait: a SettleBarrier tells the coordinator it may
// gather; a Barrier does not, as before, so that a coordinator takes an
// older worker's barriers as ones in a hurry.
func TestSettleBarrierMayWait(t *testing.T) {
	nc := plainServer(t)
	bodies := make(chan []byte, 2)
	sub, err := nc.Subscribe(SubjectSync, func(m *nats.Msg) {
		bodies <- m.Data
		_ = m.Respond([]byte("ok"))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := Barrier(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
	if err := SettleBarrier(context.Background(), nc); err != nil {
		t.Fatal(err)
	}
	if b := <-bodies; MayGather(b) {
		t.Errorf("Barrier sent %q, which lets the coordinator wait", b)
	}
	if b := <-bodies; !MayGather(b) {
		t.Errorf("SettleBarrier sent %q, which does not let the coordinator wait", b)
	}
	if MayGather(nil) {
		t.Error("an empty body (an older worker's barrier) lets the coordinator wait")
	}
}

// plainServer starts a NATS server without JetStream on loopback, stopped
// at cleanup, and returns a connection to it.
func plainServer(t *testing.T) *nats.Conn {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestBarrierWaitsForACoordinatorThatIsStarting: a coordinator accepts
// connections before it serves barriers; a barrier asked in between waits
// for it instead of failing with "no responders", and one that no
// coordinator ever answers fails when its context ends.
func TestBarrierWaitsForACoordinatorThatIsStarting(t *testing.T) {
	nc := plainServer(t)

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := Barrier(ctx, nc); !errors.Is(err, ErrNotDurable) {
		t.Fatalf("no coordinator: got %v, want ErrNotDurable", err)
	}
	if d := time.Since(start); d < 250*time.Millisecond || d > 2*time.Second {
		t.Errorf("no coordinator: failed after %s, want at its context's end (300ms)", d)
	}

	done := make(chan error, 1)
	go func() { done <- Barrier(context.Background(), nc) }()
	time.Sleep(300 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("barrier returned before a coordinator served it: %v", err)
	default:
	}
	sub, err := nc.Subscribe(SubjectSync, func(m *nats.Msg) { _ = m.Respond([]byte("ok")) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("barrier once a coordinator serves it: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("barrier still waiting after the coordinator began serving")
	}
}

// TestAskInfoAllNamesTheBuildsOfACluster: where the coordinators of a
// cluster run different builds (mid-upgrade), the merged answer names each
// one's; where they agree, it names none.
func TestAskInfoAllNamesTheBuildsOfACluster(t *testing.T) {
	nc := plainServer(t)
	for _, tc := range []struct {
		builds []string
		want   map[string]string
	}{
		{[]string{"v2", "v2", "v2"}, nil},
		{[]string{"v2", "v1", ""}, map[string]string{"c0": "v2", "c1": "v1", "c2": ""}},
	} {
		var subs []*nats.Subscription
		for i, b := range tc.builds {
			data, err := Encode(&CoordinatorInfo{Name: fmt.Sprintf("c%d", i), Cluster: "k", Coordinators: len(tc.builds), Version: b})
			if err != nil {
				t.Fatal(err)
			}
			// Each answers a moment after the one before, c0 first.
			delay := time.Duration(i) * 20 * time.Millisecond
			sub, err := nc.Subscribe(SubjectInfo, func(m *nats.Msg) {
				time.Sleep(delay)
				_ = m.Respond(data)
			})
			if err != nil {
				t.Fatal(err)
			}
			subs = append(subs, sub)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ci, err := AskInfoAll(ctx, nc, 2*time.Second)
		cancel()
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
		if err != nil || ci.Name != "c0" || !maps.Equal(ci.Versions, tc.want) {
			t.Errorf("builds %q: answer %+v, %v; want c0's with versions %v", tc.builds, ci, err, tc.want)
		}
	}
}
