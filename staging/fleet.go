package staging

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Fleet bounds how many copies run at once across every host: a semaphore
// of Slots keys in a KV bucket whose TTL frees the slot of a stager that
// died. Create takes a free slot; Update(revision) renews it while the copy
// runs; Delete gives it back.
type Fleet struct {
	KV    jetstream.KeyValue
	Slots int
	Owner string
	// TTL is the bucket's TTL; the holder renews at a third of it.
	TTL time.Duration
}

// acquire takes a fleet slot, waiting (polling at most every 250 ms) until
// one is free; the returned function releases it.
func (f *Fleet) acquire(ctx context.Context) (func(), error) {
	if f == nil || f.Slots <= 0 {
		return func() {}, nil
	}
	for {
		for i := range f.Slots {
			key := fmt.Sprintf("slot-%d", i)
			rev, err := f.KV.Create(ctx, key, []byte(f.Owner))
			if err == nil {
				return f.hold(key, rev), nil
			}
			if !errors.Is(err, jetstream.ErrKeyExists) {
				return nil, fmt.Errorf("fleet staging slot: %w", err)
			}
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// hold renews the slot until released.
func (f *Fleet) hold(key string, rev uint64) func() {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(max(f.TTL/3, 100*time.Millisecond))
		defer t.Stop()
		for {
			select {
			case <-stop:
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_ = f.KV.Delete(ctx, key, jetstream.LastRevision(rev))
				cancel()
				return
			case <-t.C:
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				if r, err := f.KV.Update(ctx, key, []byte(f.Owner), rev); err == nil {
					rev = r
				}
				cancel()
			}
		}
	}()
	return func() { close(stop); <-done }
}
