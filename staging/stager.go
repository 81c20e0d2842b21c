package staging

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/time/rate"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// Config configures a Stager. Zero values mean the documented default.
type Config struct {
	// Dir is the local scratch directory; staged files live in Dir/cache.
	// Required.
	Dir string
	// Concurrency bounds simultaneous file copies on this host: of this
	// stager, and of all the stagers that share HostDir. Default 2.
	Concurrency int
	// BytesPerSec bounds the copy rate of this host (all copies together,
	// of every stager that shares HostDir); 0 means unbounded.
	BytesPerSec int64
	// HostDir is where the stagers of one user on this host share their
	// bounds (host.go); a local directory of this user's. Default Dir.
	HostDir string
	// Retries is how many times a file is fetched again after a checksum
	// mismatch before the shard fails. Default 2.
	Retries int
	// CacheBytes is how many bytes of staged files no running shard uses
	// are kept for later shards. Default 0: removed at release.
	CacheBytes int64
	// Fleet, when set, also bounds copies across every host.
	Fleet *Fleet
	// Probe decides whether Dir is local storage. Default: the real host.
	Probe *probe.Prober
	// Free reports the bytes available at Dir. Default: statfs.
	Free func(dir string) (int64, error)
	// Logger receives structured logs; default discards.
	Logger *slog.Logger
}

// Stager stages inputs for the shards of one host.
type Stager struct {
	cfg     Config
	sem     chan struct{}
	limiter *rate.Limiter
	log     *slog.Logger
	host    *hostCopies // the host's copy slots, shared with other stagers

	// sharedAt is when the limiter's rate was last set from the host's
	// copies (reshare).
	shareMu  sync.Mutex
	sharedAt time.Time

	mu      sync.Mutex
	claims  map[*claim]bool   // the shards' reservations
	entries map[string]*entry // by cache key
	// lock is <Dir>/.lock, held shared while the stager lives (Close):
	// a stager made while another process's holds it (two `shardpool
	// run`s of one user share their default scratch) adopts nothing.
	lock *os.File
	// uses hold the entries this stager's shards use (shared.go).
	uses *useLocks
}

// claim is one shard's reservation: n bytes of the file system, held
// from before the shard writes until it ends. What the shard has written
// in its directories (dirs: its {out}, {scratch}, unpacked inputs) is
// gone from the free space already, so it no longer counts as reserved:
// counted in both, a shard that had written most of its room kept a
// shard beside it waiting for room that was there.
type claim struct {
	n    int64
	dirs []string
	used int64     // in dirs at the last look
	at   time.Time // of the last look
}

// usageEvery is how long a look at a claim's directories stands.
const usageEvery = time.Second

// usageEntries bounds the entries a look at a claim's directories counts:
// a tree larger than that counts for what was seen, which errs toward
// waiting.
const usageEntries = 10000

// unwritten is what of the claim is still to be written, under mu.
func (c *claim) unwritten() int64 {
	if len(c.dirs) > 0 && time.Since(c.at) >= usageEvery {
		c.used, c.at = dirUsage(c.dirs), time.Now()
	}
	return max(c.n-c.used, 0)
}

// dirUsage is the space the files under dirs take on the disk. A file
// with more than one link is not counted: it may be a link to what was
// there before (a staged input, another shard's file), which took no
// room from the reservation.
func dirUsage(dirs []string) int64 {
	var n int64
	seen := 0
	for _, d := range dirs {
		filepath.WalkDir(d, func(_ string, e fs.DirEntry, err error) error {
			if err != nil {
				return nil // not made yet, or removed meanwhile
			}
			if seen++; seen > usageEntries {
				return fs.SkipAll
			}
			if !e.Type().IsRegular() {
				return nil
			}
			fi, err := e.Info()
			if err != nil {
				return nil
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				if st.Nlink == 1 {
					n += st.Blocks * 512
				}
			} else {
				n += fi.Size()
			}
			return nil
		})
	}
	return n
}

// claimLocked reserves n bytes for a shard writing in dirs, under mu.
func (s *Stager) claimLocked(n int64, dirs []string) *claim {
	c := &claim{n: n, dirs: dirs}
	if s.claims == nil {
		s.claims = map[*claim]bool{}
	}
	s.claims[c] = true
	return c
}

// unclaimLocked releases c, under mu.
func (s *Stager) unclaimLocked(c *claim) {
	delete(s.claims, c)
}

// reservedLocked is what the claims hold, written or not, under mu.
func (s *Stager) reservedLocked() int64 {
	var n int64
	for c := range s.claims {
		n += c.n
	}
	return n
}

