package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/coordinator/drill"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestStatusNamesRunningShardsOfSilentWorkers: a running shard whose owner
// is not among the live worker reports (killed, or its host is gone) is
// shown as such, with what happens next; one whose owner reports is not.
func TestStatusNamesRunningShardsOfSilentWorkers(t *testing.T) {
	now := time.Now().UTC()
	st := &coordinator.Status{V: coordinator.StatusVersion, Time: now,
		Runs: []coordinator.RunStatus{{Name: "r", State: stream.RunRunning, Counts: stream.Counts{Total: 2, Running: 2},
			Shards: []stream.ShardRecord{
				{ID: "a", State: stream.ShardRunning, Owner: &stream.Owner{Worker: "w1", Host: "h1", PID: 41, Attempt: 1}},
				{ID: "b", State: stream.ShardRunning, Owner: &stream.Owner{Worker: "w2", Host: "h2", PID: 42, Attempt: 2}},
				{ID: "c", State: stream.ShardRunning, Owner: &stream.Owner{Worker: "w3", Host: "h2", PID: 43, Attempt: 1}},
				{ID: "d", State: stream.ShardRunning, Owner: &stream.Owner{Worker: "w4", Host: "h3", PID: 44, Attempt: 1}},
			}}},
		// w1 restarted under a new pid: the old process is gone. w3's
		// report outlives its process (proven gone by the reader).
		Workers: []stream.WorkerReport{{Name: "w1", Host: "h1", PID: 99, Reported: now}, {Name: "w2", Host: "h2", PID: 42, Reported: now},
			{Name: "w3", Host: "h2", PID: 43, Reported: now, Gone: "pid 43 is not running on h2, where it reported"},
			{Name: "w4", Host: "h3", PID: 44, Reported: now, Disconnected: "no connection named shardpool-worker-w4 at the coordinator"}},
	}
	var b strings.Builder
	printStatus(&b, st)
	lines := map[string]string{}
	for _, l := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(l); len(f) > 1 && (f[0] == "a" || f[0] == "b" || f[0] == "c" || f[0] == "d" || f[0] == "w3" || f[0] == "w4") {
			lines[f[0]] = l
		}
	}
	if !strings.Contains(lines["a"], "not reporting") || !strings.Contains(lines["a"], "lease expires") {
		t.Errorf("shard of a gone worker process: got %q, want it named not reporting", lines["a"])
	}
	if lines["b"] == "" || strings.Contains(lines["b"], "not reporting") || strings.Contains(lines["b"], "gone") {
		t.Errorf("shard of a reporting worker: got %q, want its owner without the note", lines["b"])
	}
	if !strings.Contains(lines["c"], "that worker is gone (pid 43 is not running on h2") {
		t.Errorf("shard of a worker proven gone: got %q, want it named gone with why", lines["c"])
	}
	if !strings.Contains(lines["w3"], "GONE") {
		t.Errorf("worker proven gone: got %q, want GONE beside its last report", lines["w3"])
	}
	if !strings.Contains(lines["d"], "that worker is disconnected (no connection named shardpool-worker-w4") {
		t.Errorf("shard of a disconnected worker: got %q, want it named disconnected with why", lines["d"])
	}
	if !strings.Contains(lines["w4"], "DISCONNECTED") || strings.Contains(lines["w4"], "GONE") {
		t.Errorf("disconnected worker: got %q, want DISCONNECTED beside its last report", lines["w4"])
	}
	if !strings.Contains(b.String(), "w4: disconnected: no connection named") {
		t.Errorf("status does not say why w4 is disconnected:\n%s", b.String())
	}
}

// TestStatusNamesSlotsHeldForAnotherWorkersShard: a worker holding a
// delivery of a shard another worker runs (its message came again) shows
// it: the running shard names the worker that holds a slot for it, and
// the worker says that its slot runs nothing. Before, that worker only
// counted one more running shard, with none of its own to show for it.
func TestStatusNamesSlotsHeldForAnotherWorkersShard(t *testing.T) {
	now := time.Now().UTC()
	st := &coordinator.Status{V: coordinator.StatusVersion, Time: now,
		Runs: []coordinator.RunStatus{{Name: "r", State: stream.RunRunning, Counts: stream.Counts{Total: 2, Running: 2},
			Shards: []stream.ShardRecord{
				{ID: "a", State: stream.ShardRunning, Owner: &stream.Owner{Worker: "w1", Host: "h1", PID: 41, Attempt: 1}},
				{ID: "b", State: stream.ShardRunning, Owner: &stream.Owner{Worker: "w2", Host: "h2", PID: 42, Attempt: 1}},
			}}},
		Workers: []stream.WorkerReport{
			{Name: "w1", Host: "h1", PID: 41, Reported: now, Running: map[string]int{"cpu": 1}},
			{Name: "w2", Host: "h2", PID: 42, Reported: now, Running: map[string]int{"cpu": 1}},
			{Name: "w3", Host: "h3", PID: 43, Reported: now, Running: map[string]int{"cpu": 1}, Awaiting: []string{"r.a"}},
		},
	}
	var b strings.Builder
	printStatus(&b, st)
	out := b.String()
	lines := rowsByFirstWord(out)
	if !strings.Contains(lines["a"], "its message came again, to w3, which holds a slot for it until this attempt ends") {
		t.Errorf("shard a: got %q, want the worker holding a slot for it named", lines["a"])
	}
	if strings.Contains(lines["b"], "came again") {
		t.Errorf("shard b: got %q, want no other worker named", lines["b"])
	}
	if !strings.Contains(out, "w3: 1 of its running slot(s) hold a shard that another attempt runs (r.a)") {
		t.Errorf("status does not say what w3's slot holds:\n%s", out)
	}
	if strings.Contains(out, "w1: 1 of its running") || strings.Contains(out, "w2: 1 of its running") {
		t.Errorf("a worker running its own shard is said to hold another's:\n%s", out)
	}
}

