package checkpoint

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"
)

// entry maps one source file onto its relative path in the commit.
type entry struct {
	src, rel string
	mode     fs.FileMode
	size     int64
}

// collect lists the regular files of root (recursively) under prefix.
// Symlinks and special files are refused: following them could commit
// something outside the job's output.
func collect(root, prefix string) ([]entry, []string, error) {
	var files []entry
	var dirs []string
	err := walkDir(root, func(p string, d fs.DirEntry) error {
		rel, _ := filepath.Rel(root, p)
		if prefix != "" {
			rel = filepath.Join(prefix, rel)
		}
		if rel == "." {
			return nil
		}
		rel = filepath.ToSlash(rel)
		// Named by the path inside the output: where the job wrote it
		// (an attempt's {out}) is gone by the time anyone reads this.
		const only = "an output holds regular files and directories only"
		if !utf8.ValidString(rel) {
			// The marker's file list is JSON, which turns such bytes into
			// U+FFFD: the list read back would never verify.
			return fmt.Errorf("%w: %q is not a UTF-8 name; the commit's file list (JSON) cannot hold it: name outputs in UTF-8", ErrUnsafe, rel)
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			to, _ := os.Readlink(p)
			return fmt.Errorf("%w: %s is a symlink (to %s); %s", ErrUnsafe, rel, to, only)
		case d.IsDir():
			dirs = append(dirs, rel)
		case d.Type().IsRegular():
			if rel == ManifestName || rel == MarkerName {
				return fmt.Errorf("%w: %s uses a name reserved for the commit's own marker", ErrUnsafe, rel)
			}
			info, err := d.Info()
			if err != nil {
				return err
			}
			files = append(files, entry{src: p, rel: rel, mode: info.Mode().Perm(), size: info.Size()})
		default:
			return fmt.Errorf("%w: %s is a %s; %s", ErrUnsafe, rel, kind(d.Type()), only)
		}
		return nil
	})
	return files, dirs, err
}

// kind names a file type that is not a regular file, directory or link.
func kind(m fs.FileMode) string {
	switch {
	case m&fs.ModeNamedPipe != 0:
		return "named pipe (FIFO)"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeDevice != 0:
		return "device file"
	}
	return "special file"
}

func randSuffix() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// fill writes files and dirs into tmp, then COMPLETE with their list.
func fill(ctx context.Context, tmp string, files []entry, dirs []string, gen int64, opt Options) (Marker, error) {
	sort.Strings(dirs)
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(tmp, filepath.FromSlash(d)), 0o755); err != nil {
			return Marker{}, err
		}
	}
	sort.Slice(files, func(i, j int) bool { return files[i].rel < files[j].rel })
	var m manifest // an empty output's list stays nil: its checksum is that of "null"
	if len(files) > 0 {
		m.Files = make([]File, len(files))
		if err := placeAll(ctx, tmp, files, m.Files, opt); err != nil {
			return Marker{}, err
		}
	}
	var total int64
	for _, f := range m.Files {
		total += f.Size
	}
	write := writeFileSync
	if opt.Sync != nil {
		// One opt.Sync after the marker covers everything (see Options.Sync).
		write = writeFileNoSync
	} else {
		// Directory entries must be durable before the marker vouches for them.
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := syncDir(filepath.Join(tmp, filepath.FromSlash(dirs[i]))); err != nil {
				return Marker{}, err
			}
		}
	}
	// The file list travels inside the marker (format 2): one metadata file
	// per commit instead of two, which on a local disk is a third of the
	// inode allocations of a small shard's commit and on NFS one round trip
	// fewer.
	mk := Marker{V: formatV, Generation: gen, Manifest: listChecksum(m.Files),
		Owner: opt.Owner, Fingerprint: opt.Fingerprint, Run: opt.Run, Inputs: opt.Inputs, Time: time.Now().UTC(), Files: len(m.Files), Bytes: total,
		Contents: m.Files}
	// Every file is fsynced before the marker is written. Their directory
	// entries become durable with the one fsync of tmp below, which precedes
	// the rename; a crash before it leaves a .tmp- directory that no reader
	// consumes, and a marker whose files went missing fails Verify.
	if err := write(filepath.Join(tmp, MarkerName), mk.encode()); err != nil {
		return Marker{}, err
	}
	if opt.Sync != nil {
		if err := opt.Sync(tmp); err != nil {
			return Marker{}, fmt.Errorf("sync %s: %w", tmp, err)
		}
		return mk, nil
	}
	return mk, syncDir(tmp)
}

