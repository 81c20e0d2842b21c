package coordinator

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
)

// BenchmarkTrackerHoldsAShard reports the heap the tracker keeps for a
// validated shard's record (B/shard): a coordinator keeps one per shard
// of every run it tracks. 250 B before the fifty-seventh session, 195
// after (strings shared, the output's path not kept, the key's subject
// not held by its id); 211 since the fifty-ninth, which keeps what the
// validated attempt took (its time and peak, for final.json's timing).
func BenchmarkTrackerHoldsAShard(b *testing.B) {
	const n = 100_000
	entries := make([]watchEvent, n)
	for i := range entries {
		id := fmt.Sprintf("s%07d", i)
		// As a watch delivers it: the key cut from the message's subject.
		subj := "$KV.shardpool-shards.big." + id
		entries[i] = watchEvent{bucket: stream.BucketShards, op: jetstream.KeyValuePut, key: subj[len("$KV.shardpool-shards."):], rev: uint64(i + 1), val: []byte(`{"v":1,"run":"big","id":"` + id +
			`","fingerprint":"d87f13b4d32e8064","class":"cpu","state":"validated","retry":0,"attempts":[{"n":1,"outcome":"validated"}],"output":{"path":"/data/out/` + id +
			`","checksum":"2b37a3d2213e3fea","files":3,"bytes":4096}}`)}
	}
	var held uint64
	for range b.N {
		tr := newTracker(nil)
		tr.info("big").rec.Fingerprint = "d87f13b4d32e8064"
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for _, e := range entries {
			tr.onShard(e)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got := len(tr.runs["big"].shards); got != n {
			b.Fatalf("the tracker holds %d shards, want %d", got, n)
		}
		held = (after.HeapAlloc - before.HeapAlloc) / n
		runtime.KeepAlive(tr)
	}
	b.ReportMetric(float64(held), "B/shard")
}
