package stream

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// FuzzManifest feeds arbitrary bytes to LoadManifest as a manifest. It
// must not panic; an error wraps ErrInvalidManifest and every line of it
// names the file; an accepted manifest has valid, unique ids, declared
// classes and inputs that are existing files, and ManifestIDs (which the
// check of two runs sharing an output directory reads) finds the same ids
// and hash. `go test` runs the seeds; `go test -fuzz FuzzManifest
// ./stream` searches further.
func FuzzManifest(f *testing.F) {
	for _, seed := range []string{
		`{"id":"a","inputs":["in"]}` + "\n" + `{"id":"b","inputs":["in"],"class":"gpu","params":{"k":"v"},"cost":5}`,
		"\xEF\xBB\xBF" + `{"id":"bom","inputs":["in"]}` + "\n",
		`{"inputs":["in"]}` + "\r\n\r\n" + `{"inputs":["in"]}`,
		`{"id":"a","inputs":["in"]}` + "\n" + `{"id":"a","inputs":["in"]}`,
		`{"id":"a b"}`, `{"ID":"x"}`, `{"id":1}`, `[1,2]`, `{"id":"a","inputs":["in"],"cost":-1}`,
		`{"id":"a","inputs":["nope"]}`, `{"id":"a","inputs":[""]}`, `{"id":"a","params":{"=":"x"}}`,
		`{"id":"a","class":"tpu","inputs":["in"]}`, `{"id":"a","inputs":["in"],"id":"b"}`, "\n\n", "{",
	} {
		f.Add([]byte(seed))
	}
	dir := f.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "in"), []byte("x"), 0o644); err != nil {
		f.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "adir"), 0o755); err != nil {
		f.Fatal(err)
	}
	specPath := filepath.Join(dir, "shardpool.toml")
	src := "name = \"fz\"\nmanifest = \"m.jsonl\"\noutput = \"out\"\ncommand = [\"cat\", \"{inputs}\"]\n[class.cpu]\n[class.gpu]\ngpus = 1\n"
	if err := os.WriteFile(specPath, []byte(src), 0o644); err != nil {
		f.Fatal(err)
	}
	spec, err := LoadSpec(specPath)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(spec.Manifest, data, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := LoadManifest(spec)
		if err != nil {
			if !errors.Is(err, ErrInvalidManifest) {
				t.Fatalf("error does not wrap ErrInvalidManifest: %v", err)
			}
			for _, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, spec.Manifest+":") {
					t.Fatalf("error line %q does not begin with the manifest's path", line)
				}
			}
			return
		}
		if len(m.Shards) == 0 {
			t.Fatal("accepted a manifest with no shards")
		}
		if want := fmt.Sprintf("%016x", xxhash.Sum64(data)); m.Hash != want {
			t.Fatalf("hash %s, want %s (the file's bytes)", m.Hash, want)
		}
		seen := map[string]bool{}
		for _, sh := range m.Shards {
			if !ValidShardID(sh.ID) || seen[sh.ID] {
				t.Fatalf("line %d: id %q invalid or repeated", sh.Line, sh.ID)
			}
			seen[sh.ID] = true
			if _, ok := spec.Classes[sh.Class]; !ok || sh.Cost < 0 {
				t.Fatalf("line %d: class %q undeclared or cost %d negative", sh.Line, sh.Class, sh.Cost)
			}
			for _, in := range sh.Inputs {
				if st, err := os.Stat(in); err != nil || !st.Mode().IsRegular() || !filepath.IsAbs(in) {
					t.Fatalf("line %d: input %q is not an absolute path of a file (%v)", sh.Line, in, err)
				}
			}
		}
		ids, hash, err := ManifestIDs(spec.Manifest)
		if err != nil || hash != m.Hash || len(ids) != len(seen) {
			t.Fatalf("ManifestIDs: %d ids, hash %s, %v; LoadManifest: %d ids, hash %s", len(ids), hash, err, len(seen), m.Hash)
		}
		for id := range seen {
			if !ids[id] {
				t.Fatalf("ManifestIDs misses id %q that LoadManifest accepted", id)
			}
		}
	})
}

// FuzzParseSize: no input panics, and a size parsed is never negative.
func FuzzParseSize(f *testing.F) {
	for _, s := range []string{"512MiB", "1.5G", "0", " 2 GiB ", "1e3", ".", "-1", "99999999999999999999TiB", "NaN", "1..2k"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if n, err := ParseSize(s); err == nil && n < 0 {
			t.Fatalf("ParseSize(%q) = %d", s, n)
		}
	})
}

// FuzzSpec feeds arbitrary bytes to the spec parser: no panic, and an
// error wraps ErrInvalidSpec and begins with the spec's path.
func FuzzSpec(f *testing.F) {
	for _, seed := range []string{
		"name = \"a\"\nmanifest = \"m.jsonl\"\noutput = \"out\"\ncommand = [\"cat\", \"{inputs}\"]\nretries = 2\ntimeout = \"5s\"\n[class.cpu]\ncpus = 2\nmemory = \"64MiB\"\n",
		"name = \"a\"\nmanifest = \"m.jsonl\"\noutput = \"out\"\ncommand = [\"cat\", \"{inptus}\"]\n",
		"name = \"A B\"\n", "[class.gpu]\ngpus = -1\n", "retries = \"x\"\n", "command = []\n", "timeout = \"forever\"\n",
		"name = \"a\"\nmanifest = \"m\"\noutput = \"o\"\ncommand = [\"cat\"]\n[class.cpu]\nmemory = \"lots\"\n", "[[x]]\n", "=",
	} {
		f.Add([]byte(seed))
	}
	dir := f.TempDir()
	abs := filepath.Join(dir, "shardpool.toml")
	f.Fuzz(func(t *testing.T, src []byte) {
		s, err := parseSpec(abs, src)
		if err == nil {
			if s.Name == "" || len(s.Command) == 0 {
				t.Fatalf("accepted a spec without a name or a command: %+v", s)
			}
			return
		}
		if !errors.Is(err, ErrInvalidSpec) || !strings.HasPrefix(err.Error(), abs) {
			t.Fatalf("error %q does not wrap ErrInvalidSpec or name the spec first", err)
		}
	})
}
