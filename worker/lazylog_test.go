package worker

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestAttemptLogKeepsHeadAndTail: a child that prints more than the log
// keeps leaves its first and last bytes, with a line saying how much was
// left out between them; one under the limit is kept whole.
func TestAttemptLogKeepsHeadAndTail(t *testing.T) {
	for _, tc := range []struct {
		name       string
		lines      int
		head, tail int64
	}{{"over", 5000, 1000, 300}, {"under", 50, 1000, 300}, {"just over", 300, 1000, 300}} {
		t.Run(tc.name, func(t *testing.T) {
			var want strings.Builder
			for i := 1; i <= tc.lines; i++ {
				fmt.Fprintf(&want, "%d\n", i)
			}
			full := want.String()
			path := filepath.Join(t.TempDir(), "a.log")
			l, err := newLazyLog(path)
			if err != nil {
				t.Fatal(err)
			}
			l.head, l.tail = tc.head, tc.tail
			cmd := exec.Command("seq", "1", fmt.Sprint(tc.lines))
			cmd.Stdout, cmd.Stderr = l.w, l.w
			if err := cmd.Start(); err != nil {
				l.abort()
				t.Fatal(err)
			}
			l.started()
			if err := cmd.Wait(); err != nil {
				t.Fatal(err)
			}
			if !l.close() {
				t.Fatal("no log written")
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			got := string(b)
			if int64(len(full)) <= tc.head {
				if got != full {
					t.Fatalf("log under the limit: got %d bytes, want the %d-byte output whole", len(got), len(full))
				}
				return
			}
			left := int64(len(full)) - tc.head - min(int64(len(full))-tc.head, tc.tail)
			note := fmt.Sprintf("bytes left out; its last %d bytes follow]\n", min(int64(len(full))-tc.head, tc.tail))
			head, tail, ok := strings.Cut(got, "\n[shardpool: ")
			if !ok || head != full[:tc.head] || !strings.Contains(tail, fmt.Sprintf("; %d %s", left, note)) {
				t.Fatalf("log over the limit: head ok %v, marker %q; want the first %d bytes and %d left out", head == full[:tc.head], strings.SplitN(tail, "\n", 2)[0], tc.head, left)
			}
			if _, last, _ := strings.Cut(tail, "follow]\n"); last != full[len(full)-len(last):] || int64(len(last)) != min(int64(len(full))-tc.head, tc.tail) {
				t.Fatalf("log tail: got %d bytes %q..., want the output's last %d bytes", len(last), last[:min(len(last), 20)], tc.tail)
			}
		})
	}
}