// unwrittenLocked is what the claims hold still to be written, under mu.
func (s *Stager) unwrittenLocked() int64 {
	var n int64
	for c := range s.claims {
		n += c.unwritten()
	}
	return n
}

type entry struct {
	mu       sync.Mutex // held while the file is verified or copied
	path     string
	size     int64
	refs     int
	lastUsed time.Time
	ready    bool
	// seen is the copy's identity when it was last verified in full, if it
	// had not been changed just before (see unchanged).
	seen fileID
	// found: on the disk when this stager began (adopt), not used by a
	// shard of it since: staged ahead (shardpool stage), or left by an
	// earlier process of the worker (its cache, a copy it was making
	// when killed). The cache bound leaves it be, as it did before it
	// was known; room taken for a shard removes it (freeUpLocked).
	found bool
}

// fileID is what any change to a file's content moves: a write or a
// truncate moves its ctime (which no user can set back), a replacement its
// inode.
type fileID struct {
	dev, ino     uint64
	size         int64
	mtime, ctime int64 // ns
}

func statID(p string) (fileID, bool) {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, size: st.Size, mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano()}, true
}

// racyWindow: a file changed this shortly before it was verified may be
// changed again within the same tick of the file system's clock without
// its times moving, so its identity is not trusted (git's "racily clean").
const racyWindow = time.Second

// New validates cfg; it does no I/O (call Check before staging).
func New(cfg Config) (*Stager, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("%w: Dir is required", ErrConfig)
	}
	abs, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("%w: Dir: %v", ErrConfig, err)
	}
	cfg.Dir = abs
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 2
	}
	if cfg.BytesPerSec < 0 || cfg.Retries < 0 || cfg.CacheBytes < 0 {
		return nil, fmt.Errorf("%w: BytesPerSec, Retries and CacheBytes cannot be negative", ErrConfig)
	}
	if cfg.Retries == 0 {
		cfg.Retries = 2
	}
	if cfg.Free == nil {
		cfg.Free = probe.FreeBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HostDir == "" {
		cfg.HostDir = cfg.Dir
	}
	s := &Stager{cfg: cfg, sem: make(chan struct{}, cfg.Concurrency), log: cfg.Logger.With("component", "staging"), entries: map[string]*entry{},
		uses: &useLocks{path: filepath.Join(cfg.Dir, useLockName), held: map[string]*useRef{}}, host: newHostCopies(cfg.HostDir, cfg.Concurrency)}
	if cfg.BytesPerSec > 0 {
		s.limiter = rate.NewLimiter(rate.Limit(cfg.BytesPerSec), int(min(cfg.BytesPerSec, 1<<20)))
	}
	if alone := s.lockDir(); alone {
		s.adopt()
	}
	return s, nil
}

// lockDir takes <Dir>/.lock shared for the stager's life, and reports
// whether no other process's stager held it (an exclusive lock taken
// first, then made shared): only then are the files in the cache
// nobody's (adopt). Where the lock cannot be had, nothing is adopted.
func (s *Stager) lockDir() (alone bool) {
	if err := os.MkdirAll(s.cfg.Dir, 0o755); err != nil {
		return false
	}
	f, err := os.OpenFile(filepath.Join(s.cfg.Dir, ".lock"), os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return false
	}
	alone = checkpoint.Flock(f, syscall.LOCK_EX|syscall.LOCK_NB) == nil
	if checkpoint.Flock(f, syscall.LOCK_SH) != nil {
		f.Close()
		return false
	}
	s.lock = f
	return alone
}

// Close lets go of the stager's directory (lockDir): a stager made
// after it may adopt what this one left. Its files stay.
func (s *Stager) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lock != nil {
		s.lock.Close()
		s.lock = nil
	}
	s.uses.close()
	s.host.close()
}

