package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/testenv"
)

// TestCrashConsistency SIGKILLs `shardpool ckpt commit` at random points of
// many commits and checks that verify never accepts a partial generation
// and that no verified generation is ever lost. (A process kill keeps the
// page cache; power loss is what the fsyncs are for and is not simulated.)
func TestCrashConsistency(t *testing.T) {
	testenv.Binary(t)
	dir := filepath.Join(t.TempDir(), "ckpt")
	src := t.TempDir()
	files := []string{testenv.RandomFile(t, src, "weights.bin", 3<<20), testenv.RandomFile(t, src, "optimizer.bin", 1<<20), testenv.RandomFile(t, src, "step", 16)}
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 1))
	// The kills land at random moments of a whole commit, start-up
	// included, as long as one took here: a fixed window (it was 25 ms)
	// ended before the first write on days when a process took longer to
	// start, and then no kill fell mid-commit.
	begun := time.Now()
	first := testenv.Start(t, append([]string{"ckpt", "commit", dir}, files...)...)
	if code := first.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("a commit left to finish: exit %d: %s", code, first.Output())
	}
	whole := time.Since(begun)
	verified := 1
	killedMidway, partial := 0, 0
	for i := range 40 {
		p := testenv.Start(t, append([]string{"ckpt", "commit", dir}, files...)...)
		time.Sleep(time.Duration(rng.Int64N(int64(whole))))
		p.Signal(syscall.SIGKILL)
		if code := p.Wait(t, 10*time.Second); code != 0 {
			killedMidway++
		}
		// A commit killed after its first write leaves its temporary
		// directory, which the next commit sweeps.
		if len(tempDirs(dir)) > 0 {
			partial++
		}
		reports, err := checkpoint.VerifyAll(dir)
		if err != nil {
			t.Fatal(err)
		}
		ok := 0
		for _, r := range reports {
			if !r.OK {
				t.Fatalf("round %d: generation %d is visible but does not verify: %s", i, r.N, r.Reason)
			}
			ok++
		}
		if ok < verified {
			t.Fatalf("round %d: %d verified generations, had %d: one was lost", i, ok, verified)
		}
		verified = ok
		if verified > 0 {
			g, _, err := checkpoint.Latest(dir)
			if err != nil || strings.Contains(g.Path, ".tmp-") {
				t.Fatalf("round %d: latest %q, %v", i, g.Path, err)
			}
		}
	}
	if killedMidway < 5 || partial < 1 {
		t.Fatalf("%d of 40 commits killed, %d left partial temp dirs; the test did not exercise crashes mid-commit", killedMidway, partial)
	}
	// The next commit, left to finish, sweeps what the killed ones left.
	p := testenv.Start(t, append([]string{"ckpt", "commit", dir}, files...)...)
	if code := p.Wait(t, 30*time.Second); code != 0 {
		t.Fatalf("commit after the kills: exit %d: %s", code, p.Output())
	}
	if left := tempDirs(dir); len(left) > 0 {
		t.Errorf("temporary directories of killed commits left after the next commit: %v", left)
	}
	t.Logf("a commit took %s; %d commits killed, %d of them mid-write, %d generations verified", whole, killedMidway, partial, verified)
}

func TestDiskFullLeavesPreviousGeneration(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "small")
	testenv.SmallTmpfs(t, dir, "1m")
	src := t.TempDir()
	ctx := context.Background()
	small := testenv.RandomFile(t, src, "state", 200<<10)
	if _, err := checkpoint.Commit(ctx, dir, []string{small}, checkpoint.Options{}); err != nil {
		t.Fatal(err)
	}
	big := testenv.RandomFile(t, src, "big", 2<<20)
	_, err := checkpoint.Commit(ctx, dir, []string{big}, checkpoint.Options{})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("commit on a full disk: got %v, want ENOSPC", err)
	}
	g, _, err := checkpoint.Latest(dir)
	if err != nil || g.N != 1 {
		t.Fatalf("latest after a failed commit: gen %d, %v; want gen 1", g.N, err)
	}
	if left := tempDirs(dir); len(left) > 0 {
		t.Fatalf("temp dir %s left on the full disk", left[0])
	}
	// CommitDir on a full disk: nothing at the destination, and an
	// error that says what the commit needed there.
	dst := filepath.Join(dir, "out")
	_, err = checkpoint.CommitDir(ctx, dst, src, checkpoint.Options{}, "")
	var re *checkpoint.RoomError
	if !errors.Is(err, syscall.ENOSPC) || !errors.As(err, &re) || !checkpoint.IsNoRoom(err) {
		t.Fatalf("CommitDir on a full disk: got %v, want a RoomError of ENOSPC", err)
	}
	if want := int64(2<<20 + 200<<10); re.Bytes < want || re.Bytes > want+128<<10 || re.Files != 2 || re.Dir != dir {
		t.Errorf("RoomError %+v, want about %d bytes in 2 files, in %s", re, want, dir)
	}
	if _, err := os.Stat(dst); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("destination exists after a failed commit")
	}
	// The look for room: none for the commit that failed, room for a
	// small one; neither leaves anything behind.
	if err := checkpoint.Room(dir, re.Bytes, re.Files); !checkpoint.IsNoRoom(err) {
		t.Errorf("Room for %d bytes on a 1 MiB disk: %v, want no room", re.Bytes, err)
	}
	if err := checkpoint.Room(dir, 512<<10, 1); err != nil {
		t.Errorf("Room for 512 KiB with about 800 KiB free: %v, want room", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("the disk holds %v after the looks, want the first generation alone", ents)
	}
}