// TestStatusSaysThePace: a running run's pace (from its record) is
// printed as run's progress line has it, with its age once the record
// has not changed for a while, and without a time left once none is
// pending; a run with a verdict has none.
func TestStatusSaysThePace(t *testing.T) {
	now := time.Now().UTC()
	pace := &stream.RunPace{PerSecond: 12.5, LeftSeconds: 300}
	going := stream.Counts{Total: 4000, Validated: 246, Running: 4, Pending: 3750}
	st := &coordinator.Status{Time: now, Runs: []coordinator.RunStatus{
		{Name: "fresh", State: stream.RunRunning, Updated: now.Add(-time.Second), Counts: going, Pace: pace},
		{Name: "still", State: stream.RunRunning, Updated: now.Add(-3 * time.Minute), Counts: going, Pace: pace},
		{Name: "done", State: stream.RunComplete, Updated: now, Pace: pace},
		{Name: "tail", State: stream.RunRunning, Updated: now, Counts: stream.Counts{Total: 9, Validated: 7, Running: 2}, Pace: pace},
	}}
	var b strings.Builder
	printStatus(&b, st)
	for _, want := range []string{"\nfresh: shards end at 12/s, about 5m left\n",
		"\nstill: shards end at 12/s, about 5m left (as of 3m ago, when its counts last changed)\n",
		"\ntail: shards end at 12/s; none pending, the rest are running\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("printed:\n%s\nwant %q", b.String(), want)
		}
	}
	if strings.Contains(b.String(), "done: shards end") {
		t.Errorf("a COMPLETE run given a pace:\n%s", b.String())
	}
}

// TestStatusComparesRunningShardsWithTheValidated: before its verdict a
// run's record has what its shards validated so far took; status prints
// it as such, and a running shard that has run longer than 95% of them,
// or than any, says so: a straggler stands out among its running
// shards. Below 20 validated shards no 95th percentile is compared.
func TestStatusComparesRunningShardsWithTheValidated(t *testing.T) {
	now := time.Now().UTC()
	running := func(id string, d time.Duration) stream.ShardRecord {
		return stream.ShardRecord{ID: id, State: stream.ShardRunning, Owner: &stream.Owner{Worker: "w1", Host: "h1", PID: 41, Attempt: 1},
			Attempts: []stream.Attempt{{N: 1, Worker: "w1", Host: "h1", Start: now.Add(-d)}}}
	}
	timing := func(n int) *stream.Timing {
		return &stream.Timing{Shards: n, Seconds: stream.Spread[float64]{Shards: n, P50: 1, P95: 2, Max: 3, MaxShard: "s07"}}
	}
	st := &coordinator.Status{Time: now, Runs: []coordinator.RunStatus{
		{Name: "r", State: stream.RunRunning, Updated: now, Counts: stream.Counts{Total: 50, Validated: 40, Running: 3}, Timing: timing(40),
			Shards: []stream.ShardRecord{running("a", time.Second), running("b", 2500*time.Millisecond), running("c", 10*time.Second)}},
		{Name: "few", State: stream.RunRunning, Updated: now, Counts: stream.Counts{Total: 12, Validated: 10, Running: 1}, Timing: timing(10),
			Shards: []stream.ShardRecord{running("d", 2500*time.Millisecond)}},
		// Shards of milliseconds: one a few past the longest is concluding
		// (its commit counts), not a straggler.
		{Name: "short", State: stream.RunRunning, Updated: now, Counts: stream.Counts{Total: 5000, Validated: 4000, Running: 40},
			Timing: &stream.Timing{Shards: 4000, Seconds: stream.Spread[float64]{Shards: 4000, P50: 0.001, P95: 0.003, Max: 0.02, MaxShard: "s01"}},
			Shards: []stream.ShardRecord{running("e", 30*time.Millisecond), running("f", 1500*time.Millisecond)}},
	}, Workers: []stream.WorkerReport{{Name: "w1", Host: "h1", PID: 41, Reported: now}}}
	var b strings.Builder
	printStatus(&b, st)
	out := b.String()
	lines := rowsByFirstWord(out)
	if !strings.Contains(out, "\nr: shards validated so far, 40 timed: 1.00s p50, 2.00s p95, 3.00s max (s07); peak memory not measured") {
		t.Errorf("status of a running run lacks what its validated shards took so far:\n%s", out)
	}
	for id, want := range map[string]string{
		"a": "for 1.00s",
		"b": "for 2.50s, longer than 95% of the 40 validated took (p95 2.00s)",
		"c": "for 10s, longer than any of the 40 validated took (the longest 3.00s)",
		"d": "for 2.50s",
		"e": "for 0.03s",
		"f": "for 1.50s, longer than any of the 4000 validated took (the longest 0.02s)",
	} {
		if !strings.HasSuffix(lines[id], " "+want) {
			t.Errorf("shard %s: got %q, want it to end %q", id, lines[id], want)
		}
	}
}

