package checkpoint_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
)

// TestInputsStamp: the stamp of a shard's inputs changes when an input is
// rewritten (size or modification time) or the inputs are reordered, and
// not when nothing changed nor when the directory that holds them moved;
// no inputs is "", a missing input an error; a marker without a stamp
// never says its inputs changed.
func TestInputsStamp(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	write := func(p, body string, when time.Time) {
		t.Helper()
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, when, when); err != nil {
			t.Fatal(err)
		}
	}
	stamp := func(paths ...string) string {
		t.Helper()
		s, err := checkpoint.InputsStamp(paths)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	write(a, "one", at)
	write(b, "two!", at)
	first := stamp(a, b)
	if first == "" || stamp(a, b) != first {
		t.Fatalf("stamp %q, then %q: want one non-empty stamp for unchanged inputs", first, stamp(a, b))
	}
	if stamp(b, a) == first {
		t.Error("reordered inputs: same stamp")
	}
	write(a, "one", at.Add(time.Nanosecond))
	if stamp(a, b) == first {
		t.Error("modification time changed by 1ns: same stamp")
	}
	write(a, "ONE!", at)
	if stamp(a, b) == first {
		t.Error("size changed, time put back: same stamp")
	}
	write(a, "one", at)
	if stamp(a, b) != first {
		t.Error("content, size and time as they were: another stamp")
	}
	moved := filepath.Join(t.TempDir(), "moved")
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if stamp(filepath.Join(moved, "a"), filepath.Join(moved, "b")) != first {
		t.Error("the inputs' directory moved (mv keeps sizes and times): another stamp")
	}
	if err := os.Rename(moved, dir); err != nil {
		t.Fatal(err)
	}
	if s, err := checkpoint.InputsStamp(nil); s != "" || err != nil {
		t.Errorf("no inputs: %q, %v; want \"\" and no error", s, err)
	}
	if _, err := checkpoint.InputsStamp([]string{filepath.Join(dir, "gone")}); !os.IsNotExist(err) {
		t.Errorf("missing input: %v, want not-exist", err)
	}

	mk := checkpoint.Marker{Inputs: first}
	if mk.InputsChanged([]string{a, b}) {
		t.Error("InputsChanged of unchanged inputs")
	}
	if !mk.InputsChanged([]string{b, a}) {
		t.Error("InputsChanged missed reordered inputs")
	}
	if mk.InputsChanged([]string{filepath.Join(dir, "gone")}) {
		t.Error("InputsChanged of inputs it cannot look at: want false (the run's own check says what is wrong)")
	}
	if (checkpoint.Marker{}).InputsChanged([]string{a}) {
		t.Error("a marker without a stamp (written before stamps) said its inputs changed")
	}
}
