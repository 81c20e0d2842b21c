package staging

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/cespare/xxhash/v2"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/stream"
)

// ChunkSize is the unit of resumption: a .part is kept up to the last whole
// chunk whose checksum matches.
const ChunkSize = 8 << 20

// Hashes is a cache of input descriptions keyed by path, size and mtime, so
// that a resubmission does not read every input again.
type Hashes struct {
	path  string
	mu    sync.Mutex
	m     map[string]stream.InputFile
	dirty bool
}

func cacheKey(path string, size, mtime int64) string {
	return fmt.Sprintf("%s\x00%d\x00%d", path, size, mtime)
}

// LoadHashes opens the cache file at path ("" for an in-memory cache).
func LoadHashes(path string) *Hashes {
	h := &Hashes{path: path, m: map[string]stream.InputFile{}}
	if path == "" {
		return h
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return h
	}
	var files []stream.InputFile
	if json.Unmarshal(b, &files) == nil {
		for _, f := range files {
			h.m[cacheKey(f.Path, f.Size, f.MTime)] = f
		}
	}
	return h
}

// Save writes the cache durably if it changed.
func (h *Hashes) Save() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.path == "" || !h.dirty {
		return nil
	}
	files := make([]stream.InputFile, 0, len(h.m))
	for _, f := range h.m {
		files = append(files, f)
	}
	b, err := json.Marshal(files)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(h.path), 0o755); err != nil {
		return err
	}
	h.dirty = false
	return checkpoint.WriteFile(h.path, b)
}

// Describe returns size, mtime and checksums of path, from the cache when
// path, size and mtime are unchanged, else by reading it.
func (h *Hashes) Describe(ctx context.Context, path string) (stream.InputFile, error) {
	st, err := os.Stat(path)
	if err != nil {
		return stream.InputFile{}, fmt.Errorf("describe %s: %w", path, err)
	}
	key := cacheKey(path, st.Size(), st.ModTime().UnixNano())
	h.mu.Lock()
	f, ok := h.m[key]
	h.mu.Unlock()
	if ok {
		return f, nil
	}
	in, err := os.Open(path)
	if err != nil {
		return stream.InputFile{}, fmt.Errorf("describe %s: %w", path, err)
	}
	defer in.Close()
	f = stream.InputFile{Path: path, Size: st.Size(), MTime: st.ModTime().UnixNano()}
	ch := newChunker(nil)
	if _, err := io.Copy(ch, &ctxReader{ctx, in}); err != nil {
		return stream.InputFile{}, fmt.Errorf("describe %s: %w", path, err)
	}
	f.Chunks, f.XXH64 = ch.finish()
	if ch.n != f.Size {
		return stream.InputFile{}, fmt.Errorf("describe %s: size changed while reading (%d, then %d bytes)", path, f.Size, ch.n)
	}
	h.mu.Lock()
	h.m[key], h.dirty = f, true
	h.mu.Unlock()
	return f, nil
}

// chunker hashes a stream whole and per ChunkSize piece. With want set, it
// fails as soon as a finished chunk differs from the recorded one.
type chunker struct {
	whole *xxhash.Digest
	chunk *xxhash.Digest
	in    int64 // bytes in the current chunk
	n     int64
	sums  []string
	want  []string
}

func newChunker(want []string) *chunker {
	return &chunker{whole: xxhash.New(), chunk: xxhash.New(), want: want}
}

func sum(d *xxhash.Digest) string { return fmt.Sprintf("%016x", d.Sum64()) }

func (c *chunker) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		k := min(int64(len(p)), ChunkSize-c.in)
		c.whole.Write(p[:k])
		c.chunk.Write(p[:k])
		c.in += k
		c.n += k
		p = p[k:]
		if c.in == ChunkSize {
			s := sum(c.chunk)
			if i := len(c.sums); c.want != nil && (i >= len(c.want) || c.want[i] != s) {
				return 0, fmt.Errorf("%w: chunk %d", ErrMismatch, i)
			}
			c.sums = append(c.sums, s)
			c.chunk.Reset()
			c.in = 0
		}
	}
	return total, nil
}

// finish returns the chunk sums (the last, partial chunk included) and the whole sum.
func (c *chunker) finish() ([]string, string) {
	sums := c.sums
	if c.in > 0 || c.n == 0 {
		sums = append(sums, sum(c.chunk))
	}
	return sums, sum(c.whole)
}

type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
