package staging

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cespare/xxhash/v2"

	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker/probe"
)

// PackManifestName is the first member of a pack: every file with its size
// and checksum.
const PackManifestName = ".shardpool-pack.json"

// Packing thresholds: a shard with at least PackMinFiles inputs whose
// average size is at most PackMaxAvg is staged as one pack.
const (
	PackMinFiles = 256
	PackMaxAvg   = 256 << 10
)

// ShouldPack reports whether inputs (of total cost bytes) are better staged
// as one pack: many, small, and with distinct base names.
func ShouldPack(inputs []string, bytes int64) bool {
	if len(inputs) < PackMinFiles || bytes/int64(len(inputs)) > PackMaxAvg {
		return false
	}
	seen := make(map[string]bool, len(inputs))
	for _, in := range inputs {
		b := filepath.Base(in)
		if seen[b] {
			return false
		}
		seen[b] = true
	}
	return true
}

// PackEntry is one packed file.
type PackEntry struct {
	Name  string `json:"name"`
	Size  int64  `json:"size"`
	XXH64 string `json:"xxh64"`
}

// Pack writes files into one tar stream at dst, manifest first, so that a
// shard of thousands of small inputs is staged as one sequential read
// instead of thousands of metadata round trips. Names are the files' base
// names and must be unique.
func Pack(ctx context.Context, dst string, files []string) ([]PackEntry, error) {
	entries := make([]PackEntry, 0, len(files))
	seen := map[string]bool{}
	for _, f := range files {
		name := filepath.Base(f)
		if seen[name] {
			return nil, fmt.Errorf("pack %s: two inputs named %s", dst, name)
		}
		seen[name] = true
		size, sum, err := hashPath(f)
		if err != nil {
			return nil, fmt.Errorf("pack %s: %w", dst, err)
		}
		entries = append(entries, PackEntry{Name: name, Size: size, XXH64: sum})
	}
	// Written aside and renamed: a pack cut short (a crash, a full disk)
	// is never found in dst's place.
	part := dst + ".part"
	out, err := os.Create(part)
	if err != nil {
		return nil, err
	}
	defer os.Remove(part) // a no-op once renamed
	defer out.Close()
	tw := tar.NewWriter(out)
	man, _ := json.Marshal(entries)
	if err := tw.WriteHeader(&tar.Header{Name: PackManifestName, Mode: 0o644, Size: int64(len(man))}); err != nil {
		return nil, err
	}
	tw.Write(man)
	for i, f := range files {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		in, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		err = tw.WriteHeader(&tar.Header{Name: entries[i].Name, Mode: 0o644, Size: entries[i].Size})
		if err == nil {
			_, err = io.Copy(tw, in)
		}
		in.Close()
		if err != nil {
			return nil, fmt.Errorf("pack %s: %s: %w", dst, f, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := out.Sync(); err != nil {
		return nil, err
	}
	if err := out.Close(); err != nil {
		return nil, err
	}
	return entries, os.Rename(part, dst)
}

// PackDir is where the packs of a run writing to output go (one per shard
// and state of its inputs; see DescribeShard). A shard's pack is removed
// once its output is committed.
func PackDir(output string) string {
	return filepath.Join(output, ".shardpool", "packs")
}

// PackPath is where the pack of a shard's inputs goes in dir: named by the
// shard and by its inputs' paths, sizes and modification times, so that
// inputs rewritten since a pack was made get a pack of their own instead
// of the stale one.
func PackPath(dir, id string, inputs []string) (string, error) {
	d := xxhash.New()
	for _, in := range inputs {
		st, err := os.Stat(in)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(d, "%s\x00%d\x00%d\x00", in, st.Size(), st.ModTime().UnixNano())
	}
	return filepath.Join(dir, fmt.Sprintf("%s-%016x.tar", id, d.Sum64())), nil
}

// Packing decides which shards that ShouldPack are packed: every one
// (the spec's pack = true), none (pack = false), or, by default, those
// with an input on storage not known to be local. Packs are for network storage, where each
// file's open and stat is a round trip; from a local disk they cost more
// than they save (docs/staging.md: 3.8 s against 3.1 s for 40 shards of
// 300 small files). One Packing serves a whole submission: it remembers
// each input directory's locality.
type Packing struct {
	mode *bool
	// Locality is the probe's locality of dir (probe.Local, Network or
	// Unsure); tests set it, nil probes this host.
	Locality func(ctx context.Context, dir string) string
	known    map[string]string
}

// NewPacking is the spec's `pack`: nil decides by locality, true packs
// always, false never.
func NewPacking(pack *bool) *Packing {
	return &Packing{mode: pack, known: map[string]string{}}
}

// wants reports whether a shard with these inputs is packed, given that
// ShouldPack holds.
func (p *Packing) wants(ctx context.Context, inputs []string) bool {
	if p == nil {
		return true
	}
	if p.mode != nil {
		return *p.mode
	}
	if p.Locality == nil {
		pr, err := probe.New(probe.Config{})
		if err != nil {
			return true // not known to be local
		}
		p.Locality = func(ctx context.Context, dir string) string { return pr.Where(ctx, dir).Locality }
	}
	for _, in := range inputs {
		dir := filepath.Dir(in)
		loc, ok := p.known[dir]
		if !ok {
			loc = p.Locality(ctx, dir)
			p.known[dir] = loc
		}
		if loc != probe.Local {
			return true
		}
	}
	return false
}

// DescribeShard describes a shard's inputs as the worker stages them: one
// pack of them all where ShouldPack and p wants it (made in packDir
// unless it is there already), else each input. Both submit and
// `shardpool stage` use it, so that what is staged ahead is what the
// worker looks for. A nil p packs whatever ShouldPack.
func DescribeShard(ctx context.Context, h *Hashes, p *Packing, packDir, id string, inputs []string, cost int64) ([]stream.InputFile, error) {
	if ShouldPack(inputs, cost) && p.wants(ctx, inputs) {
		f, err := describePack(ctx, h, packDir, id, inputs)
		if err == nil {
			return []stream.InputFile{f}, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// A pack is a speed-up: where it cannot be made (an output
		// directory this host cannot write), the inputs are staged one
		// by one, and a missing input is named below.
	}
	files := make([]stream.InputFile, 0, len(inputs))
	for _, in := range inputs {
		f, err := h.Describe(ctx, in)
		if err != nil {
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// describePack describes the pack of inputs in packDir, making it first
// when it is not there.
func describePack(ctx context.Context, h *Hashes, packDir, id string, inputs []string) (stream.InputFile, error) {
	pack, err := PackPath(packDir, id, inputs)
	if err != nil {
		return stream.InputFile{}, err
	}
	if _, err := os.Stat(pack); err != nil {
		if err := os.MkdirAll(packDir, 0o755); err != nil {
			return stream.InputFile{}, err
		}
		if _, err := Pack(ctx, pack, inputs); err != nil {
			return stream.InputFile{}, err
		}
	}
	f, err := h.Describe(ctx, pack)
	f.Pack = true
	return f, err
}

// Packed reports whether files is a shard's inputs in one pack.
func Packed(files []stream.InputFile) bool {
	return len(files) == 1 && files[0].Pack
}

// Unpack extracts a pack into dir, verifying every file against the pack's
// manifest; a member that is missing, extra, escapes dir or does not match
// fails the whole unpack.
func Unpack(ctx context.Context, pack, dir string) ([]string, error) {
	in, err := os.Open(pack)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	tr := tar.NewReader(in)
	h, err := tr.Next()
	if err != nil || h.Name != PackManifestName {
		return nil, fmt.Errorf("unpack %s: %w: no manifest first", pack, ErrMismatch)
	}
	var entries []PackEntry
	if err := json.NewDecoder(tr).Decode(&entries); err != nil {
		return nil, fmt.Errorf("unpack %s: manifest: %w", pack, err)
	}
	want := map[string]PackEntry{}
	for _, e := range entries {
		want[e.Name] = e
	}
	var paths []string
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("unpack %s: %w", pack, err)
		}
		e, ok := want[h.Name]
		if !ok || strings.ContainsAny(h.Name, "/\\") || h.Name == ".." {
			return nil, fmt.Errorf("unpack %s: %w: unexpected member %q", pack, ErrMismatch, h.Name)
		}
		delete(want, h.Name)
		p := filepath.Join(dir, h.Name)
		out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if err != nil {
			return nil, err
		}
		// Unpacked files are working copies in scratch, checked against the
		// pack's manifest here; they are not fsynced one by one (the pack
		// itself was staged and verified).
		d := xxhash.New()
		n, err := io.Copy(io.MultiWriter(out, d), tr)
		out.Close()
		if err != nil {
			return nil, err
		}
		if n != e.Size || fmt.Sprintf("%016x", d.Sum64()) != e.XXH64 {
			return nil, fmt.Errorf("unpack %s: %w: %s", pack, ErrMismatch, h.Name)
		}
		paths = append(paths, p)
	}
	for name := range want {
		return nil, fmt.Errorf("unpack %s: %w: %s is missing", pack, ErrMismatch, name)
	}
	return paths, nil
}

func hashPath(p string) (int64, string, error) {
	in, err := os.Open(p)
	if err != nil {
		return 0, "", err
	}
	defer in.Close()
	d := xxhash.New()
	n, err := io.Copy(d, in)
	return n, fmt.Sprintf("%016x", d.Sum64()), err
}
