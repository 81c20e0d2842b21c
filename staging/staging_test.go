package staging_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/testenv"
	"github.com/shardpool/shardpool/worker/probe"
)

// TestMain fails the package's tests when a copy or a fleet watch outlives
// the call that started it.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// Fleet tests embed a coordinator (see the worker's tests).
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).expireMsgs"),
		goleak.IgnoreAnyFunction("time.Sleep"),
	)
}

func newStager(t *testing.T, cfg staging.Config) *staging.Stager {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	s, err := staging.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

func describe(t *testing.T, paths ...string) []stream.InputFile {
	t.Helper()
	h := staging.LoadHashes("")
	var out []stream.InputFile
	for _, p := range paths {
		f, err := h.Describe(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, f)
	}
	return out
}

func TestStageVerifiesAndShares(t *testing.T) {
	src := t.TempDir()
	a := testenv.RandomFile(t, src, "a.bin", 3*staging.ChunkSize+123)
	b := testenv.RandomFile(t, src, "b.txt", 10)
	s := newStager(t, staging.Config{CacheBytes: 1 << 30})
	files := describe(t, a, b)
	st, err := s.Stage(context.Background(), files, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.Stats.Copied != files[0].Size+files[1].Size || filepath.Base(st.Paths[0]) != "a.bin" {
		t.Fatalf("first stage: copied %d to %v", st.Stats.Copied, st.Paths)
	}
	// A second shard with the same input reuses the verified copy.
	st2, err := s.Stage(context.Background(), files[:1], 0)
	if err != nil || st2.Stats.Copied != 0 || st2.Stats.Reused != 1 || st2.Paths[0] != st.Paths[0] {
		t.Fatalf("second stage: %+v %v, want a verified reuse", st2.Stats, err)
	}
	st.Release()
	st2.Release()
}

func TestCorruptCopyIsRefetchedAndCorruptSourceFails(t *testing.T) {
	src := t.TempDir()
	a := testenv.RandomFile(t, src, "a.bin", 2*staging.ChunkSize+7)
	s := newStager(t, staging.Config{CacheBytes: 1 << 30})
	files := describe(t, a)
	st, err := s.Stage(context.Background(), files, 0)
	if err != nil {
		t.Fatal(err)
	}
	st.Release()
	// Damage the staged copy: the next stage detects it and copies again.
	flipByte(t, st.Paths[0], 100)
	st, err = s.Stage(context.Background(), files, 0)
	if err != nil || st.Stats.Copied != files[0].Size || st.Stats.Reused != 0 {
		t.Fatalf("after damaging the copy: %+v %v, want a fresh copy", st.Stats, err)
	}
	st.Release()
	// Change the source after it was described: every fetch mismatches.
	g, _ := os.OpenFile(a, os.O_WRONLY, 0)
	g.WriteAt([]byte("changed"), staging.ChunkSize+5)
	g.Close()
	s2 := newStager(t, staging.Config{Retries: 2})
	_, err = s2.Stage(context.Background(), files, 0)
	if !errors.Is(err, staging.ErrMismatch) || !strings.Contains(err.Error(), "3 fetches") || !strings.Contains(err.Error(), "a.bin") {
		t.Fatalf("corrupt source: got %v, want a mismatch after 3 fetches naming the file", err)
	}
}

func TestDiskThatWouldFillIsRefusedBeforeCopying(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "small")
	testenv.SmallTmpfs(t, dir, "1m")
	src := t.TempDir()
	big := testenv.RandomFile(t, src, "big.bin", 2<<20)
	s := newStager(t, staging.Config{Dir: dir})
	_, err := s.Stage(context.Background(), describe(t, big), 0)
	if !errors.Is(err, staging.ErrNoSpace) || !strings.Contains(err.Error(), "2.0MiB") {
		t.Fatalf("got %v, want ErrNoSpace naming the 2MiB need", err)
	}
	small := testenv.RandomFile(t, src, "small.bin", 100<<10)
	if _, err := s.Stage(context.Background(), describe(t, small), 4<<20); !errors.Is(err, staging.ErrNoSpace) {
		t.Fatalf("declared scratch beyond the disk: got %v, want ErrNoSpace", err)
	}
	var parts []string
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		// .lock is the stager's own (empty) lock of the directory.
		if err == nil && !info.IsDir() && p != filepath.Join(dir, ".lock") {
			parts = append(parts, p)
		}
		return nil
	})
	if len(parts) != 0 {
		t.Fatalf("files written before the refusal: %v", parts)
	}
}

// TestRoomIsNotMadeOfTheShardsOwnInputs: a shard whose input is staged
// and idle (its retry, or another shard of the same input) counts it as
// no copy; making room for the rest must remove other idle inputs, not
// that one, which would then be copied again outside the reservation.
func TestRoomIsNotMadeOfTheShardsOwnInputs(t *testing.T) {
	scratch := filepath.Join(t.TempDir(), "scratch")
	testenv.SmallTmpfs(t, scratch, "4m")
	s := newStager(t, staging.Config{Dir: filepath.Join(scratch, "stage"), CacheBytes: 1 << 30})
	src := t.TempDir()
	own := testenv.RandomFile(t, src, "own.bin", 2<<20)     // staged first: least recently used
	other := testenv.RandomFile(t, src, "other.bin", 1<<20) // staged second
	for _, f := range []string{own, other} {
		st, err := s.Stage(context.Background(), describe(t, f), 0)
		if err != nil {
			t.Fatal(err)
		}
		st.Release()
	}
	// About 1MiB free: 1.5MiB declared scratch needs one of the idle
	// inputs removed, and own.bin, the older, is the shard's own.
	st, err := s.Stage(context.Background(), describe(t, own), 3<<19)
	if err != nil {
		t.Fatalf("own.bin staged and idle, 1.5MiB declared, other.bin idle: %v, want room made of other.bin", err)
	}
	if st.Stats.Copied != 0 || st.Stats.Reused != 1 {
		t.Errorf("own.bin copied %d bytes, reused %d, want 0 and 1: the shard's own staged input was removed for room and copied again", st.Stats.Copied, st.Stats.Reused)
	}
	if _, err := os.Stat(st.Paths[0]); err != nil {
		t.Errorf("own.bin: %v", err)
	}
	if n, err := os.ReadDir(filepath.Join(scratch, "stage", "cache")); err != nil || len(n) != 1 {
		t.Errorf("cache holds %d entries (%v), want 1: other.bin removed for room", len(n), err)
	}
	if s.Reserved() != 3<<19 {
		t.Errorf("reserved %d, want the declared 1.5MiB", s.Reserved())
	}
	st.Release()

	// Nor is its own input, in use by another shard, room that comes back
	// to it when that shard ends: it stays for this one. About 2MiB free
	// and own.bin's 2MiB in use cannot hold 3MiB more: an error, not a wait.
	running, err := s.Stage(context.Background(), describe(t, own), 0)
	if err != nil {
		t.Fatal(err)
	}
	defer running.Release()
	if _, err := s.Stage(context.Background(), describe(t, own), 3<<20); !errors.Is(err, staging.ErrNoSpace) || staging.Held(err) {
		t.Fatalf("own.bin in use by another shard, 3MiB declared, about 2MiB free: %v (held %v), want ErrNoSpace, not held", err, staging.Held(err))
	}
}

