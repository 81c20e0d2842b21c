package main

import (
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
)

// TestSizeAllocation: a node asks for slots times the most demanding
// class per resource, a measured memory peak before a declared one, plus
// the worker's overhead; a class with no memory peak is named.
func TestSizeAllocation(t *testing.T) {
	spec := &stream.Spec{SpecPath: "/jobs/s.toml", Classes: map[string]stream.Class{
		"cpu": {CPUs: 2, Memory: 1 << 30},
		"gpu": {CPUs: 4, Memory: 2 << 30, GPUs: 1},
		"odd": {},
	}}
	man := &stream.Manifest{Shards: []stream.Shard{{ID: "a", Class: "cpu"}, {ID: "b", Class: "gpu"}}}
	a := sizeAllocation(spec, man, nil, nil, 3)
	if a.CPUs != 12 || a.Memory != 6<<30+workerOverhead || a.GPUs != 3 || len(a.Notes) != 0 {
		t.Errorf("declared: %+v, want 12 CPUs, 6GiB+256MiB, 3 GPUs, no notes", a)
	}
	prof := &plan.Profile{Classes: map[string]plan.Peak{"cpu": {Memory: 3 << 30}, "gpu": {Memory: 1 << 30}}}
	if a := sizeAllocation(spec, man, prof, nil, 2); a.Memory != 6<<30+workerOverhead {
		t.Errorf("measured: memory %d, want 2 x the measured 3GiB of class cpu + 256MiB", a.Memory)
	}
	// The run's shards reached well more than the profile's 3 GiB (its
	// record's peaks_seen): sized by that, and said; a little more
	// (within the margins) is not.
	seen := map[string]stream.PeakSeen{"cpu": {Bytes: 5 << 30, Shard: "s7"}, "gpu": {Bytes: 1<<30 + 1<<20, Shard: "s1"}}
	if a := sizeAllocation(spec, man, prof, seen, 2); a.Memory != 10<<30+workerOverhead || len(a.Notes) != 1 ||
		a.Notes[0] != "class cpu: sized by the 5.0GiB its shard s7 reached in this run (the run record's peaks_seen), above the 3.0GiB measured (profile.json)" {
		t.Errorf("with the run's peaks: %+v, want 2 x 5GiB + 256MiB and a note naming s7", a)
	}
	// A class used by no shard is not sized for.
	man.Shards = append(man.Shards, stream.Shard{ID: "c", Class: "odd"})
	a = sizeAllocation(spec, man, nil, nil, 1)
	if a.CPUs != 4 || len(a.Notes) != 1 || !strings.Contains(a.Notes[0], "class odd: no memory peak") {
		t.Errorf("with a class declaring nothing: %+v, want 4 CPUs and a note naming class odd", a)
	}
	man.Shards = []stream.Shard{{ID: "c", Class: "odd"}}
	if a := sizeAllocation(spec, man, nil, nil, 2); a.Memory != 0 || a.CPUs != 2 || len(a.Notes) != 2 {
		t.Errorf("no memory anywhere: %+v, want no --mem, 2 CPUs and both notes", a)
	}
}

func TestSlurmTimeAndWarn(t *testing.T) {
	for d, want := range map[time.Duration]string{
		10 * time.Minute:                  "0-00:10:00",
		90*time.Second + time.Millisecond: "0-00:01:31",
		49*time.Hour + 5*time.Second:      "2-01:00:05",
	} {
		if got := slurmTime(d); got != want {
			t.Errorf("slurmTime(%s) = %s, want %s", d, got, want)
		}
	}
	spec := &stream.Spec{Classes: map[string]stream.Class{"big": {Time: stream.Seconds(time.Hour)}}}
	man := &stream.Manifest{Shards: []stream.Shard{{Class: "cpu"}}}
	if w := defaultWarn(spec, man); w != 10*time.Minute {
		t.Errorf("warn without a time limit: %s, want 10m", w)
	}
	man.Shards = append(man.Shards, stream.Shard{Class: "big"})
	if w := defaultWarn(spec, man); w != 61*time.Minute {
		t.Errorf("warn with a class limited to 1h: %s, want 1h1m", w)
	}
}
