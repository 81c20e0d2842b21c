package worker_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The nats client keeps a flusher per connection until Close, and
		// the embedded server's file store has a background timer goroutine
		// that outlives Shutdown by design.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).expireMsgs"),
		goleak.IgnoreAnyFunction("time.Sleep"),
	)
}

// copyJob copies each input into {out} and appends its id to a side-effect
// log outside the outputs, which counts how many times the command ran.
func copyJob(t *testing.T, shards, retries int, extra string) (spec, runs string) {
	runs = filepath.Join(t.TempDir(), "runs.log")
	spec = testenv.WriteJob(t, testenv.Job{Shards: shards, Retries: retries, Extra: extra,
		Command: []string{"sh", "-c", `echo "$1" >> "$3" && cp "$2" "$4/"`, "sh", "{id}", "{input}", runs, "{out}"}})
	return spec, runs
}

func countLines(t *testing.T, path string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]int{}
	}
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, l := range strings.Fields(string(b)) {
		n[l]++
	}
	return n
}

func TestRunCompletesAndOutputsVerify(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	spec, runs := copyJob(t, 12, 0, "")
	res := env.Submit(spec, coordinator.SubmitOptions{Resume: "shardpool run " + spec})
	if res.Published != 12 || !res.NewRun {
		t.Fatalf("submit: got %+v, want 12 published, new run", res)
	}
	r := env.WaitState("t", 30*time.Second, stream.RunComplete)
	if r.Counts.Validated != 12 || r.Counts.Failed != 0 {
		t.Fatalf("counts: got %+v, want 12 validated", r.Counts)
	}
	for i := range 12 {
		id := fmt.Sprintf("s%04d", i)
		mk, err := checkpoint.Verify(filepath.Join(filepath.Dir(spec), "out", id))
		if err != nil {
			t.Fatalf("output %s: %v", id, err)
		}
		if mk.Fingerprint != r.Fingerprint || mk.Files != 1 {
			t.Fatalf("output %s marker: got fingerprint %s files %d, want %s and 1", id, mk.Fingerprint, mk.Files, r.Fingerprint)
		}
	}
	for id, n := range countLines(t, runs) {
		if n != 1 {
			t.Errorf("shard %s ran %d times, want 1", id, n)
		}
	}
	// Evidence: final.json with every checksum, resume.txt, admission.log, attempt logs.
	ev := env.Coord.EvidenceDir("t")
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		_, err := os.Stat(filepath.Join(ev, "final.json"))
		return err == nil, "final.json not written"
	})
	var final coordinator.Final
	b, _ := os.ReadFile(filepath.Join(ev, "final.json"))
	if err := json.Unmarshal(b, &final); err != nil {
		t.Fatalf("final.json: %v", err)
	}
	if final.State != stream.RunComplete || len(final.Shards) != 12 || final.Shards[0].Checksum == "" {
		t.Fatalf("final.json: got state %s with %d shards (first checksum %q), want COMPLETE, 12, a checksum", final.State, len(final.Shards), final.Shards[0].Checksum)
	}
	if b, err := os.ReadFile(filepath.Join(ev, "resume.txt")); err != nil || !strings.Contains(string(b), spec) {
		t.Fatalf("resume.txt: got %q (%v), want the resume command", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(ev, "admission.log")); err != nil || strings.Count(string(b), "decision=admit") != 12 {
		t.Fatalf("admission.log: got %d admits (%v), want 12", strings.Count(string(b), "decision=admit"), err)
	}
	// The job prints nothing: no attempt log is made, and the record says so.
	if _, err := os.Stat(filepath.Join(ev, "attempts", "s0000.1.log")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("attempt log of a silent command: got %v, want no file", err)
	}
	if r, err := env.Shard("t", "s0000"); err != nil || len(r.Attempts) != 1 || r.Attempts[0].Log != "" {
		t.Fatalf("record of a silent attempt: got %+v (%v), want one attempt without a log", r.Attempts, err)
	}
}

// TestAttemptLogHoldsOutput: a command's stdout and stderr go to its
// attempt's log, named in the record; the log is created by the first byte.
func TestAttemptLogHoldsOutput(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Command: []string{"sh", "-c",
		`if [ "$1" = s0001 ]; then echo "to stdout $1"; echo "to stderr $1" >&2; fi`, "sh", "{id}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	r, err := env.Shard("t", "s0001")
	if err != nil || len(r.Attempts) != 1 || r.Attempts[0].Log == "" {
		t.Fatalf("record: got %+v (%v), want one attempt with its log", r.Attempts, err)
	}
	b, err := os.ReadFile(r.Attempts[0].Log)
	if err != nil || string(b) != "to stdout s0001\nto stderr s0001\n" {
		t.Fatalf("attempt log %s: got %q (%v), want both lines in order", r.Attempts[0].Log, b, err)
	}
	if filepath.Base(r.Attempts[0].Log) != "s0001.1.log" {
		t.Fatalf("attempt log name: got %s, want s0001.1.log", r.Attempts[0].Log)
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(r.Attempts[0].Log), "s0000.1.log")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("silent shard's log: got %v, want none", err)
	}

	// A new generation's deliveries count from 1 again: its attempt log
	// takes a free name beside the first generation's, which stays.
	edited, _ := os.ReadFile(spec)
	if err := os.WriteFile(spec, []byte(strings.Replace(string(edited), "to stdout", "now to stdout", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	if b, _ := os.ReadFile(r.Attempts[0].Log); string(b) != "to stdout s0001\nto stderr s0001\n" {
		t.Fatalf("the first generation's log after the second ran: %q, want it kept", b)
	}
	r2, err := env.Shard("t", "s0001")
	if err != nil || len(r2.Attempts) != 1 || filepath.Base(r2.Attempts[0].Log) != "s0001.1-2.log" {
		t.Fatalf("second generation's record: %+v (%v), want one attempt logged to s0001.1-2.log", r2.Attempts, err)
	}
	if b, _ := os.ReadFile(r2.Attempts[0].Log); string(b) != "now to stdout s0001\nto stderr s0001\n" {
		t.Fatalf("the second generation's log: %q, want its own output", b)
	}
}

func TestResubmitIsNoOpAndChangeIsNewGeneration(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	spec, runs := copyJob(t, 5, 0, "")
	env.Submit(spec, coordinator.SubmitOptions{})
	first := env.WaitState("t", 30*time.Second, stream.RunComplete)
	// The run is COMPLETE once every record says validated; the last
	// message's ack may land a moment later, so the stream's sequence, not
	// its message count, is what says whether the resubmit published.
	s, err := env.JS.Stream(context.Background(), stream.StreamShards)
	if err != nil {
		t.Fatal(err)
	}
	before, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	again := env.Submit(spec, coordinator.SubmitOptions{})
	if again.Published != 0 || again.NewRun || again.Fingerprint != first.Fingerprint {
		t.Fatalf("resubmit: got %+v, want nothing published, same fingerprint %s", again, first.Fingerprint)
	}
	after, err := s.Info(context.Background())
	if err != nil || after.State.LastSeq != before.State.LastSeq {
		t.Fatalf("stream's last sequence after a no-op resubmit: got %d (%v), want %d", after.State.LastSeq, err, before.State.LastSeq)
	}
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		info, err := s.Info(context.Background())
		if err != nil {
			return false, err.Error()
		}
		return info.State.Msgs == 0, fmt.Sprintf("stream holds %d messages, want 0", info.State.Msgs)
	})
	// A changed env is a new fingerprint: every shard runs again.
	b, _ := os.ReadFile(spec)
	if err := os.WriteFile(spec, append(b, []byte("env = { MODE = \"v2\" }\n")...), 0o644); err != nil {
		t.Fatal(err)
	}
	changed := env.Submit(spec, coordinator.SubmitOptions{})
	if changed.Fingerprint == first.Fingerprint || changed.Published != 5 || !changed.NewRun {
		t.Fatalf("changed spec: got %+v, want a new fingerprint with 5 published", changed)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		r, err := env.Run("t")
		return err == nil && r.Fingerprint == changed.Fingerprint && r.State == stream.RunComplete, fmt.Sprintf("run %+v", r.Counts)
	})
	mk, err := checkpoint.Verify(filepath.Join(filepath.Dir(spec), "out", "s0000"))
	if err != nil || mk.Fingerprint != changed.Fingerprint {
		t.Fatalf("output after new generation: fingerprint %s (%v), want %s", mk.Fingerprint, err, changed.Fingerprint)
	}
	for id, n := range countLines(t, runs) {
		if n != 2 {
			t.Errorf("shard %s ran %d times over two generations, want 2", id, n)
		}
	}
}

func TestCommittedOutputIsSkippedOnFreshCoordinator(t *testing.T) {
	spec, runs := copyJob(t, 4, 0, "")
	env := testenv.New(t, testenv.Options{})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	env.Close()
	// A new data directory knows nothing; the outputs' markers carry the fingerprint.
	env2 := testenv.New(t, testenv.Options{})
	env2.Submit(spec, coordinator.SubmitOptions{})
	env2.WaitState("t", 30*time.Second, stream.RunComplete)
	for id, n := range countLines(t, runs) {
		if n != 1 {
			t.Errorf("shard %s ran %d times, want 1 (second run must skip verified outputs)", id, n)
		}
	}
	// A corrupted output is not taken as done.
	out := filepath.Join(filepath.Dir(spec), "out", "s0001", "s0001.txt")
	if err := os.WriteFile(out, []byte("tampered"), 0o644); err != nil {
		t.Fatal(err)
	}
	env2.Close()
	env3 := testenv.New(t, testenv.Options{})
	env3.Submit(spec, coordinator.SubmitOptions{})
	env3.WaitState("t", 30*time.Second, stream.RunComplete)
	if n := countLines(t, runs)["s0001"]; n != 2 {
		t.Fatalf("tampered shard ran %d times in total, want 2", n)
	}
	if _, err := checkpoint.Verify(filepath.Dir(out)); err != nil {
		t.Fatalf("redone output: %v", err)
	}
}

