package checkpoint_test

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/shardpool/shardpool/checkpoint"
)

// TestEmpty: a directory is empty only with no entry at all (a file, a
// subdirectory, a dot file, or more entries than one read returns); a
// missing directory or a file is an error, never "empty".
func TestEmpty(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, fill func(string)) string {
		d := filepath.Join(dir, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if fill != nil {
			fill(d)
		}
		return d
	}
	write := func(d, name string) {
		if err := os.WriteFile(filepath.Join(d, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name string
		dir  string
		want bool
	}{
		{"empty", mk("empty", nil), true},
		{"a file", mk("file", func(d string) { write(d, "x") }), false},
		{"a dot file", mk("dot", func(d string) { write(d, ".hidden") }), false},
		{"a subdirectory", mk("sub", func(d string) { os.Mkdir(filepath.Join(d, "s"), 0o755) }), false},
		{"many entries", mk("many", func(d string) {
			for i := range 300 {
				write(d, fmt.Sprintf("entry-with-a-long-name-%04d", i))
			}
		}), false},
		{"emptied", mk("emptied", func(d string) { write(d, "x"); os.Remove(filepath.Join(d, "x")) }), true},
	}
	for _, c := range cases {
		if got, err := checkpoint.Empty(c.dir); err != nil || got != c.want {
			t.Errorf("%s: got %v (%v), want %v", c.name, got, err, c.want)
		}
	}
	if got, err := checkpoint.Empty(filepath.Join(dir, "missing")); got || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing: got %v (%v), want an error that it does not exist", got, err)
	}
	file := filepath.Join(dir, "plain")
	write(dir, "plain")
	if got, err := checkpoint.Empty(file); got || !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("a file: got %v (%v), want ENOTDIR", got, err)
	}
}
