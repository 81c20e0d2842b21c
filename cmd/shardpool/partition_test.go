package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestPartitionedWorkerCommitsNothing: a worker cut off from its
// coordinator by a network partition (its connection held open, every
// byte held, as TCP holds them) while its command runs. Its lease
// expires, another worker runs the shard and commits it; then the
// partition heals while that second attempt still runs, and everything
// the first worker sent meanwhile (lease renewals, progress, its
// record and its Nak) arrives late. Nothing of it may count: the command
// ran twice in all, the shard is validated once, by the second worker,
// its output verifies, and no message is left in the queue.
func TestPartitionedWorkerCommitsNothing(t *testing.T) {
	env := testenv.New(t, testenv.Options{NoWorkers: true})
	proxy := testenv.NewProxy(t, strings.TrimPrefix(env.URL, "nats://"))
	dir := t.TempDir()
	runs := filepath.Join(dir, "runs")
	spec := testenv.WriteJob(t, testenv.Job{Shards: 1, Retries: 3,
		Command: []string{"sh", "-c", `echo "$SHARDPOOL_ATTEMPT" >> "$1"; sleep 4; echo "$SHARDPOOL_ATTEMPT" > "$2/r.txt"`, "sh", runs, "{out}"}})
	env.Submit(spec, coordinator.SubmitOptions{})
	lines := func() int {
		b, _ := os.ReadFile(runs)
		return strings.Count(string(b), "\n")
	}
	a := testenv.Start(t, "worker", "--server", "nats://"+proxy.Addr, "--name", "a", "--slots", "cpu=1",
		"--data", filepath.Join(dir, "a"), "--scratch", filepath.Join(dir, "a-scratch"), "--grace", "1s")
	testenv.Eventually(t, 30*time.Second, func() (bool, string) { return lines() == 1, "worker a has not started the command\n" + a.Output() })
	proxy.Pause()
	env.StartWorker("b", map[string]int{"cpu": 1})
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		return lines() == 2, fmt.Sprintf("the command ran %d time(s); want worker b to run it once a's lease expired", lines())
	})
	time.Sleep(time.Second)
	proxy.Resume()
	rec := env.WaitState("t", 60*time.Second, stream.RunComplete, stream.RunBlocked)
	if rec.State != stream.RunComplete {
		t.Fatalf("run after the partition healed: %s (%s)\nworker a:\n%s", rec.State, rec.Reason, a.Output())
	}
	// What worker a sent into the partition has arrived by now; give what
	// it does about it (a Nak, a record) time to land too.
	time.Sleep(4 * time.Second)
	if n := lines(); n != 2 {
		t.Errorf("the command ran %d times, want 2 (a's cut-off attempt and b's)", n)
	}
	sh, err := env.Shard("t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	var byB []stream.Attempt
	for _, at := range sh.Attempts {
		if at.Worker == "b" && at.Outcome == stream.OutcomeOK {
			byB = append(byB, at)
		}
	}
	if sh.State != stream.ShardValidated || len(byB) != 1 || sh.Output == nil {
		t.Fatalf("shard record after the partition: state %s, attempts %+v, output %+v; want validated once by b", sh.State, sh.Attempts, sh.Output)
	}
	adm, _ := os.ReadFile(filepath.Join(dir, "a", "runs", "t", "admission.log"))
	if !strings.Contains(string(adm), "decision=abandon lease") {
		t.Errorf("worker a's admission log does not say it abandoned its attempt for the lease it lost:\n%s", adm)
	}
	out := filepath.Join(filepath.Dir(spec), "out", "s0000")
	mk, err := checkpoint.Verify(out)
	if err != nil || mk.Manifest != sh.Output.Checksum {
		t.Fatalf("output %s: %v, marker checksum %s, record %s", out, err, mk.Manifest, sh.Output.Checksum)
	}
	if b, err := os.ReadFile(filepath.Join(out, "r.txt")); err != nil || string(b) != fmt.Sprintf("%d\n", byB[0].N) {
		t.Fatalf("output holds %q (%v), want what b's attempt %d wrote", b, err, byB[0].N)
	}
	ctx := context.Background()
	c, err := env.JS.Consumer(ctx, stream.StreamShards, "cpu")
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(ctx)
	if err != nil || info.NumPending != 0 || info.NumAckPending != 0 || info.NumRedelivered != 0 {
		t.Fatalf("consumer after the partition: %+v, %v; want nothing pending or redelivered", info, err)
	}
	a.Signal(syscall.SIGTERM)
	if code := a.Wait(t, 30*time.Second); code != 0 {
		t.Errorf("worker a after the partition: exit %d, want 0\n%s", code, a.Output())
	}
	if again := env.WaitState("t", time.Second, stream.RunComplete); again.Counts.Validated != 1 {
		t.Errorf("run counts after worker a stopped: %+v", again.Counts)
	}
}
