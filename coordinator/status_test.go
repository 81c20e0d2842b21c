package coordinator_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestStatusListsUnfinishedShards: the status of one run lists the shards
// of its fingerprint that are not validated, with their state and reason,
// in ID order; a run whose every shard is validated lists none.
func TestStatusListsUnfinishedShards(t *testing.T) {
	env := testenv.New(t, testenv.Options{})
	ctx := context.Background()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 6, Retries: 0,
		Command: []string{"sh", "-c", `case "$1" in s0001|s0004) exit 3;; esac; echo ok > "$2/r"`, "sh", "{id}", "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunBlocked)
	st, err := coordinator.ReadStatus(ctx, env.JS, "t")
	if err != nil {
		t.Fatal(err)
	}
	r := st.Runs[0]
	if len(r.Shards) != 2 || r.Shards[0].ID != "s0001" || r.Shards[1].ID != "s0004" {
		t.Fatalf("unfinished shards: %+v, want s0001 and s0004", r.Shards)
	}
	for _, s := range r.Shards {
		if s.State != stream.ShardFailed || s.Reason == "" || s.Payload != nil {
			t.Errorf("shard %s: state %s, reason %q, payload %v; want failed, with its reason, without the payload", s.ID, s.State, s.Reason, s.Payload)
		}
	}

	done := testenv.WriteJob(t, testenv.Job{Name: "d", Shards: 4, Retries: 0, Command: []string{"true"}})
	env.Submit(done, coordinator.SubmitOptions{})
	env.WaitState("d", 30*time.Second, stream.RunComplete)
	st, err = coordinator.ReadStatus(ctx, env.JS, "d")
	if err != nil {
		t.Fatal(err)
	}
	if r := st.Runs[0]; r.Counts.Validated != 4 || len(r.Shards) != 0 {
		t.Fatalf("complete run: counts %+v, %d shard(s) listed; want 4 validated, none listed", r.Counts, len(r.Shards))
	}
}

// TestStatusSeesRecordsBeingRewritten: a run's status lists every
// unfinished shard even while workers rewrite their records (a heartbeat, a
// new attempt). The watcher's first pass alone missed one now and then: a
// record rewritten as the pass went by was in neither its old nor its new
// place.
func TestStatusSeesRecordsBeingRewritten(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	const n = 1000
	spec := testenv.WriteJob(t, testenv.Job{Shards: n, Command: []string{"true"}})
	res := env.Submit(spec, coordinator.SubmitOptions{})
	b := env.Buckets()
	put := func(i int, attempt int) error {
		id := fmt.Sprintf("s%04d", i)
		data, _ := stream.Encode(&stream.ShardRecord{V: 1, Run: "t", ID: id, Fingerprint: res.Fingerprint, Class: "cpu",
			State: stream.ShardRunning, Attempts: []stream.Attempt{{N: attempt}}})
		_, err := b.Shards.Put(ctx, stream.ShardKey("t", id), data)
		return err
	}
	for i := range n {
		if err := put(i, 1); err != nil {
			t.Fatal(err)
		}
	}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for a := 2; ; a++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := put(rand.IntN(n), a); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer func() { close(stop); <-done }()
	for round := range 100 {
		st, err := coordinator.ReadStatus(ctx, env.JS, "t")
		if err != nil {
			t.Fatal(err)
		}
		if got := len(st.Runs[0].Shards); got != n {
			t.Fatalf("listing %d: %d unfinished shard(s) listed, want %d", round, got, n)
		}
	}
}

// TestStatusSkipsAnUnreadableRunRecord: a run record that does not decode
// (written by hand with the nats CLI, say) is named as unreadable in the
// listing of every run instead of hiding the others; asked for by name,
// it is an error.
func TestStatusSkipsAnUnreadableRunRecord(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	env.Submit(testenv.WriteJob(t, testenv.Job{Shards: 1, Command: []string{"true"}}), coordinator.SubmitOptions{})
	b := env.Buckets()
	if _, err := b.Runs.Put(ctx, "broken", []byte("not json")); err != nil {
		t.Fatal(err)
	}
	st, err := coordinator.ReadStatus(ctx, env.JS, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Runs) != 1 || st.Runs[0].Name != "t" || len(st.Unreadable) != 1 || !strings.HasPrefix(st.Unreadable[0], "broken: ") {
		t.Fatalf("status: runs %+v, unreadable %q; want run t listed and broken named unreadable", st.Runs, st.Unreadable)
	}
	if _, err := coordinator.ReadStatus(ctx, env.JS, "broken"); err == nil {
		t.Fatal("status of the unreadable run by name: no error")
	}
}

// TestStatusNamesShardsWithoutAMessage: pending shards whose messages are
// gone from the queue (purged by hand here; a damaged store does the same)
// can never be taken; status says how many and what publishes them again,
// and says nothing once a submission has.
func TestStatusNamesShardsWithoutAMessage(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Retries: 0, Command: []string{"true"}})
	env.Submit(spec, coordinator.SubmitOptions{Resume: "shardpool submit --server U " + spec})
	env.WaitState("t", 30*time.Second, stream.RunQueued)
	lines := func() string {
		t.Helper()
		st, err := coordinator.ReadStatus(ctx, env.JS, "t")
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(st.Runs[0].Waiting, "\n")
	}
	if w := lines(); strings.Contains(w, "no message in the queue") {
		t.Fatalf("every shard is queued, yet status says:\n%s", w)
	}
	s, err := env.JS.Stream(ctx, stream.StreamShards)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(ctx, jetstream.WithPurgeSubject(stream.RunSubjects("t"))); err != nil {
		t.Fatal(err)
	}
	if w := lines(); !strings.Contains(w, "3 of 3 pending shard(s) have no message in the queue") || !strings.Contains(w, "shardpool submit --server U "+spec) {
		t.Fatalf("after a purge, status says:\n%s", w)
	}
	env.Submit(spec, coordinator.SubmitOptions{})
	if w := lines(); strings.Contains(w, "no message in the queue") {
		t.Fatalf("after the resubmission restored the messages, status says:\n%s", w)
	}
}