func TestFailingShardRetriesThenBlocksThenRetryFailedCompletes(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	dir := t.TempDir()
	gate := filepath.Join(dir, "ok")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Retries: 1,
		Command: []string{"sh", "-c", `[ "$1" != s0001 ] || [ -f "$2" ] || { echo working; echo "boom: no $1" >&2; echo; exit 3; }; cp "$3" "$4/"`, "sh", "{id}", gate, "{input}", "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{Retry: "shardpool run --retry-failed " + spec})
	r := env.WaitState("t", 30*time.Second, stream.RunBlocked)
	if r.Counts.Failed != 1 || r.Counts.Validated != 2 {
		t.Fatalf("counts: got %+v, want 1 failed 2 validated", r.Counts)
	}
	// The reason says how many attempts, and quotes the child's last line
	// that is not blank, so the summary shows why without the log.
	want := `s0001 (after 2 attempt(s): exit status 3; last output: "boom: no s0001")`
	if !strings.Contains(r.Reason, want) || !strings.Contains(r.Reason, "--retry-failed") {
		t.Fatalf("reason: got %q, want %s and the retry command", r.Reason, want)
	}
	rec, err := env.Shard("t", "s0001")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != stream.ShardFailed || len(rec.Attempts) != 2 || rec.Payload == nil {
		t.Fatalf("record: got state %s, %d attempts, payload %v; want failed, 2, kept", rec.State, len(rec.Attempts), rec.Payload != nil)
	}
	for _, a := range rec.Attempts {
		if a.Outcome != stream.OutcomeExit || a.ExitCode == nil || *a.ExitCode != 3 {
			t.Fatalf("attempt %d: got outcome %s exit %v, want exit 3", a.N, a.Outcome, a.ExitCode)
		}
		if b, err := os.ReadFile(a.Log); err != nil || !strings.Contains(string(b), "boom") {
			t.Fatalf("attempt log %s: got %q (%v), want the child's stderr", a.Log, b, err)
		}
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res := env.Submit(spec, coordinator.SubmitOptions{RetryFailed: true})
	if res.Retried != 1 {
		t.Fatalf("retry: got %d retried, want 1", res.Retried)
	}
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	rec, _ = env.Shard("t", "s0001")
	if rec.State != stream.ShardValidated || len(rec.Attempts) != 3 || rec.Retry != 1 {
		t.Fatalf("after retry: got %s with %d attempts, retry round %d; want validated, 3, 1", rec.State, len(rec.Attempts), rec.Retry)
	}
}

// TestRetryDelayOfTheSpecSpacesTheRetries: a run's retry_delay (here
// 1.5 s, where the test workers' own delay is 100 ms) is what a failed
// shard waits before its next attempt, and its record says so.
func TestRetryDelayOfTheSpecSpacesTheRetries(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	tried := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 1, Extra: "retry_delay = \"1500ms\"\n",
		Command: []string{"sh", "-c", `[ -e "$0/$1" ] || { : > "$0/$1"; exit 3; }; cp "$2" "$3/"`, tried, "{id}", "{input}", "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	rec, err := env.Shard("t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Attempts) != 2 {
		t.Fatalf("attempts: %+v, want 2", rec.Attempts)
	}
	first, second := rec.Attempts[0], rec.Attempts[1]
	gap := second.Start.Sub(first.Start.Add(first.Duration.D()))
	if gap < 1500*time.Millisecond || gap > 10*time.Second {
		t.Fatalf("the retry began %s after the failed attempt ended, want retry_delay's 1.5s (the workers' own is 100ms)", gap)
	}
}

// TestOutputsAndValidatorJudgeExitZero: an attempt that exits 0 is
// committed only when {out} holds every output the spec declares and the
// validator passes; otherwise it is an invalid output, retried and then
// failed like any failure, with nothing published at its destination.
func TestOutputsAndValidatorJudgeExitZero(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	// s0001 writes its result under the wrong name; s0002 writes an empty
	// one, which the validator refuses; the others are sound.
	spec := testenv.WriteJob(t, testenv.Job{Shards: 4, Retries: 1,
		Command: []string{"sh", "-c", `case "$1" in s0001) cp "$2" "$3/wrong.txt";; s0002) : > "$3/$1.txt";; *) cp "$2" "$3/$1.txt";; esac`, "sh", "{id}", "{input}", "{out}"},
		Extra:   "outputs = [\"{id}.txt\"]\nvalidator = [\"test\", \"-s\", \"{out}/{id}.txt\"]\n"})
	env.Submit(spec, coordinator.SubmitOptions{})
	r := env.WaitState("t", 30*time.Second, stream.RunBlocked)
	if r.Counts.Failed != 2 || r.Counts.Validated != 2 {
		t.Fatalf("counts: got %+v, want 2 failed 2 validated", r.Counts)
	}
	for id, want := range map[string]string{
		"s0001": `exit 0, but nothing in {out} matches the spec's outputs ["s0001.txt"] ({out} held ["wrong.txt"])`,
		"s0002": "validator: exit status 1",
	} {
		rec, err := env.Shard("t", id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.State != stream.ShardFailed || len(rec.Attempts) != 2 {
			t.Fatalf("%s: got %s with %d attempts, want failed after 2", id, rec.State, len(rec.Attempts))
		}
		for _, a := range rec.Attempts {
			if a.Outcome != stream.OutcomeInvalid || !strings.Contains(a.Reason, want) {
				t.Fatalf("%s attempt %d: %s %q, want %s %q", id, a.N, a.Outcome, a.Reason, stream.OutcomeInvalid, want)
			}
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(spec), "out", id)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("%s: an invalid output reached its destination (%v)", id, err)
		}
	}
	for _, id := range []string{"s0000", "s0003"} {
		dst := filepath.Join(filepath.Dir(spec), "out", id)
		if _, err := checkpoint.Verify(dst); err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		if _, err := os.Stat(filepath.Join(dst, id+".txt")); err != nil {
			t.Fatalf("%s: declared output not committed: %v", id, err)
		}
	}
}

// TestInterruptedRetryIsPublishedAgain: a retry that reset a failed
// shard's record to a new round but stopped before publishing its message
// left the shard pending with nothing to deliver. Retrying again publishes
// it, and the run completes.
func TestInterruptedRetryIsPublishedAgain(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	gate := filepath.Join(t.TempDir(), "ok")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 0,
		Command: []string{"sh", "-c", `[ "$1" != s0001 ] || [ -f "$2" ] || exit 3; cp "$3" "$4/"`, "sh", "{id}", gate, "{input}", "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunBlocked)
	// The first half of a retry: the record reset, no message published.
	kv, err := env.JS.KeyValue(context.Background(), stream.BucketShards)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(context.Background(), stream.ShardKey("t", "s0001"))
	if err != nil {
		t.Fatal(err)
	}
	var rec stream.ShardRecord
	if err := stream.Decode(e.Value(), &rec); err != nil {
		t.Fatal(err)
	}
	rec.State, rec.Retry, rec.Reason = stream.ShardPending, rec.Retry+1, "retry requested"
	data, _ := stream.Encode(&rec)
	if _, err := kv.Update(context.Background(), e.Key(), data, e.Revision()); err != nil {
		t.Fatal(err)
	}
	env.WaitState("t", 10*time.Second, stream.RunQueued, stream.RunRunning)
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	res := env.Submit(spec, coordinator.SubmitOptions{RetryFailed: true})
	if res.Retried != 1 {
		t.Fatalf("retry after an interrupted retry: got %d retried, want 1", res.Retried)
	}
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	got, _ := env.Shard("t", "s0001")
	if got.State != stream.ShardValidated || got.Retry != 1 || len(got.Attempts) != 2 {
		t.Fatalf("after retry: got %s, round %d, %d attempts; want validated, 1, 2", got.State, got.Retry, len(got.Attempts))
	}
}

// TestResubmittedSettingsReachRunningWorkers: resubmitting the same
// generation with a longer timeout and more retries updates the run (they
// are outside the fingerprint), a worker that read the old record moments
// ago applies them to the retried shards, and a changed output directory
// is refused instead of being reported COMPLETE with nothing in it.
func TestResubmittedSettingsReachRunningWorkers(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 0, Timeout: "200ms",
		Command: []string{"sh", "-c", `sleep 0.6; cp "$1" "$2/"`, "sh", "{input}", "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunBlocked)
	edit := func(old, new string) {
		t.Helper()
		b, err := os.ReadFile(spec)
		if err != nil || !strings.Contains(string(b), old) {
			t.Fatalf("spec %s lacks %q (%v)", spec, old, err)
		}
		if err := os.WriteFile(spec, []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	edit(`timeout = "200ms"`, `timeout = "20s"`+"\nretry_delay = \"200ms\"")
	edit("retries = 0", "retries = 1")
	res := env.Submit(spec, coordinator.SubmitOptions{})
	if got := strings.Join(res.Changed, "; "); got != "retries 0 -> 1; timeout 200ms -> 20s; retry_delay the workers' default -> 200ms" || res.Published != 0 || res.State != stream.RunBlocked {
		t.Fatalf("resubmit with new settings: got changed %q, %d published, state %s; want retries, timeout and retry_delay, 0, BLOCKED", got, res.Published, res.State)
	}
	if r, _ := env.Run("t"); time.Duration(r.Spec.Timeout) != 20*time.Second || r.Spec.Retries != 1 || r.Spec.RetryDelay.D() != 200*time.Millisecond || r.Settings != 1 {
		t.Fatalf("run record after the update: timeout %s, retries %d, retry_delay %s, settings %d; want 20s, 1, 200ms, 1",
			time.Duration(r.Spec.Timeout), r.Spec.Retries, r.Spec.RetryDelay.D(), r.Settings)
	}
	if again := env.Submit(spec, coordinator.SubmitOptions{}); len(again.Changed) != 0 {
		t.Fatalf("the same spec again: got changed %q, want nothing", again.Changed)
	}
	if res := env.Submit(spec, coordinator.SubmitOptions{RetryFailed: true}); res.Retried != 2 {
		t.Fatalf("retry: got %d retried, want 2", res.Retried)
	}
	env.WaitState("t", 30*time.Second, stream.RunComplete)

	edit(`output = "out"`, `output = "elsewhere"`)
	_, err := env.TrySubmit(spec, coordinator.SubmitOptions{})
	if !errors.Is(err, coordinator.ErrSpecConflict) || !regexp.MustCompile(regexp.QuoteMeta(spec)+`:\d+: field "output"`).MatchString(err.Error()) || !strings.Contains(err.Error(), filepath.Join(filepath.Dir(spec), "out")) {
		t.Fatalf("resubmit with another output: got %v, want ErrSpecConflict naming the spec's line, the field and where the outputs are", err)
	}
	if r, _ := env.Run("t"); r.Spec.Output != filepath.Join(filepath.Dir(spec), "out") || r.State != stream.RunComplete {
		t.Fatalf("after the refused resubmit: output %s, state %s; want unchanged", r.Spec.Output, r.State)
	}
	// A new generation in the other directory is refused too: the run's
	// outputs would stay behind in the old one, not be made again.
	before, _ := env.Run("t")
	edit(`sleep 0.6`, `sleep 0.1`)
	_, err = env.TrySubmit(spec, coordinator.SubmitOptions{})
	if !errors.Is(err, coordinator.ErrSpecConflict) || !strings.Contains(err.Error(), "is generation "+before.Fingerprint) ||
		!strings.Contains(err.Error(), "outputs in "+filepath.Join(filepath.Dir(spec), "out")) {
		t.Fatalf("a new generation with another output: got %v, want ErrSpecConflict naming the generation and where its outputs are", err)
	}
	if r, _ := env.Run("t"); r.Fingerprint != before.Fingerprint || r.State != stream.RunComplete {
		t.Fatalf("after the refused new generation: fingerprint %s, state %s; want %s, COMPLETE", r.Fingerprint, r.State, before.Fingerprint)
	}
}

// TestRunsSharingAnOutputDirectory: a second run whose shards would
// replace another run's committed outputs (same ids, other fingerprint) is
// refused; a renamed run of the same fingerprint, or one with other ids,
// may use the same directory.
func TestRunsSharingAnOutputDirectory(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	first := testenv.WriteJob(t, testenv.Job{Name: "first", Shards: 2, Command: []string{"cp", "{input}", "{out}/"}})
	env.Submit(first, coordinator.SubmitOptions{})
	env.WaitState("first", 30*time.Second, stream.RunComplete)
	body, err := os.ReadFile(first)
	if err != nil {
		t.Fatal(err)
	}
	variant := func(name string, edits ...string) string {
		t.Helper()
		b := strings.Replace(string(body), `name = "first"`, fmt.Sprintf("name = %q", name), 1)
		for i := 0; i < len(edits); i += 2 {
			b = strings.Replace(b, edits[i], edits[i+1], 1)
		}
		p := filepath.Join(filepath.Dir(first), name+".toml")
		if err := os.WriteFile(p, []byte(b), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	copied := variant("copied", `code_rev = "test"`, `code_rev = "changed"`)
	_, err = env.TrySubmit(copied, coordinator.SubmitOptions{})
	if !errors.Is(err, coordinator.ErrSpecConflict) || !strings.Contains(err.Error(), "run first") || !strings.Contains(err.Error(), "s0000, s0001") ||
		!regexp.MustCompile(regexp.QuoteMeta(copied)+`:\d+: field "output"`).MatchString(err.Error()) {
		t.Fatalf("a copied spec with the same output: got %v, want ErrSpecConflict at the spec's output line, naming run first and the shared ids", err)
	}
	if _, err := env.Run("copied"); err == nil {
		t.Fatal("the refused run was recorded")
	}
	// Renamed, same fingerprint: its shards are already committed.
	env.Submit(variant("renamed"), coordinator.SubmitOptions{})
	env.WaitState("renamed", 30*time.Second, stream.RunComplete)
	// Other ids: no output of another run is touched.
	b, _ := os.ReadFile(filepath.Join(filepath.Dir(first), "manifest.jsonl"))
	if err := os.WriteFile(filepath.Join(filepath.Dir(first), "other.jsonl"), []byte(strings.ReplaceAll(string(b), `"id":"s`, `"id":"x`)), 0o644); err != nil {
		t.Fatal(err)
	}
	env.Submit(variant("disjoint", `code_rev = "test"`, `code_rev = "changed"`, `manifest = "manifest.jsonl"`, `manifest = "other.jsonl"`), coordinator.SubmitOptions{})
	env.WaitState("disjoint", 30*time.Second, stream.RunComplete)
	for _, id := range []string{"s0000", "x0001"} {
		if _, err := checkpoint.Verify(filepath.Join(filepath.Dir(first), "out", id)); err != nil {
			t.Errorf("output %s: %v", id, err)
		}
	}

	// A run whose shards are only queued (no worker: no records yet) is
	// found through its manifest.
	idle := testenv.New(t, testenv.Options{NoWorkers: true})
	queued := testenv.WriteJob(t, testenv.Job{Name: "queued", Shards: 2, Command: []string{"cp", "{input}", "{out}/"}})
	idle.Submit(queued, coordinator.SubmitOptions{})
	qb, _ := os.ReadFile(queued)
	copy2 := filepath.Join(filepath.Dir(queued), "copy.toml")
	os.WriteFile(copy2, []byte(strings.Replace(strings.Replace(string(qb), `name = "queued"`, `name = "copy"`, 1), `code_rev = "test"`, `code_rev = "changed"`, 1)), 0o644)
	if _, err := idle.TrySubmit(copy2, coordinator.SubmitOptions{}); !errors.Is(err, coordinator.ErrSpecConflict) || !strings.Contains(err.Error(), "run queued") {
		t.Fatalf("a copy sharing the output of a run that has not started: got %v, want ErrSpecConflict naming run queued", err)
	}
}

// TestResubmitRedoesOutputsThatNoLongerVerify: a COMPLETE run submitted
// again with Reverify checks its outputs at the destination; a deleted one
// and a truncated one are queued again and redone (the damaged copy kept
// aside), and the run is COMPLETE again only after they verify.
func TestResubmitRedoesOutputsThatNoLongerVerify(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	spec, _ := copyJob(t, 3, 0, "")
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	if res := env.Submit(spec, coordinator.SubmitOptions{Reverify: true}); res.Redone != 0 || res.State != stream.RunComplete {
		t.Fatalf("resubmit of intact outputs: got %d redone, state %s; want 0, COMPLETE", res.Redone, res.State)
	}
	out := filepath.Join(filepath.Dir(spec), "out")
	if err := os.RemoveAll(filepath.Join(out, "s0000")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "s0001", "s0001.txt"), []byte("short"), 0o644); err != nil {
		t.Fatal(err)
	}
	res := env.Submit(spec, coordinator.SubmitOptions{Reverify: true})
	if res.Redone != 2 || len(res.RedoneIDs) != 2 || !strings.Contains(strings.Join(res.RedoneIDs, " "), "has 5 bytes, the file list says") ||
		!strings.Contains(strings.Join(res.RedoneIDs, " "), "s0000 (output missing: "+filepath.Join(out, "s0000")+" is not there)") {
		t.Fatalf("resubmit after damage: got %d redone %q, want s0000 (missing) and s0001 (size)", res.Redone, res.RedoneIDs)
	}
	// The record says COMPLETE until the tracker sees the requeued shards;
	// wait for them to be validated in their new round.
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		for _, id := range []string{"s0000", "s0001"} {
			if r, err := env.Shard("t", id); err != nil || r.State != stream.ShardValidated || r.Retry != 1 {
				return false, fmt.Sprintf("%s: %s round %d (%v)", id, r.State, r.Retry, err)
			}
		}
		return true, ""
	})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	for _, id := range []string{"s0000", "s0001", "s0002"} {
		if _, err := checkpoint.Verify(filepath.Join(out, id)); err != nil {
			t.Errorf("output %s after the redo: %v", id, err)
		}
	}
	if kept, _ := os.ReadDir(filepath.Join(out, ".shardpool", "replaced")); len(kept) != 1 {
		t.Errorf("damaged outputs kept aside: got %d, want 1", len(kept))
	}
}

// TestMissingInputIsNamed: an input that was there at submit and is gone
// when the shard runs fails the attempt with its path, without running
// the command; the other shards complete.
func TestMissingInputIsNamed(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	marker := filepath.Join(t.TempDir(), "ran")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 0,
		Command: []string{"sh", "-c", `echo "$1" >> "$2"; cp "$1" "$3/"`, "sh", "{input}", marker, "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	gone := filepath.Join(filepath.Dir(spec), "in", "s0001.txt")
	if err := os.Remove(gone); err != nil {
		t.Fatal(err)
	}
	env.StartWorker("", map[string]int{"cpu": 1})
	run := env.WaitState("t", 30*time.Second, stream.RunBlocked)
	if run.Counts.Validated != 1 || run.Counts.Failed != 1 {
		t.Fatalf("counts: got %+v, want 1 validated, 1 failed", run.Counts)
	}
	rec, err := env.Shard("t", "s0001")
	if err != nil || len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeStart ||
		!strings.Contains(rec.Attempts[0].Reason, gone+" is missing on host") {
		t.Fatalf("record: %+v (%v), want one start-error attempt naming %s", rec.Attempts, err, gone)
	}
	if b, _ := os.ReadFile(marker); strings.Contains(string(b), gone) {
		t.Fatalf("the command ran for the missing input:\n%s", b)
	}
}

// TestMissingRunDirectoryIsNamed: a run whose directory (where the
// command runs: the spec's) is not on the worker's host fails its
// attempts naming that directory and the host. exec reports a working
// directory it cannot enter as the program missing ("fork/exec
// /usr/bin/sh: no such file or directory"), which sent users looking for
// sh. A program that is missing indeed is still named as such.
func TestMissingRunDirectoryIsNamed(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	// s0000 has no input (exec finds the directory gone), s0001 has one
	// in that directory (the look at the inputs does).
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 0, Command: []string{"sh", "-c", "true"},
		Line: func(i int, line string) string {
			if i == 0 {
				return `{"id":"s0000"}`
			}
			return fmt.Sprintf(`{"id":"s%04d","inputs":[%q]}`, i, line)
		}})
	env.Submit(spec, coordinator.SubmitOptions{})
	dir := filepath.Dir(spec)
	if err := os.Rename(dir, dir+"-moved"); err != nil {
		t.Fatal(err)
	}
	env.StartWorker("", map[string]int{"cpu": 1})
	env.WaitState("t", 30*time.Second, stream.RunBlocked)
	for _, id := range []string{"s0000", "s0001"} {
		rec, err := env.Shard("t", id)
		if err != nil || len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeStart ||
			!strings.Contains(rec.Attempts[0].Reason, "the run's directory "+dir+", where the command runs, does not exist on host") {
			t.Fatalf("record of %s: %+v (%v), want one start-error attempt naming the directory %s", id, rec.Attempts, err, dir)
		}
	}

	spec = testenv.WriteJob(t, testenv.Job{Name: "noprog", Shards: 1, Retries: 0, Command: []string{"no-such-program-here"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("noprog", 30*time.Second, stream.RunBlocked)
	rec, err := env.Shard("noprog", "s0000")
	if err != nil || len(rec.Attempts) != 1 || !strings.Contains(rec.Attempts[0].Reason, "start no-such-program-here: ") ||
		strings.Contains(rec.Attempts[0].Reason, "run's directory") {
		t.Fatalf("record: %+v (%v), want the program named as missing", rec.Attempts, err)
	}
}

// TestUnwritableOutputFailsBeforeTheCommand: an output directory the
// worker's host cannot write (here a read-only mount, as ext4 remounts
// itself after errors) fails the attempt before the command runs, naming
// the directory, instead of after the command's whole run at its commit.
func TestUnwritableOutputFailsBeforeTheCommand(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	ran := filepath.Join(t.TempDir(), "ran")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 1,
		Command: []string{"sh", "-c", `echo ran >> "$0"; cp "$1" "$2/"`, ran, "{input}", "{out}"}})
	out := filepath.Join(filepath.Dir(spec), "out")
	testenv.ReadOnly(t, out)
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunBlocked)
	rec, err := env.Shard("t", "s0000")
	if err != nil || len(rec.Attempts) != 2 || rec.Attempts[1].Outcome != stream.OutcomeStart ||
		!strings.Contains(rec.Attempts[1].Reason, "the output directory "+out+" cannot be written on host") {
		t.Fatalf("record: %+v (%v), want two start-error attempts naming %s", rec.Attempts, err, out)
	}
	if b, err := os.ReadFile(ran); err == nil {
		t.Fatalf("the command ran %d time(s) with nowhere to commit", strings.Count(string(b), "ran"))
	}
}

// TestRepeatedDeliveryNumberIsNotAnAttemptAgain: nats-server writes a
// consumer's state asynchronously, so a coordinator killed and restarted
// can deliver a message again as its first delivery while the shard's
// record already holds attempt 1 (a worker died running it). Run under
// that number, the job was told it was the first attempt again
// (SHARDPOOL_ATTEMPT=1) and attempt 1's log was overwritten; a test
// whose job sleeps on its first attempt hung (1 run in about 60 of
// TestAnotherRunLeavesAKilledRunsShardsToIt). Deliveries are handed back
// uncharged until one carries a number no attempt has: here the record
// holds attempts 1 and 2, so deliveries 1 (caught where the first
// delivery's optimistic record write meets the record) and 2 (caught
// where a later delivery reads it) go back, and delivery 3 runs.
func TestRepeatedDeliveryNumberIsNotAnAttemptAgain(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	seen := filepath.Join(t.TempDir(), "seen")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 2,
		Command: []string{"sh", "-c", `echo "$SHARDPOOL_ATTEMPT" >> "$0"; echo out; cp "$1" "$2/"`, seen, "{input}", "{out}"}})
	res := env.Submit(spec, coordinator.SubmitOptions{})
	// What dead workers left: attempt 1 lost, attempt 2 running, and
	// their logs.
	logDir := filepath.Join(env.Data, "runs", "t", "attempts")
	first, second := filepath.Join(logDir, "s0000.1.log"), filepath.Join(logDir, "s0000.2.log")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, l := range []string{first, second} {
		if err := os.WriteFile(l, []byte(l+", which died\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	owner := stream.Owner{Worker: "gone", Host: "elsewhere", PID: 1, Attempt: 2}
	rec := stream.ShardRecord{V: stream.SchemaVersion, Run: "t", ID: "s0000", Fingerprint: res.Fingerprint, Class: "cpu", State: stream.ShardRunning,
		Owner: &owner, Attempts: []stream.Attempt{{N: 1, Worker: "gone", Host: "elsewhere", Start: time.Now().UTC(), Outcome: stream.OutcomeLost, Log: first},
			{N: 2, Worker: "gone", Host: "elsewhere", Start: time.Now().UTC(), Log: second}}, Updated: time.Now().UTC()}
	data, _ := stream.Encode(&rec)
	if _, err := env.Buckets().Shards.Put(context.Background(), stream.ShardKey("t", "s0000"), data); err != nil {
		t.Fatal(err)
	}
	env.StartWorker("w1", map[string]int{"cpu": 1})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	if b, _ := os.ReadFile(seen); string(b) != "3\n" {
		t.Fatalf("the job saw SHARDPOOL_ATTEMPT %q, want 3 once", b)
	}
	for _, l := range []string{first, second} {
		if b, _ := os.ReadFile(l); string(b) != l+", which died\n" {
			t.Fatalf("%s now holds %q: overwritten", l, b)
		}
	}
	got, err := env.Shard("t", "s0000")
	if err != nil || len(got.Attempts) != 3 || got.Attempts[1].Outcome != stream.OutcomeLost || got.Attempts[2].N != 3 || got.Attempts[2].Outcome != stream.OutcomeOK {
		t.Fatalf("record: %+v (%v), want attempts 1 and 2 lost and attempt 3 ok", got.Attempts, err)
	}
	b, _ := os.ReadFile(filepath.Join(env.Data, "runs", "t", "admission.log"))
	for _, d := range []string{"delivery 1, but the record holds attempt 2 of this round", "delivery 2, but the record holds attempt 2 of this round"} {
		if !strings.Contains(string(b), d) {
			t.Fatalf("admission.log does not say %q:\n%s", d, b)
		}
	}
}

// openAttemptRun submits run t of one shard with the given retries,
// whose command notes each attempt in seen, and puts its record as a
// worker that died on another host left it: running, attempt 1 open, no
// lease. No worker runs yet.
func openAttemptRun(t *testing.T, retries int) (env *testenv.Env, seen string) {
	t.Helper()
	env = testenv.New(t, testenv.Options{NoWorkers: true})
	seen = filepath.Join(t.TempDir(), "seen")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: retries,
		Command: []string{"sh", "-c", `echo "$SHARDPOOL_ATTEMPT" >> "$0"; cp "$1" "$2/"`, seen, "{input}", "{out}"}})
	res := env.Submit(spec, coordinator.SubmitOptions{})
	owner := stream.Owner{Worker: "gone", Host: "elsewhere", PID: 1, Attempt: 1}
	rec := stream.ShardRecord{V: stream.SchemaVersion, Run: "t", ID: "s0000", Fingerprint: res.Fingerprint, Class: "cpu", State: stream.ShardRunning,
		Owner: &owner, Attempts: []stream.Attempt{{N: 1, Worker: "gone", Host: "elsewhere", Start: time.Now().UTC()}}, Updated: time.Now().UTC()}
	data, _ := stream.Encode(&rec)
	if _, err := env.Buckets().Shards.Put(context.Background(), stream.ShardKey("t", "s0000"), data); err != nil {
		t.Fatal(err)
	}
	return env, seen
}

// TestOpenAttemptAtTheLimitFailsTheShardOnceItsLeaseIsGone: a record
// holding its one allowed attempt open, by a worker that left no lease
// (it died and its lease expired, and a coordinator crash lost the
// delivery count, so the message comes as delivery 1 again): the shard
// fails as out of attempts, without running the command. Delivery 1
// meets the record only after taking the lease (the optimistic first
// write), and must judge it as a holder of the lease.
func TestOpenAttemptAtTheLimitFailsTheShardOnceItsLeaseIsGone(t *testing.T) {
	env, seen := openAttemptRun(t, 0)
	env.StartWorker("w1", map[string]int{"cpu": 1})
	r := env.WaitState("t", 30*time.Second, stream.RunBlocked, stream.RunComplete)
	if r.State != stream.RunBlocked || !strings.Contains(r.Reason, "attempt limit 1 reached") {
		t.Fatalf("run %s (%s); want BLOCKED, the attempt limit reached", r.State, r.Reason)
	}
	if b, _ := os.ReadFile(seen); len(b) != 0 {
		t.Fatalf("the command ran (attempts %q); want not at all", b)
	}
	got, err := env.Shard("t", "s0000")
	if err != nil || got.State != stream.ShardFailed || len(got.Attempts) != 1 || got.Attempts[0].Outcome != stream.OutcomeLost {
		t.Fatalf("record: %+v (%v), want failed with attempt 1 lost", got, err)
	}
}

// TestExhaustedShardClosesItsOpenAttempt: a shard whose message runs out
// of deliveries with an attempt open in its record and no lease left (its
// worker lost on the last delivery the message had) is recorded failed
// with that attempt lost, as a worker's attempt limit records it: the
// record does not leave an attempt without an end under a failed shard.
func TestExhaustedShardClosesItsOpenAttempt(t *testing.T) {
	env, seen := openAttemptRun(t, 2)
	// The message has one delivery, which the record's attempt 1 already
	// numbers: the worker hands it back (see TestRepeatedDeliveryNumberIsNotAnAttemptAgain),
	// and the message is out of deliveries.
	updateConsumer(t, env, func(c *jetstream.ConsumerConfig) { c.MaxDeliver = 1 })
	env.StartWorker("w1", map[string]int{"cpu": 1})
	r := env.WaitState("t", 30*time.Second, stream.RunBlocked, stream.RunComplete)
	got, err := env.Shard("t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if r.State != stream.RunBlocked || got.State != stream.ShardFailed || !strings.Contains(got.Reason, "ran out of deliveries") {
		t.Fatalf("run %s (%s), shard %s (%s); want BLOCKED, the shard out of deliveries", r.State, r.Reason, got.State, got.Reason)
	}
	if len(got.Attempts) != 1 || got.Attempts[0].Outcome != stream.OutcomeLost || !strings.Contains(got.Attempts[0].Reason, "worker gone on elsewhere") {
		t.Fatalf("attempts %+v; want attempt 1 closed as lost, naming its worker", got.Attempts)
	}
	if b, _ := os.ReadFile(seen); len(b) != 0 {
		t.Fatalf("the command ran (attempts %q); want not at all", b)
	}
}

// TestForeignDestinationIsLeftAlone: a directory at <output>/<id> that is
// not a shardpool output (no COMPLETE marker: the user's own folder, with
// the output directory shared with other files), or a file there, is not
// moved aside to make room; the shard fails naming it, and the rest of the
// run goes on. An empty directory there is taken. Such a destination stays
// until someone moves it, so the shard fails before its command runs, and
// one that appears while the command runs fails the shard at its commit,
// not retried: before, each of `retries` ran the command again, its whole
// length, to be refused the same.
func TestForeignDestinationIsLeftAlone(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	// s0003's command makes its own destination a folder of the user's
	// while it runs; every command notes that it ran.
	spec := testenv.WriteJob(t, testenv.Job{Shards: 4, Retries: 2, Command: []string{"sh", "-c",
		`echo "$SHARDPOOL_SHARD_ID" >> ran; if [ "$SHARDPOOL_SHARD_ID" = s0003 ]; then mkdir -p out/s0003 && echo mine > out/s0003/mine.txt; fi; cp "$0" "$1/"`, "{input}", "{out}"}})
	out := filepath.Join(filepath.Dir(spec), "out")
	mine := filepath.Join(out, "s0001", "notes.txt")
	if err := os.MkdirAll(filepath.Dir(mine), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(mine, []byte("the user's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(out, "s0002"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(out, "s0000")
	if err := os.WriteFile(file, []byte("a file of the user's"), 0o644); err != nil {
		t.Fatal(err)
	}
	env.Submit(spec, coordinator.SubmitOptions{})
	r := env.WaitState("t", 30*time.Second, stream.RunBlocked)
	if r.Counts.Validated != 1 || r.Counts.Failed != 3 {
		t.Fatalf("run: %+v, reason %q; want s0000, s0001 and s0003 failed, s0002 validated", r.Counts, r.Reason)
	}
	for id, want := range map[string]string{
		"s0000": file + " exists and is not a directory",
		"s0001": filepath.Dir(mine) + " exists with 1 entries and no COMPLETE marker",
		"s0003": filepath.Join(out, "s0003") + " exists with 1 entries and no COMPLETE marker",
	} {
		rec, err := env.Shard("t", id)
		if err != nil || !strings.Contains(rec.Reason, "not a shardpool output, left as it is: "+want) {
			t.Errorf("record of %s: %+v (%v), want it failed naming what is there: %s", id, rec, err, want)
		}
	}
	ran, err := os.ReadFile(filepath.Join(filepath.Dir(spec), "ran"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(ran)); len(got) != 2 || !slices.Contains(got, "s0002") || !slices.Contains(got, "s0003") {
		t.Errorf("commands that ran: %q; want s0002 and s0003 once each, none where the destination was refused before", got)
	}
	if b, err := os.ReadFile(mine); err != nil || string(b) != "the user's" {
		t.Fatalf("the user's file: %q (%v), want it where it was", b, err)
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "a file of the user's" {
		t.Fatalf("the user's file named like a shard: %q (%v), want it where it was", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(out, "s0003", "mine.txt")); err != nil || string(b) != "mine\n" {
		t.Fatalf("the folder made while s0003 ran: %q (%v), want it as it was made", b, err)
	}
	if entries, _ := os.ReadDir(filepath.Join(out, ".shardpool", "replaced")); len(entries) != 0 {
		t.Fatalf("something was moved aside: %v", entries)
	}
	if _, err := checkpoint.Verify(filepath.Join(out, "s0002")); err != nil {
		t.Fatalf("the shard whose destination was an empty directory: %v", err)
	}
}

func TestTimeoutIsRecordedAndFails(t *testing.T) {
	env := testenv.New(t, testenv.Options{Grace: 200 * time.Millisecond})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0, Timeout: "300ms",
		Command: []string{"sh", "-c", "trap '' TERM; sleep 30"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	start := time.Now()
	env.WaitState("t", 20*time.Second, stream.RunBlocked)
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("timeout took %s to be enforced, want well under 10s", d)
	}
	rec, _ := env.Shard("t", "s0000")
	if len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeTimeout {
		t.Fatalf("attempts: got %+v, want one timeout", rec.Attempts)
	}
	if rec.Attempts[0].Signal != "killed" {
		t.Fatalf("signal: got %q, want killed (the child ignored SIGTERM)", rec.Attempts[0].Signal)
	}
}

func TestOOMKillIsRecorded(t *testing.T) {
	cg := testenv.MemoryCgroup(t, 32<<20)
	env := testenv.New(t, testenv.Options{})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 1,
		Command: []string{"sh", "-c", `echo $$ > "$1/cgroup.procs" && head -c 300M /dev/zero | tail -n 1 > /dev/null`, "sh", cg}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 60*time.Second, stream.RunBlocked)
	rec, _ := env.Shard("t", "s0000")
	if rec.State != stream.ShardFailed || len(rec.Attempts) != 2 {
		t.Fatalf("record: got %s with %d attempts, want failed with 2", rec.State, len(rec.Attempts))
	}
	for _, a := range rec.Attempts {
		if a.Outcome != stream.OutcomeOOM {
			t.Fatalf("attempt %d: got outcome %s (%s), want oom", a.N, a.Outcome, a.Reason)
		}
	}
}

func TestDiskFullDuringCommitLeavesNothingPartial(t *testing.T) {
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0,
		Command: []string{"sh", "-c", `head -c 400000 /dev/zero > "$1/big"`, "sh", "{out}"}})
	out := filepath.Join(filepath.Dir(spec), "out")
	testenv.SmallTmpfs(t, out, "128k")
	env := testenv.New(t, testenv.Options{})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunBlocked)
	rec, _ := env.Shard("t", "s0000")
	// An output larger than its whole file system is not waited for
	// (TestFullOutputHoldsTheWorkerNotTheShards): it never fits.
	if len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeCommit || !strings.Contains(rec.Attempts[0].Reason, "no space") ||
		!strings.Contains(rec.Attempts[0].Reason, "it never fits there") {
		t.Fatalf("attempt: got %+v, want a commit error naming no space, and that it never fits", rec.Attempts)
	}
	ents, _ := os.ReadDir(out)
	for _, e := range ents {
		if e.Name() != ".shardpool" {
			t.Fatalf("destination holds %s after a failed commit, want nothing", e.Name())
		}
	}
}

// TestOutputSymlinkIsRefused: an output that cannot be committed safely
// (here a symlink out of {out}) fails the shard at once with the reason,
// though retries are left: the command would write it again, and each
// retry cost its whole run.
func TestOutputSymlinkIsRefused(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 2,
		Command: []string{"ln", "-s", "/etc/passwd", "{out}/escape"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunBlocked)
	rec, _ := env.Shard("t", "s0000")
	if len(rec.Attempts) != 1 || !strings.Contains(rec.Attempts[0].Reason, "symlink") {
		t.Fatalf("attempt: got %+v, want one attempt, a refusal naming the symlink", rec.Attempts)
	}
	if rec.State != stream.ShardFailed || !strings.Contains(rec.Reason, "not retried") {
		t.Fatalf("record: %s %q, want failed, saying it is not retried", rec.State, rec.Reason)
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(spec), "out", "s0000")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("output dir exists after refusal (%v), want none", err)
	}
}

// concurrencyJob writes a job whose shards each sleep, then record how many
// shards of the job were running at that moment (their directories in a
// shared one), in out/<id>/n.
func concurrencyJob(t *testing.T, shards int, sleep, extra string) string {
	t.Helper()
	dir := t.TempDir()
	return testenv.WriteJob(t, testenv.Job{Shards: shards, Retries: 0, Extra: extra,
		Command: []string{"sh", "-c", `mkdir "$1/$2" && sleep "$4" && ls "$1" | wc -l > "$3/n" && rmdir "$1/$2"`, "sh", dir, "{id}", "{out}", sleep}})
}

// maxConcurrent is the largest count a concurrencyJob's shards recorded; a
// shard without a count fails the test.
func maxConcurrent(t *testing.T, spec string, shards int) int {
	t.Helper()
	most := 0
	for i := range shards {
		b, err := os.ReadFile(filepath.Join(filepath.Dir(spec), "out", fmt.Sprintf("s%04d", i), "n"))
		if err != nil {
			t.Fatal(err)
		}
		var n int
		if _, err := fmt.Sscan(string(b), &n); err != nil {
			t.Fatalf("shard %d count %q: %v", i, b, err)
		}
		most = max(most, n)
	}
	return most
}

func TestSlotsBoundConcurrency(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 3}})
	// At most 3 may overlap.
	spec := concurrencyJob(t, 9, "0.3", "")
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	if maxSeen := maxConcurrent(t, spec, 9); maxSeen > 3 || maxSeen < 2 {
		t.Fatalf("concurrent shards seen: %d, want 2..3 with 3 slots", maxSeen)
	}
}

// TestUnchangedWaitIsLoggedOnce: a busy worker waits for a slot before
// nearly every fetch; the host's admission log says so when the reason
// changes, not each time (it had one line per shard).
func TestUnchangedWaitIsLoggedOnce(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 2}})
	spec := concurrencyJob(t, 8, "0.2", "")
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	log, err := os.ReadFile(filepath.Join(env.Data, "admission.log"))
	if err != nil {
		t.Fatal(err)
	}
	full := 0
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "decision=wait 2 of 2 slots of class cpu in use") {
			full++
		}
	}
	if full != 1 {
		t.Fatalf("wait lines for full slots: got %d, want 1\n%s", full, log)
	}
}

