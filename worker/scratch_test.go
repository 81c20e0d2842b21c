package worker

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardpool/shardpool/staging"
)

// TestScratchPoolReusesEmptiedDirectories: a returned pair comes back
// empty (whatever the job left, nested or read-only), is reused instead of
// recreated, and everything is removed at close.
func TestScratchPoolReusesEmptiedDirectories(t *testing.T) {
	root := t.TempDir()
	p := newScratchPool(root, 42)
	a, err := p.take("run")
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.take("run")
	if err != nil || b == a {
		t.Fatalf("second take: got %s (%v), want a second pair", b, err)
	}
	os.MkdirAll(filepath.Join(a+".out", "deep", "er"), 0o755)
	os.WriteFile(filepath.Join(a+".out", "deep", "er", "f"), []byte("x"), 0o444)
	os.WriteFile(filepath.Join(a+".tmp", "t"), []byte("y"), 0o644)
	p.put("run", a)
	c, err := p.take("run")
	if err != nil || c != a {
		t.Fatalf("take after put: got %s (%v), want %s reused", c, err, a)
	}
	for _, d := range []string{c + ".out", c + ".tmp"} {
		if ents, err := os.ReadDir(d); err != nil || len(ents) != 0 {
			t.Fatalf("%s after reuse: %d entries (%v), want empty", d, len(ents), err)
		}
	}
	if !strings.HasPrefix(filepath.Base(a), "p42-") {
		t.Fatalf("pair name %s lacks the worker's pid", a)
	}
	p.put("run", b)
	p.put("run", c)
	p.close()
	if _, err := os.Stat(filepath.Join(root, "run")); !os.IsNotExist(err) {
		t.Fatalf("after close: %v, want the run's scratch removed", err)
	}
}

// TestOOMKillsParsesVmstat reads the counter from a vmstat fixture (lines
// from a real 6.x kernel) and reports -1 without it.
func TestOOMKillsParsesVmstat(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) { os.WriteFile(filepath.Join(dir, "vmstat"), []byte(s), 0o644) }
	write("nr_free_pages 5372213\nnr_zone_inactive_anon 25046\noom_kill 17\nnuma_pte_updates 0\n")
	if n := oomKills(dir); n != 17 {
		t.Fatalf("got %d, want 17", n)
	}
	write("oom_kill 3\nnr_free_pages 1\n")
	if n := oomKills(dir); n != 3 {
		t.Fatalf("first line: got %d, want 3", n)
	}
	write("nr_free_pages 5372213\nnr_oom_kill_x 4\n")
	if n := oomKills(dir); n != -1 {
		t.Fatalf("no counter: got %d, want -1", n)
	}
	if n := oomKills(filepath.Join(dir, "absent")); n != -1 {
		t.Fatalf("no file: got %d, want -1", n)
	}
}

// TestDeadWorkersPairsAreRemoved: a worker killed while a shard of many
// small inputs ran leaves its pair and the unpacked inputs (.in) behind;
// the worker that finds it dead removes all three, and nothing of another
// worker process. A directory left at an attempt's unpack path (an earlier
// process of the same pid, before a reboot) does not fail the unpack.
func TestDeadWorkersPairsAreRemoved(t *testing.T) {
	root := t.TempDir()
	dead, live := newScratchPool(root, 41), newScratchPool(root, 42)
	d, err := dead.take("run")
	if err != nil {
		t.Fatal(err)
	}
	l, err := live.take("run")
	if err != nil {
		t.Fatal(err)
	}
	for _, base := range []string{d, l} {
		os.MkdirAll(base+".in", 0o755)
		os.WriteFile(filepath.Join(base+".in", "part-0001"), []byte("x"), 0o644)
	}
	removeDeadPairs(root, 41)
	for _, s := range pairSuffixes {
		if _, err := os.Stat(d + s); !os.IsNotExist(err) {
			t.Fatalf("%s of the dead worker: %v, want it removed", d+s, err)
		}
		if _, err := os.Stat(l + s); err != nil {
			t.Fatalf("%s of the live worker: %v, want it kept", l+s, err)
		}
	}
	src := filepath.Join(t.TempDir(), "part-0001")
	os.WriteFile(src, []byte("new"), 0o644)
	pack := filepath.Join(t.TempDir(), "s.tar")
	if _, err := staging.Pack(context.Background(), pack, []string{src}); err != nil {
		t.Fatal(err)
	}
	paths, err := unpack(context.Background(), pack, l+".in")
	if err != nil || len(paths) != 1 {
		t.Fatalf("unpack over a directory left behind: %v %v, want the pack's one file", paths, err)
	}
	if b, _ := os.ReadFile(paths[0]); string(b) != "new" {
		t.Fatalf("unpacked %q, want the pack's content", b)
	}
	live.close()
	if _, err := os.Stat(l + ".in"); !os.IsNotExist(err) {
		t.Fatalf("after close: %v, want the unpack dir removed too", err)
	}
}