// TestStatusDoesNotTakeAShardJustFailedForLost: a worker writes a
// shard's final record, then removes its message; the run record's
// counts follow by the tracker's flush. Status read in between saw the
// shard pending with no message and said the store had lost it (found by
// hand: `run` said so while shards failed their start at once, their
// output file system gone read-only). A shard really gone from the queue
// is still named (TestStatusNamesShardsWithoutAMessage).
func TestStatusDoesNotTakeAShardJustFailedForLost(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 4, Retries: 0, Command: []string{"true"}})
	res := env.Submit(spec, coordinator.SubmitOptions{})
	env.WaitState("t", 30*time.Second, stream.RunQueued)
	cons, err := env.JS.Consumer(ctx, stream.StreamShards, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	b := env.Buckets()
	// Each round fails one shard as a worker does, record first, and
	// reads the status at once: a round or two would race the flush by
	// chance, every round of the three is a fair trial.
	for round := range 3 {
		batch, err := cons.FetchNoWait(1)
		if err != nil {
			t.Fatal(err)
		}
		var msg jetstream.Msg
		for m := range batch.Messages() {
			msg = m
		}
		if msg == nil {
			t.Fatalf("round %d: no message fetched", round)
		}
		var sm stream.ShardMsg
		if err := stream.Decode(msg.Data(), &sm); err != nil {
			t.Fatal(err)
		}
		data, _ := stream.Encode(&stream.ShardRecord{V: 1, Run: "t", ID: sm.ID, Fingerprint: res.Fingerprint, Class: "cpu", State: stream.ShardFailed, Reason: "test"})
		if _, err := b.Shards.Put(ctx, stream.ShardKey("t", sm.ID), data); err != nil {
			t.Fatal(err)
		}
		if err := msg.Term(); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			q, err := stream.QueuedOf(ctx, env.JS, "t")
			return err == nil && q == uint64(3-round), fmt.Sprintf("%d queued (%v), want %d", q, err, 3-round)
		})
		st, err := coordinator.ReadStatus(ctx, env.JS, "t")
		if err != nil {
			t.Fatal(err)
		}
		if w := strings.Join(st.Runs[0].Waiting, "\n"); strings.Contains(w, "no message in the queue") {
			t.Fatalf("round %d: shard %s failed, its message removed after its record, and status says:\n%s", round, sm.ID, w)
		}
	}
}