// TestStatusBoundsShardLines: a run with thousands of shards not validated
// prints the first ones and how many more there are, not thousands of lines.
func TestStatusBoundsShardLines(t *testing.T) {
	r := coordinator.RunStatus{Name: "r", State: stream.RunBlocked, Counts: stream.Counts{Total: 500, Failed: 500}}
	for i := range 500 {
		r.Shards = append(r.Shards, stream.ShardRecord{ID: fmt.Sprintf("s%04d", i), State: stream.ShardFailed, Reason: "exit status 1"})
	}
	var b strings.Builder
	printStatus(&b, &coordinator.Status{Runs: []coordinator.RunStatus{r}})
	out := b.String()
	if n := strings.Count(out, " failed exit status 1"); n != maxShardLines {
		t.Fatalf("printed %d shard lines, want %d", n, maxShardLines)
	}
	if !strings.Contains(out, fmt.Sprintf("... and %d more shard(s)", 500-maxShardLines)) {
		t.Fatalf("output lacks the count of shards not printed:\n%s", out[len(out)-300:])
	}
}

// TestStatusListsFailedShardsFirst: the shards a run lists are the ones a
// person reads status for. By ID, a run of short shards filled the 50
// lines with running ones, most of them committing, and its failed
// shards, with the reasons, fell among "... and 73 more".
func TestStatusListsFailedShardsFirst(t *testing.T) {
	r := coordinator.RunStatus{Name: "r", State: stream.RunRunning, Counts: stream.Counts{Total: 1000, Running: 120, Pending: 1, Failed: 2}}
	for i := range 120 {
		r.Shards = append(r.Shards, stream.ShardRecord{ID: fmt.Sprintf("s%04d", i), State: stream.ShardRunning,
			Owner: &stream.Owner{Worker: "w1", Host: "h1", PID: 41, Attempt: 1}})
	}
	r.Shards = append(r.Shards,
		stream.ShardRecord{ID: "s0150", State: stream.ShardPending, Reason: "exit status 3; retry in 2s"},
		stream.ShardRecord{ID: "s0200", State: stream.ShardFailed, Reason: "after 3 attempt(s): exit status 1"},
		stream.ShardRecord{ID: "s0201", State: stream.ShardFailed, Reason: "after 3 attempt(s): exit status 2"})
	var b strings.Builder
	printStatus(&b, &coordinator.Status{Runs: []coordinator.RunStatus{r}, Workers: []stream.WorkerReport{{Name: "w1", Host: "h1", PID: 41}}})
	var listed []string
	for _, l := range strings.Split(b.String(), "\n") {
		if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(l, "  s") {
			listed = append(listed, f[0]+" "+f[1])
		}
	}
	if len(listed) != maxShardLines {
		t.Fatalf("%d shard lines, want %d:\n%s", len(listed), maxShardLines, b.String())
	}
	want := []string{"s0200 failed", "s0201 failed", "s0150 pending", "s0000 running", "s0001 running"}
	if !slices.Equal(listed[:len(want)], want) || listed[maxShardLines-1] != "s0046 running" {
		t.Errorf("shard lines begin %q and end %q; want %q first, then the running ones by ID to s0046\n%s", listed[:len(want)], listed[maxShardLines-1], want, b.String())
	}
	if !strings.Contains(b.String(), "  ... and 73 more shard(s) not validated: 73 running (status --json lists every one)") {
		t.Errorf("the line of shards not listed does not say what they are:\n%s", b.String())
	}
}

