package main

import (
	"strings"
	"testing"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/worker/probe"
)

// TestPlanShowsWhatAdmissionRuns: `shardpool plan` printed 0 slots and a
// 0B peak for a class that declares no memory, which `run` and a worker
// run one shard at a time. The table now says what admission does; a
// class with a peak prints the formula's count, and one whose budget is
// unknown still prints 0.
func TestPlanShowsWhatAdmissionRuns(t *testing.T) {
	gib := int64(1 << 30)
	full := plan.Budget{"cpu": probe.Known(16000, "cgroup"), "memory": probe.Known(64*gib, "cgroup")}
	unknown := plan.Budget{"cpu": probe.Known(16000, ""), "memory": probe.Unknown("cgroup", "memory.max unreadable")}
	none, declared := plan.Peak{CPU: 1000, Source: "declared (spec)"}, plan.Peak{CPU: 1000, Memory: gib, Source: "declared (spec)"}
	p := &plan.Plan{Classes: []plan.ClassPlan{
		{Class: "bare", Shards: 6, Peak: none, Slots: plan.Compute(full, plan.Peak{}, none, false)},
		{Class: "sized", Shards: 2, Peak: declared, Slots: plan.Compute(full, plan.Peak{}, declared, false)},
		{Class: "blind", Shards: 1, Peak: none, Slots: plan.Compute(unknown, plan.Peak{}, none, false)},
	}}
	var out strings.Builder
	printPlan(&out, p)
	rows := map[string][]string{}
	for _, line := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(line); len(f) > 6 {
			rows[f[0]] = f
		}
	}
	for class, want := range map[string][2]string{"bare": {"unknown", "1"}, "sized": {"1.0GiB", "16"}, "blind": {"unknown", "0"}} {
		f := rows[class]
		if len(f) < 6 || f[2] != want[0] || f[5] != want[1] {
			t.Errorf("class %s: got row %q, want peak memory %s and %s slot(s)\n%s", class, f, want[0], want[1], out.String())
		}
	}
	if !strings.Contains(out.String(), "one shard at a time: no measured or declared memory peak") {
		t.Errorf("the class without a peak does not say it runs one shard at a time:\n%s", out.String())
	}
}