// TestStatusSaysAWorkerOfThisHostIsGone: the report of a worker of this
// host whose process is gone (killed with SIGKILL: its report stays until
// the bucket's TTL) is marked gone, and its stale "slots in use" no longer
// explains why shards wait; a live worker of this host, and one of
// another boot, whose pid proves nothing here, are not marked.
func TestStatusSaysAWorkerOfThisHostIsGone(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	env.Submit(testenv.WriteJob(t, testenv.Job{Shards: 3, Command: []string{"true"}}), coordinator.SubmitOptions{})
	env.WaitState("t", 10*time.Second, stream.RunQueued)
	exited := exec.Command("true")
	if err := exited.Run(); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	boot, pidns := stream.BootID("/proc"), stream.PIDNamespace()
	b := env.Buckets()
	putBusyReports(t, b,
		stream.WorkerReport{Name: "dead", Host: host, BootID: boot, PIDNS: pidns, PID: exited.Process.Pid},
		stream.WorkerReport{Name: "live", Host: host, BootID: boot, PIDNS: pidns, PID: os.Getpid()},
		stream.WorkerReport{Name: "far", Host: "elsewhere", BootID: "another-boot", PIDNS: pidns, PID: exited.Process.Pid})
	// The run's counts per class, which say that shards wait, come with
	// the tracker's first look at the run.
	var st *coordinator.Status
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		var err error
		st, err = coordinator.ReadStatus(ctx, env.JS, "t")
		return err == nil && len(st.Runs) == 1 && len(st.Runs[0].Waiting) > 0, fmt.Sprintf("status: %v, %+v", err, st)
	})
	gone := map[string]string{}
	for _, w := range st.Workers {
		gone[w.Name] = w.Gone
	}
	if gone["dead"] == "" || gone["live"] != "" || gone["far"] != "" {
		t.Fatalf("gone: %q; want only the worker whose pid exited on this host marked", gone)
	}
	waiting := strings.Join(st.Runs[0].Waiting, "\n")
	if strings.Contains(waiting, "of dead in use") || !strings.Contains(waiting, "of live in use") {
		t.Fatalf("why shards wait: %q; want the live workers' reasons, not the gone one's", waiting)
	}
}

