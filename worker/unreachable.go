package worker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/stream"
)

// A coordinator that does not answer for a while (a restart, an upgrade,
// a crash and its restart on the same --data) is not a reason to lose
// work. A lease renewal that got no answer was taken for a lost lease: the
// running command was killed at the next heartbeat, and a command that had
// ended had its output discarded at the commit, so a coordinator restart
// of ten seconds killed every running shard of the fleet, hours into their
// work, and ran them again. Now:
//
//   - a heartbeat whose renewal gets no answer keeps the command running
//     and tries again every second; only a store that answers that the
//     lease is another's ends it (renew, retake);
//   - a commit that cannot reach the store keeps the output and tries
//     again until the coordinator answers (untilStore), keeping the
//     message in progress meanwhile;
//   - a lease that expired during the outage and that no one else took is
//     taken back (retake); one that another worker took is lost, as before.
//
// What makes this safe is unchanged: an output is published only after
// this attempt won the shard's commit claim in the store, and a lease is
// renewed (or taken back) before the claim.

// errStoreUnreachable: a request to the coordinator's store got no answer.
// It is an errCoordinator: where the wait for an answer is given up (the
// worker stops), the attempt is handed back uncharged like any other the
// store did not take.
var errStoreUnreachable = fmt.Errorf("%w: no answer", errCoordinator)

// unreachable says whether err is a request to the coordinator's store
// that got no answer: a timeout, no responders (JetStream not ready yet
// after a restart), a connection down or closed. A store that answered
// (a conflict, a full store) is not unreachable.
func unreachable(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, errStoreUnreachable) {
		return true
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		// "temporarily unavailable", "jetstream not enabled" (yet): 503;
		// a full store answers 503 too, and is full, not away.
		return api.Code == 503 && !stream.IsStoreFull(err)
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrDisconnected) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, jetstream.ErrServerShutdown)
}

// retake takes this attempt's lease back after the store answered that
// l.rev is not its last revision. The lease expired while the store could
// not be reached and no one took it (it is absent): created again. A
// renewal of this attempt's was applied but its answer lost (the lease is
// this very owner's): renewed from that revision. Another owner's: lost.
func (w *Worker) retake(ctx context.Context, l *lease, data []byte) error {
	e, err := w.b.Leases.Get(ctx, l.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		sent := time.Now()
		rev, err := w.b.Leases.Create(ctx, l.key, data)
		if err != nil {
			if stream.IsConflict(err) {
				return fmt.Errorf("%w: taken by another worker as it expired", ErrLeaseLost)
			}
			return err
		}
		l.rev, l.confirmed = rev, sent
		// Or this process did not run (stopped with Ctrl-Z or SIGSTOP, a
		// suspended job, a frozen VM): another worker may have run the
		// shard meanwhile, and the commit claim then discards this
		// attempt's output.
		w.log.Info("lease taken back: it expired before this worker could renew it (the coordinator not answering, or this process stopped), and no one holds it now", "shard", l.key)
		return nil
	}
	if err != nil {
		return err
	}
	var cur stream.Lease
	if derr := stream.Decode(e.Value(), &cur); derr != nil || cur.Owner != l.rec.Owner {
		return fmt.Errorf("%w: held by worker %s on %s pid %d (attempt %d)", ErrLeaseLost, cur.Owner.Worker, cur.Owner.Host, cur.Owner.PID, cur.Owner.Attempt)
	}
	sent := time.Now()
	rev, err := w.b.Leases.Update(ctx, l.key, data, e.Revision())
	if err != nil {
		if stream.IsConflict(err) {
			return fmt.Errorf("%w: changed under it: %v", ErrLeaseLost, err)
		}
		return err
	}
	l.rev, l.confirmed = rev, sent
	return nil
}

// StoreRefusesWrites tells the worker that its coordinator's store takes
// no more writes (a `run` stopping on a full store): what the worker
// still writes (records, leases, hand-backs, its report) gives up at
// once instead of each waiting out its request's timeout.
// `run` took 18 s after its disk filled to say so and stop, 12 s of them
// in such waits (TestFullStoreStopsTheRunAndItResumes).
func (w *Worker) StoreRefusesWrites() {
	if w.markStoreGone != nil {
		w.markStoreGone()
	}
}

// storeCtx is ctx, ended too once the store takes no more writes
// (StoreRefusesWrites): a write then gives up at once, also one already
// waiting, instead of waiting out its request's timeout.
func (w *Worker) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	if w.storeGone == nil {
		return ctx, cancel // a worker not made by New: a profile's
	}
	stop := context.AfterFunc(w.storeGone, cancel)
	return ctx, func() {
		stop()
		cancel()
	}
}

// exitWrite is the context of a write on the worker's way out (or of an
// attempt's): parent's values without its end, for at most wait, and
// ended once the store takes no more writes (storeCtx).
func (w *Worker) exitWrite(parent context.Context, wait time.Duration) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(parent), wait)
	ctx, end := w.storeCtx(ctx)
	return ctx, func() {
		end()
		cancel()
	}
}

// untilStore runs f, and again every second while it fails because the
// coordinator's store does not answer, until it answers, ctx ends or the
// worker stops (a.stop: then the output is given up, as before): a
// finished attempt's output is kept and committed once the coordinator
// is back, rather than discarded and its command run again. The
// delivery is kept in progress meanwhile. The wait is said once, in the
// log and the run's admission.log. A drain (SIGUSR1) waits: its shards
// end as they would. A store that takes no more writes
// (StoreRefusesWrites) ends the wait, and the try in flight: f's ctx ends.
func (w *Worker) untilStore(ctx context.Context, a *attemptState, f func(context.Context) error) error {
	ctx, cancel := w.storeCtx(ctx)
	defer cancel()
	var since time.Time
	for {
		err := f(ctx)
		if err == nil || !unreachable(err) || ctx.Err() != nil {
			if err == nil && !since.IsZero() {
				w.admission(a.m.Run, a.m.ID, a.m.Class, "resume", fmt.Sprintf("the coordinator answers again after %s; committing the output kept", time.Since(since).Round(time.Second)))
			}
			return err
		}
		if since.IsZero() {
			since = time.Now()
			w.log.Warn("coordinator unreachable at the commit: the output is kept until it answers", "shard", a.key, "err", err)
			w.admission(a.m.Run, a.m.ID, a.m.Class, "wait", "coordinator unreachable at the commit ("+err.Error()+"); the output is kept until it answers")
		}
		_ = a.msg.InProgress()
		select {
		case <-ctx.Done():
			return err
		case <-a.stop:
			return err
		case <-time.After(time.Second):
		}
	}
}