// placeReaders is how many files of one commit are placed (moved or
// copied, hashed, fsynced) at once: an output of many small files is
// bound by the latency of each open and read, most of all on network
// storage, more than by CPU.
const placeReaders = 4

// placeAll places each of files into tmp, its File at the same index of
// out, placeReaders at a time; it stops at the first error.
func placeAll(ctx context.Context, tmp string, files []entry, out []File, opt Options) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(placeReaders, len(files)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				e := files[i]
				dst := filepath.Join(tmp, filepath.FromSlash(e.rel))
				var f File
				var err error
				if e.src == dst {
					// Moved in with its directory (moveInto).
					f, err = hashSync(dst, e.rel, e.mode, opt.Sync == nil)
				} else if err = os.MkdirAll(filepath.Dir(dst), 0o755); err == nil {
					f, err = place(e, dst, opt.Move, opt.Sync == nil)
				}
				if err != nil {
					cancel(fmt.Errorf("commit %s: %w", e.rel, err))
					continue
				}
				out[i] = f
			}
		}()
	}
feed:
	for i := range files {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	return context.Cause(ctx)
}

// place moves (when allowed and possible) or copies one file, hashing it and
// (with sync) fsyncing the result.
func place(e entry, dst string, move, sync bool) (File, error) {
	if move {
		if err := os.Rename(e.src, dst); err == nil {
			return hashSync(dst, e.rel, e.mode, sync)
		} else if !errors.Is(err, syscall.EXDEV) {
			return File{}, err
		}
	}
	in, err := Open(e.src)
	if err != nil {
		return File{}, err
	}
	defer in.Close()
	out, err := OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, e.mode|0o200)
	if err != nil {
		return File{}, err
	}
	h := xxhash.New()
	n, err := copyFrom(io.MultiWriter(out, h), in)
	if err == nil && sync {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return File{}, err
	}
	return File{Path: e.rel, Size: n, XXH64: fmt.Sprintf("%016x", h.Sum64()), Mode: uint32(e.mode)}, nil
}

func hashSync(path, rel string, mode fs.FileMode, sync bool) (File, error) {
	f, err := Open(path)
	if err != nil {
		return File{}, err
	}
	defer f.Close()
	n, sum, err := hashOpen(f)
	if err != nil {
		return File{}, err
	}
	if sync {
		if err := f.Sync(); err != nil {
			return File{}, err
		}
	}
	return File{Path: rel, Size: n, XXH64: sum, Mode: uint32(mode)}, nil
}

// CommitDir commits the regular files under src as the directory dst:
// everything is written into a temporary directory beside dst, fsynced,
// COMPLETE is written last, and the result replaces dst in one
// atomic exchange. A dst that existed is removed after the exchange, or moved
// into keepReplaced when that is not empty (for inspection).
func CommitDir(ctx context.Context, dst, src string, opt Options, keepReplaced string) (Marker, error) {
	p, err := Prepare(ctx, dst, src, opt)
	if err != nil {
		return Marker{}, err
	}
	if err := p.Publish(keepReplaced); err != nil {
		return Marker{}, err
	}
	return p.Marker, nil
}

// Pending is a fully written, fsynced commit that is not yet visible under
// its final name. Exactly one of Publish or Discard must follow.
type Pending struct {
	Marker Marker
	dst    string
	tmp    string
	lock   *os.File // holds tmp's lock against SweepTemps (newTemp)
	sync   func(string) error
}