func TestPlaceholdersAndEnvironment(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0,
		Extra: "env = { GREETING = \"hello world\", SHARDPOOL_SHARD_ID = \"spoofed\" }\n[class.cpu]\ncpus = 3\n",
		Line: func(i int, in string) string {
			return fmt.Sprintf(`{"id":"p%d","inputs":[%q,%q],"params":{"lr":"0.1","batch-size":"32"}}`, i, in, in)
		},
		Command: []string{"sh", "-c", `printf '%s\n' "$@" > "$SHARDPOOL_OUT/args"; env | sort > "$SHARDPOOL_OUT/env"`, "sh", "{id}", "{inputs}", "--ckpt={ckpt}", "{attempt}", "{print $1}"}})
	res := env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	out := filepath.Join(filepath.Dir(spec), "out", "p0")
	args, _ := os.ReadFile(filepath.Join(out, "args"))
	lines := strings.Split(strings.TrimSpace(string(args)), "\n")
	in := filepath.Join(filepath.Dir(spec), "in", "s0000.txt")
	want := []string{"p0", in, in, "--ckpt=" + worker.CkptDir(filepath.Join(filepath.Dir(spec), "out"), "t", res.Fingerprint, "p0"), "1", "{print $1}"}
	if strings.Join(lines, "|") != strings.Join(want, "|") {
		t.Fatalf("argv: got %q, want %q", lines, want)
	}
	envb, _ := os.ReadFile(filepath.Join(out, "env"))
	for _, kv := range []string{"GREETING=hello world", "OMP_NUM_THREADS=3", "OPENBLAS_NUM_THREADS=3", "SHARDPOOL_PARAM_LR=0.1", "SHARDPOOL_PARAM_BATCH_SIZE=32", "SHARDPOOL_SHARD_ID=p0", "CUDA_VISIBLE_DEVICES="} {
		if !strings.Contains(string(envb), kv+"\n") {
			t.Errorf("child environment lacks %q", kv)
		}
	}
	// The shard's own variables win over the spec's env.
	if strings.Contains(string(envb), "spoofed") {
		t.Errorf("the spec's env replaced SHARDPOOL_SHARD_ID:\n%s", envb)
	}
}

// TestPlaceholdersInEnvAreExpanded: the spec's env may name placeholders,
// expanded for each attempt as inside an argument, for the command and
// its validator; {ckpt} named there is made before the command runs. A
// variable of shardpool's own is not replaced by one.
func TestPlaceholdersInEnvAreExpanded(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0,
		Extra: "validator = [\"sh\", \"-c\", \"test -s \\\"$OUT_DIR/env\\\"\"]\n" +
			"env = { OUT_DIR = \"{out}\", HF_HOME = \"{scratch}/hf\", CKPT = \"{ckpt}\", TAG = \"{id}-{attempt}\", IN = \"{input}\", SHARDPOOL_SHARD_ID = \"{id}x\", AWK = \"{print $1}\" }\n",
		Command: []string{"sh", "-c", `test -d "$CKPT" && test "$HF_HOME" = "$SHARDPOOL_SCRATCH/hf" && env | sort > "$OUT_DIR/env"`}})
	res := env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	envb, err := os.ReadFile(filepath.Join(filepath.Dir(spec), "out", "s0000", "env"))
	if err != nil {
		t.Fatal(err)
	}
	envb = append([]byte("\n"), envb...) // each entry between newlines
	for _, kv := range []string{"TAG=s0000-1", "IN=" + filepath.Join(filepath.Dir(spec), "in", "s0000.txt"), "SHARDPOOL_SHARD_ID=s0000", "AWK={print $1}",
		"CKPT=" + worker.CkptDir(filepath.Join(filepath.Dir(spec), "out"), "t", res.Fingerprint, "s0000")} {
		if !strings.Contains(string(envb), "\n"+kv+"\n") {
			t.Errorf("child environment lacks %q:\n%s", kv, envb)
		}
	}
	for _, k := range []string{"OUT_DIR", "HF_HOME"} {
		if n := strings.Count(string(envb), "\n"+k+"="); n != 1 || strings.Contains(string(envb), k+"={") {
			t.Errorf("child environment has %s %d times, or unexpanded:\n%s", k, n, envb)
		}
	}
}

