package coordinator

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/shardpool/shardpool/stream"
)

// TestStagedShardTooBigIsRefused: a staged shard whose message, with the
// description of each input, would pass the server's payload limit is
// refused with the manifest's file, line and field before anything is
// published; one that fits passes.
func TestStagedShardTooBigIsRefused(t *testing.T) {
	files := func(n int) []stream.InputFile {
		out := make([]stream.InputFile, n)
		for i := range out {
			out[i] = stream.InputFile{Path: fmt.Sprintf("/data/in/%06d.bin", i), Size: 1 << 20, MTime: 1, XXH64: "0123456789abcdef", Chunks: []string{"0123456789abcdef"}}
		}
		return out
	}
	man := &stream.Manifest{Path: "/job/m.jsonl", Shards: []stream.Shard{
		{ID: "small", Line: 1, Files: files(10)},
		{ID: "big", Line: 2, Files: files(80_000)},
	}}
	err := checkStagedSizes(man)
	if !errors.Is(err, stream.ErrInvalidManifest) || !strings.Contains(err.Error(), `/job/m.jsonl:2: field "inputs"`) || !strings.Contains(err.Error(), "shard big") {
		t.Fatalf("got %v, want line 2 (shard big) refused", err)
	}
	man.Shards = man.Shards[:1]
	if err := checkStagedSizes(man); err != nil {
		t.Fatalf("a small staged shard: %v", err)
	}
}
