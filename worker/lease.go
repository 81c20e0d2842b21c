package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
)

// lease is a held shard lease; rev is the revision to renew from.
type lease struct {
	key string
	rec stream.Lease
	rev uint64
	// confirmed is when the server last acknowledged the lease; it lives at
	// least until confirmed + TTL.
	confirmed time.Time
}

// takeLease takes the shard's lease with Create. An existing lease is taken
// over only when its owner is verified gone: the same boot of this host and
// a process that no longer exists (or this very worker process). Otherwise
// ErrLeaseHeld, and the caller waits for the TTL to expire it.
func (w *Worker) takeLease(ctx context.Context, key, fp string, attempt int) (_ *lease, err error) {
	// An attempt of this shard in flight in this very process (a delivery
	// sent again, as after a coordinator restart, while the first is still
	// committing) holds it, whatever the lease's owner check would say of
	// this process: ownerGone takes an owner with this pid for an earlier,
	// finished attempt. The mark lasts until the attempt ends (disown).
	w.mu.Lock()
	if w.owning[key] {
		w.mu.Unlock()
		return nil, fmt.Errorf("take lease %s: %w: another delivery of it is in flight in this worker", key, ErrLeaseHeld)
	}
	w.owning[key] = true
	w.mu.Unlock()
	ctx, cancel := w.storeCtx(ctx)
	defer cancel()
	defer func() {
		if err != nil {
			w.disown(key)
		}
	}()
	now := time.Now().UTC()
	l := stream.Lease{Owner: w.owner(attempt),
		Fingerprint: fp, Taken: now, Renewed: now}
	data, err := stream.Encode(&l)
	if err != nil {
		return nil, err
	}
	for range 3 {
		sent := time.Now()
		rev, err := w.b.Leases.Create(ctx, key, data)
		if err == nil {
			return &lease{key: key, rec: l, rev: rev, confirmed: sent}, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("take lease %s: %w", key, err)
		}
		e, gerr := w.b.Leases.Get(ctx, key)
		if errors.Is(gerr, jetstream.ErrKeyNotFound) {
			continue // expired between the two calls
		}
		if gerr != nil {
			return nil, fmt.Errorf("take lease %s: %w", key, gerr)
		}
		var cur stream.Lease
		if derr := stream.Decode(e.Value(), &cur); derr == nil && !w.ownerGone(cur.Owner) {
			return nil, fmt.Errorf("take lease %s: %w: worker %s on %s pid %d", key, ErrLeaseHeld, cur.Owner.Worker, cur.Owner.Host, cur.Owner.PID)
		}
		// Verified gone (or unreadable): take it over from its revision, so a
		// concurrent taker cannot also win.
		sent = time.Now()
		rev, err = w.b.Leases.Update(ctx, key, data, e.Revision())
		if err == nil {
			return &lease{key: key, rec: l, rev: rev, confirmed: sent}, nil
		}
	}
	return nil, fmt.Errorf("take lease %s: %w", key, ErrLeaseHeld)
}

// disown ends this process's hold on a shard taken by takeLease.
func (w *Worker) disown(key string) {
	w.mu.Lock()
	delete(w.owning, key)
	w.mu.Unlock()
}

// ownerGone is true only when this host can prove the owner is not running:
// it was this same process (an earlier attempt here), or it ran on this boot
// of this host, in this pid namespace, and its process is gone. Without a
// readable boot ID and namespace nothing is proven: a pid is only
// meaningful within one namespace on one boot of one host (two containers
// on a host share its name and boot ID). Owners on other hosts are never
// proven gone here; their leases end by TTL.
func (w *Worker) ownerGone(o stream.Owner) bool {
	if o.Host != w.host || !stream.SamePIDSpace(w.boot, w.pidns, o.BootID, o.PIDNS) {
		return false
	}
	if o.PID == w.pid && o.Worker == w.cfg.Name {
		return true
	}
	return !pidAlive(o.PID)
}