// TestReserveSharesTheLedgerAndEvictsIdleInputs: room held for a shard
// that stages nothing (Reserve) is in the same reservations as staged
// shards', works before anything was staged (the stage directory not
// made yet), and removes idle staged inputs to make room, as Stage does;
// where others hold the room the error says so (held), and where the
// file system could never hold it, not.
func TestReserveSharesTheLedgerAndEvictsIdleInputs(t *testing.T) {
	scratch := filepath.Join(t.TempDir(), "scratch")
	testenv.SmallTmpfs(t, scratch, "4m")
	s, err := staging.New(staging.Config{Dir: filepath.Join(scratch, "stage"), CacheBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	release, err := s.Reserve(1 << 20)
	if err != nil || s.Reserved() != 1<<20 {
		t.Fatalf("before the stage directory exists: %v (reserved %d), want 1MiB reserved", err, s.Reserved())
	}
	release()
	release() // twice returns it once
	if s.Reserved() != 0 {
		t.Fatalf("released: %d reserved, want 0", s.Reserved())
	}
	if err := s.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	in := testenv.RandomFile(t, t.TempDir(), "in.bin", 2<<20)
	st, err := s.Stage(context.Background(), describe(t, in), 0)
	if err != nil {
		t.Fatal(err)
	}
	// While the staged shard runs, its input is not removed for room.
	if _, err := s.Reserve(3 << 20); !errors.Is(err, staging.ErrNoSpace) || !staging.Held(err) {
		t.Fatalf("3MiB beside a running staged shard's 2MiB on 4MiB: %v (held %v), want ErrNoSpace, held by it", err, staging.Held(err))
	}
	// Room, admission's look at the ledger, agrees: the running shard's
	// input is not room, and once idle it is.
	if room, free, _, err := s.Room(); err != nil || room >= 3<<20 || room != free {
		t.Fatalf("room beside a running staged shard's 2MiB on 4MiB: %d (free %d, %v), want the free space alone, under 3MiB", room, free, err)
	}
	st.Release() // idle now, kept in the cache
	if _, err := os.Stat(st.Paths[0]); err != nil {
		t.Fatalf("the idle staged input: %v, want it cached", err)
	}
	if room, free, _, err := s.Room(); err != nil || room < 3<<20 || room != free+2<<20 {
		t.Fatalf("room with 2MiB of idle staged input on 4MiB: %d (free %d, %v), want the free space and the idle input", room, free, err)
	}
	release, err = s.Reserve(3 << 20)
	if err != nil {
		t.Fatalf("3MiB with 2MiB of idle staged input on 4MiB: %v, want the input removed to make room", err)
	}
	if _, err := os.Stat(st.Paths[0]); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the idle staged input after the reservation: %v, want it removed", err)
	}
	small := testenv.RandomFile(t, t.TempDir(), "small.bin", 2<<20)
	if _, err := s.Stage(context.Background(), describe(t, small), 0); !errors.Is(err, staging.ErrNoSpace) || !staging.Held(err) {
		t.Fatalf("staging 2MiB beside 3MiB reserved on 4MiB: %v (held %v), want ErrNoSpace, held (one ledger)", err, staging.Held(err))
	}
	_, err = s.Reserve(2 << 20)
	if !errors.Is(err, staging.ErrNoSpace) || !staging.Held(err) || !strings.Contains(err.Error(), "other running shards hold 3.0MiB reserved") {
		t.Fatalf("2MiB beside 3MiB reserved on 4MiB: %v (held %v), want ErrNoSpace, held by the others", err, staging.Held(err))
	}
	if _, err = s.Reserve(8 << 20); !errors.Is(err, staging.ErrNoSpace) || staging.Held(err) {
		t.Fatalf("8MiB on 4MiB: %v (held %v), want ErrNoSpace, not held: it never fits", err, staging.Held(err))
	}
	if _, err := s.Stage(context.Background(), describe(t, small), 6<<20); !errors.Is(err, staging.ErrNoSpace) || staging.Held(err) {
		t.Fatalf("staging 2MiB with 6MiB declared on 4MiB: %v (held %v), want ErrNoSpace, not held", err, staging.Held(err))
	}
	release()
	if release, err = s.Reserve(2 << 20); err != nil {
		t.Fatalf("2MiB once the 3MiB were released: %v", err)
	}
	release()

	// A staged input counts once: on the disk, not in the reservations
	// too. Before, 1MiB beside 2MiB staged on 4MiB waited for room there
	// was.
	busy, err := s.Stage(context.Background(), describe(t, small), 0)
	if err != nil {
		t.Fatal(err)
	}
	if s.Reserved() != 0 {
		t.Fatalf("reserved %d once the input was copied, want 0: it is on the disk", s.Reserved())
	}
	if release, err = s.Reserve(1 << 20); err != nil {
		t.Fatalf("1MiB beside a staged 2MiB on 4MiB: %v", err)
	}
	release()

	// DropIdle (a scratch that filled): every idle input goes, none in use.
	tiny := testenv.RandomFile(t, t.TempDir(), "tiny.bin", 100<<10)
	st, err = s.Stage(context.Background(), describe(t, tiny), 0)
	if err != nil {
		t.Fatal(err)
	}
	st.Release()
	if freed := s.DropIdle(); freed != 100<<10 {
		t.Fatalf("DropIdle freed %d, want the idle input's %d", freed, 100<<10)
	}
	if _, err := os.Stat(st.Paths[0]); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the idle input after DropIdle: %v, want it removed", err)
	}
	if _, err := os.Stat(busy.Paths[0]); err != nil {
		t.Fatalf("the input in use after DropIdle: %v, want it kept", err)
	}
	busy.Release()
}

