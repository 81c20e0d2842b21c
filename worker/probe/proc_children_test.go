package probe

import (
	"os"
	"os/exec"
	"slices"
	"testing"
)

// TestChildren finds a child this test started, and nothing for a pid
// with no children.
func TestChildren(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if kids := Children("/proc", os.Getpid()); !slices.Contains(kids, cmd.Process.Pid) {
		t.Errorf("Children of this test: %v, want the sleep %d among them", kids, cmd.Process.Pid)
	}
	if kids := Children("/proc", cmd.Process.Pid); len(kids) != 0 {
		t.Errorf("Children of the sleep: %v, want none", kids)
	}
}
