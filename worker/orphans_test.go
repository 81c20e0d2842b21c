package worker

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The journal's live groups are those started and not ended; a torn last
// line is skipped. A group is left alone when its id may name another
// group now: a leader that runs, or a member older than the dead worker.
func TestChildJournalAndGroupChecks(t *testing.T) {
	dir := t.TempDir()
	j, err := openChildJournal(dir, "h1", "/scratch with space", "w1", "boot-1", 4242, 1000)
	if err != nil {
		t.Fatal(err)
	}
	j.note('+', 10)
	j.note('+', 11)
	j.note('-', 10)
	j.note('+', 12)
	j.f.WriteString("+ 1") // torn
	got, err := readJournal(filepath.Join(dir, "children", "h1", "4242.w1"))
	if err != nil || got.boot != "boot-1" || got.pid != 4242 || got.start != 1000 || got.scratch != "/scratch with space" || len(got.live) != 2 || got.live[0] != 11 || got.live[1] != 12 {
		t.Fatalf("journal read back as %+v (%v), want boot-1, pid 4242, start 1000, its scratch, live [11 12]", got, err)
	}
	// A worker of another host sharing the state directory (an NFS home)
	// neither reads nor removes this host's journal: its boot differs, and
	// so would everything a pid means.
	other := &Worker{host: "h2", boot: "boot-2", log: slog.Default()}
	other.cfg.StateDir, other.cfg.ProcRoot = dir, "/proc"
	other.reapOrphans()
	if _, err := os.Stat(filepath.Join(dir, "children", "h1", "4242.w1")); err != nil {
		t.Fatalf("another host's worker removed this host's journal: %v", err)
	}
	j.close()
	if _, err := os.Stat(filepath.Join(dir, "children", "h1", "4242.w1")); !os.IsNotExist(err) {
		t.Fatalf("a closed journal is still there: %v", err)
	}

	procs := []procStat{{pid: 4242, start: 1000}, {pid: 4243, start: 1000, zombie: true}, {pid: 4244, start: 7}}
	for _, c := range []struct {
		pid   int
		alive bool
	}{{4242, true}, {4243, false}, {4244, false}, {4245, false}} {
		if got := workerAlive(procs, c.pid, 1000); got != c.alive {
			t.Errorf("worker %d started at 1000: alive %v, want %v (procs %+v)", c.pid, got, c.alive, procs)
		}
	}

	for _, c := range []struct {
		name  string
		procs []procStat
		why   string
	}{
		{"live leader", []procStat{{pid: 500, pgrp: 500, start: 2000}, {pid: 501, pgrp: 500, start: 2001}}, "leader runs"},
		{"older member", []procStat{{pid: 501, pgrp: 500, start: 999}}, "started before"},
		{"gone", []procStat{{pid: 500, pgrp: 500, start: 2000, zombie: true}, {pid: 7, pgrp: 7, start: 1}}, ""},
	} {
		n, why := killOrphanGroup(c.procs, 500, 1000)
		if n != 0 || (c.why == "" && why != "") || !strings.Contains(why, c.why) {
			t.Errorf("%s: killed %d, reason %q; want none, reason containing %q", c.name, n, why, c.why)
		}
	}
}
