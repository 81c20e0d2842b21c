package worker

import (
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
	w := &Worker{host: "h", cfg: Config{StateDir: state}, logs: map[string]*openLog{}, announced: map[string]bool{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
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
	// stands. Past it, a look that fails otherwise than with EROFS (the
	// directory gone: outputMoved's to say) forgets the note.
	gone := filepath.Join(out, "gone", "out")
	w.roOutputs = map[string]*readOnlyOutput{gone: {since: time.Now(), what: "test"}}
	w.roOutputs[gone].looked = time.Now()
	if why := w.outputReadOnly(gone); !strings.Contains(why, "cannot be written on host h") {
		t.Fatalf("within %s of the last look: %q, want the refusal", readOnlyLookEvery, why)
	}
	w.roOutputs[gone].looked = time.Now().Add(-readOnlyLookEvery)
	if why := w.outputReadOnly(gone); why != "" {
		t.Fatalf("a look that meets ENOENT, not EROFS: %q, want the note forgotten", why)
	}
}
