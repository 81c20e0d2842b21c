package stream

import "github.com/nats-io/nats.go/jetstream"

// StopWatch stops a KV watcher that its reader no longer reads. nats.go
// delivers entries from the subscription's goroutine with a blocking send
// on the updates channel (256 entries): once a busy bucket has filled it,
// that goroutine waits in the send for good, and Stop alone does not end
// it. So the channel is drained until nats.go closes it, which it does as
// the subscription's goroutine ends.
func StopWatch(w jetstream.KeyWatcher) {
	_ = w.Stop()
	go func() {
		for range w.Updates() {
		}
	}()
}