// TestStatusNamesTheLastAttemptsLog: a shard that is not running is
// listed with its last attempt's log, and the host it is on when that is
// not this one; an attempt that printed nothing has none to name. A
// running shard says how long it has run and the log it writes (not as
// its last), the longest running first.
func TestStatusNamesTheLastAttemptsLog(t *testing.T) {
	here, _ := os.Hostname()
	now := time.Now().UTC()
	r := coordinator.RunStatus{Name: "r", State: stream.RunRunning, Counts: stream.Counts{Total: 5, Failed: 2, Pending: 1, Running: 2}, Shards: []stream.ShardRecord{
		{ID: "a", State: stream.ShardFailed, Reason: "after 2 attempt(s): exit status 1",
			Attempts: []stream.Attempt{{N: 1, Host: here, Log: "/ev/a.1.log"}, {N: 2, Host: "far", Log: "/ev/a.2.log"}}},
		{ID: "b", State: stream.ShardFailed, Reason: "after 1 attempt(s): exit status 1", Attempts: []stream.Attempt{{N: 1, Host: here}}},
		{ID: "c", State: stream.ShardPending, Reason: "exit status 1; retry in 3s", Attempts: []stream.Attempt{{N: 1, Host: here, Log: "/ev/c.1.log"}}},
		{ID: "d", State: stream.ShardRunning, Owner: &stream.Owner{Worker: "w1", Host: here, PID: 1, Attempt: 2},
			Attempts: []stream.Attempt{{N: 1, Host: here, Log: "/ev/d.1.log", Outcome: stream.OutcomeExit},
				{N: 2, Host: here, Log: "/ev/d.2.log", Start: now.Add(-95 * time.Second)}}},
		{ID: "e", State: stream.ShardRunning, Owner: &stream.Owner{Worker: "w2", Host: "far", PID: 2, Attempt: 1},
			Attempts: []stream.Attempt{{N: 1, Host: "far", Log: "/ev/e.1.log", Start: now.Add(-2 * time.Hour)}}},
	}}
	var b strings.Builder
	printStatus(&b, &coordinator.Status{Time: now, Runs: []coordinator.RunStatus{r}})
	for _, want := range []string{
		"  a failed after 2 attempt(s): exit status 1 (log: /ev/a.2.log on far)\n",
		"  b failed after 1 attempt(s): exit status 1\n",
		"  c pending exit status 1; retry in 3s (log: /ev/c.1.log)\n",
		"  e running attempt 1 on w2 (worker pid 2 on far) for 2h0m0s (log as it prints: /ev/e.1.log on far); that worker is not reporting",
		"  d running attempt 2 on w1 (worker pid 1 on " + here + ") for 1m35s (log as it prints: /ev/d.2.log); that worker is not reporting",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("printed:\n%s\nwant the line %q", b.String(), want)
		}
	}
	if strings.Contains(b.String(), "(log: /ev/d.") || strings.Index(b.String(), "  e running") > strings.Index(b.String(), "  d running") {
		t.Errorf("a running attempt's log named as its last, or the shorter running shard listed first:\n%s", b.String())
	}
}

// TestStatusNamesACommandsPid: a running shard's line names its
// command's pid where its worker's report lists the command in the
// attempt the record names; not one from another attempt (the report
// is older than the record), nor where the worker does not report.
func TestStatusNamesACommandsPid(t *testing.T) {
	now := time.Now().UTC()
	owner := func(worker string, attempt int) *stream.Owner {
		return &stream.Owner{Worker: worker, Host: "h1", PID: 41, Attempt: attempt}
	}
	r := coordinator.RunStatus{Name: "r", State: stream.RunRunning, Updated: now, Counts: stream.Counts{Total: 3, Running: 3}, Shards: []stream.ShardRecord{
		{ID: "a", State: stream.ShardRunning, Owner: owner("w1", 1)},
		{ID: "b", State: stream.ShardRunning, Owner: owner("w1", 2)},
		{ID: "c", State: stream.ShardRunning, Owner: owner("w2", 1)},
	}}
	w1 := stream.WorkerReport{Name: "w1", Host: "h1", PID: 41, Reported: now, Commands: []stream.Command{
		{Key: "r.a", Attempt: 1, PID: 5001, Start: now}, {Key: "r.b", Attempt: 1, PID: 5002, Start: now}}}
	var b strings.Builder
	printStatus(&b, &coordinator.Status{Time: now, Runs: []coordinator.RunStatus{r}, Workers: []stream.WorkerReport{w1}})
	lines := rowsByFirstWord(b.String())
	for id, want := range map[string]string{
		"a": "running attempt 1 on w1 (worker pid 41 on h1, command pid 5001)",
		"b": "running attempt 2 on w1 (worker pid 41 on h1)",
		"c": "running attempt 1 on w2 (worker pid 41 on h1); that worker is not reporting",
	} {
		if !strings.HasPrefix(strings.TrimSpace(lines[id]), id+" "+want) {
			t.Errorf("shard %s: got %q, want it to begin %q", id, lines[id], id+" "+want)
		}
	}
}