// TestNoPrefetch checks that a worker fetches only for a command it can
// start: with 1 slot and 4 queued shards, one command runs at a time, and
// the consumer never has more than 2 messages pending acknowledgement (the
// running shard, and the previous one while its commit and ack finish
// after its command exited). A prefetch buffer would hold the rest.
func TestNoPrefetch(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 4, Command: []string{"sleep", "0.5"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	maxPending := 0
	for time.Now().Before(deadline) {
		c, err := env.JS.Consumer(ctx, stream.StreamShards, "cpu")
		if err == nil {
			info, err := c.Info(ctx)
			if err == nil {
				maxPending = max(maxPending, info.NumAckPending)
			}
		}
		if r, _ := env.Run("t"); r.State == stream.RunComplete {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if maxPending < 1 || maxPending > 2 {
		t.Fatalf("max ack pending: got %d, want 1 or 2 (one slot, no prefetch)", maxPending)
	}
}

var _ = jetstream.ErrKeyNotFound
var _ = exec.Command

func TestStagedInputsRunFromLocalScratch(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	// The command records where {input} points and checks that the staged
	// copy equals the original, whose path comes in a param.
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, InputSize: 100000, Extra: "stage = true\n",
		Command: []string{"sh", "-c", `echo "$1" > "$2/where" && cmp "$1" "$SHARDPOOL_PARAM_ORIG" && cp "$1" "$2/"`, "sh", "{input}", "{out}"},
		Line: func(i int, in string) string {
			return fmt.Sprintf(`{"id":"s%04d","inputs":[%q],"params":{"orig":%q}}`, i, in, in)
		}})
	// params hold the path relative to the spec; the command runs there.
	env.Submit(spec, coordinator.SubmitOptions{})
	r := env.WaitState("t", 30*time.Second, stream.RunComplete, stream.RunBlocked)
	if r.State != stream.RunComplete {
		rec, _ := env.Shard("t", "s0001")
		t.Fatalf("run %s: %s %+v", r.State, r.Reason, rec.Attempts)
	}
	where, _ := os.ReadFile(filepath.Join(filepath.Dir(spec), "out", "s0000", "where"))
	if !strings.Contains(string(where), filepath.Join("scratch", "w1", "stage", "cache")) {
		t.Fatalf("{input} was %q, want a path in the worker's staging cache", where)
	}
	log, err := os.ReadFile(filepath.Join(env.Data, "runs", "t", "staging.jsonl"))
	if err != nil || strings.Count(string(log), `"copied":100000`) != 3 {
		t.Fatalf("staging.jsonl: %v\n%s", err, log)
	}
	rec, _ := env.Shard("t", "s0000")
	if rec.Attempts[0].StageSeconds <= 0 || rec.Attempts[0].CommitSeconds <= 0 {
		t.Fatalf("attempt timings: %+v, want stage and commit seconds", rec.Attempts[0])
	}
}

// manySmallInputs writes staging.PackMinFiles inputs into dir, input i
// holding content(i), named tiny-NNNN.txt in order, and returns their
// paths as a JSON array for a manifest line.
func manySmallInputs(t *testing.T, dir string, content func(i int) []byte) string {
	t.Helper()
	var inputs []string
	for i := range staging.PackMinFiles {
		p := filepath.Join(dir, fmt.Sprintf("tiny-%04d.txt", i))
		if err := os.WriteFile(p, content(i), 0o644); err != nil {
			t.Fatal(err)
		}
		inputs = append(inputs, p)
	}
	b, _ := json.Marshal(inputs)
	return string(b)
}

func TestManySmallInputsArePackedAndUnpacked(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	dir := t.TempDir()
	inJSON := manySmallInputs(t, dir, func(i int) []byte { return []byte(fmt.Sprintf("file %d\n", i)) })
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Extra: "stage = true\npack = true\n",
		Command: []string{"sh", "-c", `cat "$@" > "$SHARDPOOL_OUT/all"; echo "$1" > "$SHARDPOOL_OUT/first"`, "sh", "{inputs}"},
		Line:    func(int, string) string { return `{"id":"many","inputs":` + inJSON + `}` }})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	out := filepath.Join(filepath.Dir(spec), "out")
	// The pack was made at submit, staged, and removed once the shard's
	// output was committed.
	if packs, _ := filepath.Glob(filepath.Join(out, ".shardpool", "packs", "*")); len(packs) != 0 {
		t.Fatalf("packs left after the shard committed: %v", packs)
	}
	all, _ := os.ReadFile(filepath.Join(out, "many", "all"))
	if strings.Count(string(all), "\n") != staging.PackMinFiles || !strings.HasPrefix(string(all), "file 0\nfile 1\n") {
		t.Fatalf("the command saw %d lines in order %q..., want every input in manifest order", strings.Count(string(all), "\n"), string(all)[:min(20, len(all))])
	}
	first, _ := os.ReadFile(filepath.Join(out, "many", "first"))
	// The unpacked copy is in the attempt's own ".in" directory, not the
	// stager's cache (where each input would be, staged one by one).
	if !strings.HasSuffix(strings.TrimSpace(string(first)), ".in/tiny-0000.txt") || strings.HasPrefix(string(first), dir) {
		t.Fatalf("{inputs} pointed at %q, want the unpacked local copy", first)
	}
	log, err := os.ReadFile(filepath.Join(env.Data, "runs", "t", "staging.jsonl"))
	if err != nil || !strings.Contains(string(log), `"files":1,`) {
		t.Fatalf("staging.jsonl: %v\n%s\nwant one file staged (the pack)", err, log)
	}
}

// TestMissingPackStagesTheInputs: a shard delivered after its pack was
// removed (the shard committed, then its message came back) stages its
// inputs one by one instead of failing.
func TestMissingPackStagesTheInputs(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	dir := t.TempDir()
	inJSON := manySmallInputs(t, dir, func(i int) []byte { return []byte(fmt.Sprintf("file %d\n", i)) })
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0, Extra: "stage = true\npack = true\n",
		Command: []string{"sh", "-c", `cat "$@" > "$SHARDPOOL_OUT/all"`, "sh", "{inputs}"},
		Line:    func(int, string) string { return `{"id":"many","inputs":` + inJSON + `}` }})
	env.Submit(spec, coordinator.SubmitOptions{})
	out := filepath.Join(filepath.Dir(spec), "out")
	packs, _ := filepath.Glob(filepath.Join(out, ".shardpool", "packs", "many-*.tar"))
	if len(packs) != 1 {
		t.Fatalf("packs after submit: %v, want the shard's", packs)
	}
	os.Remove(packs[0])
	env.StartWorker("w1", map[string]int{"cpu": 1})
	if r := env.WaitState("t", 30*time.Second, stream.RunComplete, stream.RunBlocked); r.State != stream.RunComplete {
		rec, _ := env.Shard("t", "many")
		t.Fatalf("run %s: %s %+v", r.State, r.Reason, rec.Attempts)
	}
	all, _ := os.ReadFile(filepath.Join(out, "many", "all"))
	if strings.Count(string(all), "\n") != staging.PackMinFiles {
		t.Fatalf("the command saw %d lines, want every input's", strings.Count(string(all), "\n"))
	}
}

// TestFailedUnpackFailsTheAttempt: many small inputs come as one pack,
// which the worker unpacks into its scratch. A scratch without room for
// the unpacked copy refuses the shard before copying, with the numbers;
// one whose unpack fails all the same (here, out of inodes, which the
// reservation does not count) fails the attempt with the reason. Before,
// that error was dropped: the command ran on no inputs, exited 0, and its
// output was validated.
func TestFailedUnpackFailsTheAttempt(t *testing.T) {
	for _, tc := range []struct{ name, tmpfs, want string }{
		{"bytes", "2560k", "the unpacked copy of their pack"},
		{"inodes", "16m,nr_inodes=128", "unpack: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := testenv.New(t, testenv.Options{NoWorkers: true})
			testenv.SmallTmpfs(t, filepath.Join(env.Data, "scratch", "w1"), tc.tmpfs)
			env.StartWorker("w1", map[string]int{"cpu": 1})
			inJSON := manySmallInputs(t, t.TempDir(), func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 6<<10) })
			ran := filepath.Join(t.TempDir(), "ran")
			spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0, Extra: "stage = true\npack = true\n",
				Command: []string{"sh", "-c", `echo "$#" >> "$0"; cat "$@" > "$SHARDPOOL_OUT/all"`, ran, "{inputs}"},
				Line:    func(int, string) string { return `{"id":"many","inputs":` + inJSON + `}` }})
			env.Submit(spec, coordinator.SubmitOptions{})
			env.WaitState("t", 30*time.Second, stream.RunBlocked, stream.RunComplete)
			if b, err := os.ReadFile(ran); err == nil {
				t.Fatalf("the command ran, with %s input(s), on a scratch without room for them", strings.TrimSpace(string(b)))
			}
			rec, err := env.Shard("t", "many")
			if err != nil {
				t.Fatal(err)
			}
			if rec.State != stream.ShardFailed || len(rec.Attempts) != 1 {
				t.Fatalf("shard %s with attempts %+v, want failed after one", rec.State, rec.Attempts)
			}
			at := rec.Attempts[0]
			if at.Outcome != stream.OutcomeStage || !strings.Contains(at.Reason, tc.want) || !strings.Contains(at.Reason, "space") {
				t.Fatalf("attempt %s: %q, want a staging failure naming %q and the space", at.Outcome, at.Reason, tc.want)
			}
		})
	}
}

// TestEscapedDescendantDoesNotHoldTheAttempt: a command that leaves a
// process behind in another session (which the process-group kill does not
// reach) keeps the log pipe open; the attempt still ends once the command
// has exited and the log's drain time has passed, with its output logged.
func TestEscapedDescendantDoesNotHoldTheAttempt(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	pidFile := filepath.Join(t.TempDir(), "escaped.pid")
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	// The command waits until the escaped process runs (and holds the pipe).
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Command: []string{"sh", "-c",
		`setsid sh -c 'echo $$ > "$1"; exec sleep 8' sh "$1" & while [ ! -s "$1" ]; do sleep 0.05; done; echo started`, "sh", pidFile}})
	start := time.Now()
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	if d := time.Since(start); d > 6*time.Second {
		t.Fatalf("run took %s, want it done well before the escaped sleep (8s) ends", d)
	}
	r, err := env.Shard("t", "s0000")
	if err != nil || len(r.Attempts) != 1 {
		t.Fatalf("record: %+v (%v)", r.Attempts, err)
	}
	if b, err := os.ReadFile(r.Attempts[0].Log); err != nil || string(b) != "started\n" {
		t.Fatalf("attempt log: got %q (%v), want \"started\\n\"", b, err)
	}
}

// commitWaitingForTheStore starts worker w1 on one shard (retries = 0)
// whose command appends a line to ran, waits for a gate, then copies its
// input; removes the checkpoints bucket while it runs, so that no one
// answers for the commit claim; opens the gate; and returns once the
// attempt says, in the run's admission log (log), that its commit waits.
func commitWaitingForTheStore(t *testing.T) (env *testenv.Env, ran, log string) {
	t.Helper()
	env = testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}})
	gate := filepath.Join(t.TempDir(), "go")
	ran = filepath.Join(t.TempDir(), "ran")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0,
		Command: []string{"sh", "-c", `echo >> "$4"; while [ ! -e "$1" ]; do sleep 0.05; done; cp "$2" "$3/"`, "sh", gate, "{input}", "{out}", ran}})
	env.Submit(spec, coordinator.SubmitOptions{})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, _ := env.Run("t")
		return r.Counts.Running == 1, "the shard is not running yet"
	})
	if err := env.JS.DeleteKeyValue(context.Background(), stream.BucketCheckpoint); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	log = filepath.Join(env.Data, "runs", "t", "admission.log")
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(log)
		return strings.Contains(string(b), "decision=wait coordinator unreachable at the commit"), "admission log:\n" + string(b)
	})
	return env, ran, log
}

// TestCommitWaitsOutAnUnavailableStore: while the coordinator's store does
// not answer the commit claim (here its bucket is gone, so no one answers
// for it, as while a coordinator restarts), the attempt keeps its output
// and waits, in progress; when the store is back, the same attempt
// commits. Before, the output was discarded and the shard handed back, so
// its command ran again: a coordinator restart cost every shard then
// concluding its whole run. A full store, which answers, still hands the
// attempt back (TestCoordinatorReloadsItsStoreAfterAFullDisk).
func TestCommitWaitsOutAnUnavailableStore(t *testing.T) {
	env, ran, log := commitWaitingForTheStore(t)
	ctx := context.Background()
	// Longer than a lease TTL (3 s): the delivery is kept in progress and
	// the lease renewed while the output waits.
	time.Sleep(4 * time.Second)
	if rec, _ := env.Shard("t", "s0000"); rec.State != stream.ShardRunning {
		t.Fatalf("shard %s while its commit waited (%s), want running", rec.State, rec.Reason)
	}
	if err := stream.Setup(ctx, env.JS, stream.Layout{LeaseTTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	committedByTheAttemptThatWaited(t, env, ran, log)
}

// committedByTheAttemptThatWaited checks, after commitWaitingForTheStore
// and the store's return, that the run is COMPLETE with its one shard
// committed by its first attempt, the command run once, and the wait's
// end said in the admission log.
func committedByTheAttemptThatWaited(t *testing.T, env *testenv.Env, ran, log string) {
	t.Helper()
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	rec, _ := env.Shard("t", "s0000")
	if len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeOK || rec.Interrupted != 0 {
		t.Fatalf("record: interrupted %d, attempts %+v; want the one attempt committed", rec.Interrupted, rec.Attempts)
	}
	if b, _ := os.ReadFile(ran); strings.Count(string(b), "\n") != 1 {
		t.Fatalf("the command ran %d times, want once", strings.Count(string(b), "\n"))
	}
	if b, _ := os.ReadFile(log); !strings.Contains(string(b), "decision=resume the coordinator answers again after") {
		t.Fatalf("no resume line in the admission log:\n%s", b)
	}
}

// TestStoppedWhileItsCommitWaitsHandsTheShardBack: a worker stopped
// (SIGTERM) while its commit waits for a store that does not answer gives
// the wait up: it stops within its grace, and the attempt is handed back
// uncharged, so the shard (retries = 0) runs again on another worker once
// the store answers. The first version of the wait heard no stop, and the
// worker never exited.
func TestStoppedWhileItsCommitWaitsHandsTheShardBack(t *testing.T) {
	env, _, _ := commitWaitingForTheStore(t)
	ctx := context.Background()
	if err := env.StopWorker("w1"); err != nil {
		t.Fatalf("stop while the commit waits: %v", err)
	}
	rec, err := env.Shard("t", "s0000")
	if err != nil || rec.State != stream.ShardPending || rec.Interrupted != 1 || len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeInterrupted {
		t.Fatalf("record after the stop: %s, interrupted %d, attempts %+v (%v); want pending, the attempt interrupted and uncharged", rec.State, rec.Interrupted, rec.Attempts, err)
	}
	if err := stream.Setup(ctx, env.JS, stream.Layout{LeaseTTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	env.StartWorker("w2", map[string]int{"cpu": 1})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	if rec, _ := env.Shard("t", "s0000"); len(rec.Attempts) != 2 || rec.Attempts[1].Outcome != stream.OutcomeOK || rec.Attempts[1].Worker != "w2" {
		t.Fatalf("record: %+v; want the second attempt, w2's, committed", rec.Attempts)
	}
}

// TestDrainedWhileItsCommitWaitsCommitsWhenTheStoreAnswers: a drain
// (SIGUSR1, Slurm's warning before a job's end) lets running shards end as
// they would, and a commit waiting for a store that does not answer is one
// of them: the worker goes on waiting rather than handing the attempt
// back, commits that same attempt once the store answers, and only then
// ends.
func TestDrainedWhileItsCommitWaitsCommitsWhenTheStoreAnswers(t *testing.T) {
	env, ran, log := commitWaitingForTheStore(t)
	w := env.Worker("w1")
	w.W.Drain("SIGUSR1")
	select {
	case <-w.Ended():
		t.Fatalf("the drained worker ended while its commit waited for the store")
	case <-time.After(2 * time.Second):
	}
	if rec, _ := env.Shard("t", "s0000"); rec.State != stream.ShardRunning {
		t.Fatalf("shard %s while the drained worker's commit waited (%s), want running", rec.State, rec.Reason)
	}
	if err := stream.Setup(context.Background(), env.JS, stream.Layout{LeaseTTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.Ended():
	case <-time.After(30 * time.Second):
		t.Fatalf("the drained worker did not end within 30 s of the store answering")
	}
	committedByTheAttemptThatWaited(t, env, ran, log)
}

// TestLeaseWaitsOutAnUnavailableStore: while the store takes no lease
// write (here the leases bucket at a limit of 1 byte; a full disk looks
// the same to a worker), a worker holds the deliveries it fetched instead of handing
// them back, so they are not counted as attempts: with `retries = 0` every
// shard completes once the store takes writes again, each in one attempt.
func TestLeaseWaitsOutAnUnavailableStore(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 2}})
	ctx := context.Background()
	refuseLeases(t, env)
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Retries: 0,
		Command: []string{"cp", "{input}", "{out}/"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	log := filepath.Join(env.Data, "runs", "t", "admission.log")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(log)
		return strings.Count(string(b), "holding the shard until the store takes writes again") >= 2, "admission log:\n" + string(b)
	})
	// More than a TTL (3 s) without a lease: a delivery handed back (after
	// half a TTL) would have gone out again by now.
	time.Sleep(4 * time.Second)
	for _, id := range []string{"s0000", "s0001", "s0002"} {
		if rec, err := env.Shard("t", id); err == nil && rec.State == stream.ShardFailed {
			t.Fatalf("%s failed while the store took no writes: %s", id, rec.Reason)
		}
	}
	cons, err := env.JS.Consumer(ctx, stream.StreamShards, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	if ci, err := cons.Info(ctx); err != nil || ci.NumRedelivered != 0 || ci.NumAckPending != 2 {
		t.Fatalf("consumer while the store took no writes: %+v (%v); want the 2 held deliveries pending, none redelivered", ci, err)
	}
	// Status says why the queued shards wait, from the worker's report.
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		st, err := coordinator.ReadStatus(ctx, env.JS, "t")
		if err != nil {
			return false, err.Error()
		}
		w := strings.Join(st.Runs[0].Waiting, "\n")
		return strings.Contains(w, "2 shard(s) held: the store takes no lease write"), "waiting:\n" + w
	})
	if err := stream.Setup(ctx, env.JS, stream.Layout{LeaseTTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	for _, id := range []string{"s0000", "s0001", "s0002"} {
		rec, err := env.Shard("t", id)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Attempts) != 1 || rec.Attempts[0].N != 1 {
			t.Fatalf("%s: attempts %+v; want one, the first delivery", id, rec.Attempts)
		}
	}
	b, _ := os.ReadFile(log)
	if !strings.Contains(string(b), "the store takes writes again") {
		t.Fatalf("admission log does not say the store came back:\n%s", b)
	}
}

// TestInterruptionIsNotCountedAtTheRetryDecision: a shard whose first
// delivery was handed back by a worker's shutdown still gets every attempt
// `retries` allows when it then fails: with retries = 1 the command runs
// twice more, and the shard fails "after 2 attempt(s)".
func TestInterruptionIsNotCountedAtTheRetryDecision(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	runs := filepath.Join(t.TempDir(), "runs")
	// The first run sleeps until it is interrupted; every later one fails.
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 1,
		Command: []string{"sh", "-c", `echo x >> "$1"; if [ "$(wc -l < "$1")" -eq 1 ]; then exec sleep 60; fi; echo broken; exit 3`, "sh", runs}})
	env.Submit(spec, coordinator.SubmitOptions{})
	w := env.StartWorker("", map[string]int{"cpu": 1})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(runs)
		return len(b) > 0, "the command has not started"
	})
	if err := env.StopWorker(w.Name); err != nil {
		t.Fatal(err)
	}
	env.StartWorker("", map[string]int{"cpu": 1})
	env.WaitState("t", 30*time.Second, stream.RunBlocked)
	rec, err := env.Shard("t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(runs)
	if n := strings.Count(string(b), "x"); n != 3 {
		t.Fatalf("the command ran %d time(s), want 3 (interrupted, then retries+1 attempts); record %+v", n, rec)
	}
	if rec.State != stream.ShardFailed || !strings.HasPrefix(rec.Reason, "after 2 attempt(s): ") {
		t.Fatalf("record: state %s, reason %q; want failed after 2 attempt(s)", rec.State, rec.Reason)
	}
}

