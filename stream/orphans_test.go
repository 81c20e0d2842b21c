package stream_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestRemoveOrphansTakesOnlyWhatNoConsumerDelivers: a message of a run at
// or below its class consumer's acknowledged floor (as a store back from a
// power cut can leave one: the consumer's acknowledgement kept, the work
// queue's removal lost) is removed; the run's messages above the floor,
// another run's, and those of a class with no consumer yet stay.
func TestRemoveOrphansTakesOnlyWhatNoConsumerDelivers(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	pub := func(run, class string) uint64 {
		t.Helper()
		a, err := env.JS.Publish(ctx, stream.ShardSubject(run, class), []byte(run))
		if err != nil {
			t.Fatal(err)
		}
		return a.Sequence
	}
	// The state a crash can leave, made here without one: the consumer
	// of class zz, first filtered on another class, acknowledges a later
	// message and so moves its floor past the run's zz message; its filter
	// then becomes zz's, and that message lies below the floor, never to be
	// delivered. (Another run's message there stays: it is not r's.)
	cfg := jetstream.ConsumerConfig{Durable: "zz", FilterSubject: stream.ClassFilter("ww"), AckPolicy: jetstream.AckExplicitPolicy}
	cons, err := env.JS.CreateOrUpdateConsumer(ctx, stream.StreamShards, cfg)
	if err != nil {
		t.Fatal(err)
	}
	orphan := pub("r", "zz")
	other := pub("o", "zz")
	pub("r", "ww")
	b, err := stream.NewPuller(env.JS, cons).Fetch(1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if m, ok := b.Next(); !ok || m.DoubleAck(ctx) != nil {
		t.Fatalf("fetch the ww message: %v", b.Error())
	}
	cfg.FilterSubject = stream.ClassFilter("zz")
	if cons, err = env.JS.CreateOrUpdateConsumer(ctx, stream.StreamShards, cfg); err != nil {
		t.Fatal(err)
	}
	if info, err := cons.Info(ctx); err != nil || info.AckFloor.Stream <= other || info.NumPending != 0 {
		t.Fatalf("consumer: %+v (%v), want its floor past %d and nothing pending", info, err, other)
	}
	delivered := pub("r", "zz")
	above := pub("r", "zz")
	noConsumer := pub("r", "yy")
	b, err = stream.NewPuller(env.JS, cons).Fetch(1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	m, ok := b.Next()
	if md, _ := m.Metadata(); !ok || md == nil || md.Sequence.Stream != delivered {
		t.Fatalf("fetch: got %v, want sequence %d", md, delivered)
	}
	if err := m.DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := stream.QueuedOf(ctx, env.JS, "r"); err != nil || n != 3 {
		t.Fatalf("queued before: %d (%v), want the orphan, the one above the floor and the one without a consumer", n, err)
	}

	removed, err := stream.RemoveOrphans(ctx, env.JS, "r")
	if err != nil || !slices.Equal(removed, []uint64{orphan}) {
		t.Fatalf("removed %v (%v), want [%d] alone", removed, err, orphan)
	}
	s, err := env.JS.Stream(ctx, stream.StreamShards)
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range []uint64{other, above, noConsumer} {
		if _, err := s.GetMsg(ctx, seq); err != nil {
			t.Errorf("message %d: %v, want it kept", seq, err)
		}
	}
	if removed, err := stream.RemoveOrphans(ctx, env.JS, "r"); err != nil || len(removed) != 0 {
		t.Errorf("a second look removed %v (%v), want nothing", removed, err)
	}
	// What stayed is still delivered.
	b, _ = stream.NewPuller(env.JS, cons).Fetch(1, time.Second)
	if m, ok := b.Next(); !ok {
		t.Errorf("the message above the floor is no longer delivered (%v)", b.Error())
	} else if md, _ := m.Metadata(); md == nil || md.Sequence.Stream != above {
		t.Errorf("fetch after: got %v, want sequence %d", md, above)
	}
}