// TestStatusSaysTheStoreIsFull: a coordinator whose store refuses writes
// is shown with the reason and what to do (a read-only file system is not
// told to free space); one with room shows no such line.
func TestStatusSaysTheStoreIsFull(t *testing.T) {
	for _, tc := range []struct{ full, want string }{
		{"the file system of /data/stores/r has 0B free", "STORE FULL: the file system of /data/stores/r has 0B free; no shard can be leased or recorded: free space there\n"},
		{"the store /s holds 9MiB of its limit of 9MiB (what it held plus three quarters of the space free when the limit was set)",
			"no shard can be leased or recorded: free space on its file system: the coordinator raises the limit by itself, to what the store holds plus three quarters of the free space, once that is 8 MiB more\n"},
		{"the file system of /data/stores/r/jetstream refuses writes: read-only file system",
			"STORE READ-ONLY: the file system of /data/stores/r/jetstream refuses writes: read-only file system; no shard can be leased or recorded: make its file system writable again ("},
		{"", ""},
	} {
		var b strings.Builder
		printStatus(&b, &coordinator.Status{Coordinator: &stream.CoordinatorInfo{Host: "h", Sync: "group", StoreFull: tc.full}})
		out := b.String()
		if tc.want != "" && !strings.Contains(out, tc.want) || tc.want == "" && strings.Contains(out, "STORE FULL") {
			t.Errorf("store_full %q: got\n%s\nwant a line %q", tc.full, out, tc.want)
		}
	}
}

// TestStatusNamesAWorkerOfAnotherBuild: the coordinator's build is on its
// line, and a worker that runs another build (left from before an
// upgrade) is named with both and how to move it; a worker of the same
// build, or one whose report names none (older), is not.
func TestStatusNamesAWorkerOfAnotherBuild(t *testing.T) {
	now := time.Now().UTC()
	var b strings.Builder
	printStatus(&b, &coordinator.Status{Coordinator: &stream.CoordinatorInfo{Host: "h", Sync: "group", Version: "v1.2.0"},
		Workers: []stream.WorkerReport{
			{Name: "same", Host: "h1", PID: 41, Reported: now, Version: "v1.2.0"},
			{Name: "old", Host: "h2", PID: 42, Reported: now, Version: "v1.1.0"},
			{Name: "older", Host: "h3", PID: 43, Reported: now},
		}})
	out := b.String()
	for _, want := range []string{
		"coordinator on h, sync group, shardpool v1.2.0\n",
		"old: runs shardpool v1.1.0, not the coordinator's v1.2.0: left from before an upgrade, or another installation? To move it to the coordinator's build, drain it (kill -USR1 42 on h2)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("printed:\n%s\nwant %q", out, want)
		}
	}
	for _, not := range []string{"same: runs", "older: runs", "different builds"} {
		if strings.Contains(out, not) {
			t.Errorf("printed:\n%s\nwant no line %q", out, not)
		}
	}

	// A cluster mid-upgrade: its coordinators' builds are named, and a
	// worker of the build of one that did not answer first is not.
	b.Reset()
	printStatus(&b, &coordinator.Status{Coordinator: &stream.CoordinatorInfo{Name: "c1", Cluster: "k", Coordinators: 3, Host: "h", Sync: "always", Leader: "c1",
		Version: "v1.2.0", Versions: map[string]string{"c1": "v1.2.0", "c2": "v1.1.0", "c3": ""}},
		Workers: []stream.WorkerReport{
			{Name: "mid", Host: "h1", PID: 41, Reported: now, Version: "v1.1.0"},
			{Name: "stray", Host: "h2", PID: 42, Reported: now, Version: "v0.9.0"},
		}})
	out = b.String()
	for _, want := range []string{
		"the coordinators of cluster k run different builds of shardpool: c1 v1.2.0, c2 v1.1.0, c3 a build too old to say (mid-upgrade: restart the rest on the new build, one at a time)\n",
		"stray: runs shardpool v0.9.0, not the coordinator's v1.2.0",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("printed:\n%s\nwant %q", out, want)
		}
	}
	if strings.Contains(out, "mid: runs") {
		t.Errorf("printed:\n%s\nwant no line for worker mid, of coordinator c2's build", out)
	}
}

// TestStatusDataWithAHolderThatGaveNoURL: a store held by a coordinator
// that has not written its URL (starting, or an older shardpool) is named
// with both possibilities, not taken for a stopped run.
func TestStatusDataWithAHolderThatGaveNoURL(t *testing.T) {
	dir := t.TempDir()
	testenv.LockStore(t, dir, "r", unix.LOCK_EX, "pid 1 on h since 2026-11-01T00:00:00Z\n")
	_, _, ok, err := serverFromData(dir, "r")
	if ok || err == nil || !strings.Contains(err.Error(), "has not written where it listens") || !strings.Contains(err.Error(), "pid 1 on h") {
		t.Fatalf("held store without a URL: got ok %v, %v; want an error naming the holder", ok, err)
	}
}

