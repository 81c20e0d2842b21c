package coordinator

import (
	"encoding/json"
	"os"
	"path/filepath"
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
		{ID: "s1", State: stream.ShardValidated, Checksum: "2b37a3d2213e3fea", Files: 2, Bytes: 10, Attempts: 1},
		{ID: "s2", State: stream.ShardFailed, Attempts: 3, Reason: "exit status 3; last output: \"a\\tb <c>\" \u2028"},
		{ID: "s3", State: stream.ShardValidated, Checksum: "0000000000000001", Attempts: 2},
	}
	for _, c := range []struct {
		name   string
		shards []FinalShard
	}{{"none", nil}, {"empty", []FinalShard{}}, {"one", three[:1]}, {"three", three}} {
		dir := t.TempDir()
		f := Final{RunSummary: sum, Shards: c.shards}
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
		if err != nil || back.Run != "r" || len(back.Shards) != len(c.shards) {
			t.Errorf("%s: ReadFinal: %+v, %v", c.name, back, err)
		}
	}
}
