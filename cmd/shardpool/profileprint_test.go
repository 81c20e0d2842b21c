package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
)

// TestProfileSaysWhenNoPeakWasCaught: where no cgroup measures a command
// and it ends before the first look at its memory, its peak is unknown,
// and the table says so rather than claiming 0B.
func TestProfileSaysWhenNoPeakWasCaught(t *testing.T) {
	var b strings.Builder
	printProfile(&b, &worker.ProfileReport{
		Samples: []worker.Sample{{Kind: "smallest", ID: "a", Outcome: "ok", PeakSource: "polling"}, {Kind: "largest", ID: "b", Outcome: "ok", PeakMemory: 3 << 20}},
		Classes: map[string]plan.Peak{"cpu": {CPU: 1000}},
	})
	out := b.String()
	peaks := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 5 {
			peaks[f[0]] = f[5] // PEAK MEMORY
		}
	}
	if peaks["smallest"] != "unknown" || peaks["largest"] != "3.0MiB" {
		t.Fatalf("profile table:\n%s\nwant the uncaught peak unknown (not 0B) and the caught one 3.0MiB", out)
	}
	if !strings.Contains(out, "class cpu: measured peak memory unknown") {
		t.Fatalf("profile class line:\n%s\nwant the class's measured peak unknown", out)
	}
}

// TestProfileSaysEachOutcomeOnce: the OUTCOME column printed "exit exit
// status 5; ..." for a command that exited 5; the outcome's word is said
// once, and an outcome whose reason does not start with it keeps both.
func TestProfileSaysEachOutcomeOnce(t *testing.T) {
	var b strings.Builder
	printProfile(&b, &worker.ProfileReport{Samples: []worker.Sample{
		{Kind: "smallest", ID: "a", Outcome: "exit", Reason: `exit status 5; last output: "refusing bad input"`},
		{Kind: "typical", ID: "b", Outcome: "timeout", Reason: "exceeded the time limit of 1s"},
		{Kind: "largest", ID: "c", Outcome: "ok"},
	}})
	out := b.String()
	for _, want := range []string{`  exit status 5; last output: "refusing bad input"` + "\n", "  timeout: exceeded the time limit of 1s\n", "  ok\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("profile table:\n%s\nwant a line ending %q", out, want)
		}
	}
	if strings.Contains(out, "exit exit") {
		t.Errorf("profile table:\n%s\nsays exit twice", out)
	}
}

// TestProfileTableShowsGPUAndDiskFigures: the table showed neither a
// sample's peak VRAM and GPU duty nor what it read and wrote, though
// profile measured them (profile.json had them): a GPU job's user saw its
// host memory alone. The GPU columns come where a sample's class has
// GPUs, with NVML's reason for a figure it could not give said once
// below the table; the class line names its GPUs and VRAM.
func TestProfileTableShowsGPUAndDiskFigures(t *testing.T) {
	var b strings.Builder
	nvml := "NVML library not found: ERROR_LIBRARY_NOT_FOUND"
	printProfile(&b, &worker.ProfileReport{
		Samples: []worker.Sample{
			{Kind: "smallest", ID: "a", Class: "gpu", Outcome: "ok", PeakMemory: 1 << 30, PeakVRAM: "unknown: " + nvml, GPUDuty: "unknown: " + nvml, ReadBytes: 3 << 20, WriteBytes: 4096},
			{Kind: "largest", ID: "b", Class: "gpu", Outcome: "ok", PeakMemory: 2 << 30, PeakVRAM: fmt.Sprint(int64(12) << 30), GPUDuty: "0.91", ReadBytes: 5 << 30},
		},
		Classes: map[string]plan.Peak{"gpu": {CPU: 1000, Memory: 2 << 30, GPUs: 1, VRAM: 12 << 30}},
	})
	out := b.String()
	rows := map[string][]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = f
		}
	}
	want := map[string][]string{
		"SAMPLE":   {"PEAK", "VRAM", "GPU", "DUTY", "DISK", "READ", "DISK", "WRITE"},
		"smallest": {"unknown", "unknown", "3.0MiB", "4.0KiB"},
		"largest":  {"12.0GiB", "0.91", "5.0GiB", "0B"},
	}
	for row, cells := range want {
		if !strings.Contains(strings.Join(rows[row], " "), strings.Join(cells, " ")) {
			t.Errorf("row %s: %q, want %q in it\n%s", row, rows[row], cells, out)
		}
	}
	if n := strings.Count(out, nvml); n != 1 || !strings.Contains(out, "peak VRAM and GPU duty unknown (smallest): "+nvml) {
		t.Errorf("NVML's reason said %d times, want once naming the sample:\n%s", n, out)
	}
	if !strings.Contains(out, "class gpu: measured peak memory 2.0GiB, cpu 1.00, 1 GPU(s) with 12.0GiB of VRAM over them") {
		t.Errorf("class line without its GPUs and VRAM:\n%s", out)
	}

	// A CPU job's table has no GPU columns, whatever NVML said.
	b.Reset()
	printProfile(&b, &worker.ProfileReport{
		Samples: []worker.Sample{{Kind: "smallest", ID: "a", Class: "cpu", Outcome: "ok", PeakVRAM: "unknown: " + nvml, GPUDuty: "unknown: " + nvml}},
		Classes: map[string]plan.Peak{"cpu": {CPU: 1000}},
	})
	if out := b.String(); strings.Contains(out, "VRAM") || strings.Contains(out, nvml) || !strings.Contains(out, "DISK READ") {
		t.Errorf("a CPU job's table:\n%s\nwant no GPU column nor NVML's reason, and the disk columns", out)
	}
}

// A sample whose command never started (its class's GPUs not to be had on
// this host) measured nothing: its row showed 0.000 seconds, 0.00 CPU duty
// and 0B read and written, as if the command had run and done nothing,
// and "peak memory measured by: " ended in nothing.
func TestProfileTableShowsNoFiguresOfASampleThatNeverRan(t *testing.T) {
	var b strings.Builder
	why := "its class asks for 1 GPU(s), and this host has none to give: NVML library not found: ERROR_LIBRARY_NOT_FOUND"
	printProfile(&b, &worker.ProfileReport{
		Samples: []worker.Sample{{Kind: "smallest", ID: "s1", Class: "gpu", Cost: 7, Outcome: stream.OutcomeStart, Reason: why}},
		Classes: map[string]plan.Peak{},
	})
	out := b.String()
	var row []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "smallest" {
			row = f
		}
	}
	if want := "smallest s1 7 - - - - - - - start-error: " + why; strings.Join(row, " ") != want {
		t.Errorf("the row of a sample that never ran:\n%q\nwant\n%q\n%s", strings.Join(row, " "), want, out)
	}
	if strings.Contains(out, "measured by") || strings.Contains(out, "disk read and write:") {
		t.Errorf("how the figures were measured, where none was:\n%s", out)
	}
}