// Prepare writes src into a temporary directory beside dst with its
// COMPLETE marker, all fsynced, without touching dst. The caller can then win
// a compare-and-set elsewhere before publishing. dst's parent must exist.
func Prepare(ctx context.Context, dst, src string, opt Options) (*Pending, error) {
	files, dirs, err := collect(src, "")
	if err != nil {
		return nil, fmt.Errorf("commit %s: %w", dst, err)
	}
	// The parent is not made: it is the caller's. Where it has gone (a
	// file system unmounted under a worker), making it again would
	// publish on the disk beneath, hidden once that is mounted back.
	parent := filepath.Dir(dst)
	need := needOf(files, dirs)
	tmp, lock, err := newTemp(parent, TempPrefix+filepath.Base(dst)+"-"+randSuffix())
	if err != nil {
		return nil, fmt.Errorf("commit %s: %w", dst, noRoom(err, parent, need, len(files)+len(dirs)))
	}
	if opt.Move && len(files)+len(dirs) > 0 {
		files, dirs, err = moveInto(src, tmp, files, dirs)
	}
	var mk Marker
	if err == nil {
		mk, err = fill(ctx, tmp, files, dirs, 1, opt)
	}
	if err != nil {
		os.RemoveAll(tmp)
		closeLock(lock)
		return nil, fmt.Errorf("commit %s: %w", dst, noRoom(err, parent, need, len(files)+len(dirs)))
	}
	return &Pending{Marker: mk, dst: dst, tmp: tmp, lock: lock, sync: opt.Sync}, nil
}

// moveInto renames each entry at the top of src into tmp, a directory
// with everything under it in one rename, and returns the files and
// directories to commit: what is now in tmp, listed again there (a
// process the command left behind may have written more since src was
// listed), and, of files and dirs (src's listing), those under entries
// that could not be renamed (another file system mounted inside src),
// to be copied. Renaming a whole directory instead of each file, a stat
// and a rename per file, cut the commit of 20,000 small files by 40%
// (and with copyFrom's pooled buffer by 60%: bench/commit).
func moveInto(src, tmp string, files []entry, dirs []string) ([]entry, []string, error) {
	tops, err := ReadDir(src)
	if err != nil {
		return nil, nil, err
	}
	moved := map[string]bool{}
	for _, t := range tops {
		name := t.Name()
		if name == MarkerName || name == ManifestName {
			continue // refused by collect when listed; one written since stays behind
		}
		err := os.Rename(filepath.Join(src, name), filepath.Join(tmp, name))
		switch {
		case err == nil:
			moved[name] = true
		case errors.Is(err, syscall.EXDEV) || errors.Is(err, syscall.EBUSY):
			// Copied below, file by file.
		default:
			return nil, nil, err
		}
	}
	if len(moved) == 0 {
		return files, dirs, nil
	}
	inFiles, inDirs, err := collect(tmp, "")
	if err != nil {
		return nil, nil, err
	}
	top := func(rel string) string {
		t, _, _ := strings.Cut(rel, "/")
		return t
	}
	for _, e := range files {
		if !moved[top(e.rel)] {
			inFiles = append(inFiles, e)
		}
	}
	for _, d := range dirs {
		if !moved[top(d)] {
			inDirs = append(inDirs, d)
		}
	}
	return inFiles, inDirs, nil
}

// Discard removes the prepared directory.
func (p *Pending) Discard() {
	os.RemoveAll(p.tmp)
	closeLock(p.lock)
}

// PublishIfAbsent makes the prepared directory visible as dst where
// nothing is there yet, in one system call (renameat2 RENAME_NOREPLACE)
// where a look for dst and a rename were two, and reports whether it did.
// Where it did not (dst exists, the file system cannot rename without
// replacing, or the rename failed), nothing changed: Publish follows, and
// says what went wrong.
func (p *Pending) PublishIfAbsent() (bool, error) {
	if unix.Renameat2(unix.AT_FDCWD, p.tmp, unix.AT_FDCWD, p.dst, unix.RENAME_NOREPLACE) != nil {
		return false, nil
	}
	closeLock(p.lock)
	return true, p.syncParent()
}

// syncDir makes renames into dir durable: by the commit's Options.Sync
// where it has one, else by fsync of dir.
func (p *Pending) syncDir(dir string) error {
	if p.sync != nil {
		return p.sync(dir)
	}
	return syncDir(dir)
}

// syncParent makes the rename into dst's directory durable.
func (p *Pending) syncParent() error {
	if err := p.syncDir(filepath.Dir(p.dst)); err != nil {
		return fmt.Errorf("commit %s: %w", p.dst, err)
	}
	return nil
}

// afterSwap, when set (tests only), runs after Publish's first rename:
// the swap, or the move of what dst held into keepReplaced.
var afterSwap func()

