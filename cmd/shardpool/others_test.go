package main_test

import (
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker/probe"
)

// TestRunSaysWhenOthersLimitTheCPUs: with another user keeping every CPU
// busy, `shardpool run` admits fewer shards than the host has CPUs
// (docs/admission.md, "Others' CPU"); its output says so, with the
// numbers, instead of leaving the user to wonder why one shard runs where
// the plan said more.
func TestRunSaysWhenOthersLimitTheCPUs(t *testing.T) {
	testenv.RequireRoot(t)
	testenv.BurnCPUs(t, testenv.FreeCPUs(t))
	spec := testenv.WriteJob(t, testenv.Job{Name: "crowded", Shards: 3, Command: []string{"sleep", "0.5"},
		Extra: "[class.cpu]\ncpus = 1\nmemory = \"16MiB\"\n"})
	p := testenv.Start(t, "run", "--data", t.TempDir(), spec)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("run exit %d\n%s", code, p.Output())
	}
	if out := p.Output(); !strings.Contains(out, "cpu: "+probe.ScopeOthers+": ") || !strings.Contains(out, "online less") {
		t.Fatalf("run does not say that others' use limits its shards:\n%s", out)
	}
}
