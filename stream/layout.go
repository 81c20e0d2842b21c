package stream

import (
	"context"
	"errors"
	"fmt"
	"maps"
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

// WorkerReports reads every worker report in the workers bucket (a report
// not refreshed within the bucket's TTL is gone); an entry that cannot be
// read or decoded is skipped.
//
// The keys come from the bucket stream's own count of its subjects, one
// answer of the server. The KV key listing (a watcher) missed a key whose
// report was being rewritten as it went by, 1 listing in 15 with a report
// rewritten every millisecond (TestWorkerReportsSeesAReportBeingRewritten):
// a live worker missing from status, or from its peers' locality choice.
func (b *Buckets) WorkerReports(ctx context.Context) ([]WorkerReport, error) {
	st, err := b.js.Stream(ctx, "KV_"+BucketWorkers)
	if err != nil {
		return nil, err
	}
	prefix := "$KV." + BucketWorkers + "."
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, err
	}
	var out []WorkerReport
	for _, subject := range slices.Sorted(maps.Keys(info.State.Subjects)) {
		e, err := b.Workers.Get(ctx, strings.TrimPrefix(subject, prefix))
		if err != nil {
			continue
		}
		var r WorkerReport
		if Decode(e.Value(), &r) == nil {
			out = append(out, r)
		}
	}
	return out, nil
}

// WaitBuckets is OpenBuckets for a client that may have connected to a
// coordinator still creating its layout: it retries for up to wait.
func WaitBuckets(ctx context.Context, js jetstream.JetStream, wait time.Duration) (*Buckets, error) {
	deadline := time.Now().Add(wait)
	for {
		b, err := OpenBuckets(ctx, js)
		if err == nil || !errors.Is(err, jetstream.ErrBucketNotFound) || time.Now().After(deadline) {
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
		*x.dst = kv
	}
	return &b, nil
}