// TestRoomCountsInodes: a file system out of inodes, with blocks to
// spare, fails a commit with ENOSPC too; the RoomError counts its files,
// and the look for room finds none until inodes are freed.
func TestRoomCountsInodes(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "few")
	testenv.SmallTmpfs(t, dir, "8m,nr_inodes=16")
	var filler []string
	for i := 0; ; i++ {
		p := filepath.Join(dir, fmt.Sprintf("filler-%d", i))
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
		filler = append(filler, p)
	}
	src := t.TempDir()
	for i := range 3 {
		testenv.RandomFile(t, src, fmt.Sprintf("f%d", i), 1024)
	}
	_, err := checkpoint.CommitDir(context.Background(), filepath.Join(dir, "out"), src, checkpoint.Options{}, "")
	var re *checkpoint.RoomError
	if !errors.As(err, &re) || re.Files != 3 {
		t.Fatalf("commit with no inode free: %v (%+v), want a RoomError of 3 files", err, re)
	}
	if err := checkpoint.Room(dir, re.Bytes, re.Files); !checkpoint.IsNoRoom(err) || !strings.Contains(err.Error(), "inodes free") {
		t.Fatalf("Room with no inode free: %v, want no room, naming the inodes", err)
	}
	for _, p := range filler[:8] {
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
	}
	if err := checkpoint.Room(dir, re.Bytes, re.Files); err != nil {
		t.Fatalf("Room with 8 inodes freed: %v, want room", err)
	}
}

func TestConcurrentCommittersGetDistinctGenerations(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	src := t.TempDir()
	var wg sync.WaitGroup
	results := make([]int64, 8)
	errs := make([]error, 8)
	for i := range 8 {
		f := testenv.RandomFile(t, src, fmt.Sprintf("f%d", i), 64<<10)
		wg.Add(1)
		go func() {
			defer wg.Done()
			g, err := checkpoint.Commit(context.Background(), dir, []string{f}, checkpoint.Options{})
			results[i], errs[i] = g.N, err
		}()
	}
	wg.Wait()
	seen := map[int64]bool{}
	won := 0
	for i := range 8 {
		if errs[i] != nil {
			if !errors.Is(errs[i], checkpoint.ErrConflict) {
				t.Fatalf("committer %d: %v, want success or ErrConflict", i, errs[i])
			}
			continue
		}
		if seen[results[i]] {
			t.Fatalf("generation %d was won twice", results[i])
		}
		seen[results[i]] = true
		won++
	}
	reports, _ := checkpoint.VerifyAll(dir)
	if len(reports) != won {
		t.Fatalf("%d generations on disk, %d winners", len(reports), won)
	}
	for _, r := range reports {
		if !r.OK {
			t.Fatalf("generation %d: %s", r.N, r.Reason)
		}
	}
}

func TestReplicateVerifiesAndWritesMarkerLast(t *testing.T) {
	ctx := context.Background()
	src := t.TempDir()
	testenv.RandomFile(t, src, "a", 1<<20)
	os.MkdirAll(filepath.Join(src, "sub"), 0o755)
	testenv.RandomFile(t, filepath.Join(src, "sub"), "b", 1000)
	g, err := checkpoint.Commit(ctx, filepath.Join(t.TempDir(), "ck"), []string{filepath.Join(src, "a"), filepath.Join(src, "sub")}, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "replica", "gen-1")
	r, err := checkpoint.Replicate(ctx, g.Path, dst)
	if err != nil {
		t.Fatal(err)
	}
	if r.Bytes < 1<<20 {
		t.Fatalf("replicated %d bytes, want the generation's size", r.Bytes)
	}
	mk, err := checkpoint.Verify(dst)
	if err != nil || mk.Manifest != g.Marker.Manifest {
		t.Fatalf("replica: %v (manifest %s, want %s)", err, mk.Manifest, g.Marker.Manifest)
	}
	// A damaged source is refused.
	os.Truncate(filepath.Join(g.Path, "a"), 10)
	if _, err := checkpoint.Replicate(ctx, g.Path, filepath.Join(t.TempDir(), "r2")); !errors.Is(err, checkpoint.ErrCorrupt) {
		t.Fatalf("replicate of a damaged source: got %v, want ErrCorrupt", err)
	}
}

