package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
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

// TestProfileHintNamesTheRunsStateDirectory: a run whose class has no
// memory peak points at the profile command that writes where the run
// reads (with its --data), and at a profile made into the default state
// directory instead, which it does not read.
func TestProfileHintNamesTheRunsStateDirectory(t *testing.T) {
	t.Setenv("XDG_STATE_HOME", t.TempDir())
	def := worker.DefaultStateDir()
	spec := &stream.Spec{Name: "job", SpecPath: "/jobs/job.toml"}
	if got := profileCommand(spec, def); got != "shardpool profile /jobs/job.toml" {
		t.Errorf("default state directory: got %q", got)
	}
	other := t.TempDir()
	if got, want := profileCommand(spec, other), "shardpool profile --data "+other+" /jobs/job.toml"; got != want {
		t.Errorf("another state directory: got %q, want %q", got, want)
	}
	if got := profileElsewhere(spec, other); got != "" {
		t.Errorf("no profile anywhere: got %q, want nothing", got)
	}
	made := filepath.Join(def, "runs", "job", "profile.json")
	if err := os.MkdirAll(filepath.Dir(made), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(made, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := profileElsewhere(spec, other); !strings.Contains(got, made) || !strings.Contains(got, filepath.Join(other, "runs", "job", "profile.json")) {
		t.Errorf("a profile in the default state directory: got %q, want it named with the one the run reads", got)
	}
	if got := profileElsewhere(spec, def); got != "" {
		t.Errorf("the run reads the default state directory: got %q, want nothing", got)
	}
}

// TestPlanShowsTheVRAMAGPUClassNeeds: the table had a GPUS column but
// not the VRAM a shard needs over them, which admission reserves from
// the spec or the profile's measured peak. Where a class asks for GPUs
// a VRAM column says it, "not declared" where the spec gives none, and
// "-" for the classes without GPUs; a plan without GPU classes has no
// such column.
func TestPlanShowsTheVRAMAGPUClassNeeds(t *testing.T) {
	gib := int64(1 << 30)
	budget := plan.Budget{"cpu": probe.Known(16000, "cgroup"), "memory": probe.Known(64*gib, "cgroup"),
		"gpus": probe.Known(2, "nvml"), "vram": probe.Known(80*gib, "nvml")}
	classes := map[string]plan.Peak{
		"cpu":   {CPU: 1000, Memory: gib, Source: "declared (spec)"},
		"gpu":   {CPU: 1000, Memory: gib, GPUs: 1, VRAM: 12 * gib, Source: "measured (profile.json)"},
		"bare":  {CPU: 1000, Memory: gib, GPUs: 1, Source: "declared (spec)"},
		"multi": {CPU: 2000, Memory: gib, GPUs: 2, VRAM: 40 * gib, Source: "declared (spec)"},
	}
	p := &plan.Plan{}
	for _, name := range []string{"bare", "cpu", "gpu", "multi"} {
		p.Classes = append(p.Classes, plan.ClassPlan{Class: name, Shards: 1, Peak: classes[name], Slots: plan.Compute(budget, plan.Peak{}, classes[name], false)})
	}
	var out strings.Builder
	printPlan(&out, p)
	rows := rowsByFirstWord(out.String())
	for class, want := range map[string]string{"CLASS": "GPUS  VRAM  SLOTS", "cpu": " 0     -  ", "gpu": " 1     12.0GiB  ", "bare": " 1     not declared", "multi": " 2     40.0GiB  "} {
		if got := regexp.MustCompile(` +`).ReplaceAllString(rows[class], " "); !strings.Contains(got, regexp.MustCompile(` +`).ReplaceAllString(want, " ")) {
			t.Errorf("row %s: %q, want %q in it\n%s", class, rows[class], want, out.String())
		}
	}

	out.Reset()
	printPlan(&out, &plan.Plan{Classes: []plan.ClassPlan{{Class: "cpu", Shards: 1, Peak: classes["cpu"], Slots: plan.Compute(budget, plan.Peak{}, classes["cpu"], false)}}})
	if strings.Contains(out.String(), "VRAM") {
		t.Errorf("a plan without GPU classes has a VRAM column:\n%s", out.String())
	}
}
