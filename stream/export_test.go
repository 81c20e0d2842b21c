package stream

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
)

var ReadPubAck = readPubAck

// WritesFast reports whether kv's Create and Update take casKV's path.
func WritesFast(kv jetstream.KeyValue) bool {
	_, ok := kv.(*casKV)
	return ok
}

// FastWrite is casKV's own write, without the library behind it: done is
// false where the library would take it over.
func FastWrite(kv jetstream.KeyValue, ctx context.Context, key string, value []byte, last uint64) (uint64, bool, error) {
	return kv.(*casKV).write(ctx, key, value, last)
}

// NewPullerFor is a Puller asking the consumer named consumer on stream,
// whatever cons is.
var NewPullerFor = newPuller

// PullsFast reports whether p fetches on its own lanes.
func PullsFast(p *Puller) bool { return p.lib == nil }

// IdleLanes are the inboxes of p's lanes waiting for a request.
func IdleLanes(p *Puller) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s []string
	for _, l := range p.idle {
		s = append(s, l.sub.Subject)
	}
	return s
}

// Lanes is how many inbox subscriptions p holds, idle or serving.
func Lanes(p *Puller) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lanes
}