// throttle waits until n more bytes may be copied under BytesPerSec.
// It waits in pieces of at most the limiter's burst (a second's worth,
// at most 1 MiB): one wait for a whole read of 1 MiB failed every copy
// under a bound below 1 MiB/s ("exceeds limiter's burst").
func (s *Stager) throttle(ctx context.Context, n int) error {
	if s.limiter == nil {
		return nil
	}
	s.reshare(false)
	for n > 0 {
		k := min(n, s.limiter.Burst())
		if err := s.limiter.WaitN(ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// reshare sets the limiter's rate to BytesPerSec times this stager's
// share of the copies under way on the host: at once where now, else
// at most every shareEvery.
func (s *Stager) reshare(now bool) {
	if s.limiter == nil {
		return
	}
	s.shareMu.Lock()
	if !now && time.Since(s.sharedAt) < shareEvery {
		s.shareMu.Unlock()
		return
	}
	s.sharedAt = time.Now()
	s.shareMu.Unlock()
	s.limiter.SetLimit(rate.Limit(float64(s.cfg.BytesPerSec) * s.host.share()))
}

// Reserved is the scratch space the shards staging, staged or holding
// room (Reserve) now hold: inputs not yet copied, declared scratch,
// whether they have written in it yet or not.
func (s *Stager) Reserved() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reservedLocked()
}

// reserveLocked claims need for a shard writing in dirs, under mu, where
// the file system has room for it beside what the others' claims hold
// still to be written, removing idle staged inputs (least recently used
// first) to make it. It returns the claim, nil where even then there is
// not enough, and the free space it counted. The inputs in keep (the
// shard's own, already staged, which need counts as no copy) are not
// removed: removed, they would be copied again outside the reservation.
func (s *Stager) reserveLocked(need int64, keep map[string]bool, dirs []string) (c *claim, free int64, err error) {
	// The free space is measured now: what the claims have written is
	// looked at now too, not up to usageEvery ago (a copy may have
	// written megabytes since, and would count in both).
	for c := range s.claims {
		c.at = time.Time{}
	}
	held, free, err := s.lookLocked()
	if err != nil {
		return nil, 0, err
	}
	if need > free-held {
		free += s.freeUpLocked(need-(free-held), keep)
	}
	if need > free-held {
		return nil, free, nil
	}
	return s.claimLocked(need, dirs), free, nil
}

// Room is what a new reservation could hold now, by Reserve's own
// arithmetic: the free space of Dir's file system less what the
// reservations hold still to be written, plus the idle verified staged
// inputs that Reserve would remove to make room (it removes partial
// copies too; they are not counted here). free and unwritten are its
// parts, for a message.
func (s *Stager) Room() (room, free, unwritten int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	unwritten, free, err = s.lookLocked()
	if err != nil {
		return 0, 0, 0, err
	}
	room = free - unwritten
	for _, x := range s.idleLocked() {
		if x.e.ready {
			room += x.e.size
		}
	}
	return room, free, unwritten, nil
}

// lookLocked is what the claims have still to be written and the free
// space, under mu, looked at in that order: what a copy writes between
// the two looks then counts in both, which errs toward waiting. Looked
// at the other way round, it counted in neither, and admission saw room
// for a shard that the copies in flight were taking (a staged shard was
// fetched to wait in its slot).
func (s *Stager) lookLocked() (unwritten, free int64, err error) {
	unwritten = s.unwrittenLocked()
	free, err = s.free()
	return unwritten, free, err
}

// free is the room on Dir's file system, measured at Dir or, before
// Check made it, at its parent (the worker's scratch directory).
func (s *Stager) free() (int64, error) {
	n, err := s.cfg.Free(s.cfg.Dir)
	if errors.Is(err, fs.ErrNotExist) {
		n, err = s.cfg.Free(filepath.Dir(s.cfg.Dir))
	}
	if err != nil {
		return 0, fmt.Errorf("free space of %s: %w", s.cfg.Dir, err)
	}
	return n, nil
}

// Reserve holds need bytes of the scratch file system for a shard that
// stages nothing (its class's declared scratch) until release, in the
// same reservations as staged shards, and removes idle staged inputs to
// make room as Stage does. What the shard writes in dirs leaves the
// reservation (claim). It needs no Check: it copies nothing. Where
// there is not room, the error (ErrNoSpace) has the numbers, and Held
// says whether other shards' reservations hold it.
func (s *Stager) Reserve(need int64, dirs ...string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, free, err := s.reserveLocked(need, nil, dirs)
	if err != nil {
		return nil, err
	}
	if c == nil {
		return nil, s.noSpace(need, free, nil, fmt.Errorf("%w: the shard's class declares %s of scratch, %s is free on the file system of %s, %s",
			ErrNoSpace, stream.FormatSize(need), stream.FormatSize(free), s.cfg.Dir, s.othersLocked(nil)))
	}
	return func() {
		s.mu.Lock()
		s.unclaimLocked(c)
		s.mu.Unlock()
	}, nil
}

// noSpace marks err, under mu, as room other shards hold (Held) where
// need fits once they end: their reservations are released and the
// inputs they use can be removed then, but for those in keep (the
// shard's own: they stay for it). free already lacks what they wrote,
// so that is counted once, not subtracted twice.
func (s *Stager) noSpace(need, free int64, keep map[string]bool, err error) error {
	if need <= free+s.heldLocked(keep) {
		return heldError{err}
	}
	return err
}

// heldLocked is the room running shards hold, under mu: their
// reservations and the staged inputs they use, but for those in keep.
func (s *Stager) heldLocked(keep map[string]bool) int64 {
	n := s.reservedLocked()
	for k, e := range s.entries {
		if e.refs > 0 && e.ready && !keep[k] {
			n += e.size
		}
	}
	return n
}

// othersLocked says, under mu, what other running shards hold: their
// reservations (what they wrote of them is no longer free, the rest still
// is) and the staged inputs they use, but those in keep.
func (s *Stager) othersLocked(keep map[string]bool) string {
	reserved := s.reservedLocked()
	w := "other running shards hold " + stream.FormatSize(reserved) + " reserved"
	if written := reserved - s.unwrittenLocked(); written > 0 {
		w += " (" + stream.FormatSize(written) + " of it written)"
	}
	if in := s.heldLocked(keep) - reserved; in > 0 {
		w += " and " + stream.FormatSize(in) + " of staged inputs"
	}
	return w
}

// heldError is an ErrNoSpace whose room other shards' reservations hold.
type heldError struct{ error }

func (e heldError) Unwrap() error { return e.error }

// Held reports whether err (from Stage or Reserve) is a lack of room
// that other shards' reservations hold: waiting for them to end will
// do. Otherwise the file system cannot hold the shard even then.
func Held(err error) bool {
	var h heldError
	return errors.As(err, &h)
}

// Check refuses scratch that is network storage or whose locality cannot
// be told (probing Dir, or its nearest existing ancestor), and only then
// creates the cache directory.
func (s *Stager) Check(ctx context.Context) error {
	pr := s.cfg.Probe
	if pr == nil {
		var err error
		if pr, err = probe.New(probe.Config{}); err != nil {
			return err
		}
	}
	pi := pr.Where(ctx, s.cfg.Dir) // not created yet: its nearest existing parent
	switch {
	case pi.Unknown != "":
		return fmt.Errorf("staging scratch %s: %w: cannot probe it: %s", s.cfg.Dir, ErrNetworkScratch, pi.Unknown)
	case pi.Locality == probe.Network:
		return fmt.Errorf("staging scratch %s: %w: it resolves to %s on %s%s (%s, mounted at %s); use a local disk", s.cfg.Dir, ErrNetworkScratch, pi.Resolved, pi.Type, subtype(pi.Subtype), pi.Source, pi.MountPoint)
	case pi.Locality != probe.Local:
		return fmt.Errorf("staging scratch %s: %w: cannot tell whether %s%s at %s is local", s.cfg.Dir, ErrNetworkScratch, pi.Type, subtype(pi.Subtype), pi.MountPoint)
	}
	if err := os.MkdirAll(filepath.Join(s.cfg.Dir, "cache"), 0o755); err != nil {
		return fmt.Errorf("staging scratch %s: %w", s.cfg.Dir, err)
	}
	return nil
}

// keepInterrupted keeps the copies of keys that an interruption (the
// worker's stop, a lost lease, a halt) cut short, whatever the cache
// bound, as files found on the disk are (adopt): the shard's next
// attempt, here or in the worker's next process, resumes from their
// whole chunks; room for a shard removes them first. Removed with the
// shard under --stage-cache 0, a copy of gigabytes halted (halt --now)
// and submitted again started from nothing.
func (s *Stager) keepInterrupted(keys []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		e := s.entries[k]
		if e == nil || e.ready || e.refs > 1 {
			continue // verified, or another shard's copy goes on
		}
		if info, err := os.Stat(e.path + ".part"); err == nil && info.Size() > 0 {
			e.found, e.size = true, info.Size()
		}
	}
}

// adopt notes the staged files already in the cache directory, unknown
// to this stager: before, they stayed on the disk for good, since only
// known entries are ever removed. A worker restarted with --stage-cache
// 20GiB left up to 20 GiB behind each time, and a SIGKILLed one its
// copies, while its shards could fail for want of that room. Each is an
// idle entry (found) that room for a shard may remove, least recently
// written first; the cache bound leaves it be until a shard uses it
// (staged ahead with shardpool stage, it is the point). A directory
// holding neither a staged file nor a .part is removed, as is one a
// removal left (shared.go).
func (s *Stager) adopt() {
	dir := filepath.Join(s.cfg.Dir, "cache")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range ents {
		k := d.Name()
		if strings.HasPrefix(k, removingPrefix) {
			os.RemoveAll(filepath.Join(dir, k)) // a removal a crash cut short
			continue
		}
		if !d.IsDir() || s.entries[k] != nil {
			continue
		}
		files, _ := os.ReadDir(filepath.Join(dir, k))
		var path string
		var size int64
		var mtime time.Time
		for _, f := range files {
			info, err := f.Info()
			if err != nil || !info.Mode().IsRegular() || lockName(f.Name()) {
				continue
			}
			path = filepath.Join(dir, k, strings.TrimSuffix(f.Name(), ".part"))
			size += info.Size()
			if info.ModTime().After(mtime) {
				mtime = info.ModTime()
			}
		}
		if path == "" {
			if !slices.ContainsFunc(files, func(f fs.DirEntry) bool { return !lockName(f.Name()) }) {
				os.RemoveAll(filepath.Join(dir, k)) // its lock alone
			}
			continue
		}
		s.entries[k] = &entry{path: path, size: size, lastUsed: mtime, found: true}
	}
}

func subtype(s string) string {
	if s == "" {
		return ""
	}
	return "." + s
}

// Stats are one staging's measurements, written to the evidence folder.
type Stats struct {
	Files         int     `json:"files"`
	Bytes         int64   `json:"bytes"`
	Copied        int64   `json:"copied"`
	Resumed       int64   `json:"resumed_bytes"`
	Reused        int     `json:"reused"`
	Refetched     int     `json:"refetched"`
	Seconds       float64 `json:"seconds"`
	VerifySeconds float64 `json:"verify_seconds"`
	BytesPerSec   float64 `json:"bytes_per_sec"`
	FilesPerSec   float64 `json:"files_per_sec"`
}

// Staged is a shard's staged inputs; Release them after the shard ends.
type Staged struct {
	Paths []string
	Stats Stats
	s     *Stager
	keys  []string
	claim *claim
	once  sync.Once
	// used are the keys of the entries the shard holds in use
	// (useLocks.acquire), one for each acquire, until Release.
	used []string
}

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func key(f stream.InputFile) string {
	return fmt.Sprintf("%s-%d-%s", f.XXH64, f.Size, unsafeChars.ReplaceAllString(filepath.Base(f.Path), "_"))
}

// Stage copies files to local scratch (or reuses verified copies) and
// returns their local paths in order. extra is the space the shard needs
// besides its inputs (expected output and checkpoints); it is reserved
// until Release. A pack's unpacked copy (at most the pack's size) is
// reserved too: the worker unpacks it into the same scratch.
func (s *Stager) Stage(ctx context.Context, files []stream.InputFile, extra int64, dirs ...string) (*Staged, error) {
	return s.StageHeld(ctx, files, extra, nil, dirs...)
}

// StageHeld is Stage where hold, when not nil, is called once the
// shard's reservation is in the ledger (Room counts it) and before the
// first byte is copied; the function it returns is called before the
// reservation is released where Stage fails after that. A worker counts
// its shards that hold reservations this way: counted from the copy's
// end instead, a shard being copied counted twice in its admission, once
// by its reservation and once as fetched without one.
func (s *Stager) StageHeld(ctx context.Context, files []stream.InputFile, extra int64, hold func() (unhold func()), dirs ...string) (*Staged, error) {
	start := time.Now()
	st := &Staged{s: s, Paths: make([]string, len(files))}
	what := "inputs not yet staged"
	if Packed(files) {
		what = "inputs not yet staged, the unpacked copy of their pack"
	}
	s.mu.Lock()
	copies, keep := s.copiesLocked(files)
	need := extra + copies + unpacked(files)
	// What the copies have written is gone from the free space as they
	// write it: their cache directories are among the claim's until the
	// copies are done, so that it is not counted in both meanwhile.
	copying := slices.Clone(dirs)
	for _, f := range files {
		if k := key(f); !keep[k] {
			copying = append(copying, filepath.Join(s.cfg.Dir, "cache", k))
		}
	}
	c, free, err := s.reserveLocked(need, keep, copying)
	if err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("stage: %w", err)
	}
	if c == nil {
		err := s.noSpace(need, free, keep, fmt.Errorf("stage: %w: the shard needs %s (%s, plus %s declared scratch), %s is free at %s, %s",
			ErrNoSpace, stream.FormatSize(need), what, stream.FormatSize(extra), stream.FormatSize(free), s.cfg.Dir, s.othersLocked(keep)))
		s.mu.Unlock()
		return nil, err
	}
	st.claim = c
	for _, f := range files {
		k := key(f)
		e := s.entries[k]
		if e == nil {
			e = &entry{path: filepath.Join(s.cfg.Dir, "cache", k, filepath.Base(f.Path)), size: f.Size}
			s.entries[k] = e
		}
		if e.found {
			// Used now: an entry of the cache like any other from here on.
			e.found, e.size = false, f.Size
		}
		e.refs++
		e.lastUsed = time.Now()
		st.keys = append(st.keys, k)
		st.Paths[len(st.keys)-1] = e.path
	}
	s.mu.Unlock()
	unhold := func() {}
	if hold != nil {
		unhold = hold()
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for i, f := range files {
		k := st.keys[i]
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.uses.acquire(ctx, k)
			held := err == nil
			if held {
				err = os.MkdirAll(filepath.Dir(st.Paths[i]), 0o755)
			}
			var r oneResult
			if err == nil {
				r, err = s.stageOne(ctx, f, k)
			}
			mu.Lock()
			defer mu.Unlock()
			if held {
				st.used = append(st.used, k)
			}
			if err != nil && firstErr == nil {
				firstErr = err
			}
			st.Stats.Copied += r.copied
			st.Stats.Resumed += r.resumed
			st.Stats.VerifySeconds += r.verify.Seconds()
			st.Stats.Refetched += r.refetched
			if r.reused {
				st.Stats.Reused++
			}
		}()
	}
	wg.Wait()
	for _, f := range files {
		st.Stats.Files++
		st.Stats.Bytes += f.Size
	}
	st.Stats.Seconds = time.Since(start).Seconds()
	if st.Stats.Seconds > 0 {
		st.Stats.BytesPerSec = float64(st.Stats.Copied) / st.Stats.Seconds
		st.Stats.FilesPerSec = float64(st.Stats.Files) / st.Stats.Seconds
	}
	if firstErr != nil {
		if ctx.Err() != nil {
			s.keepInterrupted(st.keys)
		}
		unhold()
		st.Release()
		return nil, firstErr
	}
	// The copies are on the disk now, kept from eviction while the shard
	// uses them: the free space counts them, so the reservation keeps only
	// what is still to be written (a pack's unpacked copy, the declared
	// scratch). Kept, they counted twice while the shard ran, and a shard
	// beside it waited for room there was.
	s.mu.Lock()
	st.claim.n -= copies
	st.claim.dirs, st.claim.at = st.claim.dirs[:len(dirs)], time.Time{}
	s.mu.Unlock()
	return st, nil
}

