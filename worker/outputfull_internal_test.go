package worker

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFullOutputHoldsEachClassThatMeetsIt: an output directory noted full
// holds the class whose commit failed there and, once a shard of another
// class finds it still full before its command, that class too; a look
// that finds the room forgets the note and holds neither. Looks come at
// most every fullLookEvery. (The full disk itself, end to end:
// TestFullOutputHoldsTheWorkerNotTheShards.)
func TestFullOutputHoldsEachClassThatMeetsIt(t *testing.T) {
	state, out := t.TempDir(), t.TempDir()
	w := logOnlyWorker(state)
	// More than any disk here has free: no room.
	w.fullOutputs = map[string]*fullOutput{out: {since: time.Now(), what: "no space left on device", bytes: 1 << 60, files: 1,
		classes: map[string]bool{"cpu": true}}}
	if why := w.outputFullHeld("cpu"); !strings.Contains(why, "the output directory "+out+" has no room on host h") {
		t.Fatalf("class cpu, its output noted full: %q, want it held", why)
	}
	if why := w.outputFullHeld("gpu"); why != "" {
		t.Fatalf("class gpu, no shard of which met the full output: %q, want it not held", why)
	}
	// Within fullLookEvery of the last look, no look: held still.
	looked := w.fullOutputs[out].looked
	if why := w.roomAt(out, "gpu"); why == "" || w.fullOutputs[out].looked != looked {
		t.Fatalf("a shard of class gpu before its command: %q, want it refused without a look", why)
	}
	if why := w.outputFullHeld("gpu"); why == "" {
		t.Fatal("class gpu after one of its shards found the output full: not held")
	}
	// The room is there: forgotten at the next look, neither class held,
	// and nothing left in the directory.
	w.mu.Lock()
	w.fullOutputs[out].bytes, w.fullOutputs[out].looked = 4096, time.Now().Add(-fullLookEvery)
	w.mu.Unlock()
	if why := w.outputFullHeld("gpu"); why != "" {
		t.Fatalf("a look that finds room: %q, want no hold", why)
	}
	if w.fullOutputs[out] != nil || w.outputFullHeld("cpu") != "" {
		t.Fatal("the note stays after a look found room")
	}
	if ents, err := os.ReadDir(out); err != nil || len(ents) != 0 {
		t.Fatalf("the look left %v (%v) in the output directory", ents, err)
	}
	log, _ := os.ReadFile(filepath.Join(state, "admission.log"))
	if !strings.Contains(string(log), "decision=output-room") {
		t.Errorf("host admission.log:\n%s\nwant the look that found room", log)
	}
}