// refuseLeases puts the leases bucket at a store limit it cannot take
// another byte under (DiscardNew): JetStream refuses every lease write, as
// for a full store. stream.Setup lifts the limit again.
func refuseLeases(t *testing.T, env *testenv.Env) {
	t.Helper()
	ctx := context.Background()
	ls, err := env.JS.Stream(ctx, "KV_"+stream.BucketLeases)
	if err != nil {
		t.Fatal(err)
	}
	cfg := ls.CachedInfo().Config
	cfg.MaxBytes = 1
	if _, err := env.JS.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// TestUnleasedDeliveryIsNotAnAttempt: a worker that stops while it holds a
// delivery it could not lease (the store took no write) hands it back; that
// delivery never began an attempt, so with `retries = 0` the next one still
// runs the command, and the shard completes in one attempt.
func TestUnleasedDeliveryIsNotAnAttempt(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	refuseLeases(t, env)
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0,
		Command: []string{"cp", "{input}", "{out}/"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	w := env.StartWorker("", map[string]int{"cpu": 1})
	log := filepath.Join(env.Data, "runs", "t", "admission.log")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(log)
		return strings.Contains(string(b), "holding the shard until the store takes writes again"), "admission log:\n" + string(b)
	})
	if err := env.StopWorker(w.Name); err != nil {
		t.Fatal(err)
	}
	if err := stream.Setup(context.Background(), env.JS, stream.Layout{LeaseTTL: 3 * time.Second}); err != nil {
		t.Fatal(err)
	}
	env.StartWorker("", map[string]int{"cpu": 1})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	rec, err := env.Shard("t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Attempts) != 1 || rec.Attempts[0].N < 2 || rec.Attempts[0].Outcome != stream.OutcomeOK {
		t.Fatalf("attempts %+v; want one, ok, on a later delivery than the handed-back one", rec.Attempts)
	}
}

// submitWithUnreadableRecord submits run "t" of two shards and puts a
// record that does not decode in place of s0001's: nothing can begin an
// attempt of s0001, so its message runs out of deliveries.
func submitWithUnreadableRecord(t *testing.T, env *testenv.Env) {
	t.Helper()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 0,
		Command: []string{"cp", "{input}", "{out}/"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	kv, err := env.JS.KeyValue(context.Background(), stream.BucketShards)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(context.Background(), stream.ShardKey("t", "s0001"), []byte("not json")); err != nil {
		t.Fatal(err)
	}
}

// TestExhaustedShardWithUnreadableRecordFails: a shard whose record does
// not decode (put by hand) cannot begin an attempt, so its message runs
// out of deliveries; the coordinator then records it failed, replacing the
// unreadable record, and the run ends BLOCKED naming it instead of waiting
// for good on a shard with neither a message nor a readable record.
func TestExhaustedShardWithUnreadableRecordFails(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	submitWithUnreadableRecord(t, env)
	env.StartWorker("", map[string]int{"cpu": 1})
	run := env.WaitState("t", 60*time.Second, stream.RunBlocked)
	if run.Counts.Validated != 1 || run.Counts.Failed != 1 {
		t.Fatalf("counts %+v; want 1 validated, 1 failed", run.Counts)
	}
	rec, err := env.Shard("t", "s0001")
	if err != nil {
		t.Fatal(err)
	}
	if rec.State != stream.ShardFailed || !strings.Contains(rec.Reason, "ran out of deliveries") || !strings.Contains(rec.Reason, "did not decode") {
		t.Fatalf("record: %s %q; want failed, out of deliveries, naming the unreadable record", rec.State, rec.Reason)
	}
}

// TestExhaustedMessageWithoutAdvisoryIsFound: a message that runs out of
// deliveries while the coordinator is not tracking (between Start and Run,
// as while it restarts) sends its advisory to no one. The tracker's sweep
// finds it from the consumer's state, records the shard failed and the run
// ends BLOCKED instead of RUNNING for good.
func TestExhaustedMessageWithoutAdvisoryIsFound(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true, HoldTracking: true})
	submitWithUnreadableRecord(t, env)
	ctx := context.Background()
	env.StartWorker("", map[string]int{"cpu": 1})
	cons, err := env.JS.Consumer(ctx, stream.StreamShards, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		ci, err := cons.Info(ctx)
		if err != nil {
			return false, err.Error()
		}
		si, err := env.JS.Stream(ctx, stream.StreamShards)
		if err != nil {
			return false, err.Error()
		}
		msgs := si.CachedInfo().State.Msgs
		return msgs == 1 && ci.NumPending == 0 && ci.NumAckPending == 0,
			fmt.Sprintf("stream holds %d message(s), consumer: %d pending, %d awaiting ack", msgs, ci.NumPending, ci.NumAckPending)
	})
	env.Track()
	run := env.WaitState("t", 30*time.Second, stream.RunBlocked)
	if run.Counts.Validated != 1 || run.Counts.Failed != 1 {
		t.Fatalf("counts %+v; want 1 validated, 1 failed", run.Counts)
	}
	rec, err := env.Shard("t", "s0001")
	if err != nil || rec.State != stream.ShardFailed || !strings.Contains(rec.Reason, "ran out of deliveries") {
		t.Fatalf("record: %+v (%v); want failed, out of deliveries", rec, err)
	}
}

// TestSecondDeliveryInTheSameWorkerWaits: a shard's message delivered again
// while its first delivery is still in flight in the same worker (as after
// a coordinator restart that lost the consumer's state; here a copy of the
// message published by hand) does not take the shard over: the lease's
// owner is this very process, which once read as "an earlier, finished
// attempt here". The copy waits, then settles on the committed output; the
// command runs once and the record shows one attempt.
func TestSecondDeliveryInTheSameWorkerWaits(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	runs := filepath.Join(t.TempDir(), "runs")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 2,
		Command: []string{"sh", "-c", `echo x >> "$1"; sleep 1.5; cp "$2" "$3/"`, "sh", runs, "{input}", "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	s, err := env.JS.Stream(ctx, stream.StreamShards)
	if err != nil {
		t.Fatal(err)
	}
	orig, err := s.GetMsg(ctx, s.CachedInfo().State.FirstSeq)
	if err != nil {
		t.Fatal(err)
	}
	env.StartWorker("", map[string]int{"cpu": 2})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(runs)
		return len(b) > 0, "the command has not started"
	})
	if _, err := env.JS.Publish(ctx, orig.Subject, orig.Data); err != nil {
		t.Fatal(err)
	}
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		si, err := env.JS.Stream(ctx, stream.StreamShards)
		return err == nil && si.CachedInfo().State.Msgs == 0, "the copy is still queued"
	})
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "x") != 1 {
		t.Fatalf("the command ran %d times, want once", strings.Count(string(b), "x"))
	}
	rec, err := env.Shard("t", "s0000")
	if err != nil || rec.State != stream.ShardValidated || len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeOK {
		t.Fatalf("record: %+v (%v); want validated after one ok attempt", rec, err)
	}
}

// gatedTTL is gatedAttempt's lease TTL.
const gatedTTL = 10 * time.Second

// gatedAttempt submits run t of one shard with no retries, whose command
// notes each start in runs and then waits for the file gate before it
// commits, and starts worker a, which runs it: attempt 1 is running when
// it returns. The lease TTL is 10 s, so that a's lease outlives a stall
// of the test process on a loaded machine (heartbeats every 3.3 s).
func gatedAttempt(t *testing.T) (env *testenv.Env, runs, gate string) {
	t.Helper()
	env = testenv.New(t, testenv.Options{NoWorkers: true, LeaseTTL: gatedTTL})
	tmp := t.TempDir()
	runs, gate = filepath.Join(tmp, "runs"), filepath.Join(tmp, "go")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0,
		Command: []string{"sh", "-c", `echo x >> "$1"; while [ ! -e "$2" ]; do sleep 0.05; done; cp "$3" "$4/"`,
			"sh", runs, gate, "{input}", "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.StartWorker("a", map[string]int{"cpu": 1})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(runs)
		return len(b) > 0, "the command has not started"
	})
	return env, runs, gate
}

// openGate lets gatedAttempt's command end, and checks that the run
// completes from that one attempt, its command run once.
func openGate(t *testing.T, env *testenv.Env, runs, gate string) {
	t.Helper()
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rr := env.WaitState("t", 30*time.Second, stream.RunComplete, stream.RunBlocked)
	rec, err := env.Shard("t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if rr.State != stream.RunComplete || rec.State != stream.ShardValidated || len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeOK {
		b, _ := os.ReadFile(filepath.Join(env.Data, "runs", "t", "admission.log"))
		t.Fatalf("run %s (%s), shard %s (%s), attempts %+v; want COMPLETE after the one attempt, ok\nadmission log:\n%s",
			rr.State, rr.Reason, rec.State, rec.Reason, rec.Attempts, b)
	}
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "x") != 1 {
		t.Fatalf("the command ran %d times, want once", strings.Count(string(b), "x"))
	}
}

// updateConsumer changes the cpu class consumer's configuration.
func updateConsumer(t *testing.T, env *testenv.Env, change func(*jetstream.ConsumerConfig)) {
	t.Helper()
	ctx := context.Background()
	s, err := env.JS.Stream(ctx, stream.StreamShards)
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Consumer(ctx, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	cfg := c.CachedInfo().Config
	change(&cfg)
	if _, err := s.UpdateConsumer(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

// secondDelivery sends the shard of gatedAttempt to worker b while a's
// attempt runs: the consumer's ack wait is made shorter than the
// heartbeat period, so that the message is delivered again between two
// beats, and put back once b has met the shard. It returns the run's
// admission log.
func secondDelivery(t *testing.T, env *testenv.Env) (log string) {
	t.Helper()
	updateConsumer(t, env, func(c *jetstream.ConsumerConfig) { c.AckWait = 300 * time.Millisecond })
	env.StartWorker("b", map[string]int{"cpu": 1})
	log = filepath.Join(env.Data, "runs", "t", "admission.log")
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(log)
		return bytes.Contains(b, []byte("worker=b run=t shard=s0000 ")), "no second delivery yet; admission log:\n" + string(b)
	})
	updateConsumer(t, env, func(c *jetstream.ConsumerConfig) { c.AckWait = gatedTTL })
	return log
}

// commitOtherRunsOutput commits an output of run "other" as run t's s0000, in
// run t's output directory, and returns where.
func commitOtherRunsOutput(t *testing.T, env *testenv.Env) (dst string) {
	t.Helper()
	dst, _ = commitOutput(t, env, checkpoint.Options{Run: "other", Fingerprint: "0123456789abcdef"})
	return dst
}

// commitOutput commits an output of one file, r.txt saying "made by
// OWNER", as run t's s0000, with the marker's run, fingerprint and owner
// from opt, and returns where and its marker. An empty opt.Fingerprint is
// run t's.
func commitOutput(t *testing.T, env *testenv.Env, opt checkpoint.Options) (dst string, mk checkpoint.Marker) {
	t.Helper()
	r, err := env.Run("t")
	if err != nil {
		t.Fatal(err)
	}
	if opt.Fingerprint == "" {
		opt.Fingerprint = r.Fingerprint
	}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "r.txt"), []byte("made by "+opt.Owner+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dst = filepath.Join(r.Spec.Output, "s0000")
	// The output directory, as `run` or a worker's first commit makes it.
	if err := os.MkdirAll(r.Spec.Output, 0o755); err != nil {
		t.Fatal(err)
	}
	mk, err = checkpoint.CommitDir(context.Background(), dst, src, opt, "")
	if err != nil {
		t.Fatal(err)
	}
	return dst, mk
}

// TestRedeliveryAtTheAttemptLimitWaitsForTheRunningAttempt: a shard
// with no retries left whose message comes again while its one attempt
// still runs (its heartbeat reached the server after the ack wait: a
// stalled or overloaded host, here an ack wait made shorter than the
// heartbeat period) is not failed as out of attempts: the delivery waits
// for the lease, and the attempt that held it commits. Before, the second
// worker recorded "attempt limit 1 reached: earlier attempts ended
// without a report" while the attempt ran, and the run ended BLOCKED (a
// rare CI failure of TestSbatchAcrossNodes).
func TestRedeliveryAtTheAttemptLimitWaitsForTheRunningAttempt(t *testing.T) {
	env, runs, gate := gatedAttempt(t)
	secondDelivery(t, env)
	openGate(t, env, runs, gate)
}

// TestLeaseWaitEndsWhenTheRecordSaysTheShardEnded: a delivery waiting for
// the lease of a running attempt (here the message came again, its
// heartbeat having reached the server after the ack wait) is settled as
// soon as the shard's record says the attempt committed, while the lease
// the attempt leaves to expire still lives. Before, the delivery kept its
// worker's slot until that lease expired (up to a TTL after the commit).
func TestLeaseWaitEndsWhenTheRecordSaysTheShardEnded(t *testing.T) {
	env, runs, gate := gatedAttempt(t)
	log := secondDelivery(t, env)
	// While it waits, b's report names the shard it holds a slot for.
	awaiting := func(want []string) {
		t.Helper()
		testenv.Eventually(t, 5*time.Second, func() (bool, string) {
			rs, err := env.Buckets().WorkerReports(context.Background())
			for _, r := range rs {
				if r.Name == "b" {
					return slices.Equal(r.Awaiting, want), fmt.Sprintf("b's report: awaiting %q, want %q", r.Awaiting, want)
				}
			}
			return false, fmt.Sprintf("no report of b (%v)", err)
		})
	}
	awaiting([]string{"t.s0000"})
	openGate(t, env, runs, gate)
	// a's lease, left to expire after its commit: it ends TTL after its
	// last write, by the server's clock, which is this machine's.
	e, err := env.Buckets().Leases.Get(context.Background(), stream.ShardKey("t", "s0000"))
	if err != nil {
		t.Fatalf("a's lease right after its commit: %v", err)
	}
	expires := e.Created().Add(gatedTTL)
	var skipped time.Time
	testenv.Eventually(t, 3*gatedTTL, func() (bool, string) {
		b, _ := os.ReadFile(log)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "worker=b ") && strings.Contains(line, "decision=skip") {
				skipped, err = time.Parse(time.RFC3339Nano, strings.Fields(line)[0])
				return err == nil, fmt.Sprintf("line %q: %v", line, err)
			}
		}
		return false, "b did not settle its delivery; admission log:\n" + string(b)
	})
	if !skipped.Before(expires) {
		t.Fatalf("b settled its delivery at %s, after a's lease expired (%s); want as soon as the record said the shard committed",
			skipped.Format(time.RFC3339Nano), expires.Format(time.RFC3339Nano))
	}
	awaiting(nil)
}