// TestCommittedGenerationsSurvivePowerCuts cuts the power under `shardpool
// ckpt commit` (testenv.PowerCutFS: what was not made durable is lost, as
// on a host that loses power): a generation the command reported (exit 0,
// its path printed) survives every later cut, and one a cut interrupted is
// never visible half made. This is what the fsyncs and their order are
// for; the SIGKILLs of TestCrashConsistency keep the page cache.
//
// It runs under ext4 and XFS (testenv.PowerCutKinds).
func TestCommittedGenerationsSurvivePowerCuts(t *testing.T) {
	testenv.Binary(t)
	for _, kind := range testenv.PowerCutKinds {
		t.Run(kind, func(t *testing.T) { commitsSurvivePowerCuts(t, kind) })
	}
}

func commitsSurvivePowerCuts(t *testing.T, kind string) {
	fs := testenv.NewPowerCutFSKind(t, 256<<20, kind)
	dir := filepath.Join(fs.Dir, "ckpt")
	src := t.TempDir()
	files := []string{testenv.RandomFile(t, src, "weights.bin", 4<<20), testenv.RandomFile(t, src, "step", 16)}
	rng := mrand.New(mrand.NewPCG(uint64(time.Now().UnixNano()), 2))
	committed := map[string]bool{} // generation paths reported
	interrupted := 0
	for round := range 8 {
		for range 1 + rng.IntN(2) {
			p := testenv.Start(t, append([]string{"ckpt", "commit", dir}, files...)...)
			if code := p.Wait(t, 30*time.Second); code != 0 {
				t.Fatalf("round %d: ckpt commit exited %d: %s", round, code, p.Output())
			}
			committed[strings.TrimSpace(p.Output())] = true
		}
		// Every other round the power goes right after a commit reported
		// (nothing later makes its last steps durable by chance: ext4
		// commits its whole journal on any fsync); the others at a random
		// moment of one more commit, once its temporary directory is there.
		if round%2 == 0 {
			fs.Cut()
			checkAfterCut(t, round, dir, committed)
			continue
		}
		// A commit that ends before its random moment is one more
		// committed generation; up to three more commits are tried for a
		// moment within one (a fast disk finished most of them first, and
		// the round then cut no commit at all).
		for try := 0; try < 4; try++ {
			if killMidCommit(t, rng, dir, files, committed) {
				interrupted++
				break
			}
		}
		fs.Cut()
		checkAfterCut(t, round, dir, committed)
	}
	if interrupted < 2 {
		t.Fatalf("only %d of 4 cuts came while a commit ran; the test did not exercise a cut mid-commit", interrupted)
	}
	t.Logf("%d generations reported committed, all kept; %d cuts mid-commit", len(committed), interrupted)
}

// killMidCommit starts a commit of files into dir and SIGKILLs it at a
// random moment once its temporary directory is there. It reports whether
// the kill came first; a commit that ended before it is noted committed.
func killMidCommit(t *testing.T, rng *mrand.Rand, dir string, files []string, committed map[string]bool) bool {
	before := map[string]bool{}
	for _, name := range tempDirs(dir) {
		before[name] = true
	}
	p := testenv.Start(t, append([]string{"ckpt", "commit", dir}, files...)...)
wait:
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !p.Exited(); time.Sleep(200 * time.Microsecond) {
		for _, name := range tempDirs(dir) {
			if !before[name] {
				break wait
			}
		}
	}
	time.Sleep(time.Duration(rng.IntN(8000)) * time.Microsecond)
	p.Signal(syscall.SIGKILL)
	if code := p.Wait(t, 10*time.Second); code == 0 {
		committed[strings.TrimSpace(p.Output())] = true
		return false
	}
	return true
}

// tempDirs are the names of dir's temporary generation directories.
func tempDirs(dir string) []string {
	var names []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), checkpoint.TempPrefix) {
			names = append(names, e.Name())
		}
	}
	return names
}

// checkAfterCut checks that every generation of dir verifies and that each
// one reported committed is there.
func checkAfterCut(t *testing.T, round int, dir string, committed map[string]bool) {
	t.Helper()
	reports, err := checkpoint.VerifyAll(dir)
	if err != nil {
		t.Fatalf("round %d, after the cut: %v", round, err)
	}
	visible := map[string]bool{}
	for _, r := range reports {
		if !r.OK {
			t.Fatalf("round %d: after a power cut generation %d is visible but does not verify: %s", round, r.N, r.Reason)
		}
		visible[r.Path] = true
	}
	for path := range committed {
		if !visible[path] {
			t.Fatalf("round %d: %s was reported committed, and a power cut lost it (visible: %v)", round, path, visible)
		}
	}
}

