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
}