// TestExhaustedMessageWaitsForItsRunningAttempt: a shard's message that
// runs out of deliveries while an attempt of it still runs and holds its
// lease (the heartbeats reached the server late, each time: here an ack
// wait made shorter than their period, and two deliveries allowed) is not
// recorded failed by the coordinator while that lease lives; the attempt
// commits and the run completes. Before, the shard was recorded failed
// at once, under the running attempt.
func TestExhaustedMessageWaitsForItsRunningAttempt(t *testing.T) {
	env, runs, gate := gatedAttempt(t)
	advisories, err := env.JS.Conn().SubscribeSync(stream.AdvisoryMaxDeliveries)
	if err != nil {
		t.Fatal(err)
	}
	updateConsumer(t, env, func(c *jetstream.ConsumerConfig) { c.AckWait, c.MaxDeliver = 300*time.Millisecond, 2 })
	// b has a slot to spare: its fetch is what meets the message with no
	// delivery left.
	env.StartWorker("b", map[string]int{"cpu": 2})
	if _, err := advisories.NextMsg(20 * time.Second); err != nil {
		t.Fatalf("the message did not run out of deliveries: %v", err)
	}
	// The coordinator handles the advisory at once, and looks again every
	// 200 ms: give it a few looks.
	time.Sleep(time.Second)
	if rec, err := env.Shard("t", "s0000"); err != nil || rec.State != stream.ShardRunning {
		t.Fatalf("shard %s (%s), %v; want still running, its attempt holding the lease", rec.State, rec.Reason, err)
	}
	openGate(t, env, runs, gate)
	// The message is gone from the queue: the run does not wait on it.
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		si, err := env.JS.Stream(context.Background(), stream.StreamShards)
		return err == nil && si.CachedInfo().State.Msgs == 0, "the message is still queued"
	})
}

// TestRedeliveryOverAnotherRunsOutputWaitsForTheRunningAttempt: a
// delivery that finds another run's output at the shard's destination
// while the shard's one attempt still runs (the message came again, the
// heartbeat having reached the server after the ack wait) leaves the
// verdict to that attempt, which meets the same output at its commit: the
// shard fails once, its attempt closed with its own outcome, and the other
// run's output stays as it was. Before, the second delivery closed the
// running attempt as lost and failed the shard under it.
func TestRedeliveryOverAnotherRunsOutputWaitsForTheRunningAttempt(t *testing.T) {
	env, runs, gate := gatedAttempt(t)
	// Run "other" commits its own s0000 into the same output directory
	// while attempt 1 of run t runs.
	dst := commitOtherRunsOutput(t, env)
	log := secondDelivery(t, env)
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rr := env.WaitState("t", 30*time.Second, stream.RunBlocked, stream.RunComplete)
	rec, err := env.Shard("t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if rr.State != stream.RunBlocked || rec.State != stream.ShardFailed || !strings.Contains(rec.Reason, "holds the output of run other") {
		t.Fatalf("run %s (%s), shard %s (%s); want BLOCKED, the shard failed naming run other", rr.State, rr.Reason, rec.State, rec.Reason)
	}
	if len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeCommit {
		b, _ := os.ReadFile(log)
		t.Fatalf("attempts %+v; want attempt 1 closed by its own commit (%s), not by the second delivery\nadmission log:\n%s", rec.Attempts, stream.OutcomeCommit, b)
	}
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "x") != 1 {
		t.Fatalf("the command ran %d times, want once", strings.Count(string(b), "x"))
	}
	if mk, err := checkpoint.Verify(dst); err != nil || mk.Run != "other" {
		t.Fatalf("the other run's output: marker of run %q, %v; want run other's, verifying", mk.Run, err)
	}
}

// TestRedeliveryOverTheRunningAttemptsOutputWaitsForItsRecord: a delivery
// that finds the shard's output committed, with this fingerprint, while
// the record still holds the attempt open (the attempt published it and
// its record is on the way: here the output is put there in the
// attempt's name while its command waits) leaves the record to that
// attempt: the shard ends validated with attempt 1 ok, written by its own
// worker. Before, the second delivery recorded the shard validated over
// the open attempt, which kept no outcome, and the attempt's own record
// write was refused (a CI failure of the drill's coordinator outage).
func TestRedeliveryOverTheRunningAttemptsOutputWaitsForItsRecord(t *testing.T) {
	env, runs, gate := gatedAttempt(t)
	rec, err := env.Shard("t", "s0000")
	if err != nil || !rec.OpenAttempt() {
		t.Fatalf("record %+v (%v); want attempt 1 open", rec, err)
	}
	at := rec.Attempts[0]
	commitOutput(t, env, checkpoint.Options{Run: "t", Owner: fmt.Sprintf("%s/%s/%d/attempt-%d", at.Worker, at.Host, os.Getpid(), at.N)})
	log := secondDelivery(t, env)
	if b, _ := os.ReadFile(log); !bytes.Contains(b, []byte("worker=b run=t shard=s0000 class=cpu decision=defer")) {
		t.Fatalf("b did not wait for a's lease; admission log:\n%s", b)
	}
	openGate(t, env, runs, gate)
}

// TestOutputOfAnOpenAttemptClosesIt: the record holds attempt 1 open by a
// worker that left no lease, and the shard's output is committed with
// this fingerprint. The delivery that takes the lease records the shard
// validated from that output without running the command, and closes the
// open attempt: ok when the output's marker names it as its committer (it
// died between publishing and recording), lost when not: another attempt
// number, worker or pid.
func TestOutputOfAnOpenAttemptClosesIt(t *testing.T) {
	for _, tc := range []struct {
		owner, outcome, reason string
	}{
		{"gone/elsewhere/1/attempt-1", stream.OutcomeOK, "committed by attempt 1, which did not record it"},
		{"gone/elsewhere/1/attempt-2", stream.OutcomeLost, "already committed by an earlier run"},
		{"other/elsewhere/1/attempt-1", stream.OutcomeLost, "already committed by an earlier run"},
		{"gone/elsewhere/2/attempt-1", stream.OutcomeLost, "already committed by an earlier run"},
	} {
		t.Run(tc.owner, func(t *testing.T) {
			env, seen := openAttemptRun(t, 2)
			dst, _ := commitOutput(t, env, checkpoint.Options{Run: "t", Owner: tc.owner})
			env.StartWorker("w1", map[string]int{"cpu": 1})
			rr := env.WaitState("t", 30*time.Second, stream.RunComplete, stream.RunBlocked)
			rec, err := env.Shard("t", "s0000")
			if err != nil {
				t.Fatal(err)
			}
			if rr.State != stream.RunComplete || rec.State != stream.ShardValidated || !strings.Contains(rec.Reason, tc.reason) {
				t.Fatalf("run %s (%s), shard %s (%s); want COMPLETE, the shard validated: %q", rr.State, rr.Reason, rec.State, rec.Reason, tc.reason)
			}
			if len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != tc.outcome {
				t.Fatalf("attempts %+v; want attempt 1 closed %s", rec.Attempts, tc.outcome)
			}
			if b, _ := os.ReadFile(seen); len(b) != 0 {
				t.Fatalf("the command ran (attempts %q); want not at all", b)
			}
			if mk, err := checkpoint.Verify(dst); err != nil || mk.Owner != tc.owner {
				t.Fatalf("the output: marker of %q, %v; want the one committed before, verifying", mk.Owner, err)
			}
		})
	}
}

// TestOtherRunsOutputRemovedWhileWaitingIsNotHeldAgainstTheShard: a
// delivery that found another run's output at the destination and waited
// for the running attempt's lease judges the destination afresh once it
// holds the lease: the user removed that output meanwhile, and the
// attempt it waited for was interrupted (its worker stopped), so it runs
// the shard. Before, it failed the shard naming the output it had seen
// before the wait.
func TestOtherRunsOutputRemovedWhileWaitingIsNotHeldAgainstTheShard(t *testing.T) {
	env, runs, gate := gatedAttempt(t)
	dst := commitOtherRunsOutput(t, env)
	log := secondDelivery(t, env)
	// The user hands the directory over, and worker a stops: its attempt
	// is interrupted (not charged) and its lease released.
	if err := os.RemoveAll(dst); err != nil {
		t.Fatal(err)
	}
	if err := env.StopWorker("a"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rr := env.WaitState("t", 60*time.Second, stream.RunComplete, stream.RunBlocked)
	if rr.State != stream.RunComplete {
		b, _ := os.ReadFile(log)
		t.Fatalf("run %s (%s); want COMPLETE from b's attempt\nadmission log:\n%s", rr.State, rr.Reason, b)
	}
	if mk, err := checkpoint.Verify(dst); err != nil || mk.Run != "t" {
		t.Fatalf("the output: marker of run %q, %v; want run t's, verifying", mk.Run, err)
	}
	if b, _ := os.ReadFile(runs); strings.Count(string(b), "x") != 2 {
		t.Fatalf("the command started %d times, want twice (a's, interrupted; b's)", strings.Count(string(b), "x"))
	}
}

// TestOpenAttemptOverAnotherRunsOutputFailsOnceItsLeaseIsGone: another
// run's output at the destination of a shard whose record holds an
// attempt open by a worker that left no lease (openAttemptRun): the
// first delivery takes the lease, reads the record, and fails the shard
// at once, the attempt closed as lost, without running the command.
// Before, that delivery wrote its failed record over a record it had not
// read, which the store refused: the shard waited a TTL for the next
// delivery.
func TestOpenAttemptOverAnotherRunsOutputFailsOnceItsLeaseIsGone(t *testing.T) {
	env, seen := openAttemptRun(t, 2)
	commitOtherRunsOutput(t, env)
	env.StartWorker("w1", map[string]int{"cpu": 1})
	rr := env.WaitState("t", 30*time.Second, stream.RunBlocked, stream.RunComplete)
	rec, err := env.Shard("t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	log, _ := os.ReadFile(filepath.Join(env.Data, "runs", "t", "admission.log"))
	if rr.State != stream.RunBlocked || rec.State != stream.ShardFailed || !strings.Contains(rec.Reason, "holds the output of run other") {
		t.Fatalf("run %s (%s), shard %s (%s); want BLOCKED, the shard failed naming run other", rr.State, rr.Reason, rec.State, rec.Reason)
	}
	if len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeLost || bytes.Contains(log, []byte("final record not written")) {
		t.Fatalf("attempts %+v; want attempt 1 closed as lost by the first delivery\nadmission log:\n%s", rec.Attempts, log)
	}
	if b, _ := os.ReadFile(seen); len(b) != 0 {
		t.Fatalf("the command ran (attempts %q); want not at all", b)
	}
}

// gatedCommit submits run t of one shard with no retries, whose command
// waits for the file gate and then writes "mine", and starts a worker: the
// shard is running when it returns, with its destination dst.
func gatedCommit(t *testing.T) (env *testenv.Env, run stream.RunRecord, dst, gate string) {
	t.Helper()
	env = testenv.New(t, testenv.Options{NoWorkers: true})
	gate = filepath.Join(t.TempDir(), "go")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0,
		Command: []string{"sh", "-c", `while [ ! -e "$1" ]; do sleep 0.05; done; echo mine > "$2/r.txt"`, "sh", gate, "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.StartWorker("", map[string]int{"cpu": 1})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, _ := env.Run("t")
		return r.Counts.Running == 1, "the shard is not running yet"
	})
	run, err := env.Run("t")
	if err != nil {
		t.Fatal(err)
	}
	return env, run, filepath.Join(filepath.Dir(spec), "out", "s0000"), gate
}

// claimAndGo puts another attempt's commit claim of gatedCommit's shard,
// with checksum, just written, by an owner on another host, then lets the
// command end.
func claimAndGo(t *testing.T, env *testenv.Env, run stream.RunRecord, dst, checksum, gate string) {
	t.Helper()
	ctx := context.Background()
	claim, _ := stream.Encode(&stream.CommitRecord{Run: "t", ID: "s0000", Fingerprint: run.Fingerprint, State: stream.CommitCommitted,
		Owner: stream.Owner{Worker: "gone", Host: "elsewhere", PID: 1}, Checksum: checksum, Path: dst, Time: time.Now().UTC()})
	kv, err := env.JS.KeyValue(ctx, stream.BucketCheckpoint)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, stream.ShardKey("t", "s0000"), claim); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// openAttemptRecord reads gatedCommit's shard record, with the bucket,
// key and entry to update it from, and checks that it holds attempt 1
// open (its command waits at the gate).
func openAttemptRecord(t *testing.T, env *testenv.Env) (jetstream.KeyValue, string, jetstream.KeyValueEntry, stream.ShardRecord) {
	t.Helper()
	ctx := context.Background()
	kv, err := env.JS.KeyValue(ctx, stream.BucketShards)
	if err != nil {
		t.Fatal(err)
	}
	key := stream.ShardKey("t", "s0000")
	e, err := kv.Get(ctx, key)
	var rec stream.ShardRecord
	if err == nil {
		err = stream.Decode(e.Value(), &rec)
	}
	if err != nil || !rec.OpenAttempt() || len(rec.Attempts) != 1 || rec.Owner == nil {
		t.Fatalf("record %+v (%v); want attempt 1 open", rec, err)
	}
	return kv, key, e, rec
}

// publishAndGo publishes another attempt's output of gatedCommit's shard
// at its destination (commitOutput, with the marker's owner and run from
// opt), puts its claim (claimAndGo), lets the command end, and returns
// the output's checksum.
func publishAndGo(t *testing.T, env *testenv.Env, run stream.RunRecord, gate string, opt checkpoint.Options) string {
	t.Helper()
	dst, mk := commitOutput(t, env, opt)
	claimAndGo(t, env, run, dst, mk.Manifest, gate)
	return mk.Manifest
}

// TestLostCommitRaceStillRecordsValidated: an attempt whose commit finds
// another attempt's claim already published (that attempt died, or lost its
// record write, between publishing and recording) discards its own output
// and records the shard validated from the published one, read back in
// full; before, it left the record running and settled the message, and
// the run waited for good.
func TestLostCommitRaceStillRecordsValidated(t *testing.T) {
	env, run, dst, gate := gatedCommit(t)
	// Another attempt's output, published at the destination with its claim.
	theirs := publishAndGo(t, env, run, gate, checkpoint.Options{Owner: "gone/vm/1/attempt-1"})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	rec, err := env.Shard("t", "s0000")
	if err != nil || rec.State != stream.ShardValidated || rec.Output == nil || rec.Output.Checksum != theirs ||
		!strings.Contains(rec.Reason, "committed by another attempt") {
		t.Fatalf("record: %+v (%v); want validated with the published output", rec, err)
	}
	// The attempt that lost, once, closed as discarded: not also left open
	// (which would charge it).
	if len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeDiscarded {
		t.Fatalf("attempts %+v; want the one attempt, discarded", rec.Attempts)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "r.txt")); string(b) != "made by gone/vm/1/attempt-1\n" {
		t.Fatalf("destination holds %q, want the published output kept", b)
	}
}

// TestLostCommitRaceClosesTheWinnersOpenAttempt: attempt 1's lease was
// given up for lost while it committed, and attempt 2, on another host,
// began, published its output and has not recorded it yet (here the
// test writes that record and output while attempt 1's command waits). Attempt 1 loses the commit race and records the shard validated
// from attempt 2's output: attempt 1 discarded, attempt 2 ok, since its
// own record write is refused from then on. Before, attempt 2 kept no
// outcome under the validated record.
func TestLostCommitRaceClosesTheWinnersOpenAttempt(t *testing.T) {
	env, run, dst, gate := gatedCommit(t)
	ctx := context.Background()
	kv, key, e, rec := openAttemptRecord(t, env)
	// What attempt 2's start writes (beginAttempt).
	owner := stream.Owner{Worker: "b", Host: "elsewhere", PID: 7, Attempt: 2}
	rec.CloseLost()
	rec.Owner = &owner
	rec.Attempts = append(rec.Attempts, stream.Attempt{N: 2, Worker: owner.Worker, Host: owner.Host, Start: time.Now().UTC()})
	data, err := stream.Encode(&rec)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Update(ctx, key, data, e.Revision()); err != nil {
		t.Fatal(err)
	}
	theirs := publishAndGo(t, env, run, gate, checkpoint.Options{Owner: "b/elsewhere/7/attempt-2", Run: "t"})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	rec, err = env.Shard("t", "s0000")
	if err != nil || rec.State != stream.ShardValidated || rec.Output == nil || rec.Output.Checksum != theirs {
		t.Fatalf("record: %+v (%v); want validated with attempt 2's output", rec, err)
	}
	if len(rec.Attempts) != 2 || rec.Attempts[0].Outcome != stream.OutcomeDiscarded || rec.Attempts[1].Outcome != stream.OutcomeOK ||
		!strings.Contains(rec.Attempts[1].Reason, "recorded by attempt 1 of ") {
		t.Fatalf("attempts %+v; want attempt 1 discarded, attempt 2 ok, recorded by attempt 1", rec.Attempts)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "r.txt")); string(b) != "made by b/elsewhere/7/attempt-2\n" {
		t.Fatalf("destination holds %q, want attempt 2's output kept", b)
	}
}

// TestCommitRaceWinnerTakesTheRecordWrittenForIt: the attempt that wins
// the commit race finds its record write refused when the loser has
// recorded the shard validated from the winner's output and closed the
// winner's attempt ok (recordDiscarded). That record is what the winner
// would write: it settles the message at once. Before, it took the
// refusal for a store that did not answer, logged "defer ... coordinator
// store unavailable" and handed the message back, to be settled by the
// next delivery half a lease later.
func TestCommitRaceWinnerTakesTheRecordWrittenForIt(t *testing.T) {
	env, kv, key, rev, dst := losersRecord(t, stream.OutcomeOK)
	b := waitForVerdict(t, env)
	if !bytes.Contains(b, []byte("decision=validated attempt 1 ")) || bytes.Contains(b, []byte("decision=defer")) {
		t.Fatalf("admission log:\n%s\nwant attempt 1 validated, nothing deferred", b)
	}
	if got, _ := os.ReadFile(filepath.Join(dst, "r.txt")); string(got) != "mine\n" {
		t.Fatalf("destination holds %q, want the command's output", got)
	}
	waitSettled(t, env, 5*time.Second)
	if e, err := kv.Get(context.Background(), key); err != nil || e.Revision() != rev {
		t.Fatalf("record written again (%v): the loser's record should stand", err)
	}
}

