package worker

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
)

// TestStartFailuresInARowDrain: StopAfterStartFailures counts attempts
// in a row whose command could not start; one whose command ran, however
// it exited, starts the count over, and one handed back uncharged
// (interrupted, preempted, lease lost) neither counts nor resets. At the
// limit, with another worker of the class starting commands since the
// failures began, the worker drains, once, saying why; zero never drains.
func TestStartFailuresInARowDrain(t *testing.T) {
	ctx := context.Background()
	newW := func(limit int) *Worker {
		return &Worker{cfg: Config{StopAfterStartFailures: limit}, host: "h", log: slog.New(slog.NewTextHandler(io.Discard, nil)), drain: make(chan struct{}),
			peers: []stream.WorkerReport{{Name: "w2", Slots: map[string]int{"cpu": 1}, LastStarted: time.Now().Add(time.Hour)}}}
	}
	drained := func(w *Worker) bool { return isClosed(w.drain) }
	w := newW(3)
	for _, o := range []string{stream.OutcomeStart, stream.OutcomeStage, stream.OutcomeExit, stream.OutcomeStart, stream.OutcomeStage,
		stream.OutcomeInterrupted, stream.OutcomePreempted, stream.OutcomeLeaseLost} {
		w.noteStart(ctx, "cpu", o, "x")
	}
	if drained(w) || w.Failed() != "" {
		t.Fatalf("drained after 2 start errors in a row (a command that ran between, then hand-backs): %q", w.Failed())
	}
	w.noteStart(ctx, "cpu", stream.OutcomeStart, "the run's directory /d, where the command runs, does not exist on host h")
	if !drained(w) || !strings.Contains(w.Failed(), "the last 3 attempts could not start their command on host h (the last: the run's directory /d") ||
		!strings.Contains(w.Failed(), "while worker w2 started commands") {
		t.Fatalf("after the third start error in a row: drained %v, %q", drained(w), w.Failed())
	}
	first := w.Failed()
	w.noteStart(ctx, "cpu", stream.OutcomeStart, "another")
	if w.Failed() != first {
		t.Fatalf("the reason changed after the drain: %q, was %q", w.Failed(), first)
	}
	w = newW(0)
	for range 20 {
		w.noteStart(ctx, "cpu", stream.OutcomeStart, "x")
	}
	if drained(w) || w.Failed() != "" {
		t.Fatal("drained with StopAfterStartFailures 0")
	}
}