// renew extends the lease by updating it from its revision. It fails with
// ErrLeaseLost only where the store answered that the lease is another's;
// a store that did not answer is errStoreUnreachable, one that refused the
// write (full) errCoordinator.
func (w *Worker) renew(ctx context.Context, l *lease) error {
	sent := time.Now()
	l.rec.Renewed = sent.UTC()
	data, err := stream.Encode(&l.rec)
	if err != nil {
		return err
	}
	rev, err := w.b.Leases.Update(ctx, l.key, data, l.rev)
	if err == nil {
		l.rev, l.confirmed = rev, sent
		return nil
	}
	if !stream.IsConflict(err) {
		// No answer, or not about the lease (a full store): it may well be
		// held still (unreachable.go).
		return storeErr(fmt.Errorf("renew lease %s: %w", l.key, err))
	}
	// The store answered that l.rev is not the lease's last revision.
	if rerr := w.retake(ctx, l, data); rerr != nil {
		if errors.Is(rerr, ErrLeaseLost) {
			return fmt.Errorf("renew lease %s: %w", l.key, rerr)
		}
		return storeErr(fmt.Errorf("renew lease %s: %w", l.key, rerr))
	}
	return nil
}

// storeErr marks err, a request the store did not answer or did not take,
// as errStoreUnreachable or errCoordinator (a full store).
func storeErr(err error) error {
	if unreachable(err) {
		return fmt.Errorf("%w: %w", errStoreUnreachable, err)
	}
	return fmt.Errorf("%w: %w", errCoordinator, err)
}

// ensureHeld makes sure the lease outlives the next step: a lease confirmed
// less than half a TTL ago is still held for at least half a TTL; an older
// one is renewed, which fails if another owner took it.
func (w *Worker) ensureHeld(ctx context.Context, l *lease) error {
	if time.Since(l.confirmed) < w.ttl/2 {
		return nil
	}
	return w.renew(ctx, l)
}

// release deletes the lease if it is still ours, so another worker can take
// the shard at once instead of after the TTL.
func (w *Worker) release(l *lease) {
	ctx, cancel := w.exitWrite(context.Background(), 2*time.Second)
	defer cancel()
	_ = w.b.Leases.Delete(ctx, l.key, jetstream.LastRevision(l.rev))
}

// requeueNow hands a delivery back to the queue for immediate redelivery
// and waits until the server has taken it. A plain Nak only puts the
// message on the consumer's in-memory redelivery queue: if the coordinator
// stops soon after (the end of an interrupted `shardpool run`), its store
// still holds the delivery as pending from the time it was sent, and after
// a restart it waits out the whole ack wait. A Nak with a delay rewrites
// that stored time, so the delivery is due at once, also after a restart.
func (w *Worker) requeueNow(reply string) error {
	if w.cfg.JetStream == nil || reply == "" || !w.cfg.JetStream.Conn().IsConnected() {
		// A worker draining while its coordinator is away does not wait
		// for answers that cannot come: the caller's plain Nak is buffered.
		return errors.New("not connected to hand the delivery back on")
	}
	_, err := w.cfg.JetStream.Conn().Request(reply, nakNow, 2*time.Second)
	return err
}

// nakNow is a Nak due 1 ms from now (a zero delay would be a plain Nak).
var nakNow = []byte(`-NAK {"delay": 1000000}`)

// handBackUnstarted returns a delivery that reached a shutting-down worker
// before it was started. Its delivery count went up all the same, so the
// shard's record counts it as interrupted (best effort, compare-and-set):
// a worker stopped twice must not leave a shard out of attempts it never
// used.
func (w *Worker) handBackUnstarted(msg jetstream.Msg) {
	var m stream.ShardMsg
	if w.b != nil && w.cfg.JetStream.Conn().IsConnected() && stream.Decode(msg.Data(), &m) == nil {
		ctx, cancel := w.exitWrite(context.Background(), 2*time.Second)
		a := &attemptState{msg: msg, m: m, key: stream.ShardKey(m.Run, m.ID)}
		if err := w.loadRecord(ctx, a); err == nil && a.rec.State == stream.ShardPending {
			a.rec.Interrupted++
			a.rec.Reason = "handed back unstarted by a worker's shutdown"
			if err := w.putRecord(ctx, a); err != nil {
				w.log.Warn("count an unstarted delivery", "shard", a.key, "err", err)
			}
		}
		cancel()
	}
	w.requeue(msg)
}

// requeue hands msg back for immediate redelivery (requeueNow), or with a
// plain Nak where that cannot be done.
func (w *Worker) requeue(msg jetstream.Msg) {
	if err := w.requeueNow(msg.Reply()); err != nil {
		_ = msg.Nak()
	}
}
