package worker

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/shardpool/shardpool/stream"
)

// TestStartFailuresInARowDrain: StopAfterStartFailures counts attempts
// in a row whose command could not start; one whose command ran, however
// it exited, starts the count over, and one handed back uncharged
// (interrupted, preempted, lease lost) neither counts nor resets. At the
// limit the worker drains, once, saying why; zero never drains.
func TestStartFailuresInARowDrain(t *testing.T) {
	newW := func(limit int) *Worker {
		return &Worker{cfg: Config{StopAfterStartFailures: limit}, host: "h", log: slog.New(slog.NewTextHandler(io.Discard, nil)), drain: make(chan struct{})}
	}
	drained := func(w *Worker) bool { return isClosed(w.drain) }
	w := newW(3)
	for _, o := range []string{stream.OutcomeStart, stream.OutcomeStage, stream.OutcomeExit, stream.OutcomeStart, stream.OutcomeStage,
		stream.OutcomeInterrupted, stream.OutcomePreempted, stream.OutcomeLeaseLost} {
		w.noteStart(o, "x")
	}
	if drained(w) || w.Failed() != "" {
		t.Fatalf("drained after 2 start errors in a row (a command that ran between, then hand-backs): %q", w.Failed())
	}
	w.noteStart(stream.OutcomeStart, "the run's directory /d, where the command runs, does not exist on host h")
	if !drained(w) || !strings.Contains(w.Failed(), "the last 3 attempts could not start their command on host h (the last: the run's directory /d") {
		t.Fatalf("after the third start error in a row: drained %v, %q", drained(w), w.Failed())
	}
	first := w.Failed()
	w.noteStart(stream.OutcomeStart, "another")
	if w.Failed() != first {
		t.Fatalf("the reason changed after the drain: %q, was %q", w.Failed(), first)
	}
	w = newW(0)
	for range 20 {
		w.noteStart(stream.OutcomeStart, "x")
	}
	if drained(w) || w.Failed() != "" {
		t.Fatal("drained with StopAfterStartFailures 0")
	}
}

// TestFailedInARowStartsOverOnAValidatedShard: the report's count of
// failed attempts in a row grows with each, keeps the last reason (cut to
// 300 bytes), and starts over when the worker validates a shard; a shard
// failed after its retries counts no more than its attempt did.
func TestFailedInARowStartsOverOnAValidatedShard(t *testing.T) {
	w := &Worker{poke: make(chan struct{}, 1)}
	report := func() (int, string) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.failedInARow, w.lastFailure
	}
	w.attemptFailed(context.Background(), "t.a", "cpu", "t a: exit status 1")
	w.attemptFailed(context.Background(), "t.b", "cpu", "t b: "+strings.Repeat("x", 500))
	w.attemptFailed(context.Background(), "t.a", "cpu", "t a: exit status 1")
	w.attemptFailed(context.Background(), "t.b", "cpu", "t b: "+strings.Repeat("x", 500))
	w.count(false)
	if n, last := report(); n != 4 || len(last) != 303 || !strings.HasPrefix(last, "t b: xxx") {
		t.Fatalf("after four failed attempts: %d in a row, last %q; want 4 and the last one's reason cut to 300 bytes", n, last)
	}
	if !slices.Equal(w.streakKeys, []string{"t.a", "t.b"}) || w.chargedHere != 4 {
		t.Fatalf("streak's shards %q, %d charged attempts; want each shard once, most recent last, and 4", w.streakKeys, w.chargedHere)
	}
	w.count(true)
	if n, last := report(); n != 0 || last != "" || len(w.streakKeys) != 0 || w.chargedHere != 5 {
		t.Fatalf("after a validated shard: %d in a row, last %q, streak %q, %d charged; want 0, none, none and 5", n, last, w.streakKeys, w.chargedHere)
	}
}
