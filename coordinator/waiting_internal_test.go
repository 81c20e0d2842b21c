package coordinator

import (
	"strings"
	"testing"

	"github.com/shardpool/shardpool/stream"
)

// TestWaitingForAClassNoWorkerServes: shards of a class no live worker
// serves wait with the way to serve it, which depends on whether live
// workers were given --slots for other classes. A worker gone does not
// count.
func TestWaitingForAClassNoWorkerServes(t *testing.T) {
	r := RunStatus{ClassCounts: map[string]stream.Counts{"big": {Total: 1, Pending: 1}}}
	cpuOnly := stream.WorkerReport{Name: "w1", Slots: map[string]int{"cpu": 2}}
	gone := stream.WorkerReport{Name: "w0", Slots: map[string]int{"cpu": 2}, Gone: "pid 7 is not running"}
	for _, c := range []struct {
		workers []stream.WorkerReport
		want    string
	}{
		{nil, "class big: 1 shard(s) wait: no live worker serves class big (start one: shardpool worker --slots auto (or N) serves every class, --slots big=N this one)"},
		{[]stream.WorkerReport{gone}, "no live worker serves class big (start one:"},
		{[]stream.WorkerReport{cpuOnly, gone}, "no live worker serves class big (the workers were given --slots for other classes; start one with --slots auto (or N), or with big=N among its classes)"},
	} {
		got := waiting(r, c.workers, nil)
		if len(got) != 1 || !strings.Contains(got[0], c.want) {
			t.Errorf("workers %v: %q, want %q", c.workers, got, c.want)
		}
	}
	// An outlier class: a worker given its class's slots serves it too.
	r = RunStatus{ClassCounts: map[string]stream.Counts{"big-outlier": {Total: 1, Pending: 1}}}
	want := "no live worker serves class big-outlier (the workers were given --slots for other classes; start one with --slots auto (or N), or with big-outlier=N among its classes, or big=N, which serves its outliers too)"
	if got := waiting(r, []stream.WorkerReport{cpuOnly}, nil); len(got) != 1 || !strings.Contains(got[0], want) {
		t.Errorf("outlier class: %q, want %q", got, want)
	}
}

// TestWaitingOnAutoWorkersNamesTheirLogs: shards that live auto workers
// hold back without a reason in their reports wait with where each of
// them logs its decisions ("see their admission.log" alone left a user
// to find the workers' hosts and state directories).
func TestWaitingOnAutoWorkersNamesTheirLogs(t *testing.T) {
	r := RunStatus{ClassCounts: map[string]stream.Counts{"cpu": {Total: 3, Pending: 3}}}
	wa := stream.WorkerReport{Name: "wa", Host: "h1", Auto: true, AdmissionLog: "/s/admission.log"}
	wb := stream.WorkerReport{Name: "wb", Host: "h2", Auto: true, AdmissionLog: "/t/admission.log"}
	gone := stream.WorkerReport{Name: "w0", Host: "h3", Auto: true, AdmissionLog: "/u/admission.log", Gone: "pid 7 is not running"}
	old := stream.WorkerReport{Name: "wo", Host: "h4", Auto: true}
	got := waiting(r, []stream.WorkerReport{wa, wb, gone, old}, nil)
	want := "class cpu: 3 shard(s) wait: workers admit by measured headroom; see their admission.log (wa on h1: /s/admission.log; wb on h2: /t/admission.log)"
	if len(got) != 1 || got[0] != want {
		t.Errorf("%q, want %q", got, want)
	}
	if got := waiting(r, []stream.WorkerReport{old}, nil); len(got) != 1 || !strings.HasSuffix(got[0], "see their admission.log") {
		t.Errorf("a report of an older worker, with no log named: %q, want the reason without a list", got)
	}
}

// TestWaitingSaysTheClassOnce: an auto worker's reason begins with its
// class ("class cpu: all 1 slot(s) in use ..."), which the line names
// already: "class cpu: 3 shard(s) wait: wb: class cpu: all 1 slot(s)".
func TestWaitingSaysTheClassOnce(t *testing.T) {
	r := RunStatus{ClassCounts: map[string]stream.Counts{"cpu": {Total: 3, Pending: 3}}}
	wa := stream.WorkerReport{Name: "wa", Slots: map[string]int{"cpu": 2}, Waiting: map[string]string{"cpu": "2 of 2 slots of class cpu in use; slots from configuration"}}
	wb := stream.WorkerReport{Name: "wb", Auto: true, Waiting: map[string]string{"cpu": "class cpu: all 1 slot(s) in use (one shard at a time: no measured or declared memory peak)"}}
	got := waiting(r, []stream.WorkerReport{wa, wb}, nil)
	want := "class cpu: 3 shard(s) wait: wa: 2 of 2 slots of class cpu in use; slots from configuration; wb: all 1 slot(s) in use (one shard at a time: no measured or declared memory peak)"
	if len(got) != 1 || got[0] != want {
		t.Errorf("%q, want %q", got, want)
	}
}
