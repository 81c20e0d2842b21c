package stream

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// A shard costs four compare-and-set writes (its lease, its record twice,
// its commit claim). nats.go's Create and Update check the key with a
// regular expression, wrap a context without a deadline in a new one, and
// decode the server's acknowledgement with encoding/json: together 2% of
// a run of short shards (perf, forty-sixth session). casKV writes the
// same message (the key's subject, the expected-last-subject-sequence
// header) on the same connection, and reads a plain acknowledgement
// itself. Whatever it does not handle goes to the library: a write the
// server refused (the library writes it again, is refused again, and says
// why in its own errors: ErrKeyExists, ErrKeyRevisionMismatch, a Create
// over a deleted key), no responders (not stored; the library retries), a
// key the fast check does not accept, Create's options. A write that may
// have been stored is never handed on: the library's second try would
// then meet it.
type casKV struct {
	jetstream.KeyValue
	nc      *nats.Conn
	prefix  string        // "$KV.<bucket>."
	timeout time.Duration // for a context without a deadline, as the library's
}

// fastWrites wraps kv for the plain layout (plainLayout).
func fastWrites(js jetstream.JetStream, kv jetstream.KeyValue) jetstream.KeyValue {
	nc, timeout, ok := plainLayout(js)
	if !ok {
		return kv
	}
	return &casKV{KeyValue: kv, nc: nc, prefix: kvSubject(kv, ""), timeout: timeout}
}

// plainLayout is js's connection and its requests' timeout where the
// subjects are the plain ones: no JetStream domain or API prefix (a
// subject would carry it), which shardpool never sets. Where they are
// not, ok is false and callers leave the work to nats.go.
func plainLayout(js jetstream.JetStream) (nc *nats.Conn, timeout time.Duration, ok bool) {
	o := js.Options()
	if o.Domain != "" || (o.APIPrefix != "" && o.APIPrefix != jetstream.DefaultAPIPrefix) || js.Conn() == nil {
		return nil, 0, false
	}
	timeout = o.DefaultTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	return js.Conn(), timeout, true
}

// bounded gives a context without a deadline the library's default one,
// as nats.go does for its requests; cancel must be called.
func bounded(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, timeout)
}

// Create writes key when it has no value.
func (kv *casKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if len(opts) == 0 {
		if rev, done, err := kv.write(ctx, key, value, 0); done {
			return rev, err
		}
	}
	return kv.KeyValue.Create(ctx, key, value, opts...)
}

// Update writes key when its last revision is revision.
func (kv *casKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if rev, done, err := kv.write(ctx, key, value, revision); done {
		return rev, err
	}
	return kv.KeyValue.Update(ctx, key, value, revision)
}

// write publishes value to key expecting last as the key's last revision.
// done is false when the library must take the write over: nothing was
// stored.
func (kv *casKV) write(ctx context.Context, key string, value []byte, last uint64) (rev uint64, done bool, err error) {
	if !plainKey(key) {
		return 0, false, nil
	}
	m := &nats.Msg{Subject: kv.prefix + key, Data: value,
		Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(last, 10)}}}
	ctx, cancel := bounded(ctx, kv.timeout)
	defer cancel()
	resp, err := kv.nc.RequestMsgWithContext(ctx, m)
	if errors.Is(err, nats.ErrNoResponders) {
		return 0, false, nil
	}
	if err != nil {
		return 0, true, err
	}
	seq, refused, ok := readPubAck(resp.Data)
	switch {
	case refused:
		return 0, false, nil
	case !ok:
		return 0, true, jetstream.ErrInvalidJSAck
	}
	return seq, true, nil
}

// readPubAck reads a publish acknowledgement: the sequence it was stored
// at, or that the server refused it (an "error" member: the name followed
// by a colon, which a string value, such as a stream or domain named
// error, never is). Anything else is not an acknowledgement (ok false).
func readPubAck(b []byte) (seq uint64, refused, ok bool) {
	if bytes.Contains(b, []byte(`"error":`)) {
		return 0, true, true
	}
	if !bytes.Contains(b, []byte(`"stream":"`)) || bytes.Contains(b, []byte(`"stream":""`)) {
		return 0, false, false
	}
	i := bytes.Index(b, []byte(`"seq":`))
	if i < 0 {
		return 0, false, false
	}
	rest := b[i+len(`"seq":`):]
	n := 0
	for n < len(rest) && rest[n] >= '0' && rest[n] <= '9' {
		n++
	}
	if n == 0 || n >= len(rest) || (rest[n] != ',' && rest[n] != '}') {
		return 0, false, false
	}
	seq, err := strconv.ParseUint(string(rest[:n]), 10, 64)
	if err != nil {
		return 0, false, false
	}
	return seq, false, true
}

// plainKey is nats.go's rule for a key (letters, digits, -/_=. with no
// dot at either end or twice in a row) without its regular expression.
func plainKey(key string) bool {
	if key == "" || key[0] == '.' || key[len(key)-1] == '.' {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '/', c == '_', c == '=':
		case c == '.':
			if key[i-1] == '.' {
				return false
			}
		default:
			return false
		}
	}
	return true
}