// TestStartFailuresEverywhereHold: at the limit, where no other worker of
// the class has started a command since the failures began (a file
// server away for every host), the worker holds its fetches instead of
// stopping: 10 s, doubling at each limit reached again; a command that
// starts ends the hold; a peer whose report predates the failures is
// waited for a report period; past outageMax of it the worker stops.
func TestStartFailuresEverywhereHold(t *testing.T) {
	ctx := context.Background()
	w := &Worker{cfg: Config{StopAfterStartFailures: 2, ReportEvery: 3 * time.Second}, host: "h", log: slog.New(slog.NewTextHandler(io.Discard, nil)), drain: make(chan struct{}),
		peers: []stream.WorkerReport{{Name: "idle", Slots: map[string]int{"cpu": 1}, Reported: time.Now().Add(time.Hour), LastStarted: time.Now().Add(-time.Hour)},
			{Name: "other-class", Slots: map[string]int{"gpu": 1}, Reported: time.Now().Add(time.Hour), LastStarted: time.Now().Add(time.Hour)}}}
	fail := func() {
		w.noteStart(ctx, "cpu", stream.OutcomeStart, "input /nfs/in/a is missing on host h (it was there at submit)")
	}
	held := func() (string, time.Duration) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.outageWhy, time.Until(w.outageUntil).Round(time.Second)
	}
	fail()
	if why, _ := held(); why != "" {
		t.Fatalf("held after 1 start failure of 2: %q", why)
	}
	fail()
	why, left := held()
	if isClosed(w.drain) || w.outageHeld() == "" || left != outageFirst ||
		!strings.Contains(why, "the last 2 attempts could not start their command on host h (the last: input /nfs/in/a is missing") ||
		!strings.Contains(why, "no other worker serving class cpu started a command meanwhile") {
		t.Fatalf("at the limit with no peer starting commands: drained %v, held %q for %s; want a hold of %s", isClosed(w.drain), why, left, outageFirst)
	}
	w.mu.Lock()
	w.outageUntil = time.Now() // the wait is over: the next attempt fails too
	w.mu.Unlock()
	fail()
	if _, left := held(); left != 2*outageFirst {
		t.Fatalf("the second hold: %s, want %s", left, 2*outageFirst)
	}
	w.noteStart(ctx, "cpu", stream.OutcomeExit, "exit status 1")
	if why := w.outageHeld(); why != "" || isClosed(w.drain) {
		t.Fatalf("a command started, yet held %q (drained %v)", why, isClosed(w.drain))
	}

	// A peer of the class that reported before the failures began: wait
	// for its next report, not a whole outage wait.
	w.peers = append(w.peers, stream.WorkerReport{Name: "quiet", Slots: map[string]int{"cpu": 1}, Reported: time.Now().Add(-time.Minute)})
	fail()
	fail()
	if why, left := held(); left != 3*time.Second || !strings.Contains(why, "worker quiet has not reported since these failures began") {
		t.Fatalf("with a peer not heard from since: held %q for %s, want 3s (its report period)", why, left)
	}

	// Past outageMax the worker stops.
	w.mu.Lock()
	w.outageUntil, w.outageSince = time.Now(), time.Now().Add(-outageMax)
	w.mu.Unlock()
	fail()
	if !isClosed(w.drain) || !strings.Contains(w.Failed(), "no other worker serving class cpu has started a command since") {
		t.Fatalf("after %s of start failures everywhere: drained %v, %q; want a stop", outageMax, isClosed(w.drain), w.Failed())
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

// TestStartCmdAsExecCmd: startCmd and waitCmd do what exec.Cmd's Start
// and Wait did for a worker's commands: the exit status in an
// *exec.ExitError, the environment and directory as given, stdin from
// /dev/null when none is set, and a clear error, before anything runs,
// for a stream that is not a file.
func TestStartCmdAsExecCmd(t *testing.T) {
	dir := t.TempDir()
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command("/bin/sh", "-c", `echo "$PWD $SHARD_VAR"; read x || echo stdin-empty; exit 3`)
	cmd.Env, cmd.Dir, cmd.Stdout = []string{"SHARD_VAR=v1"}, dir, out
	if err := startCmd(cmd); err != nil {
		t.Fatal(err)
	}
	err = waitCmd(cmd)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 || cmd.ProcessState.ExitCode() != 3 {
		t.Fatalf("wait: %v (state %v), want exit status 3", err, cmd.ProcessState)
	}
	b, _ := os.ReadFile(out.Name())
	if got, want := string(b), dir+" v1\nstdin-empty\n"; got != want {
		t.Errorf("the command wrote %q, want %q", got, want)
	}

	ok := exec.Command("true")
	if err := startCmd(ok); err != nil {
		t.Fatal(err)
	}
	if err := waitCmd(ok); err != nil || !ok.ProcessState.Success() {
		t.Errorf("true: %v, state %v", err, ok.ProcessState)
	}

	if err := startCmd(exec.Command(filepath.Join(dir, "missing"))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing program: %v, want not exist", err)
	}
	if err := startCmd(exec.Command("no-such-program-shardpool")); !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("a program not on PATH: %v, want exec.ErrNotFound", err)
	}
	marker := filepath.Join(dir, "ran")
	bad := exec.Command("touch", marker)
	bad.Stdout = new(strings.Builder)
	if err := startCmd(bad); err == nil || !strings.Contains(err.Error(), "not a file") {
		t.Errorf("stdout not a file: %v, want an error saying so", err)
	}
	if _, err := os.Stat(marker); err == nil || bad.Process != nil {
		t.Errorf("the command ran")
	}
}
