package worker

import (
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestReadOnlyNoteIsForgottenWhereTheOutputIsWritable: an EROFS noted for
// an output directory that can be written (it came from elsewhere on the
// copy's way) costs one look, which leaves nothing behind, and refuses no
// command; a look that finds it read-only is not made again for
// readOnlyLookEvery. (The read-only file system itself:
// TestOutputRemountedReadOnlyRunsNoMoreCommands.)
func TestReadOnlyNoteIsForgottenWhereTheOutputIsWritable(t *testing.T) {
	state, out := t.TempDir(), t.TempDir()
	w := logOnlyWorker(state)
	w.noteReadOnly("r", "s1", "cpu", out, &fs.PathError{Op: "mkdir", Path: filepath.Join(out, ".tmp-x"), Err: unix.EROFS})
	if why := w.outputReadOnly(out); why != "" {
		t.Fatalf("a writable output noted read-only: %q, want no refusal", why)
	}
	if w.roOutputs[out] != nil {
		t.Fatal("the note stays after a look found the output writable")
	}
	if ents, err := os.ReadDir(out); err != nil || len(ents) != 0 {
		t.Fatalf("the look left %v (%v) in the output directory", ents, err)
	}
	log, _ := os.ReadFile(filepath.Join(state, "admission.log"))
	if !strings.Contains(string(log), "decision=output-read-only") || !strings.Contains(string(log), "decision=output-writable") {
		t.Errorf("host admission.log:\n%s\nwant the note and the look that forgot it", log)
	}

	// Within readOnlyLookEvery of the last look, no look: the refusal
	// stands. Past it, a look that finds the directory gone
	// (outputMoved's to say) forgets the note.
	gone := filepath.Join(out, "gone", "out")
	w.roOutputs = map[string]*readOnlyOutput{gone: {since: time.Now(), what: "test"}}
	w.roOutputs[gone].looked = time.Now()
	if why := w.outputReadOnly(gone); !strings.Contains(why, "cannot be written on host h") {
		t.Fatalf("within %s of the last look: %q, want the refusal", readOnlyLookEvery, why)
	}
	w.roOutputs[gone].looked = time.Now().Add(-readOnlyLookEvery)
	if why := w.outputReadOnly(gone); why != "" {
		t.Fatalf("a look that finds the directory gone: %q, want the note forgotten", why)
	}
}

// logOnlyWorker is a Worker on host "h" with state directory state and
// only what its notes and logs need: no store, no slots.
func logOnlyWorker(state string) *Worker {
	return &Worker{host: "h", cfg: Config{StateDir: state}, logs: map[string]*openLog{}, announced: map[string]bool{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// TestScratchUsableAgainMakesNewPairs: once the scratch directory works
// again after a fault, the pool's free pairs, which the fault may have
// taken with it (removed under the worker, or not yet on the disk of a
// file system checked and mounted again), are dropped, and the next
// attempt gets a pair made anew.
func TestScratchUsableAgainMakesNewPairs(t *testing.T) {
	root := t.TempDir()
	w := &Worker{cfg: Config{Scratch: root}, log: slog.New(slog.NewTextHandler(io.Discard, nil)), scratch: newScratchPool(root, 42)}
	old, err := w.scratch.take("r")
	if err != nil {
		t.Fatal(err)
	}
	w.scratch.put("r", old)
	if err := os.RemoveAll(filepath.Join(root, "r")); err != nil {
		t.Fatal(err)
	}
	w.scratchFault(errors.New("test"), filepath.Join(root, "r"))
	w.scratchAt = time.Now().Add(-scratchRecheck)
	if err := w.scratchUsable(); err != nil {
		t.Fatalf("scratch after the fault: %v, want usable", err)
	}
	takeNewPair(t, w.scratch, "r", old)
}