// TestAdmissionLogsStayFew: a worker that serves run after run keeps at
// most maxOpenLogs admission logs open (it kept one per run it ever
// served, a descriptor each for its whole life), and a run whose log was
// closed gets its later decisions appended all the same. The worker's
// own output names each run's evidence directory once, a log opened
// again included.
func TestAdmissionLogsStayFew(t *testing.T) {
	dir := t.TempDir()
	var out bytes.Buffer
	w := &Worker{cfg: Config{StateDir: dir, Name: "w"}, logs: map[string]*openLog{}, announced: map[string]bool{},
		log: slog.New(slog.NewTextHandler(&out, nil))}
	defer w.closeLogs()
	const runs = 3 * maxOpenLogs
	for i := range runs {
		w.admission(fmt.Sprintf("r%02d", i), "s", "cpu", "admit", "first")
		if len(w.logs) > maxOpenLogs {
			t.Fatalf("after %d runs: %d logs open, want at most %d", i+1, len(w.logs), maxOpenLogs)
		}
	}
	w.admission("r00", "s", "cpu", "validated", "second")
	for i := range runs {
		b, err := os.ReadFile(filepath.Join(dir, "runs", fmt.Sprintf("r%02d", i), "admission.log"))
		want := 1
		if i == 0 {
			want = 2
		}
		if err != nil || strings.Count(string(b), "\n") != want {
			t.Fatalf("run r%02d's admission.log: %q (%v), want %d line(s)", i, b, err, want)
		}
		said := fmt.Sprintf("run=r%02d evidence=%s\n", i, filepath.Join(dir, "runs", fmt.Sprintf("r%02d", i)))
		if n := strings.Count(out.String(), said); n != 1 {
			t.Errorf("the worker's output names run r%02d's evidence %d time(s), want once:\n%s", i, n, out.String())
		}
	}
}

// TestIdleRunsPairsAreDropped: the pairs of a run none of whose shards
// has run here for a while are removed with the run's directory; a run
// with a shard running keeps them, however old its last take.
func TestIdleRunsPairsAreDropped(t *testing.T) {
	root := t.TempDir()
	p := newScratchPool(root, 42)
	for _, run := range []string{"done", "recent", "busy"} {
		b, err := p.take(run)
		if err != nil {
			t.Fatal(err)
		}
		if run != "busy" {
			p.put(run, b)
		}
	}
	// A second pair of the busy run, back in the pool while its first
	// shard runs on (for longer than the idle time).
	b2, err := p.take("busy")
	if err != nil {
		t.Fatal(err)
	}
	p.put("busy", b2)
	p.mu.Lock()
	p.used["done"] = time.Now().Add(-time.Hour)
	p.used["busy"] = time.Now().Add(-time.Hour)
	p.mu.Unlock()
	p.dropIdle(10 * time.Minute)
	if _, err := os.Stat(filepath.Join(root, "done")); !os.IsNotExist(err) {
		t.Fatalf("the idle run's directory: %v, want it removed", err)
	}
	for run, want := range map[string]int{"recent": 2, "busy": 4} {
		if ents, err := os.ReadDir(filepath.Join(root, run)); err != nil || len(ents) != want {
			t.Fatalf("run %s's pairs: %d entries (%v), want all %d kept", run, len(ents), err, want)
		}
	}
	// The idle run's next shard gets a new pair.
	b, err := p.take("done")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b + ".out"); err != nil {
		t.Fatalf("a new pair for the run: %v", err)
	}
	p.put("done", b)
	p.close()
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Fatalf("after close: %d entries left in the scratch root", len(ents))
	}
}

// TestUnusedPairsDropWhenIdle: with nothing in hand, a worker's pairs go
// at once, in the background, except a run's whose pair is taken; close
// waits for that removal and, once it has begun, starts none.
func TestUnusedPairsDropWhenIdle(t *testing.T) {
	root := t.TempDir()
	p := newScratchPool(root, 42)
	ended, err := p.take("ended")
	if err != nil {
		t.Fatal(err)
	}
	busy, err := p.take("busy")
	if err != nil {
		t.Fatal(err)
	}
	spare, err := p.take("busy")
	if err != nil {
		t.Fatal(err)
	}
	p.put("ended", ended)
	p.put("busy", spare)
	p.dropUnused()
	p.bg.Wait()
	if _, err := os.Stat(filepath.Join(root, "ended")); !os.IsNotExist(err) {
		t.Fatalf("the run with no pair taken: %v, want its directory removed", err)
	}
	if ents, err := os.ReadDir(filepath.Join(root, "busy")); err != nil || len(ents) != 4 {
		t.Fatalf("the run with a pair taken: %d entries (%v), want both pairs kept", len(ents), err)
	}
	// The ended run's next shard gets a new pair.
	again := takeNewPair(t, p, "ended", ended)
	p.put("ended", again)
	p.put("busy", busy)
	p.close()
	p.dropUnused() // after close: nothing starts
	p.bg.Wait()
	if ents, _ := os.ReadDir(root); len(ents) != 0 {
		t.Fatalf("after close: %d entries left in the scratch root", len(ents))
	}
}

// takeNewPair takes a pair of run from p that is not old (whose
// directories are gone) and whose directories exist.
func takeNewPair(t *testing.T, p *scratchPool, run, old string) string {
	t.Helper()
	base, err := p.take(run)
	if err != nil {
		t.Fatal(err)
	}
	if base == old {
		t.Fatalf("took %s again, whose directories were removed, want a new pair", base)
	}
	for _, d := range []string{base + ".out", base + ".tmp"} {
		if _, err := os.Stat(d); err != nil {
			t.Fatalf("the new pair: %v", err)
		}
	}
	return base
}