// Publish makes the prepared directory visible as dst (see CommitDir).
// What dst held is removed once the new output is there, or, with
// keepReplaced set (dst did not verify: kept for inspection), moved into
// that directory first (keepAside).
func (p *Pending) Publish(keepReplaced string) error {
	dst := p.dst
	// What dst held is, once swapped out, a directory beside dst under a
	// temporary name that no lock covers (the commit's lock went with its
	// directory to dst). The parent's shared lock keeps SweepTemps, which
	// would take it for a dead commit's, off it until it is kept aside or
	// removed. Without flock here, nothing sweeps either.
	if parent, err := Open(filepath.Dir(dst)); err == nil {
		_ = Flock(parent, unix.LOCK_SH)
		defer parent.Close()
	}
	if keepReplaced != "" {
		if kept, err := p.keepAside(keepReplaced); kept || err != nil {
			return err
		}
	}
	replaced, err := swapIn(p.tmp, dst)
	if afterSwap != nil {
		afterSwap()
	}
	if err != nil {
		os.RemoveAll(p.tmp)
	}
	closeLock(p.lock)
	if err != nil {
		return fmt.Errorf("commit %s: %w", dst, err)
	}
	if err := p.syncParent(); err != nil {
		return err
	}
	if replaced != "" {
		if keepReplaced != "" {
			if err := os.MkdirAll(keepReplaced, 0o755); err == nil {
				if os.Rename(replaced, asideName(keepReplaced, dst)) == nil {
					return nil
				}
			}
		}
		os.RemoveAll(replaced)
	}
	return nil
}

// asideName is where what dst held is kept in keep: its name, the time
// and a random suffix.
func asideName(keep, dst string) string {
	return filepath.Join(keep, filepath.Base(dst)+"-"+time.Now().UTC().Format("20060102T150405")+"-"+randSuffix())
}

// renameNoReplace renames from to to where nothing is at to, or where the
// file system cannot say (no RENAME_NOREPLACE: FUSE, some network
// file systems), as rename(2) does.
func renameNoReplace(from, to string) error {
	err := unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE)
	if errors.Is(err, syscall.EINVAL) {
		return os.Rename(from, to)
	}
	return err
}

// keepAside publishes over a dst that is kept for inspection: dst is
// moved into keep first, durably, and the prepared directory renamed to
// dst after. A crash between the two leaves dst absent (not committed:
// the shard is committed again) and the old content kept. Swapped first,
// the old content sat beside dst under a temporary name until its move,
// and a crash in that moment left it to the next sweep, which removed it
// as a dead commit's: the copy meant for inspection was lost. dst is
// absent for a moment, where the swap kept it present; a reader sees
// "not committed" then, as it would in the damaged output. kept is
// false, with nothing changed, where dst cannot be moved into keep (keep
// on another file system, say): the caller swaps as for any other dst.
func (p *Pending) keepAside(keep string) (kept bool, err error) {
	if err := os.MkdirAll(keep, 0o755); err != nil {
		return false, nil
	}
	aside := asideName(keep, p.dst)
	if err := renameNoReplace(p.dst, aside); err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		// dst is gone already: nothing to keep.
	} else if err := errors.Join(p.syncDir(keep), p.syncParent()); err != nil {
		// The old content is kept either way; the new output is not
		// published on a move whose durability is unknown.
		os.RemoveAll(p.tmp)
		closeLock(p.lock)
		return true, fmt.Errorf("commit %s: %s moved aside to %s: %w", p.dst, p.dst, aside, err)
	}
	if afterSwap != nil {
		afterSwap()
	}
	if err := renameNoReplace(p.tmp, p.dst); err != nil {
		os.RemoveAll(p.tmp)
		closeLock(p.lock)
		return true, fmt.Errorf("commit %s: %w", p.dst, err)
	}
	closeLock(p.lock)
	return true, p.syncParent()
}

// swapIn puts tmp at dst. When dst exists, the two are exchanged atomically
// (renameat2 RENAME_EXCHANGE) and the old content's path is returned; on
// filesystems without exchange, dst is renamed aside first, which leaves a
// moment where dst is absent: a reader then sees "not committed", never a
// partial directory.
func swapIn(tmp, dst string) (string, error) {
	err := os.Rename(tmp, dst)
	if err == nil {
		return "", nil
	}
	if !errors.Is(err, syscall.EEXIST) && !errors.Is(err, syscall.ENOTEMPTY) {
		return "", err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE); err == nil {
		return tmp, nil
	}
	aside := tmp + ".old"
	if err := os.Rename(dst, aside); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, dst); err != nil {
		_ = os.Rename(aside, dst)
		return "", err
	}
	return aside, nil
}
