package coordinator

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// TestFinalIsWrittenAsOnePieceWouldBe: final.json, written a shard at a
// time, is byte for byte what encoding the whole of it writes, with no
// shard, one, or several whose reasons need escaping; and ReadFinal reads
// it back.
func TestFinalIsWrittenAsOnePieceWouldBe(t *testing.T) {
	sum := RunSummary{Run: "r", Fingerprint: "fp", State: stream.RunBlocked, Reason: "1 shard(s) failed: <s2> & more",
		Counts: stream.Counts{Total: 3, Validated: 2, Failed: 1}, Resume: "shardpool run --retry-failed r.toml",
		Output: "/o", Written: time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC), Shardpool: "v1"}
	three := []FinalShard{
		{ID: "s1", State: stream.ShardValidated, Checksum: "2b37a3d2213e3fea", Files: 2, Bytes: 10, Attempts: 1, Seconds: 0.5, PeakMemory: 1 << 20},
		{ID: "s2", State: stream.ShardFailed, Attempts: 3, Reason: "exit status 3; last output: \"a\\tb <c>\" \u2028"},
		{ID: "s3", State: stream.ShardValidated, Checksum: "0000000000000001", Attempts: 2, Seconds: 2.25},
	}
	for _, c := range []struct {
		name   string
		shards []FinalShard
	}{{"none", nil}, {"empty", []FinalShard{}}, {"one", three[:1]}, {"three", three}} {
		dir := t.TempDir()
		f := Final{RunSummary: sum, Timing: timingOf(c.shards), Shards: c.shards}
		if err := writeFinal(dir, &f); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := os.ReadFile(filepath.Join(dir, FinalName))
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.MarshalIndent(f, "", "  ")
		if want = append(want, '\n'); string(got) != string(want) {
			t.Errorf("%s: final.json is\n%s\nwant\n%s", c.name, got, want)
		}
		back, err := ReadFinal(dir)
		if err != nil || back.Run != "r" || len(back.Shards) != len(c.shards) || !reflect.DeepEqual(back.Timing, f.Timing) {
			t.Errorf("%s: ReadFinal: %+v, %v", c.name, back, err)
		}
	}
}

// TestTimingSummarizesTheTimedShards: final.json's timing is the median,
// 95th percentile (nearest rank) and maximum of the validated shards'
// times and peaks, naming the shard of each maximum; shards without a
// timed attempt (an output found committed) are left out, peaks not
// measured too, and a run with no timed shard has no timing.
func TestTimingSummarizesTheTimedShards(t *testing.T) {
	var shards []FinalShard
	for i := 1; i <= 20; i++ {
		shards = append(shards, FinalShard{ID: fmt.Sprintf("s%02d", i), State: stream.ShardValidated, Seconds: float64(21 - i), PeakMemory: int64(i) << 20})
	}
	shards = append(shards,
		FinalShard{ID: "skipped", State: stream.ShardValidated},                  // found committed: no attempt timed
		FinalShard{ID: "unmeasured", State: stream.ShardValidated, Seconds: 0.5}, // timed, no peak
		FinalShard{ID: "failed", State: stream.ShardFailed, Attempts: 3})
	got := timingOf(shards)
	want := &stream.Timing{Shards: 21,
		Seconds:    stream.Spread[float64]{Shards: 21, P50: 10, P95: 19, Max: 20, MaxShard: "s01"},
		PeakMemory: &stream.Spread[int64]{Shards: 20, P50: 10 << 20, P95: 19 << 20, Max: 20 << 20, MaxShard: "s20"}}
	if got == nil || got.Shards != want.Shards || got.Seconds != want.Seconds || got.PeakMemory == nil || *got.PeakMemory != *want.PeakMemory {
		t.Errorf("timing of 20 timed shards and 3 others: %+v (peaks %+v), want %+v (peaks %+v)", got, got.PeakMemory, want, want.PeakMemory)
	}
	// The run record's timing, made from the tracker's shards (a map, in
	// no order) rather than final.json's list, is the same; with a tie
	// for the maximum, the lowest ID names it either way, and a shard of
	// another generation counts in neither.
	ri := &runInfo{rec: stream.RunRecord{Fingerprint: "fp"}, shards: map[string]*shardInfo{"old": {fp: "older", took: time.Hour}}}
	for _, s := range append(shards, FinalShard{ID: "s00", Seconds: 20, PeakMemory: 20 << 20}) {
		ri.shards[s.ID] = &shardInfo{fp: "fp", state: s.State, took: time.Duration(s.Seconds * float64(time.Second)), peak: s.PeakMemory}
	}
	if got, want := ri.timing(), timingOf(ri.finalShards()); !reflect.DeepEqual(got, want) || got.Seconds.MaxShard != "s00" || got.PeakMemory.MaxShard != "s00" {
		t.Errorf("the run record's timing: %+v (peaks %+v), want final.json's %+v (peaks %+v), s00 named for both ties", got, got.PeakMemory, want, want.PeakMemory)
	}
	if got := timingOf(shards[20:]); got == nil || got.Shards != 1 || got.Seconds.Max != 0.5 || got.PeakMemory != nil {
		t.Errorf("timing of one timed shard with no peak: %+v, want one shard of 0.5 s and no peak memory", got)
	}
	if got := timingOf(shards[20:21]); got != nil {
		t.Errorf("timing of no timed shard: %+v, want none", got)
	}
}
