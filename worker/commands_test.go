package worker_test

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
)

// TestAWorkerReportsItsCommandsPids: a worker's report lists the pid of
// each command it runs, with the shard and the attempt its record names,
// so that status can say which process a shard is: a person looking into
// a hung shard (strace, py-spy) found only the worker's pid, whose kill
// would end every shard of the worker. Each pid is the real process,
// leading its own group, with the shard's id in its environment; once
// the shards end, the report lists none.
func TestAWorkerReportsItsCommandsPids(t *testing.T) {
	env := testenv.New(t, testenv.Options{Slots: map[string]int{"cpu": 2}})
	gate := testenv.NewGate(t)
	spec := testenv.WriteJob(t, testenv.Job{Name: "pids", Shards: 2, Retries: 0, Command: gate.ThenCopy()})
	env.Submit(spec, coordinator.SubmitOptions{})
	report := func() (stream.WorkerReport, error) { return env.WorkerReport("w1") }
	var cmds []stream.Command
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		r, err := report()
		cmds = r.Commands
		return err == nil && len(r.Commands) == 2, fmt.Sprintf("commands reported: %+v (%v), want 2", r.Commands, err)
	})
	for _, c := range cmds {
		run, id, _ := strings.Cut(c.Key, ".")
		rec, err := env.Shard(run, id)
		if err != nil || run != "pids" || rec.Owner == nil || rec.Owner.Attempt != c.Attempt || rec.State != stream.ShardRunning {
			t.Fatalf("reported %+v; its shard's record: %+v (%v), want it running in that attempt", c, rec, err)
		}
		if c.Start.IsZero() || time.Since(c.Start) > time.Minute {
			t.Errorf("reported %+v: want the command's start", c)
		}
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", c.PID))
		if err != nil {
			t.Fatalf("reported pid %d of %s: %v", c.PID, c.Key, err)
		}
		if !bytes.Contains(environ, []byte("\x00SHARDPOOL_SHARD_ID="+id+"\x00")) && !bytes.HasPrefix(environ, []byte("SHARDPOOL_SHARD_ID="+id+"\x00")) {
			t.Errorf("pid %d reported for shard %s has no SHARDPOOL_SHARD_ID=%s in its environment", c.PID, id, id)
		}
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.PID))
		if err != nil {
			t.Fatal(err)
		}
		// Fields after the command's name: state, ppid, pgrp.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if pgrp, _ := strconv.Atoi(f[2]); pgrp != c.PID {
			t.Errorf("pid %d of %s is in process group %d, want its own", c.PID, c.Key, pgrp)
		}
	}
	gate.Open()
	env.WaitState("pids", 30*time.Second, stream.RunComplete)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		r, err := report()
		return err == nil && len(r.Commands) == 0, fmt.Sprintf("commands reported after the shards ended: %+v (%v), want none", r.Commands, err)
	})
}