// putBusyReports writes worker reports as of now, each with its one slot
// of the default class in use, and saying so.
func putBusyReports(t *testing.T, b *stream.Buckets, reports ...stream.WorkerReport) {
	t.Helper()
	for _, r := range reports {
		r.Slots, r.Running = map[string]int{stream.DefaultClass: 1}, map[string]int{stream.DefaultClass: 1}
		r.Waiting = map[string]string{stream.DefaultClass: "all 1 slot(s) of " + r.Name + " in use"}
		r.Reported = time.Now().UTC()
		data, err := stream.Encode(&r)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := b.Workers.Put(context.Background(), r.Name, data); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStatusSaysARemoteWorkerIsDisconnected: a worker of another host,
// whose pid proves nothing here, is marked disconnected while its report
// lasts when the coordinator has no connection of its name (killed on its
// host, or cut off), and is no longer counted for why shards wait; one
// whose connection is open is not marked, nor one whose report names no
// connection (an older worker). /metrics says the same.
func TestStatusSaysARemoteWorkerIsDisconnected(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	env.Submit(testenv.WriteJob(t, testenv.Job{Shards: 3, Command: []string{"true"}}), coordinator.SubmitOptions{})
	env.WaitState("t", 10*time.Second, stream.RunQueued)
	nc, err := nats.Connect(env.URL, nats.Name("shardpool-worker-near"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	b := env.Buckets()
	far := stream.WorkerReport{Host: "elsewhere", BootID: "another-boot", PIDNS: stream.PIDNamespace(), PID: 1}
	near, cut, old := far, far, far
	near.Name, near.Conn = "near", "shardpool-worker-near"
	cut.Name, cut.Conn = "cut", "shardpool-worker-cut"
	old.Name = "old"
	putBusyReports(t, b, near, cut, old)
	read := func() (*coordinator.Status, map[string]string) {
		t.Helper()
		st, err := coordinator.ReadStatus(ctx, env.JS, "t")
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, w := range st.Workers {
			out[w.Name] = w.Disconnected
		}
		return st, out
	}
	var st *coordinator.Status
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		st, _ = read()
		return len(st.Runs) == 1 && len(st.Runs[0].Waiting) > 0, fmt.Sprintf("%+v", st)
	})
	_, disc := read()
	if disc["near"] != "" || disc["old"] != "" || !strings.Contains(disc["cut"], "no connection named shardpool-worker-cut") {
		t.Fatalf("disconnected: %q; want only cut marked", disc)
	}
	if waiting := strings.Join(st.Runs[0].Waiting, "\n"); strings.Contains(waiting, "of cut in use") || !strings.Contains(waiting, "of near in use") {
		t.Fatalf("why shards wait: %q; want the connected workers' reasons, not the disconnected one's", waiting)
	}
	var m bytes.Buffer
	if err := coordinator.WriteMetrics(&m, st, nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := mustValue(t, parseMetrics(t, m.String()), "shardpool_worker_connected", "worker", "near"); got != 1 {
		t.Errorf("shardpool_worker_connected of near while connected: %v, want 1", got)
	}
	// near's host kills it: its connection closes, its report stays.
	nc.Close()
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		st, disc = read()
		return disc["near"] != "", fmt.Sprintf("disconnected: %q", disc)
	})
	m.Reset()
	if err := coordinator.WriteMetrics(&m, st, nil, nil); err != nil {
		t.Fatal(err)
	}
	fams := parseMetrics(t, m.String())
	for name, want := range map[string]float64{"near": 0, "cut": 0} {
		if got := mustValue(t, fams, "shardpool_worker_connected", "worker", name); got != want {
			t.Errorf("shardpool_worker_connected of %s: %v, want %v", name, got, want)
		}
	}
	if v, ok := value(t, fams, "shardpool_worker_connected", "worker", "old"); ok {
		t.Errorf("a report that names no connection has shardpool_worker_connected %v, want no sample", v)
	}
}

// TestCompleteWaitsForTheLastAcknowledgements: a run whose every shard is
// recorded validated is COMPLETE only once the work queue holds none of
// its messages; until then it is RUNNING and says how many wait for their
// acknowledgement, and the last one makes it COMPLETE with no record
// written after it. A worker records a shard validated before it
// acknowledges the message (a sync barrier between): before this, the
// stock nats CLI could count the run's messages in SHARDS beside a
// `shardpool status` that said COMPLETE.
func TestCompleteWaitsForTheLastAcknowledgements(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	ctx := context.Background()
	spec := testenv.WriteJob(t, testenv.Job{Shards: 2, Command: []string{"true"}})
	res := env.Submit(spec, coordinator.SubmitOptions{})
	// No output directory: the coordinator leaves the outputs to the
	// workers that committed them (verifyOutputs), as for a remote one.
	if err := os.RemoveAll(filepath.Join(filepath.Dir(spec), "out")); err != nil {
		t.Fatal(err)
	}
	cons, err := env.JS.Consumer(ctx, stream.StreamShards, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.FetchNoWait(2)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	if len(msgs) != 2 {
		t.Fatalf("fetched %d message(s), want 2", len(msgs))
	}
	b := env.Buckets()
	for _, id := range []string{"s0000", "s0001"} {
		data, _ := stream.Encode(&stream.ShardRecord{V: 1, Run: "t", ID: id, Fingerprint: res.Fingerprint, Class: "cpu", State: stream.ShardValidated})
		if _, err := b.Shards.Put(ctx, stream.ShardKey("t", id), data); err != nil {
			t.Fatal(err)
		}
	}
	waitReason := func(want string) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, func() (bool, string) {
			r, err := env.Run("t")
			if err != nil {
				return false, err.Error()
			}
			if r.State == stream.RunComplete {
				t.Fatalf("run COMPLETE with messages still queued (%s)", r.Reason)
			}
			return r.State == stream.RunRunning && r.Counts.Validated == 2 && strings.Contains(r.Reason, want),
				fmt.Sprintf("state %s, counts %+v, reason %q; want RUNNING, 2 validated, %q", r.State, r.Counts, r.Reason, want)
		})
	}
	waitReason("every shard validated; 2 message(s) of the run still in the work queue")
	if err := msgs[0].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	waitReason("every shard validated; 1 message(s) of the run still in the work queue")
	if err := msgs[1].DoubleAck(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r := env.WaitState("t", 10*time.Second, stream.RunComplete)
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("COMPLETE %s after the last acknowledgement; the tracker should look again within milliseconds", waited.Round(time.Millisecond))
	}
	if r.Counts.Validated != 2 || strings.Contains(r.Reason, "work queue") {
		t.Fatalf("COMPLETE run: counts %+v, reason %q", r.Counts, r.Reason)
	}
}