// InputNeed is what a Stage of files would reserve for them now, beside
// the shard's declared scratch: the inputs not yet staged and verified
// here, and a pack's unpacked copy. A worker learns its classes' staged
// needs from it (admission counts them before it fetches).
func (s *Stager) InputNeed(files []stream.InputFile) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, _ := s.copiesLocked(files)
	return n + unpacked(files)
}

// unpacked is the room a pack's unpacked copy takes (at most the pack's
// size); 0 for inputs staged one by one.
func unpacked(files []stream.InputFile) int64 {
	if Packed(files) {
		return files[0].Size
	}
	return 0
}

// copiesLocked is the size of files not yet staged and verified here,
// under mu, with the keys of those that are, which a reservation for
// them must not evict.
func (s *Stager) copiesLocked(files []stream.InputFile) (int64, map[string]bool) {
	var n int64
	keep := map[string]bool{}
	for _, f := range files {
		k := key(f)
		if e := s.entries[k]; e == nil || !e.ready {
			n += f.Size
		} else {
			keep[k] = true
		}
	}
	return n, keep
}

type oneResult struct {
	copied, resumed int64
	refetched       int
	reused          bool
	verify          time.Duration
}

// stageOne makes the cache entry k hold a verified copy of f.
func (s *Stager) stageOne(ctx context.Context, f stream.InputFile, k string) (oneResult, error) {
	var r oneResult
	s.sem <- struct{}{}
	defer func() { <-s.sem }()
	s.mu.Lock()
	e := s.entries[k]
	s.mu.Unlock()
	e.mu.Lock()
	defer e.mu.Unlock()
	s.mu.Lock()
	ready, seen := e.ready, e.seen
	s.mu.Unlock()
	dst := e.path
	if ready && seen != (fileID{}) {
		// Verified in full before and not changed since: a shared input
		// (a model's weights, say) is not read again for every shard.
		if id, ok := statID(dst); ok && id == seen {
			r.reused = true
			return r, nil
		}
	}
	// Another process may be copying or verifying the same input here:
	// once its lock is had, the file it made is verified below.
	cl, err := copyLock(ctx, filepath.Dir(dst))
	if err != nil {
		return r, fmt.Errorf("stage %s: %w", f.Path, err)
	}
	defer cl.Close()
	if ready || fileExists(dst) {
		t := time.Now()
		before, _ := statID(dst)
		err := verifyFile(dst, f)
		r.verify = time.Since(t)
		if err == nil {
			r.reused = true
			s.markVerified(k, dst, before, t)
			return r, nil
		}
		s.log.Warn("staged copy failed verification; fetching again", "file", dst, "err", err)
		os.Remove(dst)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return r, fmt.Errorf("stage %s: %w", f.Path, err)
	}
	// A slot among the host's copies, then one among the fleet's: a
	// wait for the host holds nothing of the fleet's.
	unhost, err := s.host.take(ctx, func() {
		s.log.Info("waiting for a copy slot: other processes of this user stage on this host", "file", f.Path, "slots", s.cfg.Concurrency, "where", s.host.path)
	})
	if err != nil {
		return r, fmt.Errorf("stage %s: %w", f.Path, err)
	}
	defer unhost()
	s.reshare(true)
	release, err := s.cfg.Fleet.acquire(ctx)
	if err != nil {
		return r, fmt.Errorf("stage %s: %w", f.Path, err)
	}
	defer release()
	for attempt := 0; attempt <= s.cfg.Retries; attempt++ {
		if attempt > 0 {
			r.refetched++
		}
		var c, res int64
		c, res, err = s.copyFile(ctx, f, dst)
		r.copied += c
		r.resumed += res
		if err == nil {
			s.markReady(k)
			return r, nil
		}
		if !errors.Is(err, ErrMismatch) {
			return r, fmt.Errorf("stage %s: %w", f.Path, err)
		}
		os.Remove(dst + ".part")
	}
	return r, fmt.Errorf("stage %s: %w after %d fetches: the source changed since it was submitted or is corrupt (%v)", f.Path, ErrMismatch, s.cfg.Retries+1, err)
}

