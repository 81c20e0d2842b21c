package stream

import "math"

// Timing is what a run's validated shards took, over those with a timed
// attempt: final.json's timing and, with a verdict, its run record's. It
// is what the next plan of such a run, or a class for its outliers, goes
// by.
type Timing struct {
	Shards  int             `json:"shards"`
	Seconds Spread[float64] `json:"seconds"`
	// PeakMemory is over the timed shards whose peak was measured (its
	// Shards of them), absent where none was: without a cgroup, a
	// command's peak is unknown where it was too short to sample and not
	// above the worker's own RSS (docs/status-json.md), so the measured
	// ones may be the longest and largest, not a sample.
	PeakMemory *Spread[int64] `json:"peak_memory,omitempty"`
}

// Spread is the median, 95th percentile (nearest rank) and maximum of a
// measure over Shards shards, and the shard that had the maximum.
type Spread[T int64 | float64] struct {
	Shards   int    `json:"shards"`
	P50      T      `json:"p50"`
	P95      T      `json:"p95"`
	Max      T      `json:"max"`
	MaxShard string `json:"max_shard"`
}

// NearestRank is the q quantile (0 < q <= 1) of sorted, by the nearest
// rank: the smallest value with at least q of them at or below it (the
// lower median of an even count). final.json's timing and profile's
// sustained p50 and p95 both take it.
func NearestRank[T int64 | float64](sorted []T, q float64) T {
	return sorted[max(int(math.Ceil(q*float64(len(sorted))))-1, 0)]
}
