package main

import (
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// TestProgressSaysThePaceAndTimeLeft: the progress line gains the rate
// at which shards end and the time the rest need at it once a few
// seconds have seen shards end; the rate follows the last minute, not
// the whole run; slow shards are counted per minute or hour; with none
// pending, the rate alone; nothing is said before there is a pace or once
// no shard is left.
func TestProgressSaysThePaceAndTimeLeft(t *testing.T) {
	t0 := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	counts := func(ended, left int) stream.Counts {
		return stream.Counts{Total: ended + left, Validated: ended, Pending: left}
	}
	p := &progress{}
	if got := p.pace(counts(0, 1000), t0); got != "" {
		t.Fatalf("at the start: %q, want nothing", got)
	}
	if got := p.pace(counts(20, 980), t0.Add(2*time.Second)); got != "" {
		t.Fatalf("after 2 s: %q, want nothing yet", got)
	}
	if got := p.pace(counts(100, 900), t0.Add(10*time.Second)); got != ", 10/s, about 1m30s left" {
		t.Fatalf("100 in 10 s with 900 left: %q", got)
	}
	// Slower for the next two minutes: the rate is the last minute's.
	var got string
	for s := 11; s <= 130; s++ {
		got = p.pace(counts(100+(s-10), 900-(s-10)), t0.Add(time.Duration(s)*time.Second))
	}
	if got != ", 1.0/s, about 13m left" {
		t.Fatalf("1 a second for two minutes, 780 left: %q", got)
	}
	// None pending, 2 running: the rate, and no time left, which the
	// rate cannot tell (the tail of a run waits on its slowest).
	if got := p.pace(stream.Counts{Total: 1000, Validated: 221, Running: 2}, t0.Add(131*time.Second)); got != ", 1.0/s" {
		t.Fatalf("none pending, 2 running: %q, want the rate alone", got)
	}
	if got := p.pace(counts(1000, 0), t0.Add(200*time.Second)); got != "" {
		t.Fatalf("none left: %q, want nothing", got)
	}
	slow := &progress{}
	slow.pace(counts(0, 50), t0)
	if got := slow.pace(counts(2, 48), t0.Add(time.Minute)); got != ", 2.0/min, about 24m left" {
		t.Fatalf("2 a minute: %q", got)
	}
	slower := &progress{}
	slower.pace(counts(0, 500), t0)
	if got := slower.pace(counts(1, 499), t0.Add(time.Hour)); !strings.HasPrefix(got, ", 1.0/h, about 499h00m left") {
		t.Fatalf("1 an hour: %q", got)
	}
}

// TestTimeLeftReadsAtAGlance: the time left is rounded to what a person
// reads, without a unit of zeros ("2m", not "2m0s"), and a rounding that
// reaches the next unit is written in it.
func TestTimeLeftReadsAtAGlance(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{45 * time.Second, "45s"},
		{59600 * time.Millisecond, "1m"},
		{75 * time.Second, "1m20s"},
		{2 * time.Minute, "2m"},
		{9*time.Minute + 58*time.Second, "10m"},
		{13*time.Minute + 20*time.Second, "13m"},
		{59*time.Minute + 40*time.Second, "1h00m"},
		{2*time.Hour + 5*time.Minute, "2h05m"},
	} {
		if got := roughly(c.d); got != c.want {
			t.Errorf("roughly(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}

// TestProgressSaysWhatIsCommitting: the running count of a worker that
// commits aside can exceed its slots; the line says how many of them the
// local worker is committing, never more than the count it qualifies.
func TestProgressSaysWhatIsCommitting(t *testing.T) {
	r := &stream.RunRecord{State: stream.RunRunning, Counts: stream.Counts{Total: 10, Validated: 2, Running: 4, Pending: 4}}
	now := 0
	p := &progress{committing: func() int { return now }}
	for _, c := range []struct {
		committing int
		want       string
	}{
		{3, "RUNNING 2/10 validated, 4 running (3 committing), 0 failed, 4 pending"},
		{7, "RUNNING 2/10 validated, 4 running (4 committing), 0 failed, 4 pending"}, // read after the record
		{0, "RUNNING 2/10 validated, 4 running, 0 failed, 4 pending"},
	} {
		now = c.committing
		if got := p.counts(r); got != c.want {
			t.Errorf("%d committing: %q, want %q", c.committing, got, c.want)
		}
	}
	if got := (&progress{}).counts(r); got != "RUNNING 2/10 validated, 4 running, 0 failed, 4 pending" {
		t.Errorf("no local worker: %q", got)
	}
}

// TestProgressNamesTheTail: once no shard is pending, the line names the
// few whose command still runs, the run's tail; not before, and not a
// long list.
func TestProgressNamesTheTail(t *testing.T) {
	var ids []string
	p := &progress{committing: func() int { return 1 }, commands: func() []string { return ids }}
	for _, c := range []struct {
		counts stream.Counts
		ids    []string
		want   string
	}{
		{stream.Counts{Total: 10, Validated: 8, Running: 2}, []string{"s7"}, "RUNNING 8/10 validated, 2 running (1 committing): s7, 0 failed, 0 pending"},
		{stream.Counts{Total: 10, Validated: 7, Running: 3}, []string{"s7", "s2", "s9"}, "RUNNING 7/10 validated, 3 running (1 committing): s7, s2, s9, 0 failed, 0 pending"},
		{stream.Counts{Total: 10, Validated: 6, Running: 3, Pending: 1}, []string{"s7"}, "RUNNING 6/10 validated, 3 running (1 committing), 0 failed, 1 pending"},
		{stream.Counts{Total: 10, Validated: 6, Running: 4}, []string{"s7", "s2", "s9", "s1"}, "RUNNING 6/10 validated, 4 running (1 committing), 0 failed, 0 pending"},
		{stream.Counts{Total: 10, Validated: 9, Running: 1}, nil, "RUNNING 9/10 validated, 1 running (1 committing), 0 failed, 0 pending"},
	} {
		ids = c.ids
		if got := p.counts(&stream.RunRecord{State: stream.RunRunning, Counts: c.counts}); got != c.want {
			t.Errorf("%+v with %q running:\n got %q\nwant %q", c.counts, c.ids, got, c.want)
		}
	}
}

// TestTimingLineReadsAtAGlance: run's shards: line gives short shards in
// milliseconds (not 0.00s), long ones as durations, and says where peak
// memory was measured for some shards only, or for none.
func TestTimingLineReadsAtAGlance(t *testing.T) {
	tm := &stream.Timing{Shards: 3, Seconds: stream.Spread[float64]{Shards: 3, P50: 0.0012, P95: 0.5, Max: 75.26, MaxShard: "s2"},
		PeakMemory: &stream.Spread[int64]{Shards: 3, P50: 1 << 20, P95: 2 << 20, Max: 3 << 20, MaxShard: "s1"}}
	if got, want := timingText(tm), "3 timed: 1.2ms p50, 0.50s p95, 1m15.3s max (s2); peak memory 1.0MiB p50, 2.0MiB p95, 3.0MiB max (s1)"; got != want {
		t.Errorf("timingText:\n got %q\nwant %q", got, want)
	}
	tm.PeakMemory.Shards = 0 // final.json of a build before the count: all of them
	if got, want := timingText(tm), "3 timed: 1.2ms p50, 0.50s p95, 1m15.3s max (s2); peak memory 1.0MiB p50, 2.0MiB p95, 3.0MiB max (s1)"; got != want {
		t.Errorf("timingText of a final.json without the count:\n got %q\nwant %q", got, want)
	}
	tm.PeakMemory.Shards = 2
	if got, want := timingText(tm), "3 timed: 1.2ms p50, 0.50s p95, 1m15.3s max (s2); peak memory 1.0MiB p50, 2.0MiB p95, 3.0MiB max (s1) of the 2 measured (the others too short to sample, and below the worker's own size)"; got != want {
		t.Errorf("timingText with peaks of some shards:\n got %q\nwant %q", got, want)
	}
	tm.PeakMemory = nil
	if got, want := timingText(tm), "3 timed: 1.2ms p50, 0.50s p95, 1m15.3s max (s2); peak memory not measured (each command too short to sample, and below the worker's own size: docs/cli.md)"; got != want {
		t.Errorf("timingText without peaks:\n got %q\nwant %q", got, want)
	}
	if got := timingText(nil); got != "" {
		t.Errorf("timingText of no timing: %q, want nothing", got)
	}
}