func (s *Stager) markReady(k string) {
	s.mu.Lock()
	s.entries[k].ready = true
	s.mu.Unlock()
}

// markVerified marks entry k ready after a full verification that began at
// start with the copy's identity before; the identity is kept for the next
// reuse when the copy is the same after the verification and was last
// changed well before it.
func (s *Stager) markVerified(k, path string, before fileID, start time.Time) {
	after, ok := statID(path)
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entries[k]
	e.ready, e.seen = true, fileID{}
	if ok && after == before && start.UnixNano()-after.ctime > int64(racyWindow) {
		e.seen = after
	}
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// verifyFile reads p and checks size and checksum.
func verifyFile(p string, f stream.InputFile) error {
	in, err := os.Open(p)
	if err != nil {
		return err
	}
	defer in.Close()
	ch := newChunker(nil)
	if _, err := io.Copy(ch, in); err != nil {
		return err
	}
	_, whole := ch.finish()
	if ch.n != f.Size || whole != f.XXH64 {
		return fmt.Errorf("%w: %s has %d bytes xxh64 %s, want %d bytes xxh64 %s", ErrMismatch, p, ch.n, whole, f.Size, f.XXH64)
	}
	return nil
}

// copyFile copies f to dst through dst.part, resuming from the verified
// prefix of an existing .part. It returns bytes copied now and bytes kept.
func (s *Stager) copyFile(ctx context.Context, f stream.InputFile, dst string) (copied, resumed int64, err error) {
	part := dst + ".part"
	ch := newChunker(f.Chunks)
	offset, err := verifiedPrefix(part, f, ch)
	if err != nil {
		return 0, 0, err
	}
	out, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return 0, 0, err
	}
	defer func() {
		if out != nil {
			out.Close()
		}
	}()
	if err := out.Truncate(offset); err != nil {
		return 0, 0, err
	}
	if _, err := out.Seek(offset, io.SeekStart); err != nil {
		return 0, 0, err
	}
	in, err := os.Open(f.Path)
	if err != nil {
		return 0, offset, err
	}
	defer in.Close()
	if _, err := in.Seek(offset, io.SeekStart); err != nil {
		return 0, offset, err
	}
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return copied, offset, err
		}
		n, rerr := in.Read(buf)
		if n > 0 {
			if err := s.throttle(ctx, n); err != nil {
				return copied, offset, err
			}
			if _, err := ch.Write(buf[:n]); err != nil {
				return copied, offset, err
			}
			if _, err := out.Write(buf[:n]); err != nil {
				return copied, offset, err
			}
			copied += int64(n)
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return copied, offset, rerr
		}
	}
	_, whole := ch.finish()
	if ch.n != f.Size || whole != f.XXH64 {
		return copied, offset, fmt.Errorf("%w: read %d bytes xxh64 %s, recorded %d bytes xxh64 %s", ErrMismatch, ch.n, whole, f.Size, f.XXH64)
	}
	if err := out.Sync(); err != nil {
		return copied, offset, err
	}
	if err := out.Close(); err != nil {
		out = nil
		return copied, offset, err
	}
	out = nil
	// No directory fsync after the rename: a staged file is verified
	// against its checksum before any later reuse, so a rename lost in a
	// crash costs a copy, never a wrong input.
	if err := os.Rename(part, dst); err != nil {
		return copied, offset, err
	}
	return copied, offset, nil
}

