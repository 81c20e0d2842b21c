package stream

import (
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// stopWait bounds how long StopWatch waits for nats.go to stop a watch.
const stopWait = time.Second

// StopWatch stops a KV watcher that its reader no longer reads.
//
// nats.go delivers entries from the subscription's goroutine with a
// blocking send on the updates channel (256 entries): once a busy bucket
// has filled it, that goroutine waits in the send for good, and Stop alone
// does not end it. So the channel is drained until nats.go closes it,
// which it does as the subscription's goroutine ends.
//
// Stop deletes the watch's consumer with a JetStream request, which waits
// out the request timeout (5 s) where the bucket's stream has no majority
// of a cluster: the last coordinator of a cluster that lost the others took
// 10 s to stop, silent, on its two watches. The wait here is bounded at
// stopWait; the deletion goes on aside (the consumer is ephemeral and
// expires anyway when it cannot be deleted).
func StopWatch(w jetstream.KeyWatcher) {
	go func() {
		for range w.Updates() {
		}
	}()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = w.Stop()
	}()
	select {
	case <-stopped:
	case <-time.After(stopWait):
	}
}