// TestCommitRaceWinnerDefersOnAnotherRecord: where the record that
// refused the winner's write does not say what it would (here the loser
// closed the winner's attempt lost), the winner hands the message back
// and the next delivery settles it from the record and the output, as
// before; its admission log says the record changed, not that the store
// was unavailable.
func TestCommitRaceWinnerDefersOnAnotherRecord(t *testing.T) {
	env, _, _, _, _ := losersRecord(t, stream.OutcomeLost)
	b := waitForVerdict(t, env)
	if !bytes.Contains(b, []byte("decision=defer the shard's record changed meanwhile (another attempt, or the coordinator, wrote it)")) ||
		bytes.Contains(b, []byte("unavailable")) {
		t.Fatalf("admission log:\n%s\nwant a deferral that says the record changed", b)
	}
	waitSettled(t, env, 20*time.Second)
	rec, err := env.Shard("t", "s0000")
	if err != nil || rec.State != stream.ShardValidated || len(rec.Attempts) != 2 || rec.Attempts[0].Outcome != stream.OutcomeLost {
		t.Fatalf("record %+v (%v); want validated as the loser wrote it", rec, err)
	}
}

// losersRecord runs gatedCommit's shard and, while its command waits,
// writes its record as an attempt that lost the commit race to it leaves
// it: validated from the output the command is about to make (same file,
// same checksum), its own attempt discarded, and the waiting attempt
// closed with outcome. Then it lets the command end. It returns the
// shards bucket, the key, the record's revision and the destination.
func losersRecord(t *testing.T, outcome string) (*testenv.Env, jetstream.KeyValue, string, uint64, string) {
	t.Helper()
	env, run, dst, gate := gatedCommit(t)
	ctx := context.Background()
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "r.txt"), []byte("mine\n"), 0o666); err != nil {
		t.Fatal(err)
	}
	same, err := checkpoint.CommitDir(ctx, filepath.Join(t.TempDir(), "s0000"), src, checkpoint.Options{Fingerprint: run.Fingerprint, Run: "t"}, "")
	if err != nil {
		t.Fatal(err)
	}
	kv, key, e, rec := openAttemptRecord(t, env)
	rec.Attempts[0].Outcome, rec.Attempts[0].Reason = outcome, "committed its output; recorded by attempt 2 of b, which lost the commit race to it"
	rec.Attempts = append(rec.Attempts, stream.Attempt{N: 2, Worker: "b", Host: "elsewhere", Start: time.Now().UTC(),
		Outcome: stream.OutcomeDiscarded, Reason: "another attempt committed the shard's output first"})
	rec.State, rec.Owner, rec.Reason = stream.ShardValidated, nil, "output committed by another attempt, which did not record it"
	rec.Output = &stream.Output{Path: dst, Checksum: same.Manifest, Files: same.Files, Bytes: same.Bytes}
	data, err := stream.Encode(&rec)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Update(ctx, key, data, e.Revision())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return env, kv, key, rev, dst
}

// waitForVerdict waits until the run's admission log says how the
// attempt of s0000 concluded (validated or deferred) and returns it.
func waitForVerdict(t *testing.T, env *testenv.Env) []byte {
	t.Helper()
	log := filepath.Join(env.Data, "runs", "t", "admission.log")
	var b []byte
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ = os.ReadFile(log)
		return bytes.Contains(b, []byte("shard=s0000 class=cpu decision=validated")) || bytes.Contains(b, []byte("decision=defer")),
			"admission log:\n" + string(b)
	})
	return b
}

// waitSettled waits until the cpu consumer has nothing pending or
// waiting for an ack.
func waitSettled(t *testing.T, env *testenv.Env, within time.Duration) {
	t.Helper()
	ctx := context.Background()
	testenv.Eventually(t, within, func() (bool, string) {
		ci, err := env.JS.Consumer(ctx, stream.StreamShards, "cpu")
		if err != nil {
			return false, err.Error()
		}
		info, err := ci.Info(ctx)
		if err != nil {
			return false, err.Error()
		}
		return info.NumPending == 0 && info.NumAckPending == 0, fmt.Sprintf("consumer: %d pending, %d waiting for an ack", info.NumPending, info.NumAckPending)
	})
}

// TestPendingCommitOfAnotherAttemptSpendsNoAttempt: an attempt whose
// commit meets another attempt's claim, just written and not published
// (its owner on another host, not known gone), discards its output
// without spending one of the shard's attempts, and the shard goes back
// to pending; once the claim is older than a lease TTL, the next delivery
// runs the shard and takes the claim over. Before, the record kept the
// attempt open beside its discarded copy: the open one was charged, and a
// shard with no retries failed as out of attempts.
func TestPendingCommitOfAnotherAttemptSpendsNoAttempt(t *testing.T) {
	env, run, dst, gate := gatedCommit(t)
	claimAndGo(t, env, run, dst, "theirs", gate)
	rr := env.WaitState("t", 30*time.Second, stream.RunComplete, stream.RunBlocked)
	rec, err := env.Shard("t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if rr.State != stream.RunComplete || rec.State != stream.ShardValidated {
		t.Fatalf("run %s (%s), shard %s (%s), attempts %+v; want COMPLETE from a second attempt", rr.State, rr.Reason, rec.State, rec.Reason, rec.Attempts)
	}
	if len(rec.Attempts) != 2 || rec.Attempts[0].Outcome != stream.OutcomeDiscarded || rec.Attempts[1].Outcome != stream.OutcomeOK {
		t.Fatalf("attempts %+v; want attempt 1 discarded, then one ok", rec.Attempts)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "r.txt")); string(b) != "mine\n" {
		t.Fatalf("destination holds %q, want the second attempt's output", b)
	}
}

// TestReportFollowsWhatTheWorkerDoes: status reads workers' reports. On
// the report period alone (a minute here, 5 s by default) a report said
// nothing ran while shards ran, and gave no reason for the ones waiting;
// a worker now reports such a change within a second (the test allows 5 s on a loaded machine, still far below the period).
func TestReportFollowsWhatTheWorkerDoes(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}, ReportEvery: time.Minute})
	ctx := context.Background()
	b := env.Buckets()
	env.Submit(concurrencyJob(t, 2, "3", ""), coordinator.SubmitOptions{})
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		rs, err := b.WorkerReports(ctx)
		if err != nil || len(rs) != 1 {
			return false, fmt.Sprintf("reports %+v (%v)", rs, err)
		}
		r := rs[0]
		return r.Running["cpu"] == 1 && strings.Contains(r.Waiting["cpu"], "1 of 1 slots of class cpu in use"),
			fmt.Sprintf("report: running %v, waiting %q; want 1 running and the other shard waiting for the slot", r.Running, r.Waiting)
	})
}

// TestAWorkerAtItsSlotsSaysWhyWhileItsShardRuns: a worker whose every
// slot is an open fetch waiting for a shard reports no wait (it holds
// nothing back), and looks again only when a slot frees or on its
// recheck. Once the shard arrived nothing said why the worker fetched
// no more: a worker at its slots with shards shorter than the recheck
// (1 s by default; a minute here) gave no reason at all, and status fell
// back to "see their admission.log". The delivery reports the wait now.
// The first shard ends at once, so that the loop looks again with its
// fetch for the second one still open.
func TestAWorkerAtItsSlotsSaysWhyWhileItsShardRuns(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}, ReportEvery: time.Minute, Recheck: time.Minute})
	ctx := context.Background()
	b := env.Buckets()
	env.Submit(testenv.WriteJob(t, testenv.Job{Shards: 3, Command: []string{"sh", "-c", `[ "$1" = s0000 ] || sleep 3`, "sh", "{id}"}}), coordinator.SubmitOptions{})
	testenv.Eventually(t, 2500*time.Millisecond, func() (bool, string) {
		rs, err := b.WorkerReports(ctx)
		if err != nil || len(rs) != 1 {
			return false, fmt.Sprintf("reports %+v (%v)", rs, err)
		}
		r := rs[0]
		return r.Running["cpu"] == 1 && r.Done == 1 && strings.Contains(r.Waiting["cpu"], "1 of 1 slots of class cpu in use"),
			fmt.Sprintf("report: running %v, done %d, waiting %q; want the second shard running and why the third waits", r.Running, r.Done, r.Waiting)
	})
	// The report names the log of its decisions, which status points to.
	rs, err := b.WorkerReports(ctx)
	if err != nil || len(rs) != 1 {
		t.Fatalf("reports %+v (%v)", rs, err)
	}
	if log, err := os.ReadFile(rs[0].AdmissionLog); err != nil || !strings.Contains(string(log), "decision=wait 1 of 1 slots of class cpu in use") {
		t.Errorf("the report's admission log %q (%v) holds:\n%s\nwant the worker's wait in it", rs[0].AdmissionLog, err, log)
	}
}

// TestNewGenerationStartsItsCheckpointsAfresh: an edited job (a new
// fingerprint) does not resume from what the old generation checkpointed
// in {ckpt}: its shards start afresh, and once one commits, the old
// generation's checkpoints of that shard are removed. Before, a training
// job edited after it finished resumed from its final checkpoint and
// committed the old model as the new generation's output.
func TestNewGenerationStartsItsCheckpointsAfresh(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Extra: "[env]\nTAG = \"g1\"\n",
		Command: []string{"sh", "-c", `ck=$SHARDPOOL_CKPT_DIR; if [ -f "$ck/state" ]; then cp "$ck/state" "$SHARDPOOL_OUT/from"; else echo "fresh $TAG" > "$SHARDPOOL_OUT/from"; fi; mkdir -p "$ck" && echo "$TAG" > "$ck/state"`}})
	out := filepath.Join(filepath.Dir(spec), "out")
	first := env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	b, _ := os.ReadFile(filepath.Join(out, "s0000", "from"))
	if string(b) != "fresh g1\n" {
		t.Fatalf("first generation's output: %q, want it fresh", b)
	}
	edited, _ := os.ReadFile(spec)
	if err := os.WriteFile(spec, []byte(strings.Replace(string(edited), `TAG = "g1"`, `TAG = "g2"`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	second := env.Submit(spec, coordinator.SubmitOptions{})
	if second.Fingerprint == first.Fingerprint {
		t.Fatalf("the edited env kept fingerprint %s", first.Fingerprint)
	}
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	b, _ = os.ReadFile(filepath.Join(out, "s0000", "from"))
	if string(b) != "fresh g2\n" {
		t.Fatalf("second generation's output: %q, want it fresh, not resumed from the first generation's checkpoint", b)
	}
	if _, err := os.Stat(worker.CkptDir(out, "t", first.Fingerprint, "s0000")); !os.IsNotExist(err) {
		t.Fatalf("the first generation's checkpoints of s0000 after the second committed it: %v, want them removed", err)
	}
	if b, _ := os.ReadFile(filepath.Join(worker.CkptDir(out, "t", second.Fingerprint, "s0000"), "state")); string(b) != "g2\n" {
		t.Fatalf("the second generation's checkpoint: %q, want g2", b)
	}
}

// TestFullScratchHoldsTheWorkerNotTheShards: a scratch directory that
// fails (here a tmpfs with no inode left, as a full /tmp) is the host's
// fault, not the shard's. Before, every shard the worker took failed
// with "scratch: ..." and spent its retries, and the run ended BLOCKED;
// now the attempt is handed back uncharged, the worker fetches nothing
// while its scratch fails, and once there is room again the run
// completes.
func TestFullScratchHoldsTheWorkerNotTheShards(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	scratch := filepath.Join(env.Data, "scratch", "w1")
	testenv.SmallTmpfs(t, scratch, "1m,nr_inodes=16")
	env.StartWorker("w1", map[string]int{"cpu": 1})
	// Wait for the worker to be up (its start checks the scratch
	// directory), then use up the inodes.
	ctx := context.Background()
	b := env.Buckets()
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		rs, _ := b.WorkerReports(ctx)
		return len(rs) == 1, fmt.Sprintf("reports %+v, want the worker's", rs)
	})
	var filler []string
	for i := 0; ; i++ {
		p := filepath.Join(scratch, fmt.Sprintf("filler-%d", i))
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the scratch tmpfs: %v", err)
			}
			break
		}
		filler = append(filler, p)
	}
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Retries: 0, Command: []string{"sh", "-c", `echo ok > "$1/r"`, "sh", "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	// One shard is taken and handed back; the worker then fetches no more.
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		rs, _ := b.WorkerReports(ctx)
		if len(rs) != 1 {
			return false, fmt.Sprintf("reports %+v", rs)
		}
		return strings.Contains(rs[0].Waiting["cpu"], "not usable"), fmt.Sprintf("waiting %q, want the scratch directory named as why", rs[0].Waiting)
	})
	time.Sleep(2 * time.Second)
	tried := 0
	for i := range 3 {
		rec, err := env.Shard("t", fmt.Sprintf("s%04d", i))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.State == stream.ShardFailed {
			t.Fatalf("shard %s failed on the worker's scratch: %+v", rec.ID, rec.Attempts)
		}
		for _, at := range rec.Attempts {
			tried++
			if at.Outcome != stream.OutcomeInterrupted || !strings.Contains(at.Reason, scratch) {
				t.Fatalf("shard %s attempt %+v, want it interrupted, naming %s", rec.ID, at, scratch)
			}
		}
	}
	if tried != 1 {
		t.Fatalf("%d attempts while the scratch was full, want 1 (then no fetch)", tried)
	}
	if r, _ := env.Run("t"); r.State == stream.RunBlocked {
		t.Fatalf("run BLOCKED on a full scratch: %s", r.Reason)
	}
	for _, p := range filler {
		os.Remove(p)
	}
	env.WaitState("t", 30*time.Second, stream.RunComplete)
	for i := range 3 {
		if b, err := os.ReadFile(filepath.Join(filepath.Dir(spec), "out", fmt.Sprintf("s%04d", i), "r")); err != nil || string(b) != "ok\n" {
			t.Fatalf("output of s%04d: %q, %v", i, b, err)
		}
	}
}

// TestStopSignalOfWorkerAndCommandIsNotAFailure: Slurm's scancel (and
// systemd's stop of a unit) signals every process at once, so a command
// may die of SIGTERM a moment before its worker begins to stop. That
// death is the worker's shutdown: the attempt is interrupted, not
// charged, and with retries = 0 the shard still completes elsewhere.
// The same signal while the worker keeps running is the shard's failure
// (TestCommandKilledBySignalFails).
func TestStopSignalOfWorkerAndCommandIsNotAFailure(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	dir := t.TempDir()
	pidFile, done := filepath.Join(dir, "pid"), filepath.Join(dir, "done")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 0,
		Command: []string{"sh", "-c", `if [ -e "$2" ]; then exit 0; fi; echo $$ > "$1"; exec sleep 60`, "sh", pidFile, done}})
	env.Submit(spec, coordinator.SubmitOptions{})
	w := env.StartWorker("", map[string]int{"cpu": 1})
	var pid int
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return pid > 0, "the command has not started"
	})
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the command is dead and reaped before its worker hears of the stop
	if err := env.StopWorker(w.Name); err != nil {
		t.Fatal(err)
	}
	rec, err := env.Shard("t", "s0000")
	if err != nil || rec.State == stream.ShardFailed || len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeInterrupted {
		t.Fatalf("record after SIGTERM to command and worker: %+v (%v); want one interrupted attempt, not failed", rec, err)
	}
	if err := os.WriteFile(done, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env.StartWorker("", map[string]int{"cpu": 1})
	env.WaitState("t", 30*time.Second, stream.RunComplete)
}

// TestCommandKilledBySignalFails: a command that dies of a signal nobody
// stopping the worker sent is a failed attempt that names the signal.
func TestCommandKilledBySignalFails(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Retries: 0,
		Line: func(i int, input string) string {
			sig := []string{"TERM", "KILL"}[i]
			return fmt.Sprintf(`{"id":"s%04d","inputs":[%q],"params":{"sig":%q}}`, i, input, sig)
		},
		Command: []string{"sh", "-c", `kill -$SHARDPOOL_PARAM_SIG $$`}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunBlocked)
	for id, want := range map[string]string{"s0000": "killed by signal terminated", "s0001": "killed by signal killed"} {
		rec, err := env.Shard("t", id)
		if err != nil || rec.State != stream.ShardFailed || len(rec.Attempts) != 1 || rec.Attempts[0].Outcome != stream.OutcomeSignal ||
			!strings.Contains(rec.Attempts[0].Reason, want) {
			t.Errorf("shard %s: %+v (%v); want failed after one attempt %q", id, rec, err, want)
		}
	}
}

// A class's declared scratch is part of admission: with 3 slots and room
// on a 12 MiB scratch for two shards of 5 MiB, the worker fetches two,
// and the third stays queued (for another host, were there one) until
// one of them ends, instead of waiting for room in its slot.
func TestAdmissionFetchesOnlyWhatScratchHasRoomFor(t *testing.T) {
	testenv.RequireRoot(t)
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	testenv.SmallTmpfs(t, filepath.Join(env.Data, "scratch", "w1"), "12m")
	env.StartWorker("w1", map[string]int{"cpu": 3})

	spec := concurrencyJob(t, 4, "1", "[class.cpu]\nscratch = \"5MiB\"\n")
	hostLog, runLog := completeWithLogs(t, env, spec, "t", 60*time.Second)
	if most := maxConcurrent(t, spec, 4); most != 2 {
		t.Errorf("%d shards ran at once; want 2 (12 MiB of scratch, 5 MiB declared each, 3 slots)\n%s", most, runLog)
	}
	if !regexp.MustCompile(`class=cpu decision=wait 2 of 3 slots of class cpu in use; slots from configuration; scratch at \S+ has room for 0 more shard\(s\) declaring 5\.0MiB: \S+ free, 10\.0MiB reserved by running shards and not yet written`).Match(hostLog) {
		t.Errorf("the worker's admission.log does not say scratch held the third slot back:\n%s", hostLog)
	}
	if strings.Contains(string(runLog), "not enough scratch space") {
		t.Errorf("a shard was fetched and waited for scratch in its slot:\n%s", runLog)
	}
	oneAttemptEach(t, env, "t", 4)
}

