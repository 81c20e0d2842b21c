package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Generation is one numbered, committed directory gen-<N> inside a
// checkpoint directory.
type Generation struct {
	N      int64  `json:"generation"`
	Path   string `json:"path"`
	Marker Marker `json:"marker"`
}

// Report is the verification result of one generation.
type Report struct {
	N      int64  `json:"generation"`
	Path   string `json:"path"`
	OK     bool   `json:"ok"`
	Reason string `json:"reason,omitempty"`
}

const genPrefix = "gen-"

// RejectedDir is where generations that fail verification are moved.
const RejectedDir = "rejected"

// numbers lists the generation numbers present in dir, newest first.
func numbers(dir string) ([]int64, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ns []int64
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), genPrefix) {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimPrefix(e.Name(), genPrefix), 10, 64)
		if err == nil && n > 0 {
			ns = append(ns, n)
		}
	}
	sort.Slice(ns, func(i, j int) bool { return ns[i] > ns[j] })
	return ns, nil
}

func genPath(dir string, n int64) string {
	return filepath.Join(dir, fmt.Sprintf("%s%d", genPrefix, n))
}

// Commit writes srcs (files, or directories copied recursively under their
// base names) as the next generation of dir. The previous generations stay;
// with opt.Retain > 0, verified generations beyond the newest Retain are
// removed only after the new one has verified.
func Commit(ctx context.Context, dir string, srcs []string, opt Options) (Generation, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Generation{}, fmt.Errorf("commit generation in %s: %w", dir, err)
	}
	// What commits that died here left (a checkpoint directory is small).
	_, _ = SweepTemps(dir)
	var files []entry
	var dirs []string
	for _, s := range srcs {
		st, err := os.Lstat(s)
		if err != nil {
			return Generation{}, fmt.Errorf("commit generation in %s: %w", dir, err)
		}
		switch {
		case st.IsDir():
			f, d, err := collect(s, filepath.Base(s))
			if err != nil {
				return Generation{}, fmt.Errorf("commit generation in %s: %w", dir, err)
			}
			files, dirs = append(files, f...), append(append(dirs, filepath.Base(s)), d...)
		case st.Mode().IsRegular():
			if b := filepath.Base(s); b == ManifestName || b == MarkerName {
				return Generation{}, fmt.Errorf("commit generation in %s: %w: %s uses a reserved name", dir, ErrUnsafe, s)
			}
			files = append(files, entry{src: s, rel: filepath.Base(s), mode: st.Mode().Perm()})
		default:
			return Generation{}, fmt.Errorf("commit generation in %s: %w: %s is not a regular file or directory", dir, ErrUnsafe, s)
		}
	}
	if len(files) == 0 {
		// A writer that failed before writing anything: committed, it
		// would be the latest generation to resume from, and with
		// --retain it would prune the last good one.
		return Generation{}, fmt.Errorf("commit generation in %s: %w: %s hold(s) no file", dir, ErrEmpty, strings.Join(srcs, ", "))
	}
	seen := map[string]bool{}
	for _, f := range files {
		if seen[f.rel] {
			return Generation{}, fmt.Errorf("commit generation in %s: %w: two sources named %s", dir, ErrUnsafe, f.rel)
		}
		seen[f.rel] = true
	}
	ns, err := numbers(dir)
	if err != nil {
		return Generation{}, fmt.Errorf("commit generation in %s: %w", dir, err)
	}
	n := int64(1)
	if len(ns) > 0 {
		n = ns[0] + 1
	}
	tmp, lock, err := newTemp(dir, fmt.Sprintf("%s%d-%s", TempPrefix, n, randSuffix()))
	if err != nil {
		return Generation{}, fmt.Errorf("commit generation %d in %s: %w", n, dir, err)
	}
	defer closeLock(lock)
	mk, err := fill(ctx, tmp, files, dirs, n, opt)
	if err != nil {
		os.RemoveAll(tmp)
		return Generation{}, fmt.Errorf("commit generation %d in %s: %w", n, dir, err)
	}
	final := genPath(dir, n)
	// rename(2) onto an existing non-empty directory fails, so two committers
	// racing for one number cannot both win.
	if err := os.Rename(tmp, final); err != nil {
		os.RemoveAll(tmp)
		if errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY) {
			return Generation{}, fmt.Errorf("commit generation %d in %s: %w", n, dir, ErrConflict)
		}
		return Generation{}, fmt.Errorf("commit generation %d in %s: %w", n, dir, err)
	}
	if err := syncDir(dir); err != nil {
		return Generation{}, fmt.Errorf("commit generation %d in %s: %w", n, dir, err)
	}
	g := Generation{N: n, Path: final, Marker: mk}
	if opt.Retain > 0 {
		if _, err := Verify(final); err != nil {
			return g, fmt.Errorf("commit generation %d in %s: read-back: %w", n, dir, err)
		}
		if err := prune(dir, ns, opt.Retain-1); err != nil {
			return g, err
		}
	}
	return g, nil
}

