package coordinator

import (
	"maps"
	"testing"

	"github.com/shardpool/shardpool/stream"
)

// TestPeaksSeenAreOfTheCurrentGeneration: the record's PeaksSeen keeps
// the largest attempt peak per class, and a new generation (another
// fingerprint) starts with none: its job may need less, and workers
// learn from its own shards.
func TestPeaksSeenAreOfTheCurrentGeneration(t *testing.T) {
	ri := newRunInfo()
	ri.rec.Fingerprint = "a"
	ri.notePeak("cpu", "s1", 100)
	ri.notePeak("cpu", "s2", 90)
	ri.notePeak("gpu", "s3", 5)
	if got, want := ri.peaksSeen(), map[string]stream.PeakSeen{"cpu": {Bytes: 100, Shard: "s1"}, "gpu": {Bytes: 5, Shard: "s3"}}; !maps.Equal(got, want) {
		t.Fatalf("peaks seen: got %v, want %v", got, want)
	}
	ri.rec.Fingerprint = "b"
	if got := ri.peaksSeen(); got != nil {
		t.Fatalf("a new generation before any attempt of it: got %v, want none", got)
	}
	ri.notePeak("cpu", "s2", 50)
	if got, want := ri.peaksSeen(), map[string]stream.PeakSeen{"cpu": {Bytes: 50, Shard: "s2"}}; !maps.Equal(got, want) {
		t.Fatalf("a new generation's first peak: got %v, want %v", got, want)
	}
}
