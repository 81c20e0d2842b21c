package main

import (
	"strings"
	"testing"

	"github.com/shardpool/shardpool/coordinator/plan"
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
