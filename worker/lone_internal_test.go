package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// TestFailureUpper: the one-sided Clopper-Pearson bound against its
// closed form where there is one (no failure: 1 - 0.05^(1/n)), and 5 in
// 10 against the Beta(6, 5) quantile 0.95 (tables give 0.813 for the
// two-sided 95% interval, which is the one-sided 97.5% bound: also
// checked).
func TestFailureUpper(t *testing.T) {
	for _, c := range []struct {
		bad, n int
		want   float64
	}{
		{0, 10, 1 - math.Pow(0.05, 0.1)},
		{0, 1, 0.95},
		{5, 10, 0.7776},
		{3, 3, 1},
		{0, 0, 1},
	} {
		if got := failureUpper(c.bad, c.n); math.Abs(got-c.want) > 1e-3 {
			t.Errorf("failureUpper(%d, %d) = %.4f, want %.4f", c.bad, c.n, got, c.want)
		}
	}
	if got := binomialCDF(5, 10, 0.8129); math.Abs(got-0.025) > 1e-3 {
		t.Errorf("binomialCDF(5, 10, 0.8129) = %.4f, want 0.025 (the two-sided interval's upper end)", got)
	}
	// Where (1-p)^n underflows: 900 failures in 1,000 attempts.
	if got := failureUpper(900, 1000); got < 0.9 || got > 0.92 {
		t.Errorf("failureUpper(900, 1000) = %.4f, want about 0.915", got)
	}
}

// TestHostFault: a host whose every attempt fails while other workers
// validate the same shards at their first try is judged at fault after a
// handful of failures; one running a job that fails as often elsewhere,
// or a flaky job whose streak chance allows, is not.
func TestHostFault(t *testing.T) {
	for _, c := range []struct {
		name string
		e    loneEvidence
		want bool
	}{
		{"others validate every shard at once", loneEvidence{Streak: 10, Here: 10, Validated: 10, Others: 10}, true},
		{"too short for chance", loneEvidence{Streak: 9, Here: 9, Validated: 9, Others: 9}, false},
		{"the same after 5,000 shards validated here", loneEvidence{Streak: 12, Here: 5012, Validated: 12, Others: 12}, true},
		{"too short after 5,000 shards validated here", loneEvidence{Streak: 10, Here: 5010, Validated: 10, Others: 10}, false},
		{"evidence not in yet", loneEvidence{Streak: 30, Here: 30, Validated: 2, Others: 2}, false},
		{"a streak shorter than the least", loneEvidence{Streak: 4, Here: 4, Validated: 4, Others: 4}, false},
		{"others fail them too: the job's fault", loneEvidence{Streak: 20, Here: 20, Validated: 3, Others: 40, OthersBad: 37}, false},
		{"a flaky job failing half its attempts everywhere", loneEvidence{Streak: 10, Here: 200, Validated: 10, Others: 20, OthersBad: 10}, false},
		{"a streak no flaky job of that rate makes", loneEvidence{Streak: 30, Here: 200, Validated: 30, Others: 60, OthersBad: 30}, true},
	} {
		if got := c.e.hostFault(); got != c.want {
			t.Errorf("%s: hostFault(%+v) = %v, want %v", c.name, c.e, got, c.want)
		}
	}
}

// TestGatherLone counts what other workers did with the streak's shards:
// their validations, and their ended attempts, failed or not; attempts of
// this worker's name, open ones and those ended by no fault of the job's
// do not count.
func TestGatherLone(t *testing.T) {
	at := func(worker, outcome string) stream.Attempt { return stream.Attempt{Worker: worker, Outcome: outcome} }
	recs := []stream.ShardRecord{
		{State: stream.ShardValidated, Attempts: []stream.Attempt{at("bad", stream.OutcomeExit), at("good", stream.OutcomeOK)}},
		{State: stream.ShardValidated, Attempts: []stream.Attempt{at("bad", stream.OutcomeExit), at("good", stream.OutcomeTimeout), at("good2", stream.OutcomeInterrupted), at("good2", stream.OutcomeOK)}},
		{State: stream.ShardPending, Attempts: []stream.Attempt{at("bad", stream.OutcomeExit), at("good", stream.OutcomeLost), at("good", "")}},
		{State: stream.ShardValidated, Attempts: []stream.Attempt{at("bad", stream.OutcomeExit), at("bad", stream.OutcomeOK)}},
	}
	v, n, bad := gatherLone(recs, "bad")
	if v != 2 || n != 4 || bad != 2 {
		t.Fatalf("gatherLone: %d validated, %d attempts, %d failed; want 2, 4 and 2", v, n, bad)
	}
}