// verifiedPrefix hashes the whole chunks of an existing .part and returns
// how many bytes of it match f's recorded chunks; those bytes are fed to ch.
func verifiedPrefix(part string, f stream.InputFile, ch *chunker) (int64, error) {
	in, err := os.Open(part)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer in.Close()
	buf := make([]byte, ChunkSize)
	var good int64
	for i := 0; i < len(f.Chunks) && good+ChunkSize <= f.Size; i++ {
		n, err := io.ReadFull(in, buf)
		if n < ChunkSize || err != nil {
			break
		}
		probe := newChunker(nil)
		probe.Write(buf)
		sums, _ := probe.finish()
		if sums[0] != f.Chunks[i] {
			break
		}
		ch.Write(buf)
		good += ChunkSize
	}
	return good, nil
}

// Release returns the shard's reservation and references; unreferenced
// staged files beyond the cache cap are removed, least recently used first.
func (st *Staged) Release() {
	st.once.Do(func() {
		s := st.s
		// First: this shard's hold would keep the stager from removing
		// the entries below.
		for _, k := range st.used {
			s.uses.release(k)
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.unclaimLocked(st.claim)
		for _, k := range st.keys {
			if e := s.entries[k]; e != nil {
				e.refs--
				e.lastUsed = time.Now()
			}
		}
		s.evictLocked()
	})
}

// DropIdle removes every staged input no shard uses now and returns the
// bytes it freed: where the scratch file system filled, the cache gives
// way to the shards' own files.
func (s *Stager) DropIdle() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.freeUpLocked(math.MaxInt64, nil)
}

