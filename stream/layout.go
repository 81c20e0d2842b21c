package stream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Layout configures the JetStream objects. Zero fields mean defaults.
type Layout struct {
	// LeaseTTL is the lease bucket TTL and every consumer's AckWait. Default 30s.
	LeaseTTL time.Duration
	// DuplicateWindow must cover one submission. Default 10 minutes.
	DuplicateWindow time.Duration
	// WorkerTTL is how long a worker report lives without refresh. Default 15s.
	WorkerTTL time.Duration
	// Replicas for streams and buckets (1 for one coordinator, 3 for a cluster).
	Replicas int
}

// Defaults for Layout's zero fields.
const (
	DefaultLeaseTTL        = 30 * time.Second
	DefaultDuplicateWindow = 10 * time.Minute
	DefaultWorkerTTL       = 15 * time.Second
)

func (l Layout) withDefaults() Layout {
	if l.LeaseTTL <= 0 {
		l.LeaseTTL = DefaultLeaseTTL
	}
	if l.DuplicateWindow <= 0 {
		l.DuplicateWindow = DefaultDuplicateWindow
	}
	if l.WorkerTTL <= 0 {
		l.WorkerTTL = DefaultWorkerTTL
	}
	if l.Replicas <= 0 {
		l.Replicas = 1
	}
	return l
}

// Setup creates or updates the SHARDS stream and every KV bucket. It is
// idempotent and safe to call from every coordinator start.
func Setup(ctx context.Context, js jetstream.JetStream, l Layout) error {
	l = l.withDefaults()
	_, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamShards,
		Description: "shardpool work queue: one message per queued shard",
		Subjects:    []string{subjectPrefix + ".>"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Duplicates:  l.DuplicateWindow,
		Replicas:    l.Replicas,
	})
	if err != nil {
		return fmt.Errorf("setup stream %s: %w", StreamShards, err)
	}
	buckets := []jetstream.KeyValueConfig{
		{Bucket: BucketRuns, Description: "run spec, fingerprint and state", History: 5},
		{Bucket: BucketShards, Description: "shard state records", History: 5},
		{Bucket: BucketLeases, Description: "shard leases; bucket TTL = lease TTL", TTL: l.LeaseTTL},
		{Bucket: BucketCheckpoint, Description: "committed generation per shard", History: 10},
		{Bucket: BucketWorkers, Description: "worker headroom reports", TTL: l.WorkerTTL},
		{Bucket: BucketStagers, Description: "fleet-wide staging slots (a semaphore; TTL = lease TTL)", TTL: l.LeaseTTL},
	}
	for _, b := range buckets {
		b.Storage = jetstream.FileStorage
		b.Replicas = l.Replicas
		if _, err := js.CreateOrUpdateKeyValue(ctx, b); err != nil {
			return fmt.Errorf("setup bucket %s: %w", b.Bucket, err)
		}
	}
	return nil
}

// LocalityDeliveries is the extra delivery each shard may spend being
// handed to a worker that has its inputs staged.
const LocalityDeliveries = 1

// InterruptDeliveries is how many deliveries of a shard a worker's
// shutdown or memory pressure may hand back without spending its attempts
// (the worker counts them in the record's Interrupted). Past them the consumer stops
// delivering the message, and the shard fails with the reason.
const InterruptDeliveries = 8

// MaxDeliver is the consumer's delivery limit for a run with retries: the
// attempts, plus the deliveries that are not attempts. Each worker enforces
// the run's own attempt limit; this is the server's backstop.
func MaxDeliver(retries int) int { return retries + 1 + LocalityDeliveries + InterruptDeliveries }

// EnsureConsumer creates the durable pull consumer of class, or raises its
// MaxDeliver when maxDeliver is larger than what it has. maxAckPending is the
// fleet-wide cap of in-flight shards of the class (-1 for none).
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, class string, maxDeliver, maxAckPending int, leaseTTL time.Duration) (jetstream.Consumer, error) {
	if !ValidClass(class) {
		return nil, fmt.Errorf("ensure consumer %q: %w: not a valid class name", class, ErrInvalidSpec)
	}
	if leaseTTL <= 0 {
		leaseTTL = DefaultLeaseTTL
	}
	if maxAckPending == 0 {
		maxAckPending = -1
	}
	s, err := js.Stream(ctx, StreamShards)
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s: %w", class, err)
	}
	if c, err := s.Consumer(ctx, class); err == nil {
		cfg := c.CachedInfo().Config
		if cfg.MaxDeliver >= maxDeliver && cfg.AckWait == leaseTTL && cfg.MaxAckPending == maxAckPending {
			return c, nil
		}
		if cfg.MaxDeliver > maxDeliver {
			maxDeliver = cfg.MaxDeliver
		}
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("ensure consumer %s: %w", class, err)
	}
	c, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       class,
		Description:   "shards of class " + class,
		FilterSubject: ClassFilter(class),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       leaseTTL,
		MaxDeliver:    maxDeliver,
		MaxAckPending: maxAckPending,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxWaiting:    512,
	})
	if err != nil {
		return nil, fmt.Errorf("ensure consumer %s: %w", class, err)
	}
	return c, nil
}

// Buckets opens the KV buckets that Setup created.
type Buckets struct {
	Runs, Shards, Leases, Checkpoints, Workers, Stagers jetstream.KeyValue

	js jetstream.JetStream // for the workers bucket's stream (WorkerReports)
}

