package checkpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cespare/xxhash/v2"
	json "github.com/segmentio/encoding/json"
)

func jsonIndent(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	return append(b, '\n'), err
}

// ReadMarker reads dir's COMPLETE marker without checking files.
func ReadMarker(dir string) (Marker, error) {
	b, err := ReadFile(filepath.Join(dir, MarkerName))
	if errors.Is(err, fs.ErrNotExist) {
		return Marker{}, fmt.Errorf("verify %s: %w", dir, ErrIncomplete)
	}
	if err != nil {
		return Marker{}, fmt.Errorf("verify %s: %w", dir, err)
	}
	var mk Marker
	if err := json.Unmarshal(b, &mk); err != nil || (mk.V != 1 && mk.V != formatV) {
		return Marker{}, fmt.Errorf("verify %s: %w: COMPLETE does not parse", dir, ErrCorrupt)
	}
	return mk, nil
}

// contents returns the file list the marker vouches for, checked against
// its checksum: from the marker itself (format 2) or from MANIFEST (1).
func contents(dir string, mk Marker) ([]File, error) {
	if mk.V >= 2 {
		if got := listChecksum(mk.Contents); got != mk.Manifest {
			return nil, fmt.Errorf("%w: the file list in COMPLETE has checksum %s, COMPLETE says %s", ErrCorrupt, got, mk.Manifest)
		}
		if len(mk.Contents) != mk.Files {
			return nil, fmt.Errorf("%w: COMPLETE lists %d files and counts %d", ErrCorrupt, len(mk.Contents), mk.Files)
		}
		return mk.Contents, nil
	}
	mb, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		return nil, fmt.Errorf("%w: MANIFEST: %v", ErrCorrupt, err)
	}
	if got := fmt.Sprintf("%016x", xxhash.Sum64(mb)); got != mk.Manifest {
		return nil, fmt.Errorf("%w: MANIFEST checksum %s, marker says %s", ErrCorrupt, got, mk.Manifest)
	}
	var m manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		return nil, fmt.Errorf("%w: MANIFEST does not parse", ErrCorrupt)
	}
	return m.Files, nil
}

// Verify checks a committed directory: marker present, its file list
// matching its checksum, every file matching the list, nothing extra. It
// reads every byte.
func Verify(dir string) (Marker, error) { return verify(dir, true) }

// VerifyQuick is Verify without reading file contents: marker, the file
// list's checksum, names and sizes. It suits a second look at outputs whose bytes
// were already read back by their committer.
func VerifyQuick(dir string) (Marker, error) { return verify(dir, false) }

// VerifyCommitted verifies dir (every byte with full, else as VerifyQuick)
// and requires that it was committed for run fingerprint fp: an output of
// another generation is not this run's result.
func VerifyCommitted(dir, fp string, full bool) (Marker, error) {
	mk, err := ReadMarker(dir)
	if err != nil {
		return Marker{}, err
	}
	if mk.Fingerprint != fp {
		// Another generation's output: not this run's result however sound
		// it is, so its files are not read (a new generation of a job with
		// large outputs read every byte of each old one before redoing it).
		// The marker is returned: it says whose output it is.
		return mk, fmt.Errorf("output carries fingerprint %s", mk.Fingerprint)
	}
	return verifyMarker(dir, mk, full)
}

func verify(dir string, full bool) (Marker, error) {
	mk, err := ReadMarker(dir)
	if err != nil {
		return Marker{}, err
	}
	return verifyMarker(dir, mk, full)
}

// verifyMarker checks dir's files against its marker mk.
func verifyMarker(dir string, mk Marker, full bool) (Marker, error) {
	list, err := contents(dir, mk)
	if err != nil {
		return Marker{}, fmt.Errorf("verify %s: %w", dir, err)
	}
	want := make(map[string]File, len(list))
	for _, f := range list {
		want[f.Path] = f
	}
	// ReadMarker found dir a directory: what is below it is walked.
	err = walkBelow(dir, func(p string, d fs.DirEntry) error {
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() || rel == MarkerName || (rel == ManifestName && mk.V == 1) {
			return nil
		}
		f, ok := want[rel]
		if !ok {
			return fmt.Errorf("%w: %s is not in the committed file list", ErrCorrupt, rel)
		}
		if !d.Type().IsRegular() {
			return fmt.Errorf("%w: %s is not a regular file", ErrCorrupt, rel)
		}
		if full {
			size, sum, err := hashFile(p)
			if err != nil {
				return err
			}
			if size != f.Size || sum != f.XXH64 {
				return fmt.Errorf("%w: %s has %d bytes xxh64 %s, the file list says %d bytes xxh64 %s", ErrCorrupt, rel, size, sum, f.Size, f.XXH64)
			}
		} else {
			// Quick: sizes only (the contents are not read, so no checksum
			// is claimed for them).
			info, err := d.Info()
			if err != nil {
				return err
			}
			if info.Size() != f.Size {
				return fmt.Errorf("%w: %s has %d bytes, the file list says %d", ErrCorrupt, rel, info.Size(), f.Size)
			}
		}
		delete(want, rel)
		return nil
	})
	if err != nil {
		return Marker{}, fmt.Errorf("verify %s: %w", dir, err)
	}
	for p := range want {
		return Marker{}, fmt.Errorf("verify %s: %w: %s is missing", dir, ErrCorrupt, p)
	}
	return mk, nil
}

func hashFile(p string) (int64, string, error) {
	f, err := Open(p)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	return hashOpen(f)
}

// hashOpen reads f to its end and returns the bytes read and their xxh64,
// as a file list writes it.
func hashOpen(f *os.File) (int64, string, error) {
	h := xxhash.New()
	n, err := copyFrom(h, f)
	if err != nil {
		return 0, "", err
	}
	return n, fmt.Sprintf("%016x", h.Sum64()), nil
}
