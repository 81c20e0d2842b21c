package coordinator

import (
	"fmt"
	"testing"
)

// TestRunsInTheStoreStayOneLine: the restart summary names at most ten
// runs of a kind, in order, and counts the rest.
func TestRunsInTheStoreStayOneLine(t *testing.T) {
	var names []string
	for i := range 12 {
		names = append(names, fmt.Sprintf("r%02d", 11-i))
	}
	if got, want := firstFew(names[10:]), "r00, r01"; got != want {
		t.Errorf("firstFew of two: %q, want %q", got, want)
	}
	if got, want := firstFew(names), "r00, r01, r02, r03, r04, r05, r06, r07, r08, r09 and 2 more"; got != want {
		t.Errorf("firstFew of twelve: %q, want %q", got, want)
	}
}
