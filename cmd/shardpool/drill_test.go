package main_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/coordinator/drill"
	"github.com/shardpool/shardpool/coordinator/drill/powercut"
	"github.com/shardpool/shardpool/testenv"
)

// TestDrillPasses runs `shardpool drill` as a user would and checks the
// table, drill.json and the exit code.
func TestDrillPasses(t *testing.T) {
	data := t.TempDir()
	start := time.Now()
	p := testenv.Start(t, "drill", "--data", data)
	if code := p.Wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("drill exit %d, want 0:\n%s%s", code, p.Output(), drillLogTails(data))
	}
	if d := time.Since(start); d > 2*time.Minute {
		t.Errorf("drill took %s, want under 2 minutes", d)
	}
	rep, _ := readDrillReport(t, data)
	if !rep.Passed || len(rep.Checks) < 9 {
		t.Fatalf("drill.json: passed %v with %d checks, want passed with every check", rep.Passed, len(rep.Checks))
	}
	// The power cut is simulated where the host allows (root with loop
	// devices, as on this project's machines and CI) and said to be
	// unverified, with why, where it does not.
	want := map[string]string{"recovery after a power cut": drill.Pass}
	if err := powercut.Available(); err != nil {
		want["recovery after a power cut"] = drill.Unverified
	}
	for _, c := range rep.Checks {
		switch {
		case want[c.Name] != "" && c.Status != want[c.Name]:
			t.Errorf("check %q: %s %s, want %s", c.Name, c.Status, c.Detail, want[c.Name])
		case want[c.Name] == "" && c.Status != drill.Pass:
			t.Errorf("check %q: %s %s", c.Name, c.Status, c.Detail)
		}
		delete(want, c.Name)
		if !strings.Contains(p.Output(), c.Name) {
			t.Errorf("the table lacks check %q", c.Name)
		}
	}
	for name := range want {
		t.Errorf("no check %q", name)
	}
	// Its state directory's evidence tells of the drill, not of a run
	// named drill that stopped without a verdict.
	st := testenv.Start(t, "status", "--data", data)
	if code := st.Wait(t, 30*time.Second); code != 0 || !strings.Contains(st.Output(), fmt.Sprintf("last recovery drill: passed all %d checks", len(rep.Checks))) ||
		strings.Contains(st.Output(), "no verdict") {
		t.Errorf("status --data after the drill: exit %d, want 0 and the drill's result alone\n%s", code, st.Output())
	}
}

// TestDrillCutsThePowerUnderItsStateDirectorysFileSystem: a drill whose
// state directory is on XFS simulates its power cuts under XFS, and says
// so; elsewhere under ext4 (TestDrillPasses).
func TestDrillCutsThePowerUnderItsStateDirectorysFileSystem(t *testing.T) {
	xfs := testenv.NewPowerCutFSKind(t, powercut.MinXFS, powercut.XFS) // here only a mounted XFS
	data := filepath.Join(xfs.Dir, "data")
	p := testenv.Start(t, "drill", "--data", data, "--json")
	if code := p.Wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("drill on XFS: exit %d, want 0:\n%s", code, p.Output())
	}
	rep, b := readDrillReport(t, data)
	for _, c := range rep.Checks {
		if c.Name == "recovery after a power cut" {
			if c.Status != drill.Pass || !strings.Contains(c.Detail, "simulated: XFS, as under this state directory") {
				t.Fatalf("power cut check with the state on XFS: %s %q, want PASS simulated under XFS", c.Status, c.Detail)
			}
			return
		}
	}
	t.Fatalf("no power cut check in %s", b)
}

// TestDrillWhereThePowerCutCannotBeSimulated: as root of a user namespace
// (as in a container) the drill may not mount its file systems. That
// failure of the simulation makes the power-cut check UNVERIFIED, saying
// why, not a failed drill.
func TestDrillWhereThePowerCutCannotBeSimulated(t *testing.T) {
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("unshare (util-linux, which .ci/run installs): %v", err)
	}
	data := t.TempDir()
	p := testenv.StartCmd(t, "unshare", "-r", testenv.Binary(t), "drill", "--data", data, "--json")
	if code := p.Wait(t, 2*time.Minute); code != 0 {
		t.Fatalf("drill in a user namespace: exit %d, want 0:\n%s", code, p.Output())
	}
	rep, b := readDrillReport(t, data)
	found := false
	for _, c := range rep.Checks {
		if c.Name != "recovery after a power cut" {
			continue
		}
		found = true
		if c.Status != drill.Unverified || !strings.Contains(c.Detail, "mount") {
			t.Errorf("power cut check in a user namespace: %s %q, want UNVERIFIED naming the mount that failed", c.Status, c.Detail)
		}
	}
	if !found {
		t.Errorf("no power cut check in %s", b)
	}
}

// readDrillReport reads the drill.json a drill with --data data wrote,
// parsed and as it is.
func readDrillReport(t *testing.T, data string) (drill.Report, []byte) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(data, "runs", "drill", "drill.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rep drill.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return rep, b
}

// drillLogTails is the end of each log the drill's checks wrote under
// data (the power-cut run's, the coordinators' and workers'): a failed
// check names its log, which the test's temporary directory takes with
// it.
func drillLogTails(data string) string {
	logs, _ := filepath.Glob(filepath.Join(data, "drill", "*", "*.log"))
	var b strings.Builder
	for _, l := range logs {
		body, err := os.ReadFile(l)
		if err != nil || len(body) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimRight(string(body), "\n"), "\n")
		fmt.Fprintf(&b, "\n--- last lines of %s:\n%s\n", l, strings.Join(lines[max(len(lines)-60, 0):], "\n"))
	}
	return b.String()
}