// TestSweepRemovesOnlyDeadCommitsTemps: a commit in progress (prepared, not
// yet published) keeps its temporary directory through a sweep, and
// publishes; one no process holds any more is removed.
func TestSweepRemovesOnlyDeadCommitsTemps(t *testing.T) {
	out := t.TempDir()
	src := t.TempDir()
	testenv.RandomFile(t, src, "data", 4096)
	p, err := checkpoint.Prepare(context.Background(), filepath.Join(out, "s1"), src, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dead := filepath.Join(out, checkpoint.TempPrefix+"s2-0123456789ab")
	if err := os.MkdirAll(filepath.Join(dead, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	removed, err := checkpoint.SweepTemps(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 1 || removed[0] != filepath.Base(dead) {
		t.Errorf("swept %v, want only %s", removed, filepath.Base(dead))
	}
	if err := p.Publish(""); err != nil {
		t.Fatalf("publish after a sweep: %v", err)
	}
	if _, err := checkpoint.Verify(filepath.Join(out, "s1")); err != nil {
		t.Fatal(err)
	}
	if left := tempDirs(out); len(left) > 0 {
		t.Errorf("left: %v", left)
	}
}

// TestSweepLeavesWhatACommitReplaced sweeps while a commit replaces a
// damaged output, after its first rename: a sweep (a worker starting
// beside this one) must take neither the damaged copy nor the new output
// for a dead commit's. Until the fifty-sixth session the first rename
// was a swap, after which the damaged copy sat beside the output under a
// temporary name with no commit's lock on it until its move into
// keepReplaced; it is moved there first now, and the parent's lock still
// holds the sweep off until the commit is through. On FUSE
// TestCommitOnFuse runs the same check.
func TestSweepLeavesWhatACommitReplaced(t *testing.T) {
	sweepDuringReplace(t, t.TempDir())
}

// damagedOutput commits out/s1 (fingerprint "a", v = "first"), damages
// it (v = "damaged"), and returns it with keep, the directory a commit
// over it keeps it in, and src, a new output (v = "second").
func damagedOutput(t *testing.T, out string) (dst, keep, src string) {
	t.Helper()
	dst, keep, src = filepath.Join(out, "s1"), filepath.Join(out, ".shardpool", "replaced"), t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "v"), []byte("first"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := checkpoint.CommitDir(context.Background(), dst, src, checkpoint.Options{Fingerprint: "a"}, ""); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "v"), []byte("damaged"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "v"), []byte("second"), 0o644); err != nil {
		t.Fatal(err)
	}
	return dst, keep, src
}

func sweepDuringReplace(t *testing.T, out string) {
	t.Helper()
	dst, keep, src := damagedOutput(t, out)
	p, err := checkpoint.Prepare(context.Background(), dst, src, checkpoint.Options{Fingerprint: "b"})
	if err != nil {
		t.Fatal(err)
	}
	type swept struct {
		removed []string
		err     error
	}
	done := make(chan swept, 1)
	finishedInWindow := false
	defer checkpoint.SetAfterSwap(func() {
		go func() {
			r, err := checkpoint.SweepTemps(out)
			done <- swept{r, err}
		}()
		// Long enough for a sweep that is not held off to finish: the
		// window is open for as long as this function runs.
		select {
		case s := <-done:
			finishedInWindow = true
			done <- s
		case <-time.After(300 * time.Millisecond):
		}
	})()
	if err := p.Publish(keep); err != nil {
		t.Fatalf("publish over the damaged output: %v", err)
	}
	var s swept
	select {
	case s = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the sweep did not finish after the commit did")
	}
	if s.err != nil || len(s.removed) > 0 {
		t.Errorf("the sweep during the replace removed %v (%v), want nothing", s.removed, s.err)
	}
	if finishedInWindow {
		t.Errorf("the sweep ran while the replaced copy had no lock on it")
	}
	if mk, err := checkpoint.Verify(dst); err != nil || mk.Fingerprint != "b" {
		t.Fatalf("after the replace: %v, fingerprint %q", err, mk.Fingerprint)
	}
	kept, _ := os.ReadDir(keep)
	if len(kept) != 1 {
		t.Fatalf("the damaged output: %d entries in %s, want 1 (kept aside)", len(kept), keep)
	}
	if got, _ := os.ReadFile(filepath.Join(keep, kept[0].Name(), "v")); string(got) != "damaged" {
		t.Errorf("kept aside: v holds %q, want the damaged output's", got)
	}
	if left := tempDirs(out); len(left) > 0 {
		t.Errorf("left beside the output: %v", left)
	}
}