// Staged inputs are part of admission: until a run's first shard is
// staged here its shards are fetched one at a time, and then the median
// of what its staged shards needed is what the next ones are fetched by.
// 5 shards each staging a 5 MiB input of its own on 12 MiB of scratch, 3
// slots: two fit. Before, every shard after the first two was fetched
// into the third slot and waited there for room, its lease renewed (3 of
// 5); with the median alone, one of the first fetches did; now none.
func TestAdmissionCountsStagedInputs(t *testing.T) {
	testenv.RequireRoot(t)
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	testenv.SmallTmpfs(t, filepath.Join(env.Data, "scratch", "w1"), "12m")
	env.StartWorker("w1", map[string]int{"cpu": 3})

	dir := t.TempDir()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 5, Retries: 0, InputSize: 5 << 20, Extra: "stage = true\n",
		Command: []string{"sh", "-c", `mkdir "$1/$2" && sleep 1.5 && ls "$1" | wc -l > "$3/n" && rmdir "$1/$2"`, "sh", dir, "{id}", "{out}"}})
	hostLog, runLog := completeWithLogs(t, env, spec, "t", 90*time.Second)
	if most := maxConcurrent(t, spec, 5); most != 2 {
		t.Errorf("%d shards ran at once; want 2 (12 MiB of scratch, 5 MiB of inputs each, 3 slots)\n%s", most, runLog)
	}
	waited := map[string]bool{}
	for _, m := range regexp.MustCompile(`shard=(\S+) .*decision=wait stage: not enough scratch space`).FindAllStringSubmatch(string(runLog), -1) {
		waited[m[1]] = true
	}
	if len(waited) > 0 {
		t.Errorf("%d shard(s) were fetched and waited for scratch in their slots, want none: %v\n%s", len(waited), waited, runLog)
	}
	if !regexp.MustCompile(`class=cpu decision=wait \d of 3 slots of class cpu in use; slots from configuration; scratch at \S+ has room for 0 more shard\(s\) needing 5\.0MiB \(0B declared, 5\.0MiB of inputs to stage: the median of the last \d+ staged\)`).Match(hostLog) {
		t.Errorf("the worker's admission.log does not say staged inputs held the third slot back:\n%s", hostLog)
	}
	oneAttemptEach(t, env, "t", 5)
}

// completeWithLogs submits spec, waits for its run to end, and returns
// the worker's admission.log and the run's; it fails t unless the run is
// COMPLETE.
func completeWithLogs(t *testing.T, env *testenv.Env, spec, run string, timeout time.Duration) (hostLog, runLog []byte) {
	t.Helper()
	env.Submit(spec, coordinator.SubmitOptions{})
	r := env.WaitState(run, timeout, stream.RunComplete, stream.RunBlocked)
	hostLog, _ = os.ReadFile(filepath.Join(env.Data, "admission.log"))
	runLog, _ = os.ReadFile(filepath.Join(env.Data, "runs", run, "admission.log"))
	if r.State != stream.RunComplete {
		t.Fatalf("run %s: %s\n%s\n%s", r.State, r.Reason, hostLog, runLog)
	}
	return hostLog, runLog
}

// runningShards is how many of run's shards ids are RUNNING now.
func runningShards(env *testenv.Env, run string, ids ...string) int {
	n := 0
	for _, id := range ids {
		if rec, err := env.Shard(run, id); err == nil && rec.State == stream.ShardRunning {
			n++
		}
	}
	return n
}

// oneAttemptEach fails t unless each of run's first n shards (s0000...)
// made one attempt and was never handed back.
func oneAttemptEach(t *testing.T, env *testenv.Env, run string, n int) {
	t.Helper()
	for i := range n {
		rec, err := env.Shard(run, fmt.Sprintf("s%04d", i))
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Attempts) != 1 || rec.Interrupted != 0 {
			t.Errorf("s%04d: %d attempt(s), %d handed back; want one", i, len(rec.Attempts), rec.Interrupted)
		}
	}
}

// The shards of a run that needs no scratch are not counted as fetched
// without a reservation (holdNoScratch): they held back the shards of a
// run that stages. Two long shards of one run occupy two of four slots;
// a run that stages 5 MiB inputs on 12 MiB of scratch runs two at a
// time beside them. Counted as fetched without a reservation, the long
// shards left room for none more when the first two staged ones ended,
// and the staged run waited for the long one.
func TestAStagedRunIsNotHeldBackByAnotherRunsShards(t *testing.T) {
	testenv.RequireRoot(t)
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	testenv.SmallTmpfs(t, filepath.Join(env.Data, "scratch", "w1"), "12m")
	env.StartWorker("w1", map[string]int{"cpu": 4})
	long := testenv.WriteJob(t, testenv.Job{Name: "long", Shards: 2, Retries: 0, Command: []string{"sleep", "10"}})
	env.Submit(long, coordinator.SubmitOptions{})
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		n := runningShards(env, "long", "s0000", "s0001")
		return n == 2, fmt.Sprintf("%d of the long run's 2 shards running", n)
	})
	staged := testenv.WriteJob(t, testenv.Job{Name: "staged", Shards: 4, Retries: 0, InputSize: 5 << 20, Extra: "stage = true\n",
		Command: []string{"sleep", "1"}})
	env.Submit(staged, coordinator.SubmitOptions{})
	r := env.WaitState("staged", 30*time.Second, stream.RunComplete, stream.RunBlocked)
	other, err := env.Run("long")
	if err != nil {
		t.Fatal(err)
	}
	log, _ := os.ReadFile(filepath.Join(env.Data, "admission.log"))
	if r.State != stream.RunComplete {
		t.Fatalf("staged run %s: %s\n%s", r.State, r.Reason, log)
	}
	if other.State == stream.RunComplete {
		t.Fatalf("the staged run completed only after the long run's shards ended: held back by them\n%s", log)
	}
	env.WaitState("long", 30*time.Second, stream.RunComplete)
}

// Every shard counted as holding its scratch is uncounted when it ends,
// whichever way: a failed attempt keeps its slot to conclude and frees
// it without the attempt's own free, and its count stayed, one more for
// each failure, until admission saw room that no shard held.
func TestScratchHoldsEndWithTheirShards(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	w := env.StartWorker("w1", map[string]int{"cpu": 2})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 4, Retries: 0,
		Command: []string{"sh", "-c", `case "$0" in s0000|s0002) exit 3;; esac`, "{id}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunBlocked, stream.RunComplete)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		n := w.W.ScratchHeld("cpu")
		return n == 0, fmt.Sprintf("%d shard(s) of class cpu still counted as holding scratch after the run ended", n)
	})
}

// What a running shard has written of its declared scratch is counted
// once: gone from the free space, no longer reserved. Two shards of 5
// MiB on 12 MiB each write 4 MiB; when the short one ends, the third
// starts beside the long one (8 MiB free, 1 MiB of it still to be
// written by the long one). Counted in both, the third waited for the
// long one too: the pool emptied before it filled again.
func TestScratchWrittenIsNotReservedTwice(t *testing.T) {
	testenv.RequireRoot(t)
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	testenv.SmallTmpfs(t, filepath.Join(env.Data, "scratch", "w1"), "12m")
	env.StartWorker("w1", map[string]int{"cpu": 3})

	spec := testenv.WriteJob(t, testenv.Job{Name: "w", Shards: 3, Retries: 0, Extra: "[class.cpu]\nscratch = \"5MiB\"\n",
		Command: []string{"sh", "-c", `head -c 4194304 /dev/zero > "$SHARDPOOL_SCRATCH/fill" && if [ "$0" = s0001 ]; then sleep 6; else sleep 1; fi`, "{id}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	r := env.WaitState("w", 60*time.Second, stream.RunComplete, stream.RunBlocked)
	log, _ := os.ReadFile(filepath.Join(env.Data, "runs", "w", "admission.log"))
	if r.State != stream.RunComplete {
		t.Fatalf("run %s: %s\n%s", r.State, r.Reason, log)
	}
	if started, longEnded := admissionAt(t, log, "s0002", "admit"), admissionAt(t, log, "s0001", "validated"); !started.Before(longEnded) {
		t.Errorf("s0002 started at %s, after the long s0001 ended (%s): written scratch was counted twice\n%s",
			started.Format(time.RFC3339Nano), longEnded.Format(time.RFC3339Nano), log)
	}
}

// admissionAt is the time of the first line of admission.log (log) where
// shard's decision was decision; it fails t where there is none.
func admissionAt(t *testing.T, log []byte, shard, decision string) time.Time {
	t.Helper()
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, "shard="+shard+" ") && strings.Contains(line, "decision="+decision+" ") {
			ts, err := time.Parse(time.RFC3339Nano, strings.Fields(line)[0])
			if err != nil {
				t.Fatal(err)
			}
			return ts
		}
	}
	t.Fatalf("no %s line for %s in admission.log:\n%s", decision, shard, log)
	return time.Time{}
}

// fetchedTogether reads a two-shard run's admission.log: second is the
// shard admitted second, together whether it was admitted before the
// first ended. Whether the second shard of such a run is fetched while
// the first runs depends on when the worker sees the new run: its open
// fetch, made for the two free slots while no active run of the class
// needed scratch, takes both shards when they are published before the
// worker's next look, and the second waits in its slot for the room the
// first holds; a fetch made after the worker saw the run takes one shard
// (scratchFit), and the next only once the first has ended. Each is
// right; the first is the usual one (the other was seen once, in a
// clean-clone CI run), and the test logs which it saw.
func fetchedTogether(t *testing.T, log []byte) (second string, together bool) {
	t.Helper()
	admits := regexp.MustCompile(`shard=(\S+) class=\S+ decision=admit `).FindAllSubmatch(log, -1)
	if len(admits) != 2 {
		t.Fatalf("admission.log has %d admit lines, want 2:\n%s", len(admits), log)
	}
	first, second := string(admits[0][1]), string(admits[1][1])
	together = admissionAt(t, log, second, "admit").Before(admissionAt(t, log, first, "validated"))
	if !together {
		t.Logf("the worker saw the run before its shards were published: fetched one at a time, none waited in its slot")
	}
	return second, together
}

// TestDeclaredScratchIsReservedWithoutStaging: a class's declared scratch
// was reserved only by staging, so a class that stages nothing declared
// it for nothing, and its shards ran whatever the disk held. Now a shard
// whose declared scratch the file system cannot hold fails unrun with the
// numbers; shards that fit one at a time run one at a time, the next
// waiting in its slot with its lease kept (one attempt each, longer than
// the lease's TTL, no second delivery); staged ones too.
func TestDeclaredScratchIsReservedWithoutStaging(t *testing.T) {
	testenv.RequireRoot(t)
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	testenv.SmallTmpfs(t, filepath.Join(env.Data, "scratch", "w1"), "8m")
	env.StartWorker("w1", map[string]int{"cpu": 2})

	ran := filepath.Join(t.TempDir(), "ran")
	spec := testenv.WriteJob(t, testenv.Job{Name: "big", Shards: 1, Retries: 0, Extra: "[class.cpu]\nscratch = \"64MiB\"\n",
		Command: []string{"sh", "-c", `echo ran >> "$0"`, ran}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("big", 30*time.Second, stream.RunBlocked, stream.RunComplete)
	if _, err := os.Stat(ran); err == nil {
		t.Fatal("the command ran on a scratch that cannot hold its declared 64MiB")
	}
	rec, err := env.Shard("big", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if at := rec.Attempts[len(rec.Attempts)-1]; rec.State != stream.ShardFailed || at.Outcome != stream.OutcomeStart ||
		!strings.Contains(at.Reason, "not enough scratch space: the shard's class declares 64.0MiB of scratch") || !strings.Contains(at.Reason, "the command was not run") {
		t.Fatalf("shard %s, attempt %s %q; want failed, a start error naming the declared scratch", rec.State, at.Outcome, at.Reason)
	}

	// 5MiB each on 8MiB: one at a time, though two slots are free. The
	// first writes 4MiB of it (the second must wait, not fail, though
	// less than 5MiB is free then) and holds the room past the lease TTL
	// (3s).
	lock := filepath.Join(t.TempDir(), "lock")
	spec = testenv.WriteJob(t, testenv.Job{Name: "two", Shards: 2, Retries: 0, Extra: "[class.cpu]\nscratch = \"5MiB\"\n",
		Command: []string{"sh", "-c", `mkdir "$0" || exit 7; head -c 4194304 /dev/zero > "$SHARDPOOL_SCRATCH/fill"; sleep 4; rmdir "$0"`, lock}})
	env.Submit(spec, coordinator.SubmitOptions{})
	r := env.WaitState("two", 60*time.Second, stream.RunComplete, stream.RunBlocked)
	log, _ := os.ReadFile(filepath.Join(env.Data, "runs", "two", "admission.log"))
	if r.State != stream.RunComplete {
		t.Fatalf("run %s: %s (want both run, one at a time: exit 7 means they overlapped)\n%s", r.State, r.Reason, log)
	}
	// What the first wrote of its 5MiB may be in the message or not yet.
	if second, together := fetchedTogether(t, log); !together {
		if !regexp.MustCompile(`shard=` + second + ` class=cpu decision=admit .*scratch at \S+ has room for 1 more shard\(s\) declaring 5\.0MiB`).Match(log) {
			t.Errorf("the shards were fetched one at a time, but the second's admission does not say the room it was fetched by:\n%s", log)
		}
	} else if !regexp.MustCompile(`decision=wait not enough scratch space: .* other running shards hold 5\.0MiB reserved(?: \(\S+ of it written\))?; waiting for them to end`).Match(log) {
		t.Errorf("admission.log does not say the second shard waited for scratch space:\n%s", log)
	}
	for _, id := range []string{"s0000", "s0001"} {
		rec, err := env.Shard("two", id)
		if err != nil {
			t.Fatal(err)
		}
		if len(rec.Attempts) != 1 || rec.Interrupted != 0 {
			t.Errorf("%s: %d attempt(s), %d handed back; want one attempt (the lease kept while it waited)\n%s", id, len(rec.Attempts), rec.Interrupted, log)
		}
	}
	if strings.Contains(string(log), "in flight in this worker") {
		t.Errorf("a shard was delivered again while it waited for scratch space:\n%s", log)
	}

	// The same with staging: one ledger, and a staged shard whose room
	// the other holds waits too, where it failed its attempt (stage-error).
	spec = testenv.WriteJob(t, testenv.Job{Name: "staged", Shards: 2, Retries: 0, Extra: "[class.cpu]\nstage = true\nscratch = \"5MiB\"\n",
		Command: []string{"sh", "-c", `mkdir "$0" || exit 7; head -c 4194304 /dev/zero > "$SHARDPOOL_SCRATCH/fill"; sleep 4; rmdir "$0"`, lock}})
	env.Submit(spec, coordinator.SubmitOptions{})
	r = env.WaitState("staged", 60*time.Second, stream.RunComplete, stream.RunBlocked)
	log, _ = os.ReadFile(filepath.Join(env.Data, "runs", "staged", "admission.log"))
	if r.State != stream.RunComplete {
		t.Fatalf("staged run %s: %s (want both run, one at a time)\n%s", r.State, r.Reason, log)
	}
	if second, together := fetchedTogether(t, log); !together {
		if !regexp.MustCompile(`shard=` + second + ` class=cpu decision=admit .*scratch at \S+ has room for 1 more shard\(s\) needing 5\.0MiB \(5\.0MiB declared, \S+ of inputs to stage: the median of the last 1 staged\)`).Match(log) {
			t.Errorf("the staged shards were fetched one at a time, but the second's admission does not say the room it was fetched by:\n%s", log)
		}
	} else if !regexp.MustCompile(`decision=wait stage: not enough scratch space: .* is free at \S+, other running shards hold 5\.0MiB reserved(?: \(\S+ of it written\))?(?: and \S+ of staged inputs)?; waiting for them to end`).Match(log) {
		// The other shard's input is among its staged inputs once copied,
		// and in its reservation while it is being copied: either may be
		// what the waiting shard saw.
		t.Errorf("admission.log does not say the second staged shard waited for scratch space:\n%s", log)
	}
	oneAttemptEach(t, env, "staged", 2)
}

// TestAWorkerWithSlotsOfAClassServesItsOutliers: a worker given slots by
// class (`shardpool worker --slots cpu=1`) serves that class's outlier
// class too (the shards submit moves out of it: cpu-outlier), which its
// user never named: they waited for good. It serves it once a run has
// it (no consumer to look up before), with the class's slots.
func TestAWorkerWithSlotsOfAClassServesItsOutliers(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 1}})
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		rep, err := env.WorkerReport("w1")
		return err == nil && maps.Equal(rep.Slots, map[string]int{"cpu": 1}), fmt.Sprintf("worker report slots %v (%v), want cpu=1 alone before any run", rep.Slots, err)
	})
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Command: []string{"cp", "{input}", "{out}/"}, Extra: "[class.cpu-outlier]\n", Line: func(i int, input string) string {
		class := "cpu"
		if i == 2 {
			class = "cpu-outlier" // as plan.SplitOutliers names it
		}
		return fmt.Sprintf(`{"id":"s%d","inputs":[%q],"class":%q}`, i, input, class)
	}})
	env.Submit(spec, coordinator.SubmitOptions{})
	if r := env.WaitState("t", 30*time.Second, stream.RunComplete); r.Counts.Validated != 3 {
		t.Fatalf("counts %+v, want 3 validated", r.Counts)
	}
	rep, err := env.WorkerReport("w1")
	if err != nil || rep.Slots["cpu-outlier"] != 1 || rep.Slots["cpu"] != 1 {
		t.Fatalf("worker report slots %v (%v), want cpu=1 and cpu-outlier=1", rep.Slots, err)
	}
}
