package main_test

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestHaltedRunReleasesALostWorkersShard: a worker killed with SIGKILL
// while it runs a shard of a halted run leaves the shard recorded
// running, and the halt took its message, so no redelivery settles it.
// Once its lease has expired the coordinator closes the attempt as lost
// and holds the shard with the others: the run no longer counts it
// running (a `shardpool run` waiting for its running shards would wait
// for good).
func TestHaltedRunReleasesALostWorkersShard(t *testing.T) {
	c := startCluster(t, "3s")
	gate := testenv.NewGate(t)
	spec := testenv.WriteJob(t, testenv.Job{Shards: 3, Retries: 1, Command: gate.NoteThenCopy()})
	w := c.worker("w1", "--slots", "cpu=1")
	c.submit(spec)
	gate.WaitStarted("s0000")
	halt := testenv.Start(t, "halt", "--server", c.url, "--token-file", c.token(), "t")
	if code := halt.Wait(t, 30*time.Second); code != 0 || !strings.Contains(halt.Output(), "1 running end as they would") {
		t.Fatalf("halt: exit %d, want 0 with the shard running on\n%s", code, halt.Output())
	}
	w.SignalMain(syscall.SIGKILL)
	w.Wait(t, 10*time.Second)
	var r stream.RunRecord
	testenv.Eventually(t, 30*time.Second, func() (bool, string) {
		var err error
		r, err = stream.ReadRun(context.Background(), c.js, "t")
		return err == nil && r.State == stream.RunBlocked && r.Counts.Running == 0 && r.Counts.Pending == 3,
			fmt.Sprintf("run %s %+v (%v), want BLOCKED with the lost worker's shard held", r.State, r.Counts, err)
	})
	sh, err := testenv.ReadShard(c.js, "t", "s0000")
	if err != nil {
		t.Fatal(err)
	}
	if at := sh.Attempts[len(sh.Attempts)-1]; sh.State != stream.ShardPending || at.Outcome != stream.OutcomeLost ||
		!strings.Contains(sh.Reason, "stopped renewing the lease while the run was halted") {
		t.Fatalf("lost worker's shard: %s, last attempt %s, reason %q; want pending, the attempt lost, and why", sh.State, at.Outcome, sh.Reason)
	}
	if !strings.Contains(c.coord.Output(), "released a halted run's shard whose worker is gone") {
		t.Errorf("coordinator output does not say it released the shard:\n%s", c.coord.Output())
	}
}