// TestHoldStartsAtTheFifthFailureWhereAPeerCanRunTheShards: the hold
// begins with the failure that makes the streak 5, only where a live
// peer serves the class and is not failing itself; after a hold ends the
// next begins 5 failures later, and a validation here starts over.
func TestHoldStartsAtTheFifthFailureWhereAPeerCanRunTheShards(t *testing.T) {
	fail := func(w *Worker, n int) {
		for i := range n {
			w.attemptFailed(context.Background(), fmt.Sprintf("t.s%d", i), "cpu", "exit status 1")
		}
	}
	healthy := stream.WorkerReport{Name: "w2", Slots: map[string]int{"cpu": 1}}
	for _, c := range []struct {
		name  string
		on    bool
		peers []stream.WorkerReport
		fails int
		want  bool
	}{
		{"four failures", true, []stream.WorkerReport{healthy}, 4, false},
		{"five failures, a healthy peer", true, []stream.WorkerReport{healthy}, 5, true},
		{"switched off", false, []stream.WorkerReport{healthy}, 5, false},
		{"no peer", true, nil, 5, false},
		{"the peer fails too", true, []stream.WorkerReport{{Name: "w2", Slots: map[string]int{"cpu": 1}, FailedInARow: 5}}, 9, false},
		{"the peer serves another class", true, []stream.WorkerReport{{Name: "w2", Slots: map[string]int{"gpu": 1}}}, 9, false},
		{"an auto peer", true, []stream.WorkerReport{{Name: "w2", Auto: true}}, 5, true},
		{"a peer serving each class as it appears", true, []stream.WorkerReport{{Name: "w2", SlotsEach: 1, Slots: map[string]int{}}}, 5, true},
	} {
		w := &Worker{cfg: Config{StopWhenFailingAlone: c.on}, poke: make(chan struct{}, 1), peers: c.peers, peersAt: time.Now()}
		fail(w, c.fails)
		if got := w.loneHeld() != ""; got != c.want {
			t.Errorf("%s: held %v (%q), want %v", c.name, got, w.loneHeld(), c.want)
		}
	}

	w := &Worker{cfg: Config{StopWhenFailingAlone: true}, poke: make(chan struct{}, 1), peers: []stream.WorkerReport{healthy}, peersAt: time.Now()}
	fail(w, 5)
	w.mu.Lock()
	w.releaseLone()
	w.mu.Unlock()
	fail(w, 4)
	if why := w.loneHeld(); why != "" {
		t.Fatalf("held again 4 failures after a hold ended: %q; want the next hold 5 failures later", why)
	}
	fail(w, 1)
	if why := w.loneHeld(); !strings.Contains(why, "its last 10 attempts failed here while worker w2 runs shards") {
		t.Fatalf("10 failures in a row, 5 after a hold ended: held %q; want a hold naming the 10 and w2", why)
	}
	w.count(true)
	if why := w.loneHeld(); why != "" {
		t.Fatalf("after a validation here: held %q, want no hold", why)
	}
	fail(w, 5)
	if w.loneHeld() == "" {
		t.Fatal("5 failures after a validation ended the streak: no hold; want one")
	}
}

// TestJudgementUnderChance simulates what the judgement sees (seeded, so
// each run is the same): a healthy worker of a job that fails a share of
// its attempts everywhere, each shard it failed then retried elsewhere
// until validated, is never judged at fault over 10,000 attempts; a host
// failing every attempt while others validate those shards at once is,
// within 10 to 14 failures however long it served before.
func TestJudgementUnderChance(t *testing.T) {
	for _, p := range []float64{0.5, 0.7, 0.9} {
		r := rand.New(rand.NewPCG(uint64(p*10), 1))
		for run := range 100 {
			var e loneEvidence
			for range 10000 {
				e.Here++
				if r.Float64() >= p {
					e = loneEvidence{Here: e.Here}
					continue
				}
				e.Streak++
				for {
					e.Others++
					if r.Float64() < p {
						e.OthersBad++
						continue
					}
					e.Validated++
					break
				}
				// The bound is at least the rate seen: skip what it cannot pass.
				if seen := float64(e.OthersBad) / float64(e.Others); float64(e.Here)*math.Pow(seen, float64(e.Streak)) >= loneChance {
					continue
				}
				if e.hostFault() {
					t.Fatalf("a job failing %.0f%% of attempts everywhere: run %d judged the host at fault: %+v", p*100, run, e)
				}
			}
		}
	}
	for _, c := range []struct{ before, want int }{{0, 10}, {5000, 12}, {100000, 14}} {
		e := loneEvidence{Here: c.before}
		for !e.hostFault() && e.Streak < 100 {
			e.Here++
			e.Streak++
			e.Others++
			e.Validated++
		}
		if e.Streak != c.want {
			t.Errorf("a host failing every attempt after %d validated: judged at fault after %d failures, want %d", c.before, e.Streak, c.want)
		}
	}
}

