package checkpoint

import (
	stdjson "encoding/json"
	"math/rand"
	"strings"
	"testing"
	"time"

	json "github.com/segmentio/encoding/json"
)

// TestMarkerBytesMatchEncodingJSON: markers and file lists are written with
// github.com/segmentio/encoding/json, and a marker's checksum is over the
// list's JSON, so those bytes must be the ones encoding/json (which wrote
// every marker before) writes, for any file name: otherwise outputs
// committed by an earlier version would no longer verify. Names mix the
// characters encoding/json escapes or replaces: HTML characters, U+2028
// and U+2029, control characters, invalid UTF-8 and a lone surrogate.
func TestMarkerBytesMatchEncodingJSON(t *testing.T) {
	parts := []string{"a", "<", ">", "&", "\u2028", "\u2029", "\x00", "\x1f", "\x7f", "\xff", "\xc3", "é", `"`, `\`, "/", "\t", "\n", "日本", "\xed\xa0\x80", "\U0001F600", "\ufffd", " ", "."}
	r := rand.New(rand.NewSource(1))
	name := func() string {
		var b strings.Builder
		for n := 1 + r.Intn(8); n > 0; n-- {
			b.WriteString(parts[r.Intn(len(parts))])
		}
		return b.String()
	}
	for i := range 20000 {
		files := make([]File, r.Intn(4))
		for j := range files {
			files[j] = File{Path: name(), Size: r.Int63(), XXH64: name(), Mode: r.Uint32()}
		}
		mk := Marker{V: formatV, Generation: r.Int63(), Manifest: listChecksum(files), Owner: name(), Fingerprint: name(),
			Time: time.Unix(r.Int63n(1<<33), r.Int63n(1e9)).UTC(), Files: len(files), Bytes: r.Int63(), Contents: files}
		want, _ := stdjson.MarshalIndent(mk, "", "  ")
		if got := mk.encode(); string(got) != string(want)+"\n" {
			t.Fatalf("case %d: marker encodes differently:\n got %q\nwant %q", i, got, want)
		}
		list, _ := stdjson.MarshalIndent(manifest{V: manifestV, Files: files}, "", "  ")
		if got := manifestBytes(files); string(got) != string(list)+"\n" {
			t.Fatalf("case %d: file list encodes differently:\n got %q\nwant %q", i, got, list)
		}
		var back Marker
		if err := stdjson.Unmarshal(want, &back); err != nil {
			t.Fatal(err)
		}
		var ours Marker
		if err := json.Unmarshal(want, &ours); err != nil || listChecksum(ours.Contents) != listChecksum(back.Contents) || ours.Owner != back.Owner {
			t.Fatalf("case %d: a marker written by encoding/json reads differently: %v", i, err)
		}
	}
}