// TestWrittenScratchLeavesTheReservation: what a shard writes in the
// directories its reservation names is gone from the free space, so it
// no longer counts as reserved. 3MiB reserved on 4MiB, 2MiB of it
// written: 1MiB more fits (2MiB free, 1MiB still to be written); counted
// in both, it did not.
func TestWrittenScratchLeavesTheReservation(t *testing.T) {
	scratch := filepath.Join(t.TempDir(), "scratch")
	testenv.SmallTmpfs(t, scratch, "4m")
	s, err := staging.New(staging.Config{Dir: filepath.Join(scratch, "stage")})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(scratch, "a.out")
	release, err := s.Reserve(3<<20, out, filepath.Join(scratch, "a.tmp"))
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(out, "part"), make([]byte, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	// A look at the directories stands for a second.
	testenv.Eventually(t, 5*time.Second, func() (bool, string) {
		room, free, unwritten, err := s.Room()
		return err == nil && unwritten == 1<<20 && room == free-1<<20,
			fmt.Sprintf("room %d, free %d, unwritten %d, %v; want 1MiB still to be written", room, free, unwritten, err)
	})
	second, err := s.Reserve(1 << 20)
	if err != nil {
		t.Fatalf("1MiB beside 3MiB reserved, 2MiB of it written, on 4MiB: %v", err)
	}
	second()
	// A link to a file that was there before took no room: not written.
	before := filepath.Join(scratch, "before")
	if err := os.WriteFile(before, make([]byte, 512<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(before, filepath.Join(out, "linked")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // past the last look
	if _, _, unwritten, err := s.Room(); err != nil || unwritten != 1<<20 {
		t.Fatalf("unwritten %d (%v) with a link to an older file in the shard's directory, want 1MiB: the link is not the shard's writing", unwritten, err)
	}
	os.Remove(filepath.Join(out, "linked"))
	os.Remove(before)
	if _, err := s.Reserve(2 << 20); !errors.Is(err, staging.ErrNoSpace) || !strings.Contains(err.Error(), "other running shards hold 3.0MiB reserved (2.0MiB of it written)") {
		t.Fatalf("2MiB beside 1MiB unwritten and 2MiB free: %v, want ErrNoSpace naming what was written", err)
	}
	if s.Reserved() != 3<<20 {
		t.Fatalf("Reserved %d, want the whole 3MiB, written or not", s.Reserved())
	}
}

// fixtureStatFS types the probe fixture's mounts by statfs magic.
type fixtureStatFS struct{ root string }

func (f fixtureStatFS) Statfs(p string) (probe.Statfs, error) {
	magic := int64(0xEF53)
	if strings.HasPrefix(p, filepath.Join(f.root, "home")) {
		magic = 0x6969
	}
	return probe.Statfs{Type: magic, Bsize: 4096, Blocks: 100, Bavail: 100, Files: 10, Ffree: 10}, nil
}

func TestScratchThroughSymlinkOnNFSIsRefused(t *testing.T) {
	root, _ := filepath.Abs("../worker/probe/testdata/v2")
	pr, err := probe.New(probe.Config{Root: root, StatFS: fixtureStatFS{root}, PolicyPath: "/nonexistent"})
	if err != nil {
		t.Fatal(err)
	}
	// /data is a symlink to /home/alice/data, on NFS in the fixture's mountinfo.
	s, err := staging.New(staging.Config{Dir: "/data", Probe: pr})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Check(context.Background())
	if !errors.Is(err, staging.ErrNetworkScratch) || !strings.Contains(err.Error(), "nfs4") || !strings.Contains(err.Error(), "/home/alice/data") {
		t.Fatalf("got %v, want ErrNetworkScratch naming nfs4 and the resolved path", err)
	}
	if _, err := os.Stat("/data/cache"); err == nil {
		t.Fatal("Check created a directory before refusing")
	}
}

func TestPackRoundTrip(t *testing.T) {
	src := t.TempDir()
	var files []string
	for i := range 500 {
		files = append(files, testenv.RandomFile(t, src, fmt.Sprintf("f%03d.dat", i), 1+i*7))
	}
	pack := filepath.Join(t.TempDir(), "shard.tar")
	entries, err := staging.Pack(context.Background(), pack, files)
	if err != nil || len(entries) != 500 {
		t.Fatalf("pack: %d entries, %v", len(entries), err)
	}
	out := t.TempDir()
	paths, err := staging.Unpack(context.Background(), pack, out)
	if err != nil || len(paths) != 500 {
		t.Fatalf("unpack: %d files, %v", len(paths), err)
	}
	for i, p := range paths {
		a, _ := os.ReadFile(files[i])
		b, _ := os.ReadFile(p)
		if string(a) != string(b) {
			t.Fatalf("%s differs after the round trip", p)
		}
	}
	// A damaged pack is refused.
	f, _ := os.OpenFile(pack, os.O_WRONLY, 0)
	info, _ := f.Stat()
	f.WriteAt([]byte("XXXX"), info.Size()/2)
	f.Close()
	if _, err := staging.Unpack(context.Background(), pack, t.TempDir()); !errors.Is(err, staging.ErrMismatch) {
		t.Fatalf("damaged pack: got %v, want ErrMismatch", err)
	}
}

// TestRewrittenInputGetsANewPack: a shard's pack is made once and found
// again while its inputs stay as they were; an input rewritten since (a
// corpus regenerated between submissions) gets a pack of its own, made
// from what the input holds now, never the stale one.
func TestRewrittenInputGetsANewPack(t *testing.T) {
	ctx := context.Background()
	src, packs := t.TempDir(), t.TempDir()
	var files []string
	for i := range staging.PackMinFiles {
		p := filepath.Join(src, fmt.Sprintf("f%03d.txt", i))
		if err := os.WriteFile(p, []byte(fmt.Sprintf("old %d\n", i)), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	h := staging.LoadHashes("")
	first, err := staging.DescribeShard(ctx, h, nil, packs, "s1", files, 2048)
	if err != nil || !staging.Packed(first) {
		t.Fatalf("describe: %+v %v, want one pack", first, err)
	}
	again, err := staging.DescribeShard(ctx, h, nil, packs, "s1", files, 2048)
	if err != nil || again[0].Path != first[0].Path || again[0].XXH64 != first[0].XXH64 {
		t.Fatalf("unchanged inputs: %+v %v, want the pack %s found again", again, err, first[0].Path)
	}
	if err := os.WriteFile(files[7], []byte("new 7, longer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	os.Chtimes(files[7], later, later)
	fresh, err := staging.DescribeShard(ctx, h, nil, packs, "s1", files, 2048)
	if err != nil || !staging.Packed(fresh) || fresh[0].Path == first[0].Path {
		t.Fatalf("after a rewrite: %+v %v, want a pack other than %s", fresh, err, first[0].Path)
	}
	paths, err := staging.Unpack(ctx, fresh[0].Path, t.TempDir())
	if err != nil || len(paths) != len(files) {
		t.Fatalf("unpack: %d files, %v", len(paths), err)
	}
	if b, _ := os.ReadFile(paths[7]); string(b) != "new 7, longer\n" {
		t.Fatalf("the new pack holds %q for the rewritten input", b)
	}
	left, _ := filepath.Glob(filepath.Join(packs, "*.part"))
	if len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
	// A pack directory that cannot be written: each input is described.
	ro := filepath.Join(t.TempDir(), "file-not-dir")
	os.WriteFile(ro, nil, 0o644)
	loose, err := staging.DescribeShard(ctx, h, nil, filepath.Join(ro, "packs"), "s1", files, 2048)
	if err != nil || len(loose) != len(files) || staging.Packed(loose) {
		t.Fatalf("unwritable pack directory: %d files, packed %v, %v; want each input described", len(loose), staging.Packed(loose), err)
	}
	// Fewer inputs than a pack is for: each is described as itself.
	each, err := staging.DescribeShard(ctx, h, nil, packs, "s2", files[:3], 30)
	if err != nil || len(each) != 3 || staging.Packed(each) || each[2].Path != files[2] {
		t.Fatalf("three inputs: %+v %v, want each described", each, err)
	}
}

// TestPackingFollowsLocality: by default a shard of many small inputs is
// packed only where an input is on storage not known to be local (a pack
// from a local disk costs more than it saves); `pack = true` packs it
// wherever its inputs are, `pack = false` never. This host's own probe
// finds a test's temporary directory local.
func TestPackingFollowsLocality(t *testing.T) {
	ctx := context.Background()
	src, nfs := t.TempDir(), t.TempDir()
	var files []string
	for i := range staging.PackMinFiles {
		dir := src
		if i == staging.PackMinFiles-1 {
			dir = nfs // one input elsewhere is enough
		}
		p := filepath.Join(dir, fmt.Sprintf("f%03d.txt", i))
		if err := os.WriteFile(p, []byte("x\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	yes, no := true, false
	probed := 0
	where := func(loc string) func(context.Context, string) string {
		return func(_ context.Context, dir string) string {
			probed++
			if dir == nfs {
				return loc
			}
			return probe.Local
		}
	}
	h := staging.LoadHashes("")
	for _, c := range []struct {
		name   string
		pack   *bool
		loc    string // of the nfs directory
		packed bool
	}{
		{"auto, network", nil, probe.Network, true},
		{"auto, unknown", nil, probe.Unsure, true},
		{"auto, local", nil, probe.Local, false},
		{"true, local", &yes, probe.Local, true},
		{"false, network", &no, probe.Network, false},
	} {
		p := staging.NewPacking(c.pack)
		p.Locality = where(c.loc)
		probed = 0
		for id := range 3 {
			got, err := staging.DescribeShard(ctx, h, p, t.TempDir(), fmt.Sprint("s", id), files, 512)
			if err != nil || staging.Packed(got) != c.packed || (!c.packed && len(got) != len(files)) {
				t.Fatalf("%s: %d file(s), packed %v, %v; want packed %v", c.name, len(got), staging.Packed(got), err, c.packed)
			}
		}
		if c.pack == nil && probed != 2 {
			t.Errorf("%s: %d locality probes for 3 shards in 2 directories, want each directory probed once", c.name, probed)
		}
	}
	got, err := staging.DescribeShard(ctx, h, staging.NewPacking(nil), t.TempDir(), "real", files, 512)
	if err != nil || staging.Packed(got) {
		t.Fatalf("inputs in this host's temporary directories: packed %v, %v; want each input described (local)", staging.Packed(got), err)
	}
}

// TestStageCommandStagesWhatWorkersUse: `shardpool stage` stages what the
// run's workers will look for: the pack of a shard of many small inputs
// (made if submit has not made it), each input of a shard with a few,
// and nothing of a class that reads its inputs in place. A spec that
// stages nothing is an error that says how to turn staging on.
func TestStageCommandStagesWhatWorkersUse(t *testing.T) {
	src := t.TempDir()
	var many []string
	for i := range staging.PackMinFiles {
		many = append(many, filepath.Base(testenv.RandomFile(t, src, fmt.Sprintf("m%03d.txt", i), 100)))
	}
	testenv.RandomFile(t, src, "one.bin", 1000)
	testenv.RandomFile(t, src, "here.bin", 1000)
	manyJSON, _ := json.Marshal(many)
	man := `{"id":"many","inputs":` + string(manyJSON) + "}\n" +
		`{"id":"one","inputs":["one.bin"]}` + "\n" +
		`{"id":"here","class":"local","inputs":["here.bin"]}` + "\n"
	os.WriteFile(filepath.Join(src, "manifest.jsonl"), []byte(man), 0o644)
	spec := "name = \"st\"\nmanifest = \"manifest.jsonl\"\noutput = \"out\"\ncommand = [\"true\"]\ncode_rev = \"x\"\nstage = true\npack = true\n[class.cpu]\n[class.local]\nstage = false\n"
	os.WriteFile(filepath.Join(src, "shardpool.toml"), []byte(spec), 0o644)
	scratch := t.TempDir()
	p := testenv.Start(t, "stage", "--scratch", scratch, "--data", t.TempDir(), "--json", filepath.Join(src, "shardpool.toml"))
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("stage: exit %d\n%s", code, p.Output())
	}
	var rep struct {
		Shards, Skipped int
		Total           staging.Stats
	}
	if err := json.Unmarshal([]byte(p.Output()), &rep); err != nil {
		t.Fatalf("%v\n%s", err, p.Output())
	}
	if rep.Shards != 2 || rep.Skipped != 1 || rep.Total.Files != 2 {
		t.Fatalf("staged %d shard(s), %d file(s), skipped %d; want 2 shards as 2 files (the pack and one.bin), 1 skipped", rep.Shards, rep.Total.Files, rep.Skipped)
	}
	packs, _ := filepath.Glob(filepath.Join(src, "out", ".shardpool", "packs", "many-*.tar"))
	cached, _ := filepath.Glob(filepath.Join(scratch, "cache", "*-many-*.tar"))
	if len(packs) != 1 || len(cached) != 1 {
		t.Fatalf("packs %v, staged packs %v: want the shard's pack made and staged", packs, cached)
	}
	if here, _ := filepath.Glob(filepath.Join(scratch, "cache", "*here.bin")); len(here) != 0 {
		t.Fatalf("staged %v, of a class that reads in place", here)
	}

	// Without pack = true, inputs on a local disk are staged one by one.
	os.WriteFile(filepath.Join(src, "shardpool.toml"), []byte(strings.Replace(spec, "pack = true\n", "", 1)), 0o644)
	p = testenv.Start(t, "stage", "--scratch", t.TempDir(), "--data", t.TempDir(), "--json", filepath.Join(src, "shardpool.toml"))
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("stage: exit %d\n%s", code, p.Output())
	}
	if err := json.Unmarshal([]byte(p.Output()), &rep); err != nil || rep.Total.Files != staging.PackMinFiles+1 {
		t.Fatalf("local inputs, no pack = true: %d file(s) staged (%v), want %d, each input\n%s", rep.Total.Files, err, staging.PackMinFiles+1, p.Output())
	}

	os.WriteFile(filepath.Join(src, "shardpool.toml"), []byte(strings.Replace(spec, "stage = true\n", "", 1)), 0o644)
	unmade := filepath.Join(t.TempDir(), "scratch")
	p = testenv.Start(t, "stage", "--scratch", unmade, "--data", t.TempDir(), filepath.Join(src, "shardpool.toml"))
	if code := p.Wait(t, 60*time.Second); code != 1 || !strings.Contains(p.Output(), "nothing to stage") || !strings.Contains(p.Output(), "set stage = true") {
		t.Fatalf("a spec that stages nothing: exit %d\n%s\nwant 1, saying how to stage", code, p.Output())
	}
	// Refused before anything is made.
	if _, err := os.Stat(unmade); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused stage left its scratch directory: %v", err)
	}
}

// TestInterruptedCopyResumes SIGKILLs `shardpool stage` mid-file and checks
// that the next run keeps the verified prefix of the .part.
func TestInterruptedCopyResumes(t *testing.T) {
	src := t.TempDir()
	testenv.RandomFile(t, src, "big.bin", 5*staging.ChunkSize+999)
	os.WriteFile(filepath.Join(src, "manifest.jsonl"), []byte(`{"id":"a","inputs":["big.bin"]}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(src, "shardpool.toml"), []byte("name = \"st\"\nmanifest = \"manifest.jsonl\"\noutput = \"out\"\ncommand = [\"true\"]\ncode_rev = \"x\"\nstage = true\n"), 0o644)
	scratch, data := t.TempDir(), t.TempDir()
	args := []string{"stage", "--scratch", scratch, "--data", data, "--json", filepath.Join(src, "shardpool.toml")}
	p := testenv.Start(t, append(args[:1:1], append([]string{"--stage-bwlimit", "16MiB"}, args[1:]...)...)...)
	// At 16 MiB/s, two 8 MiB chunks are in the .part after about a second.
	testenv.Eventually(t, 20*time.Second, func() (bool, string) {
		matches, _ := filepath.Glob(filepath.Join(scratch, "cache", "*", "*.part"))
		if len(matches) == 0 {
			return false, "no .part yet"
		}
		info, err := os.Stat(matches[0])
		return err == nil && info.Size() > 2*staging.ChunkSize+staging.ChunkSize/2, "part too small"
	})
	p.Signal(syscall.SIGKILL)
	p.Wait(t, 10*time.Second)
	p = testenv.Start(t, args...)
	if code := p.Wait(t, 60*time.Second); code != 0 {
		t.Fatalf("second stage: exit %d\n%s", code, p.Output())
	}
	var rep struct {
		Total staging.Stats `json:"total"`
	}
	if err := json.Unmarshal([]byte(p.Output()), &rep); err != nil {
		t.Fatalf("%v\n%s", err, p.Output())
	}
	if rep.Total.Resumed < 2*staging.ChunkSize || rep.Total.Copied+rep.Total.Resumed != 5*staging.ChunkSize+999 {
		t.Fatalf("resume: kept %d bytes and copied %d, want at least 2 chunks kept and the rest copied", rep.Total.Resumed, rep.Total.Copied)
	}
}

// TestUnchangedCopyIsNotReadAgain: a staged copy verified in full is reused
// without reading it again while it is unchanged (a large input shared by
// every shard is read once, not once per shard); any write to it is seen
// and the copy is verified, found damaged and fetched again.
func TestUnchangedCopyIsNotReadAgain(t *testing.T) {
	src := t.TempDir()
	a := testenv.RandomFile(t, src, "a.bin", 2*staging.ChunkSize+11)
	s := newStager(t, staging.Config{CacheBytes: 1 << 30})
	files := describe(t, a)
	stage := func() staging.Stats {
		t.Helper()
		st, err := s.Stage(context.Background(), files, 0)
		if err != nil {
			t.Fatal(err)
		}
		st.Release()
		return st.Stats
	}
	if got := stage(); got.Copied != files[0].Size {
		t.Fatalf("first stage: %+v, want a copy", got)
	}
	// A copy changed less than a second before it was verified could change
	// again unseen within one tick of the file system's clock: its identity
	// is trusted only once it is older than that.
	time.Sleep(1100 * time.Millisecond)
	if got := stage(); got.Reused != 1 || got.VerifySeconds == 0 {
		t.Fatalf("second stage: %+v, want a reuse verified in full", got)
	}
	if got := stage(); got.Reused != 1 || got.VerifySeconds != 0 || got.Copied != 0 {
		t.Fatalf("third stage: %+v, want a reuse without reading the copy", got)
	}
	st, err := s.Stage(context.Background(), files, 0)
	if err != nil {
		t.Fatal(err)
	}
	flipByte(t, st.Paths[0], 5)
	st.Release()
	if got := stage(); got.Copied != files[0].Size || got.Reused != 0 {
		t.Fatalf("after a write to the copy: %+v, want it fetched again", got)
	}
}

// flipByte changes the byte at off in path for sure: test files are
// random, so writing a fixed value would leave it as it was once in 256.
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{^b[0]}, off); err != nil {
		t.Fatal(err)
	}
}

// A worker counts a staged shard as holding its reservation from the
// moment it has one (StageHeld's hold), and stops before the reservation
// is released where staging fails: at no moment may the shard count
// neither as fetched without room nor by its reservation. InputNeed is
// what the reservation holds for the inputs: nothing for those staged.
func TestStageHeldCountsFromItsReservation(t *testing.T) {
	dir := t.TempDir()
	s := newStager(t, staging.Config{Dir: dir})
	in := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(in, make([]byte, 3<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	files := describe(t, in)
	if n := s.InputNeed(files); n != 3<<20 {
		t.Fatalf("InputNeed %d before staging, want 3MiB", n)
	}
	held, unheld := 0, 0
	hold := func() func() {
		held++
		_, _, unwritten, err := s.Room()
		if err != nil || unwritten != 3<<20+1<<20 {
			t.Errorf("at the hold the ledger holds %d unwritten (%v), want the inputs and the declared 1MiB", unwritten, err)
		}
		if ents, _ := filepath.Glob(filepath.Join(dir, "cache", "*", "*")); len(ents) > 0 {
			t.Errorf("at the hold the copy has begun: %v", ents)
		}
		return func() {
			unheld++
			if _, _, unwritten, _ := s.Room(); unwritten == 0 {
				t.Error("unhold came after the reservation was released")
			}
		}
	}
	st, err := s.StageHeld(context.Background(), files, 1<<20, hold)
	if err != nil {
		t.Fatal(err)
	}
	if held != 1 || unheld != 0 {
		t.Fatalf("held %d, unheld %d after a staging that worked; want 1, 0 (the caller ends the hold)", held, unheld)
	}
	if n := s.InputNeed(files); n != 0 {
		t.Fatalf("InputNeed %d once staged, want 0", n)
	}
	st.Release()

	// The source changes after its description: staging fails after the
	// reservation, and the hold ends before the reservation does.
	other := filepath.Join(t.TempDir(), "other")
	if err := os.WriteFile(other, make([]byte, 2<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	changed := describe(t, other)
	if err := os.WriteFile(other, []byte(strings.Repeat("x", 2<<20)), 0o644); err != nil {
		t.Fatal(err)
	}
	held, unheld = 0, 0
	hold = func() func() {
		held++
		return func() {
			unheld++
			if _, _, unwritten, _ := s.Room(); unwritten != 2<<20 {
				t.Errorf("at the unhold the ledger holds %d unwritten, want the 2MiB reservation still", unwritten)
			}
		}
	}
	if _, err := s.StageHeld(context.Background(), changed, 0, hold); !errors.Is(err, staging.ErrMismatch) {
		t.Fatalf("staging a changed source: %v, want ErrMismatch", err)
	}
	if held != 1 || unheld != 1 {
		t.Fatalf("held %d, unheld %d after a failed staging; want 1, 1", held, unheld)
	}
	if _, _, unwritten, _ := s.Room(); unwritten != 0 {
		t.Fatalf("%d still reserved after a failed staging", unwritten)
	}
}

// What a copy in progress has written is gone from the free space as it
// writes it, so it leaves the shard's reservation as it goes: counted in
// both until the copy ended, a shard beside it waited for room there was
// (TestAdmissionCountsStagedInputs failed 3 runs in 10 that way).
func TestACopyInProgressIsNotCountedTwice(t *testing.T) {
	dir := t.TempDir()
	s := newStager(t, staging.Config{Dir: dir, BytesPerSec: 2 << 20})
	in := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(in, make([]byte, 4<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		st, err := s.Stage(context.Background(), describe(t, in), 0)
		if err == nil {
			st.Release()
		}
		done <- err
	}()
	var part int64
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		parts, _ := filepath.Glob(filepath.Join(dir, "cache", "*", "*.part"))
		if len(parts) == 1 {
			if fi, err := os.Stat(parts[0]); err == nil {
				part = fi.Size()
			}
		}
		return part >= 1<<20, fmt.Sprintf("the copy has written %d bytes, want 1MiB", part)
	})
	if _, _, unwritten, err := s.Room(); err != nil || unwritten > 4<<20-part {
		t.Errorf("with %d bytes of the 4MiB copy written, %d still counted as to be written (%v)", part, unwritten, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// What a copy writes between the ledger's two looks (the free space, and
// what the reservations have still to write) is not room. Looked at free
// space first, the bytes written next counted in neither, and a worker
// fetched a staged shard that then waited in its slot for the room
// (TestAdmissionCountsStagedInputs failed a CI run, and 1 run in 30
// here). Here the free-space look returns, then 2MiB is written into a
// 3MiB reservation: the room is the 10MiB less the whole 3MiB, not less
// 1MiB.
func TestBytesWrittenBetweenTheLooksAreNotRoom(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(t.TempDir(), "a.out")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	free, write := int64(10<<20), false
	s := newStager(t, staging.Config{Dir: dir, Free: func(string) (int64, error) {
		n := free
		if write {
			write = false
			if err := os.WriteFile(filepath.Join(out, "part"), make([]byte, 2<<20), 0o644); err != nil {
				t.Error(err)
			}
			free -= 2 << 20
		}
		return n, nil
	}})
	release, err := s.Reserve(3<<20, out)
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	write = true
	room, _, _, err := s.Room()
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(10<<20 - 3<<20); room > want {
		t.Errorf("room %s with 2MiB written between the looks, want at most %s: what was written counted in neither look",
			stream.FormatSize(room), stream.FormatSize(want))
	}
	// Reserve looks the same way.
	os.Remove(filepath.Join(out, "part"))
	free, write = 10<<20, true
	if second, err := s.Reserve(8 << 20); err == nil {
		second()
		t.Error("8MiB reserved beside a 3MiB reservation on 10MiB, 2MiB of it written between the looks (7MiB of room): want ErrNoSpace")
	} else if !errors.Is(err, staging.ErrNoSpace) {
		t.Fatal(err)
	}
}

// A bound below 1 MiB/s (a copy's read size) slows the copy to it.
// The limiter's burst is a second's worth: one wait for a whole 1 MiB
// read failed every copy ("exceeds limiter's burst").
func TestASlowBandwidthBoundCopiesAtItsRate(t *testing.T) {
	s := newStager(t, staging.Config{Dir: t.TempDir(), BytesPerSec: 256 << 10})
	in := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(in, make([]byte, 768<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	st, err := s.Stage(context.Background(), describe(t, in), 0)
	if err != nil {
		t.Fatalf("stage 768KiB under 256KiB/s: %v", err)
	}
	defer st.Release()
	// The first second's worth goes at once, the other 512KiB at the rate.
	if d := time.Since(t0); d < 1500*time.Millisecond {
		t.Fatalf("768KiB staged under 256KiB/s in %s, want 2s at the rate", d)
	}
	if st.Stats.Copied != 768<<10 {
		t.Fatalf("copied %d bytes, want %d", st.Stats.Copied, 768<<10)
	}
}

// TestWhatAnEarlierStagerLeftIsRoomForShards: staged files already in
// the cache when a stager begins (an earlier worker process's cache, a
// copy it was making when killed, inputs staged ahead) were unknown to
// it and stayed on the disk for good, whatever room shards needed. They
// are now known: left be by the cache bound (staged ahead, they are
// there to be used), removed when room is taken (DropIdle here), and,
// once a shard uses one, cached like any other.
func TestWhatAnEarlierStagerLeftIsRoomForShards(t *testing.T) {
	ctx := context.Background()
	dir, src := t.TempDir(), t.TempDir()
	write := func(name string, n int) string {
		p := filepath.Join(src, name)
		if err := os.WriteFile(p, bytes.Repeat([]byte(name), n), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	a, b, c := write("a", 1<<20), write("b", 1<<20), write("c", 1<<20)
	// The earlier process kept a and b (--stage-cache) and was killed
	// 4 KiB into its copy of c.
	first := newStager(t, staging.Config{Dir: dir, CacheBytes: 1 << 30})
	for _, in := range []string{a, b} {
		st, err := first.Stage(ctx, describe(t, in), 0)
		if err != nil {
			t.Fatal(err)
		}
		st.Release()
	}
	part := filepath.Join(dir, "cache", staging.Key(describe(t, c)[0]), "c.part")
	if err := os.MkdirAll(filepath.Dir(part), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(part, make([]byte, 4096), 0o644); err != nil {
		t.Fatal(err)
	}
	// A stager of another process that lives (two runs of one user share
	// the default scratch) holds the directory: what is there may be
	// its, and nothing is adopted.
	beside := newStager(t, staging.Config{Dir: dir})
	if freed := beside.DropIdle(); freed != 0 {
		t.Fatalf("a stager made beside a live one freed %d bytes of its files", freed)
	}
	beside.Close()
	first.Close() // the earlier process is gone
	left := func() []string {
		all, _ := filepath.Glob(filepath.Join(dir, "cache", "*", "*"))
		var got []string
		for _, p := range all {
			if name := filepath.Base(p); name != ".copy" { // the stagers' lock
				got = append(got, name)
			}
		}
		slices.Sort(got)
		return got
	}

	// The worker restarted with no cache: a shard of another input ends,
	// and what it found stays.
	s := newStager(t, staging.Config{Dir: dir})
	st, err := s.Stage(ctx, describe(t, write("d", 1024)), 0)
	if err != nil {
		t.Fatal(err)
	}
	st.Release()
	if got := left(); !slices.Equal(got, []string{"a", "b", "c.part"}) {
		t.Fatalf("after a shard under no cache: %v in the cache, want a, b and c.part kept (found there), d removed", got)
	}
	// A shard uses a: reused after verification, then removed with the
	// shard under no cache, as any input this stager staged.
	st, err = s.Stage(ctx, describe(t, a), 0)
	if err != nil || st.Stats.Reused != 1 || st.Stats.Copied != 0 {
		t.Fatalf("stage a again: %+v (%v), want it reused from the disk", st, err)
	}
	st.Release()
	if got := left(); !slices.Equal(got, []string{"b", "c.part"}) {
		t.Fatalf("after a shard used a: %v in the cache, want b and c.part", got)
	}
	// Room for shards removes the rest.
	if freed := s.DropIdle(); freed != 1<<20+4096 {
		t.Fatalf("DropIdle freed %d bytes, want %d (b and c.part)", freed, 1<<20+4096)
	}
	if got := left(); len(got) != 0 {
		t.Fatalf("after room was taken: %v still in the cache", got)
	}
}

// TestAnInterruptedCopyResumesWithoutACache: a copy that its shard's
// interruption cut short (ctx: the worker's stop, a lost lease, a halt)
// is kept under --stage-cache 0, and the shard's next staging resumes
// from its whole chunks; before, the shard's release removed it with
// the shard's other staged files and the next attempt copied it all.
func TestAnInterruptedCopyResumesWithoutACache(t *testing.T) {
	dir := t.TempDir()
	s := newStager(t, staging.Config{Dir: dir, BytesPerSec: 8 << 20})
	in := filepath.Join(t.TempDir(), "in")
	if err := os.WriteFile(in, bytes.Repeat([]byte("0123456789abcdef"), 20<<20/16), 0o644); err != nil {
		t.Fatal(err)
	}
	files := describe(t, in)
	part := filepath.Join(dir, "cache", staging.Key(files[0]), "in.part")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		st, err := s.Stage(ctx, files, 0)
		if err == nil {
			st.Release()
		}
		done <- err
	}()
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		fi, err := os.Stat(part)
		return err == nil && fi.Size() > staging.ChunkSize, fmt.Sprintf("the copy is at %v (%v), want past its first chunk", fi, err)
	})
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a staging cancelled halfway succeeded")
	}
	if fi, err := os.Stat(part); err != nil || fi.Size() < staging.ChunkSize {
		t.Fatalf("after the interruption the copy is %v (%v), want it kept", fi, err)
	}
	st, err := s.Stage(context.Background(), files, 0)
	if err != nil {
		t.Fatal(err)
	}
	st.Release()
	if st.Stats.Resumed < staging.ChunkSize || st.Stats.Copied+st.Stats.Resumed != 20<<20 {
		t.Fatalf("staged again: %d bytes resumed, %d copied; want at least its first chunk resumed", st.Stats.Resumed, st.Stats.Copied)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "cache", "*", "*")); len(left) != 0 {
		t.Fatalf("after the shard, under no cache: %v left", left)
	}
}

// TestTwoProcessesShareOneCache: two stagers of one cache directory (two
// `shardpool run`s of one user share their default scratch) staging the
// same input at once: one copies it, the other waits and reuses it, and
// the first one's release leaves the file the second still uses. Before,
// both copied into one .part (one rename failed) and the first release
// removed the input under the other's command: every shard of both runs
// failed. (flock locks belong to open files, so two stagers of one
// process hold them apart as two processes would.)
func TestTwoProcessesShareOneCache(t *testing.T) {
	dir := t.TempDir()
	a := newStager(t, staging.Config{Dir: dir, BytesPerSec: 16 << 20})
	b := newStager(t, staging.Config{Dir: dir, BytesPerSec: 16 << 20})
	in := testenv.RandomFile(t, t.TempDir(), "in.bin", 6<<20)
	files := describe(t, in)
	got := make([]*staging.Staged, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i, s := range []*staging.Stager{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = s.Stage(context.Background(), files, 0)
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("staging the same input at once: %v, %v", errs[0], errs[1])
	}
	if c := got[0].Stats.Copied + got[1].Stats.Copied; c != 6<<20 || got[0].Stats.Reused+got[1].Stats.Reused != 1 {
		t.Fatalf("copied %d bytes, reused %d times; want one copy, reused by the other", c, got[0].Stats.Reused+got[1].Stats.Reused)
	}
	path := got[1].Paths[0]
	got[0].Release() // the first shard ends; the other still reads its input
	if err := staging.VerifyFile(path, files[0]); err != nil {
		t.Fatalf("the input the second stager uses, after the first let go of it: %v", err)
	}
	got[1].Release()
	if _, err := os.Stat(filepath.Dir(path)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("after both let go, under no cache: %v, want the entry removed", err)
	}
}

// TestAShardOfManyInputsHoldsNoFilePerInput: the inputs a shard uses are
// held against other processes' removal through one open file, not one
// for each: a shard of 20,000 small inputs failed with "too many open
// files" (make bench's staging of small files). Here 1,000 inputs under
// a limit of 256 open files; a second stager of the same directory that
// stages and lets go of the same inputs still removes none of them while
// the first one's shard uses them, and removes them all once it let go.
func TestAShardOfManyInputsHoldsNoFilePerInput(t *testing.T) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	low := lim
	low.Cur = 256
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim) })
	src := t.TempDir()
	var paths []string
	for i := range 1000 {
		p := filepath.Join(src, fmt.Sprintf("f%04d.txt", i))
		if err := os.WriteFile(p, []byte(fmt.Sprintf("input %d\n", i)), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, p)
	}
	files := describe(t, paths...)
	dir := t.TempDir()
	a := newStager(t, staging.Config{Dir: dir, Concurrency: 8})
	st, err := a.Stage(context.Background(), files, 0)
	if err != nil {
		t.Fatalf("staging 1,000 inputs under a limit of 256 open files: %v", err)
	}
	b := newStager(t, staging.Config{Dir: dir, Concurrency: 8})
	other, err := b.Stage(context.Background(), files, 0)
	if err != nil {
		t.Fatal(err)
	}
	if other.Stats.Reused != len(files) {
		t.Fatalf("the second stager reused %d of %d inputs, want all", other.Stats.Reused, len(files))
	}
	other.Release() // under no cache: it would remove them
	for i, p := range st.Paths {
		if err := staging.VerifyFile(p, files[i]); err != nil {
			t.Fatalf("input %d, in use by the first stager's shard, after the second let go of it: %v", i, err)
		}
	}
	st.Release()
	left, _ := os.ReadDir(filepath.Join(dir, "cache"))
	if len(left) != 0 {
		t.Fatalf("after both let go, under no cache: %d entries left, want none", len(left))
	}
}

// TestCopiesAreBoundedForTheHost: stagers that share a host directory
// (two `shardpool run`s, a worker and `shardpool stage`) share the
// host's copy slots: with one slot, a second stager's copy waits for the
// first's to end. Each stager kept its own bound until the sixty-eighth
// session, so two processes made twice the copies the user allowed.
// The first copy lasts 3s at least (4MiB at 1MiB/s, 1MiB at once): the
// second, 1MiB, would be done in a moment beside it.
func TestCopiesAreBoundedForTheHost(t *testing.T) {
	host := t.TempDir()
	dirA := t.TempDir()
	a := newStager(t, staging.Config{Dir: dirA, HostDir: host, Concurrency: 1, BytesPerSec: 1 << 20})
	b := newStager(t, staging.Config{HostDir: host, Concurrency: 1, BytesPerSec: 1 << 20})
	defer a.Close()
	defer b.Close()
	big := describe(t, testenv.RandomFile(t, t.TempDir(), "big.bin", 4<<20))
	small := describe(t, testenv.RandomFile(t, t.TempDir(), "small.bin", 1<<20))
	type done struct {
		at  time.Time
		err error
	}
	stage := func(s *staging.Stager, files []stream.InputFile, ch chan<- done) {
		st, err := s.Stage(context.Background(), files, 0)
		if err == nil {
			st.Release()
		}
		ch <- done{time.Now(), err}
	}
	aDone, bDone := make(chan done, 1), make(chan done, 1)
	go stage(a, big, aDone)
	testenv.Eventually(t, 10*time.Second, func() (bool, string) {
		parts, _ := filepath.Glob(filepath.Join(dirA, "cache", "*", "*.part"))
		return len(parts) == 1, "the first stager's copy has not begun"
	})
	go stage(b, small, bDone)
	ra, rb := <-aDone, <-bDone
	if ra.err != nil || rb.err != nil {
		t.Fatalf("staging: %v, %v", ra.err, rb.err)
	}
	if rb.at.Before(ra.at) {
		t.Fatalf("the second stager's copy ended %s before the first's, with one copy allowed on the host: it did not wait for the slot",
			ra.at.Sub(rb.at).Round(time.Millisecond))
	}
}

// TestBandwidthIsSharedForTheHost: stagers that share a host directory
// copy within one BytesPerSec together. Two copies of 3MiB under 1MiB/s
// each took 2s alone (1MiB at once, the rest at the rate); together,
// 6MiB under 1MiB/s for the host take 4s less what the two buckets held
// when they began.
func TestBandwidthIsSharedForTheHost(t *testing.T) {
	host := t.TempDir()
	a := newStager(t, staging.Config{HostDir: host, BytesPerSec: 1 << 20})
	b := newStager(t, staging.Config{HostDir: host, BytesPerSec: 1 << 20})
	defer a.Close()
	defer b.Close()
	dir := t.TempDir()
	files := [][]stream.InputFile{describe(t, testenv.RandomFile(t, dir, "a.bin", 3<<20)), describe(t, testenv.RandomFile(t, dir, "b.bin", 3<<20))}
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, s := range []*staging.Stager{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := s.Stage(context.Background(), files[i], 0)
			if err == nil {
				st.Release()
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("staging: %v, %v", errs[0], errs[1])
	}
	if d := time.Since(t0); d < 3*time.Second {
		t.Fatalf("two stagers of one host, 1MiB/s each, copied 6MiB in %s: at 1MiB/s for the host that takes more than 3s", d.Round(time.Millisecond))
	}
}