// TestHeldWorkerIsNotIdle: --idle-exit does not end a worker that holds
// its fetches (it would exit 0 saying it had nothing to run, under a
// batch scheduler that then thinks the queue ran dry); once the hold
// ends and nothing comes, it does.
func TestHeldWorkerIsNotIdle(t *testing.T) {
	w := &Worker{cfg: Config{IdleExit: 50 * time.Millisecond}, drain: make(chan struct{}), log: slog.New(slog.DiscardHandler)}
	w.busyAt.Store(time.Now().UnixNano())
	w.loneSince, w.loneWhy = time.Now(), "held"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.exitWhenIdle(ctx) }()
	select {
	case <-w.drain:
		t.Fatalf("a held worker drained as idle: %q", w.drainReason())
	case <-time.After(300 * time.Millisecond):
	}
	w.mu.Lock()
	w.releaseLone()
	w.mu.Unlock()
	select {
	case <-w.drain:
		if why := w.drainReason(); !strings.Contains(why, "--idle-exit") {
			t.Fatalf("drained for %q, want --idle-exit", why)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the hold ended and nothing came: not drained as idle within 5s")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestBusyTillNeverMovesBack: the end of a hand-back delay (nakWithDelay)
// stays the mark --idle-exit counts from when a shard is delivered or
// found running meanwhile; a later delay moves it on.
func TestBusyTillNeverMovesBack(t *testing.T) {
	var w Worker
	now := time.Now()
	w.busyTill(now.Add(time.Minute))
	w.busyTill(now)
	if got := time.Unix(0, w.busyAt.Load()); !got.Equal(now.Add(time.Minute)) {
		t.Fatalf("busy till %s after a delay to %s and a delivery now, want the delay's end", got, now.Add(time.Minute))
	}
	w.busyTill(now.Add(2 * time.Minute))
	if got := time.Unix(0, w.busyAt.Load()); !got.Equal(now.Add(2 * time.Minute)) {
		t.Fatalf("busy till %s, want the later delay's end %s", got, now.Add(2*time.Minute))
	}
}

// TestADueHoldReadsThePeersAgain: a worker that read its peers before the
// others reported (a scheduler starts a fleet at once) reads them again
// at the failure that makes a hold due, and holds at once, rather than
// fail on until the next second's look.
func TestADueHoldReadsThePeersAgain(t *testing.T) {
	ctx := context.Background()
	w := workerOnServer(t, Config{StopWhenFailingAlone: true})
	w.host = "h"
	w.refreshPeers(ctx)
	if len(w.peers) != 0 {
		t.Fatalf("peers before any reported: %+v", w.peers)
	}
	data, err := stream.Encode(&stream.WorkerReport{Name: "good", Host: "g", Slots: map[string]int{"cpu": 1}, Reported: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.b.Workers.Put(ctx, "good", data); err != nil {
		t.Fatal(err)
	}
	time.Sleep(peersFresh)
	for i := range loneStreak {
		if why := w.loneHeld(); why != "" {
			t.Fatalf("held after %d failures, want the hold at %d: %s", i, loneStreak, why)
		}
		w.attemptFailed(ctx, fmt.Sprintf("u.s%d", i), "cpu", "exit status 127")
	}
	if why := w.loneHeld(); !strings.Contains(why, "worker good runs shards") {
		t.Fatalf("after %d failures in a row, with peer good reported since the last read: hold %q, want one naming good", loneStreak, why)
	}
}

// TestPeersTimesOnOwnClock: peers whose clocks are an hour ahead and an
// hour behind this worker's, as read through a real store, have their
// report and start times moved to this worker's clock. The one behind is
// live, not gone; the start of the one ahead, two seconds before its
// report, is not taken for one after this worker's start failures began
// a second ago (outage.go's evidence that the host is at fault).
func TestPeersTimesOnOwnClock(t *testing.T) {
	ctx := context.Background()
	w := workerOnServer(t, Config{})
	w.host, w.pid = "h", 4242
	now := time.Now()
	put := func(r stream.WorkerReport) {
		t.Helper()
		data, err := stream.Encode(&r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.b.Workers.Put(ctx, r.Name, data); err != nil {
			t.Fatal(err)
		}
	}
	put(stream.WorkerReport{Name: w.cfg.Name, Host: "h", PID: 4242, Slots: map[string]int{"cpu": 1}, Reported: now})
	put(stream.WorkerReport{Name: "ahead", Host: "a", PID: 1, Slots: map[string]int{"cpu": 1}, Reported: now.Add(time.Hour), LastStarted: now.Add(time.Hour - 2*time.Second)})
	put(stream.WorkerReport{Name: "behind", Host: "b", PID: 1, Slots: map[string]int{"cpu": 1}, Reported: now.Add(-time.Hour)})
	w.refreshPeers(ctx)
	got := map[string]stream.WorkerReport{}
	for _, p := range w.peers {
		got[p.Name] = p
	}
	near := func(a, b time.Time) bool { return a.Sub(b).Abs() < time.Second }
	if p, ok := got["behind"]; !ok || !near(p.Reported, now) {
		t.Errorf("peer an hour behind: %+v (read: %v); want it live, reported about now", p.Reported, ok)
	}
	if p, ok := got["ahead"]; !ok || !near(p.Reported, now) || !near(p.LastStarted, now.Add(-2*time.Second)) {
		t.Errorf("peer an hour ahead: reported %v, last started %v (read: %v); want about now and 2 s before", p.Reported, p.LastStarted, ok)
	}
	w.startStreakAt = now.Add(-time.Second)
	if peer, _ := w.startingPeer("cpu"); peer != "" {
		t.Errorf("start failures since a second ago: %q counted as having started a command since, want none", peer)
	}
}

// TestStoreStampsOnOwnClock: a worker whose clock is an hour behind the
// coordinator's (its report, read back, says so) moves the store's
// stamps an hour back: a claim the store took a moment ago is a moment
// old on this worker's clock too.
func TestStoreStampsOnOwnClock(t *testing.T) {
	ctx := context.Background()
	w := workerOnServer(t, Config{})
	w.host, w.pid = "h", 4242
	data, err := stream.Encode(&stream.WorkerReport{Name: w.cfg.Name, Host: "h", PID: 4242, Reported: time.Now().Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.b.Workers.Put(ctx, w.cfg.Name, data); err != nil {
		t.Fatal(err)
	}
	if got := w.onOwnTime(time.Now()); time.Since(got).Abs() > time.Second {
		t.Fatalf("before its report is read back: %v, want the stamp as it is", got)
	}
	w.refreshPeers(ctx)
	if got := w.onOwnTime(time.Now()); (time.Since(got) - time.Hour).Abs() > time.Second {
		t.Errorf("a stamp of now on a clock an hour behind: %v (%s ago), want an hour ago", got, time.Since(got))
	}
}

// TestANameInUseIsJudgedByTheStoresStamp: a worker on another host whose
// clock runs an hour behind reported under a name a moment ago. Its report
// says an hour ago, the store's stamp says now: the name is in use, and a
// second worker under it is refused (judged by the writer's clock, it took
// the name, and the two overwrote each other's reports). The store's clock
// is read before this worker has a report of its own.
func TestANameInUseIsJudgedByTheStoresStamp(t *testing.T) {
	ctx := context.Background()
	w := workerOnServer(t, Config{})
	w.host, w.pid = "h", 4242
	for _, skew := range []time.Duration{-time.Hour, time.Hour} {
		data, err := stream.Encode(&stream.WorkerReport{Name: w.cfg.Name, Host: "elsewhere", PID: 7, Slots: map[string]int{"cpu": 1}, Reported: time.Now().Add(skew)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.b.Workers.Put(ctx, w.cfg.Name, data); err != nil {
			t.Fatal(err)
		}
		rev, err := w.checkName(ctx)
		if !errors.Is(err, ErrNameTaken) || rev != 0 {
			t.Errorf("a live worker's report, its clock %v off: revision %d, %v; want the name refused", skew, rev, err)
		} else if !strings.Contains(err.Error(), "last report 0s ago") {
			t.Errorf("clock %v off: %v; want its report's age by the store's stamp (0s)", skew, err)
		}
	}
	if ahead := time.Duration(w.storeAhead.Load()); ahead.Abs() > time.Second {
		t.Errorf("store clock read as %v ahead of this one (the same host's), want about 0", ahead)
	}
}
