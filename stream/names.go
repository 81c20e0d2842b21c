package stream

import (
	"fmt"
	"regexp"
)

// Names of the JetStream objects. Operators use these with the stock nats CLI.
const (
	StreamShards     = "SHARDS"
	BucketRuns       = "shardpool-runs"
	BucketShards     = "shardpool-shards"
	BucketLeases     = "shardpool-leases"
	BucketCheckpoint = "shardpool-checkpoints"
	BucketWorkers    = "shardpool-workers"
	BucketStagers    = "shardpool-stagers"

	subjectPrefix = "shards"
	// AdvisoryMaxDeliveries is where the server reports a message that ran out
	// of deliveries (for example, its last worker died mid-attempt).
	AdvisoryMaxDeliveries = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + StreamShards + ".*"
)

var (
	runNameRE   = regexp.MustCompile(`^[a-z0-9][a-z0-9-]*$`)
	shardIDRE   = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	className   = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
	workerNameR = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)
)

// ValidRunName reports whether s can name a run (it becomes a subject token and a KV key).
func ValidRunName(s string) bool { return len(s) <= 64 && runNameRE.MatchString(s) }

// ValidShardID reports whether s can identify a shard.
func ValidShardID(s string) bool { return shardIDRE.MatchString(s) }

// ValidClass reports whether s can name a resource class (it becomes a consumer name).
func ValidClass(s string) bool { return className.MatchString(s) }

// ValidWorkerName reports whether s can name a worker (it becomes a KV key).
func ValidWorkerName(s string) bool { return workerNameR.MatchString(s) }

// ShardSubject is the subject a shard of run in class is published on.
func ShardSubject(run, class string) string {
	return fmt.Sprintf("%s.%s.%s", subjectPrefix, run, class)
}

// RunSubjects matches every shard subject of one run.
func RunSubjects(run string) string { return fmt.Sprintf("%s.%s.*", subjectPrefix, run) }

// ClassFilter is the filter subject of a class's consumer.
func ClassFilter(class string) string { return fmt.Sprintf("%s.*.%s", subjectPrefix, class) }

// ShardKey is the key of a shard in the shards, leases and checkpoints buckets.
func ShardKey(run, id string) string { return run + "." + id }

// MsgID is the de-duplication ID of a shard publication. Retry rounds after a
// failure get their own suffix so they are not taken for duplicates. The run
// name is part of it: the fingerprint leaves the name out, and two runs of
// one fingerprint (a renamed run) must not drop each other's shards.
func MsgID(run, fingerprint, id string, retry int) string {
	if retry == 0 {
		return run + "." + fingerprint + "." + id
	}
	return fmt.Sprintf("%s.%s.%s.r%d", run, fingerprint, id, retry)
}
