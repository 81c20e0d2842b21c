package checkpoint

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/cespare/xxhash/v2"
)

func jsonIndent(v any) ([]byte, error) {
	b, err := json.MarshalIndent(v, "", "  ")
	return append(b, '\n'), err
}

// ReadMarker reads dir's COMPLETE marker without checking files.
func ReadMarker(dir string) (Marker, error) {
	b, err := os.ReadFile(filepath.Join(dir, MarkerName))
	if errors.Is(err, fs.ErrNotExist) {
		return Marker{}, fmt.Errorf("verify %s: %w", dir, ErrIncomplete)
	}
	if err != nil {
		return Marker{}, fmt.Errorf("verify %s: %w", dir, err)
	}
	var mk Marker
	if err := json.Unmarshal(b, &mk); err != nil || mk.V != formatV {
		return Marker{}, fmt.Errorf("verify %s: %w: COMPLETE does not parse", dir, ErrCorrupt)
	}
	return mk, nil
}

// Verify checks a committed directory: marker present, MANIFEST matching its
// checksum, every file matching MANIFEST, nothing extra. It reads every byte.
func Verify(dir string) (Marker, error) { return verify(dir, true) }

// VerifyQuick is Verify without reading file contents: marker, MANIFEST
// checksum, names and sizes. It suits a second look at outputs whose bytes
// were already read back by their committer.
func VerifyQuick(dir string) (Marker, error) { return verify(dir, false) }

func verify(dir string, full bool) (Marker, error) {
	mk, err := ReadMarker(dir)
	if err != nil {
		return Marker{}, err
	}
	mb, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		return Marker{}, fmt.Errorf("verify %s: %w: MANIFEST: %v", dir, ErrCorrupt, err)
	}
	if got := fmt.Sprintf("%016x", xxhash.Sum64(mb)); got != mk.Manifest {
		return Marker{}, fmt.Errorf("verify %s: %w: MANIFEST checksum %s, marker says %s", dir, ErrCorrupt, got, mk.Manifest)
	}
	var m manifest
	if err := json.Unmarshal(mb, &m); err != nil {
		return Marker{}, fmt.Errorf("verify %s: %w: MANIFEST does not parse", dir, ErrCorrupt)
	}
	want := map[string]File{}
	for _, f := range m.Files {
		want[f.Path] = f
	}
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = filepath.ToSlash(rel)
		if d.IsDir() || rel == ManifestName || rel == MarkerName {
			return nil
		}
		f, ok := want[rel]
		if !ok {
			return fmt.Errorf("%w: %s is not in MANIFEST", ErrCorrupt, rel)
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
				return fmt.Errorf("%w: %s has %d bytes xxh64 %s, MANIFEST says %d bytes xxh64 %s", ErrCorrupt, rel, size, sum, f.Size, f.XXH64)
			}
		} else {
			// Quick: sizes only (the contents are not read, so no checksum
			// is claimed for them).
			info, err := d.Info()
			if err != nil {
				return err
			}
			if info.Size() != f.Size {
				return fmt.Errorf("%w: %s has %d bytes, MANIFEST says %d", ErrCorrupt, rel, info.Size(), f.Size)
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
	f, err := os.Open(p)
	if err != nil {
		return 0, "", err
	}
	defer f.Close()
	h := xxhash.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return 0, "", err
	}
	return n, fmt.Sprintf("%016x", h.Sum64()), nil
}
