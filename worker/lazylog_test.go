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

// TestLastLineOfOutput: the line an attempt's reason quotes is the
// output's last one that is not blank, whatever the sizes of the reads it
// came in; a line longer than the reason keeps its end, marked cut.
func TestLastLineOfOutput(t *testing.T) {
	long := strings.Repeat("x", 300) + "END"
	for _, tc := range []struct{ name, out, want string }{
		{"nothing", "", ""},
		{"blank lines", "\n \n\t\n", ""},
		{"last of several", "first\nsecond\nError: disk quota exceeded\n\n\n", "Error: disk quota exceeded"},
		{"no final newline", "a\nlast words", "last words"},
		{"progress bar", "step 1\n 10%\r 20%\r 30%\r", "30%"},
		{"long line", "short\n" + long + "\n", "…" + long[len(long)-maxReasonLine:]},
		{"longer than the window", strings.Repeat("y", 1000), "…" + strings.Repeat("y", maxReasonLine)},
		{"the window's size, whole", strings.Repeat("z", 150) + strings.Repeat("\n", lastOutput-150), strings.Repeat("z", 150)},
		{"past the window, cut", "x" + strings.Repeat("z", 150) + strings.Repeat("\n", lastOutput-150), "…" + strings.Repeat("z", 150)},
		{"a short output, whole", "z\n", "z"},
		{"control characters", "bad\x00byte\x1b[31mred\xff\n", "bad byte [31mred\uFFFD"},
		{"a character at the cut", strings.Repeat("é", 150) + "\n", "…" + strings.Repeat("é", maxReasonLine/2)},
	} {
		for _, chunk := range []int{1, 7, 64, 4096} {
			l := &lazyLog{}
			for b := []byte(tc.out); len(b) > 0; {
				n := min(chunk, len(b))
				l.remember(b[:n])
				b = b[n:]
			}
			if got := l.lastLine(); got != tc.want {
				t.Errorf("%s, reads of %d: got %q, want %q", tc.name, chunk, got, tc.want)
			}
		}
	}
}
