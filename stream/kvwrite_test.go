package stream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestBucketWritesKeepTheLibrarysAnswers: the buckets' Create and Update
// (a faster path than nats.go's: kvwrite.go) give what the library gives
// on the same server, conflicts included, so that every caller's
// errors.Is and stream.IsConflict keep working: a Create of a key that
// exists, an Update at a stale revision, a Create over a deleted key, a key
// the library refuses, and a write that reaches no stream.
func TestBucketWritesKeepTheLibrarysAnswers(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx, cancel := context.WithCancel(context.Background()) // cancelable, no deadline: the workers' kind
	defer cancel()
	fast := env.Buckets().Checkpoints
	lib, err := env.JS.KeyValue(ctx, stream.BucketCheckpoint)
	if err != nil {
		t.Fatal(err)
	}
	if !stream.WritesFast(fast) || stream.WritesFast(lib) {
		t.Fatal("the buckets' writes do not take the fast path: nothing to compare")
	}
	// The fast path itself stores a write and hands on a refused one
	// untouched (were it to hand on everything, the comparison below would
	// compare the library with itself).
	rev, done, err := stream.FastWrite(fast, ctx, "run.own", []byte("x"), 0)
	if !done || err != nil || rev == 0 {
		t.Fatalf("fast write: got revision %d, done %v (%v), want it stored", rev, done, err)
	}
	if _, done, err := stream.FastWrite(fast, ctx, "run.own", []byte("y"), 0); done || err != nil {
		t.Fatalf("fast write over a value: got done %v (%v), want it handed on", done, err)
	}
	if e, err := lib.Get(ctx, "run.own"); err != nil || string(e.Value()) != "x" || e.Revision() != rev {
		t.Fatalf("after the fast writes: got %v (%v), want x at %d", e, err, rev)
	}
	for _, c := range []struct {
		name string
		kv   jetstream.KeyValue
	}{{"fast", fast}, {"library", lib}} {
		t.Run(c.name, func(t *testing.T) {
			key := "run." + c.name
			rev, err := c.kv.Create(ctx, key, []byte("one"))
			if err != nil {
				t.Fatalf("create: %v", err)
			}
			if e, err := lib.Get(ctx, key); err != nil || string(e.Value()) != "one" || e.Revision() != rev {
				t.Fatalf("after create: got %v at %d (%v), want one at %d", e, e.Revision(), err, rev)
			}
			if _, err := c.kv.Create(ctx, key, []byte("two")); !errors.Is(err, jetstream.ErrKeyExists) || !stream.IsConflict(err) {
				t.Errorf("create over a value: got %v, want ErrKeyExists", err)
			}
			rev2, err := c.kv.Update(ctx, key, []byte("two"), rev)
			if err != nil || rev2 <= rev {
				t.Fatalf("update: got revision %d (%v), want more than %d", rev2, err, rev)
			}
			if _, err := c.kv.Update(ctx, key, []byte("three"), rev); !errors.Is(err, jetstream.ErrKeyRevisionMismatch) || !stream.IsConflict(err) {
				t.Errorf("update at a stale revision: got %v, want ErrKeyRevisionMismatch", err)
			}
			if err := c.kv.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
			if _, err := c.kv.Create(ctx, key, []byte("four")); err != nil {
				t.Errorf("create over a deleted key: %v", err)
			}
			if e, err := lib.Get(ctx, key); err != nil || string(e.Value()) != "four" {
				t.Errorf("after the second create: got %v (%v), want four", e, err)
			}
			if _, err := c.kv.Create(ctx, "bad..key", nil); !errors.Is(err, jetstream.ErrInvalidKey) {
				t.Errorf("a key with two dots: got %v, want ErrInvalidKey", err)
			}
			// A deadline of the caller's own, and none at all.
			dctx, dcancel := context.WithTimeout(ctx, 5*time.Second)
			defer dcancel()
			if _, err := c.kv.Create(dctx, key+"-dl", []byte("x")); err != nil {
				t.Errorf("create with a deadline: %v", err)
			}
			if _, err := c.kv.Create(context.Background(), key+"-bg", []byte("x")); err != nil {
				t.Errorf("create without a context's end: %v", err)
			}
			// A canceled context stores nothing.
			cctx, ccancel := context.WithCancel(ctx)
			ccancel()
			if _, err := c.kv.Create(cctx, key+"-canceled", []byte("x")); err == nil {
				t.Error("create with a canceled context: no error")
			}
			if _, err := lib.Get(ctx, key+"-canceled"); !errors.Is(err, jetstream.ErrKeyNotFound) {
				t.Errorf("after a canceled create: got %v, want ErrKeyNotFound", err)
			}
		})
	}
}

// TestReadPubAck: what the fast path takes for stored, refused, or not an
// acknowledgement at all (which it must never hand to the library to
// write again).
func TestReadPubAck(t *testing.T) {
	for _, c := range []struct {
		in            string
		seq           uint64
		refused, isOK bool
	}{
		{`{"stream":"KV_shardpool-leases","seq":42}`, 42, false, true},
		{`{"stream":"KV_x","domain":"hub","seq":7,"duplicate":true}`, 7, false, true},
		{`{"stream":"error","domain":"error","seq":9}`, 9, false, true},
		{`{"stream":"KV_x","seq":18446744073709551615}`, 18446744073709551615, false, true},
		{`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"}}`, 0, true, true},
		{`{"error":{"code":503,"description":"resource limits exceeded"},"stream":"KV_x","seq":0}`, 0, true, true},
		{`{"stream":"","seq":4}`, 0, false, false},
		{`{"seq":4}`, 0, false, false},
		{`{"stream":"KV_x","seq":}`, 0, false, false},
		{`{"stream":"KV_x","seq":12a}`, 0, false, false},
		{`{"stream":"KV_x","seq":99999999999999999999}`, 0, false, false},
		{``, 0, false, false},
	} {
		seq, refused, ok := stream.ReadPubAck([]byte(c.in))
		if seq != c.seq || refused != c.refused || ok != c.isOK {
			t.Errorf("%s: got %d %v %v, want %d %v %v", c.in, seq, refused, ok, c.seq, c.refused, c.isOK)
		}
	}
}