// TestEvidenceTellsTheDrillFromARun: DIR/runs/drill holding only the
// drill's report is listed as the last drill, with the checks it did not
// pass, and not as a run; a run named drill beside the report is still a
// run.
func TestEvidenceTellsTheDrillFromARun(t *testing.T) {
	dir := t.TempDir()
	ev := filepath.Join(dir, "runs", drill.RunName)
	if err := os.MkdirAll(ev, 0o755); err != nil {
		t.Fatal(err)
	}
	rep := drill.Report{V: 1, Started: time.Now().UTC(), Seconds: 21.5, Checks: []drill.Check{
		{Name: "worker SIGKILL mid-shard", Status: drill.Pass},
		{Name: "coordinator SIGKILL and restart", Status: drill.Fail, Detail: "BLOCKED"},
		{Name: "recovery after a power cut", Status: drill.Unverified, Detail: "no loop devices"},
	}}
	b, _ := json.Marshal(rep)
	if err := os.WriteFile(filepath.Join(ev, "drill.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := fromEvidence(dir, "")
	if err != nil || len(st.Runs)+len(st.NoVerdict) != 0 || st.Drill == nil || st.Drill.Passed || st.Drill.Checks != 3 ||
		strings.Join(st.Drill.NotPassed, "|") != "coordinator SIGKILL and restart: FAIL|recovery after a power cut: UNVERIFIED" {
		t.Fatalf("a state directory with only a failed drill's report: %+v, %v; want no run and the drill with its two checks not passed", st, err)
	}
	var out strings.Builder
	printStopped(&out, dir, st)
	if !strings.Contains(out.String(), "holds no run's evidence") || !strings.Contains(out.String(), "last recovery drill: FAILED, 2 of 3 checks not passed") {
		t.Fatalf("printed:\n%s", out.String())
	}

	// A drill that passed with a check this host could not make says so,
	// not that every check passed.
	unverified := &coordinator.DrillSummary{Started: rep.Started, Seconds: 20, Passed: true, Checks: 11,
		NotPassed: []string{"recovery after a power cut: UNVERIFIED"}, Report: "r"}
	if got := drillLine(unverified); !strings.Contains(got, "passed, 1 of 11 checks not made here (recovery after a power cut: UNVERIFIED)") {
		t.Fatalf("a drill passed with an unverified check: %s", got)
	}

	// A run named drill keeps its evidence there too.
	if err := os.WriteFile(filepath.Join(ev, "resume.txt"), []byte("shardpool run drill.toml\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	st, err = fromEvidence(dir, "")
	if err != nil || len(st.NoVerdict) != 1 || st.NoVerdict[0].Name != drill.RunName || st.Drill == nil {
		t.Fatalf("a run named drill beside the drill's report: %+v, %v; want the run listed and the drill too", st, err)
	}

	// A folder that only plan, profile, stage or a worker of another
	// coordinator wrote to is no run that stopped without a verdict.
	planned := filepath.Join(dir, "runs", "planned")
	if err := os.MkdirAll(filepath.Join(planned, "preflight"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(planned, "plan.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := fromEvidence(dir, "planned"); err == nil || !strings.Contains(err.Error(), "no run planned was tracked there: "+planned+" holds only plan.json, preflight") {
		t.Fatalf("status of a run only planned: %v; want an error naming what its folder holds", err)
	}
	st, err = fromEvidence(dir, "")
	if err != nil || len(st.NotRuns) != 1 || st.NotRuns[0].Name != "planned" || strings.Join(st.NotRuns[0].Files, ",") != "plan.json,preflight" {
		t.Fatalf("a folder holding plan.json and preflight only: %+v, %v; want it among not_runs", st, err)
	}
	for _, n := range st.NoVerdict {
		if n.Name == "planned" {
			t.Fatalf("a folder of no run listed as a run without a verdict: %+v", n)
		}
	}
	out.Reset()
	printStopped(&out, dir, st)
	if !strings.Contains(out.String(), "evidence of no run here (from shardpool plan, profile or stage, or a worker whose coordinator keeps its state elsewhere): planned (plan.json, preflight)") {
		t.Fatalf("printed:\n%s", out.String())
	}

	// A report that does not decode is said to be unreadable, not passed.
	if err := os.WriteFile(filepath.Join(ev, "drill.json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if st, err = fromEvidence(dir, ""); err != nil || st.Drill == nil || st.Drill.Unreadable == "" || st.Drill.Passed {
		t.Fatalf("an unreadable drill report: %+v, %v", st.Drill, err)
	}
}

// TestBlockedRunNamesItsCommandOnce: a BLOCKED run whose reason already
// ends with the command that retries it does not print that command
// again as "resume with"; one whose reason does not name it does.
func TestBlockedRunNamesItsCommandOnce(t *testing.T) {
	cmd := "shardpool run --data /d --retry-failed /j/job.toml"
	named := coordinator.RunStatus{Name: "r", State: stream.RunBlocked, Reason: "1 shard(s) failed: s1 (exit status 3); retry them with: " + cmd, Resume: cmd}
	other := coordinator.RunStatus{Name: "q", State: stream.RunBlocked, Reason: "the coordinator's store is full", Resume: cmd}
	for _, print := range []func(*strings.Builder, *coordinator.Status){
		func(b *strings.Builder, st *coordinator.Status) { printStatus(b, st) },
		func(b *strings.Builder, st *coordinator.Status) { printStopped(b, "/d", st) },
	} {
		var out strings.Builder
		print(&out, &coordinator.Status{Runs: []coordinator.RunStatus{named, other}})
		if n := strings.Count(out.String(), cmd); n != 2 || !strings.Contains(out.String(), "q: resume with: "+cmd) || strings.Contains(out.String(), "r: resume with:") {
			t.Fatalf("the command appears %d times, want once for each run (r in its reason, q as resume with):\n%s", n, out.String())
		}
	}
}

// TestEvidenceListsTheShardsNotValidated: `status --data DIR RUN` of a
// run no coordinator serves lists the shards its verdict did not
// validate, with their reasons and newest attempt logs (the latest retry
// round's highest attempt), as status RUN
// does of a live run; it once showed the reason's first three alone.
// Written after final.json with the same verdict (as a run's coordinator
// does when it stops), progress.json does not hide them; without RUN no
// shard is listed.
func TestEvidenceListsTheShardsNotValidated(t *testing.T) {
	dir := t.TempDir()
	ev := filepath.Join(dir, "runs", "r")
	if err := os.MkdirAll(filepath.Join(ev, "attempts"), 0o755); err != nil {
		t.Fatal(err)
	}
	sum := coordinator.RunSummary{Run: "r", Fingerprint: "f1", State: stream.RunBlocked, Reason: "2 shard(s) failed: ...",
		Counts: stream.Counts{Total: 3, Validated: 1, Failed: 2}, Written: time.Now().UTC()}
	final := coordinator.Final{RunSummary: sum, Shards: []coordinator.FinalShard{
		{ID: "z9", State: stream.ShardFailed, Attempts: 1, Reason: "after 1 attempt(s): killed by the OOM killer"},
		{ID: "a1", State: stream.ShardValidated, Attempts: 1},
		{ID: "b2", State: stream.ShardFailed, Attempts: 10, Reason: "after 10 attempt(s): exit status 3"},
	}}
	write := func(name string, v any) {
		t.Helper()
		b, _ := json.Marshal(v)
		if err := os.WriteFile(filepath.Join(ev, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(coordinator.FinalName, final)
	for _, log := range []string{"b2.2.log", "b2.10.log", "b2.9.log", "b22.11.log", "b2.r1.2.log", "b2.r1.10.log", "b2.r1.1.validator.log",
		"z9.1.log", "z9.r2.1.log", "z9.r10.3.log", "z9.r10.1.log"} {
		if err := os.WriteFile(filepath.Join(ev, "attempts", log), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	sum.Written = sum.Written.Add(time.Second)
	write(coordinator.ProgressName, sum)
	st, err := fromEvidence(dir, "r")
	if err != nil || len(st.Runs) != 1 {
		t.Fatalf("fromEvidence: %+v, %v", st, err)
	}
	got := st.Runs[0].Shards
	if len(got) != 2 || got[0].ID != "b2" || got[1].ID != "z9" || got[1].State != stream.ShardFailed || !strings.Contains(got[1].Reason, "OOM") {
		t.Fatalf("shards listed: %+v; want b2 and z9, failed, with their reasons", got)
	}
	// The evidence has no submission time; --json leaves it out rather
	// than print year 1.
	if b, _ := json.Marshal(st); strings.Contains(string(b), `"submitted"`) {
		t.Errorf("--json from the evidence: %s\nwant no submitted time", b)
	}
	var out strings.Builder
	printStopped(&out, dir, st)
	want := []string{
		"  b2 failed after 10 attempt(s): exit status 3 (log: " + filepath.Join(ev, "attempts", "b2.r1.10.log") + ")\n",
		"  z9 failed after 1 attempt(s): killed by the OOM killer (log: " + filepath.Join(ev, "attempts", "z9.r10.3.log") + ")\n",
	}
	for _, w := range want {
		if !strings.Contains(out.String(), w) {
			t.Errorf("printed:\n%s\nwant the line %q", out.String(), w)
		}
	}
	if strings.Contains(out.String(), "a1") {
		t.Errorf("printed a validated shard:\n%s", out.String())
	}
	if st, err := fromEvidence(dir, ""); err != nil || len(st.Runs) != 1 || len(st.Runs[0].Shards) != 0 {
		t.Fatalf("without RUN: %+v, %v; want the run without its shards", st, err)
	}
	// A later verdict in progress.json than final.json holds: final.json's
	// shards are of another round and are not listed.
	sum.Counts.Validated, sum.Counts.Failed = 2, 1
	write(coordinator.ProgressName, sum)
	if st, err := fromEvidence(dir, "r"); err != nil || len(st.Runs) != 1 || len(st.Runs[0].Shards) != 0 {
		t.Fatalf("progress.json's verdict differs from final.json's: %+v, %v; want no shards listed", st, err)
	}
}

// TestStatusNamesAWorkerWhoseClockIsOff: a worker report written an hour
// ahead of the coordinator's clock (and one ahead by a moment, as any
// write is) is read through a real coordinator's store: status gives the
// first its clock_ahead and a line saying to fix that host's time
// service, and the second neither.
func TestStatusNamesAWorkerWhoseClockIsOff(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx, b := context.Background(), env.Buckets()
	for name, ahead := range map[string]time.Duration{"skewed": time.Hour, "fine": 300 * time.Millisecond} {
		data, err := stream.Encode(&stream.WorkerReport{Name: name, Host: "h-" + name, Reported: time.Now().Add(ahead)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Workers.Put(ctx, name, data); err != nil {
			t.Fatal(err)
		}
	}
	st, err := coordinator.ReadStatus(ctx, env.JS, "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]time.Duration{}
	for _, wk := range st.Workers {
		got[wk.Name] = time.Duration(wk.ClockAhead)
	}
	if d := got["skewed"]; (d-time.Hour).Abs() > time.Second || got["fine"] != 0 {
		t.Errorf("clock_ahead: %v; want about 1h for skewed, 0 for fine", got)
	}
	var out strings.Builder
	printStatus(&out, st)
	if want := "skewed: its clock is 1h0m0s ahead of the coordinator's"; !strings.Contains(out.String(), want) || !strings.Contains(out.String(), "fix the time service on h-skewed") || strings.Contains(out.String(), "fine: its clock") {
		t.Errorf("printed:\n%s\nwant %q for skewed only", out.String(), want)
	}
}

// TestStatusNamesAttemptsWaitingOnAFileSystem: a worker whose report
// lists attempts waiting long on a file system (a hung mount: the
// worker's TestHungOutputMountIsReported) gets a line that names them,
// its host, and how many the report did not list; a worker without any
// gets none.
func TestStatusNamesAttemptsWaitingOnAFileSystem(t *testing.T) {
	now := time.Now().UTC()
	slow := []string{"r.a in its commit to /data/out for 7m12s", "r.b in the look at its output directory /data/out before its command for 3m1s"}
	st := &coordinator.Status{V: coordinator.StatusVersion, Time: now,
		Workers: []stream.WorkerReport{
			{Name: "w1", Host: "h1", PID: 41, Reported: now, SlowFS: slow, SlowFSCount: 12},
			{Name: "w2", Host: "h2", PID: 42, Reported: now},
		},
	}
	var b strings.Builder
	printStatus(&b, st)
	out := b.String()
	for _, want := range []string{"w1: 12 attempt(s) have waited long on a file system", "`stat DIR` on host h1 tells",
		"stays RUNNING meanwhile, its lease renewed): " + slow[0] + "; " + slow[1] + ", and 10 more\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "waited long"); n != 1 {
		t.Errorf("w2, waiting on nothing, is said to wait:\n%s", out)
	}
}

// TestStatusSaysWhatAWorkerCommits: with short shards a run counts more
// running than its worker has slots (60 to 130 beside 4, /bin/true on 2
// cores): those whose command has ended, committed, recorded and acked
// aside. The worker's RUNNING column counted the commands alone, and
// nothing said where the rest were.
func TestStatusSaysWhatAWorkerCommits(t *testing.T) {
	now := time.Now().UTC()
	st := &coordinator.Status{V: coordinator.StatusVersion, Time: now,
		Runs: []coordinator.RunStatus{{Name: "r", State: stream.RunRunning, Counts: stream.Counts{Total: 100, Running: 67, Pending: 33}}},
		Workers: []stream.WorkerReport{
			{Name: "w1", Host: "h1", PID: 41, Reported: now, Slots: map[string]int{"cpu": 4}, Running: map[string]int{"cpu": 4}, Concluding: 63},
			{Name: "w2", Host: "h2", PID: 42, Reported: now, Slots: map[string]int{"cpu": 4}, Running: map[string]int{"cpu": 2}},
		}}
	var b strings.Builder
	printStatus(&b, st)
	lines := rowsByFirstWord(b.String())
	if f := strings.Fields(lines["w1"]); len(f) < 6 || f[3] != "cpu=4" || f[4] != "+63" || f[5] != "committing" {
		t.Errorf("worker committing 63 shards beside its 4 commands: got %q, want RUNNING \"cpu=4 +63 committing\"\n%s", lines["w1"], b.String())
	}
	if f := strings.Fields(lines["w2"]); len(f) < 5 || f[3] != "cpu=2" || f[4] != "0" || strings.Contains(lines["w2"], "committing") {
		t.Errorf("worker committing nothing: got %q, want RUNNING \"cpu=2\" alone\n%s", lines["w2"], b.String())
	}
}

// rowsByFirstWord maps the first word of each line of text that has more
// than one to the line (the last such line, where words repeat): the rows
// of a printed table by their first column.
func rowsByFirstWord(text string) map[string]string {
	rows := map[string]string{}
	for _, l := range strings.Split(text, "\n") {
		if f := strings.Fields(l); len(f) > 1 {
			rows[f[0]] = l
		}
	}
	return rows
}