// freeUpLocked removes idle staged files, least recently used first, until
// at least want bytes are freed or none is left, all but those in keep;
// it returns bytes freed.
func (s *Stager) freeUpLocked(want int64, keep map[string]bool) int64 {
	var freed int64
	idle := s.idleLocked()
	// What no shard of this stager has used (found: adopt,
	// keepInterrupted) goes first, then the cache, least recently used
	// first.
	slices.SortStableFunc(idle, func(a, b keyed) int {
		switch {
		case a.e.found && !b.e.found:
			return -1
		case b.e.found && !a.e.found:
			return 1
		}
		return 0
	})
	for _, x := range idle {
		if freed >= want {
			break
		}
		if keep[x.k] {
			continue
		}
		gone := s.uses.removeEntry(x.k, filepath.Dir(x.e.path))
		delete(s.entries, x.k) // where another process uses it, it is that one's to remove
		if gone {
			freed += x.e.size
		}
	}
	return freed
}

type keyed struct {
	k string
	e *entry
}

func (s *Stager) idleLocked() []keyed {
	var idle []keyed
	for k, e := range s.entries {
		if e.refs == 0 {
			idle = append(idle, keyed{k, e})
		}
	}
	sort.Slice(idle, func(i, j int) bool { return idle[i].e.lastUsed.Before(idle[j].e.lastUsed) })
	return idle
}

