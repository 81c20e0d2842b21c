package stream

import (
	"testing"
	"time"
)

// benchRecord is a validated shard record of one attempt, encoded.
func benchRecord() []byte {
	code := 0
	r := ShardRecord{Run: "bench", ID: "s00001", Fingerprint: "72022dc3a8c9a2bc", Class: "cpu", State: ShardValidated,
		Attempts: []Attempt{{N: 1, Worker: "vm", Host: "vm", Start: time.Now(), ExitCode: &code, Outcome: OutcomeOK, Log: ""}},
		Output:   &Output{Path: "/tmp/out/s00001", Checksum: "6c6904d5c41ede51", Files: 0}, Updated: time.Now()}
	data, _ := Encode(&r)
	return data
}

func BenchmarkDecodeShardRecord(b *testing.B) {
	data := benchRecord()
	b.ReportAllocs()
	for b.Loop() {
		var x ShardRecord
		if err := Decode(data, &x); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeShardBrief(b *testing.B) {
	data := benchRecord()
	b.ReportAllocs()
	for b.Loop() {
		var x ShardBrief
		if err := Decode(data, &x); err != nil {
			b.Fatal(err)
		}
	}
}