// Keys lists the keys of kv, one of these buckets, in order, from its
// stream's own count of its subjects: one answer of the server. The KV key
// listing (a watcher) missed a key being rewritten as it went by: with a
// worker report rewritten every millisecond, 33 listings in 500 missed it
// (TestWorkerReportsSeesAReportBeingRewritten), and run records and
// worker reports are rewritten all the time. A deleted key may be listed;
// its Get then fails.
func (b *Buckets) Keys(ctx context.Context, kv jetstream.KeyValue) ([]string, error) {
	return b.KeysMatching(ctx, kv, ">")
}

// kvStream is the stream under a bucket, and kvSubject the subject of a
// key (a pattern with wildcards too) in it.
func kvStream(kv jetstream.KeyValue) string              { return "KV_" + kv.Bucket() }
func kvSubject(kv jetstream.KeyValue, key string) string { return "$KV." + kv.Bucket() + "." + key }

// KeysMatching is Keys for the keys that match pattern, a key with NATS
// wildcards (`run.*` for the shard records of one run).
func (b *Buckets) KeysMatching(ctx context.Context, kv jetstream.KeyValue, pattern string) ([]string, error) {
	st, err := b.js.Stream(ctx, kvStream(kv))
	if err != nil {
		return nil, err
	}
	prefix := kvSubject(kv, "")
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+pattern))
	if err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(info.State.Subjects))
	for subject := range info.State.Subjects {
		keys = append(keys, strings.TrimPrefix(subject, prefix))
	}
	slices.Sort(keys)
	return keys, nil
}

// ReadRun reads a run's record through any JetStream client.
func ReadRun(ctx context.Context, js jetstream.JetStream, name string) (RunRecord, error) {
	var r RunRecord
	kv, err := js.KeyValue(ctx, BucketRuns)
	if err != nil {
		return r, err
	}
	e, err := kv.Get(ctx, name)
	if err != nil {
		return r, err
	}
	return r, Decode(e.Value(), &r)
}

// IsConflict reports a compare-and-set conflict in a KV bucket: a Create
// of a key that exists, or an Update at a revision that is not the last.
// Replicated streams (a cluster) may report it with a code of their own.
func IsConflict(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
		return true
	}
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// WorkerReports reads every worker report in the workers bucket (a report
// not refreshed within the bucket's TTL is gone); an entry that cannot be
// read or decoded is skipped.
func (b *Buckets) WorkerReports(ctx context.Context) ([]WorkerReport, error) {
	keys, err := b.Keys(ctx, b.Workers)
	if err != nil {
		return nil, err
	}
	var out []WorkerReport
	for _, k := range keys {
		e, err := b.Workers.Get(ctx, k)
		if err != nil {
			continue
		}
		var r WorkerReport
		if Decode(e.Value(), &r) == nil {
			r.Stored = e.Created()
			out = append(out, r)
		}
	}
	return out, nil
}

// openTry bounds one try of WaitBuckets.
const openTry = 5 * time.Second

// WaitBuckets is OpenBuckets for a client that may have connected to a
// coordinator still creating its layout, or to a coordinator of a cluster
// that has no majority yet (just started, or restarting after a power
// cut): there the JetStream API answers nothing, or an error, until the
// cluster has elected its leaders. It retries whatever failed for up to
// wait.
func WaitBuckets(ctx context.Context, js jetstream.JetStream, wait time.Duration) (*Buckets, error) {
	deadline := time.Now().Add(wait)
	for {
		// Each try on its own short deadline: a request lost while the
		// cluster elects (no answer ever comes) must not take the whole
		// wait.
		actx, cancel := context.WithTimeout(ctx, min(openTry, max(time.Until(deadline), time.Millisecond)))
		b, err := OpenBuckets(actx, js)
		cancel()
		if err == nil || ctx.Err() != nil || time.Now().After(deadline) {
			return b, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// OpenBuckets binds to every bucket; it fails when Setup has not run.
func OpenBuckets(ctx context.Context, js jetstream.JetStream) (*Buckets, error) {
	b := Buckets{js: js}
	for _, x := range []struct {
		name string
		dst  *jetstream.KeyValue
	}{{BucketRuns, &b.Runs}, {BucketShards, &b.Shards}, {BucketLeases, &b.Leases}, {BucketCheckpoint, &b.Checkpoints}, {BucketWorkers, &b.Workers}, {BucketStagers, &b.Stagers}} {
		kv, err := js.KeyValue(ctx, x.name)
		if err != nil {
			return nil, fmt.Errorf("open bucket %s: %w", x.name, err)
		}
		*x.dst = fastWrites(js, kv)
	}
	return &b, nil
}

// Validations are the records in a shard key's history (oldest first) that
// say validated for generation fp: a shard committed exactly once has one.
func Validations(hist []jetstream.KeyValueEntry, fp string) []ShardRecord {
	var out []ShardRecord
	for _, e := range hist {
		var rec ShardRecord
		if Decode(e.Value(), &rec) == nil && rec.State == ShardValidated && rec.Fingerprint == fp {
			out = append(out, rec)
		}
	}
	return out
}

// CheckClosed reports what is wrong with a shard record, as stored
// (value), that the run's end should have left with every attempt closed:
// it does not decode, or it holds attempts with no outcome
// (OpenAttempts). The drill's power-cut and cluster runs and the crash
// soak check the last entry of each shard's history with it.
func CheckClosed(value []byte) error {
	var rec ShardRecord
	if err := Decode(value, &rec); err != nil {
		return fmt.Errorf("record: %w", err)
	}
	if open := rec.OpenAttempts(); len(open) > 0 {
		return fmt.Errorf("%s left with no outcome, under %s", strings.Join(open, ", "), rec.State)
	}
	return nil
}