func (s *Stager) evictLocked() {
	var idle []keyed
	var kept int64
	for _, x := range s.idleLocked() {
		if !x.e.found { // not this stager's to bound (adopt)
			idle = append(idle, x)
			kept += x.e.size
		}
	}
	for _, x := range idle {
		if kept <= s.cfg.CacheBytes {
			break
		}
		s.uses.removeEntry(x.k, filepath.Dir(x.e.path))
		delete(s.entries, x.k) // where another process uses it, it is that one's to remove
		kept -= x.e.size
	}
}

// Key is the cache key of an input: checksum, size and base name.
func Key(f stream.InputFile) string { return key(f) }

// Ready lists the keys of verified staged inputs, most recently used first,
// at most n.
func (s *Stager) Ready(n int) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	type kt struct {
		k string
		t time.Time
	}
	var all []kt
	for k, e := range s.entries {
		if e.ready {
			all = append(all, kt{k, e.lastUsed})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].t.After(all[j].t) })
	out := make([]string, 0, min(n, len(all)))
	for i := 0; i < len(all) && i < n; i++ {
		out = append(out, all[i].k)
	}
	return out
}

// Has reports whether every key is staged and verified here.
func (s *Stager) Has(keys []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		if e := s.entries[k]; e == nil || !e.ready {
			return false
		}
	}
	return true
}