// prune removes verified generations among older beyond the newest keep.
// Generations that fail verification are quarantined, not removed.
func prune(dir string, older []int64, keep int) error {
	kept := 0
	for _, n := range older {
		p := genPath(dir, n)
		if _, err := Verify(p); err != nil {
			if _, qerr := Quarantine(dir, Report{N: n, Path: p, Reason: err.Error()}); qerr != nil {
				return qerr
			}
			continue
		}
		if kept < keep {
			kept++
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			return fmt.Errorf("prune generation %d in %s: %w", n, dir, err)
		}
	}
	return syncDir(dir)
}

// VerifyAll verifies every generation of dir, newest first.
func VerifyAll(dir string) ([]Report, error) {
	ns, err := numbers(dir)
	if err != nil {
		return nil, fmt.Errorf("verify %s: %w", dir, err)
	}
	out := make([]Report, 0, len(ns))
	for _, n := range ns {
		p := genPath(dir, n)
		r := Report{N: n, Path: p, OK: true}
		if _, err := Verify(p); err != nil {
			r.OK, r.Reason = false, err.Error()
		}
		out = append(out, r)
	}
	return out, nil
}

// Latest returns the newest generation of dir that verifies. Newer ones that
// fail are skipped (and reported through rejected), never consumed.
func Latest(dir string) (g Generation, rejected []Report, err error) {
	ns, err := numbers(dir)
	if err != nil {
		return Generation{}, nil, fmt.Errorf("latest in %s: %w", dir, err)
	}
	if len(ns) == 0 {
		// Said apart, for the job's author: a path that names no
		// directory (a typo, or {ckpt} of another run) or a first start.
		why := "it holds no generation (" + genPrefix + "N) yet"
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			why = "the directory does not exist"
		}
		return Generation{}, nil, fmt.Errorf("latest in %s: %w: %s", dir, ErrNoGeneration, why)
	}
	for _, n := range ns {
		p := genPath(dir, n)
		mk, err := Verify(p)
		if err != nil {
			rejected = append(rejected, Report{N: n, Path: p, Reason: err.Error()})
			continue
		}
		return Generation{N: n, Path: p, Marker: mk}, rejected, nil
	}
	return Generation{}, rejected, fmt.Errorf("latest in %s: %w", dir, ErrNoGeneration)
}

// Quarantine moves a rejected generation to <dir>/rejected/ with a REASON
// file, so it is never consumed and never silently deleted.
func Quarantine(dir string, r Report) (string, error) {
	rd := filepath.Join(dir, RejectedDir)
	if err := os.MkdirAll(rd, 0o755); err != nil {
		return "", fmt.Errorf("quarantine generation %d: %w", r.N, err)
	}
	dst := filepath.Join(rd, fmt.Sprintf("%s%d-%s", genPrefix, r.N, time.Now().UTC().Format("20060102T150405.000")))
	if err := os.Rename(r.Path, dst); err != nil {
		return "", fmt.Errorf("quarantine generation %d: %w", r.N, err)
	}
	_ = os.WriteFile(filepath.Join(dst, "REJECTED"), []byte(r.Reason+"\n"), 0o644)
	if err := syncDir(rd); err != nil {
		return "", err
	}
	return dst, syncDir(dir)
}
