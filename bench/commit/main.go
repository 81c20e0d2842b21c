// Command commit is the output commit benchmark behind `make bench`: a
// shard's {out} committed the way a worker commits it (moved into a
// temporary directory beside the destination, every file checksummed,
// one syncfs, the marker last, the rename) and the final verification that
// reads every byte back, against `cp -r` (and then `sync`), and reading every
// file with cat, in the same run. Two outputs: 20,000 small files in 100
// directories, and 1 GiB in four files. Three interleaved rounds,
// medians. It prints numbers; it asserts nothing.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/shardpool/shardpool/checkpoint"
)

func main() {
	small := flag.Int("small", 20000, "small files (100 bytes each, 200 a directory)")
	large := flag.Int("large-mib", 1024, "MiB of large files (in four files)")
	rounds := flag.Int("rounds", 3, "interleaved rounds")
	flag.Parse()
	dir, err := os.MkdirTemp("", "shardpool-commit-bench-")
	check(err)
	defer os.RemoveAll(dir)
	fmt.Printf("output commit benchmark in %s\n", dir)
	bench(dir, "small", fmt.Sprintf("%d files of 100 bytes in %d directories", *small, (*small+199)/200), *rounds, func(src string) {
		b := make([]byte, 100)
		for i := range *small {
			d := filepath.Join(src, "parts", fmt.Sprintf("d%03d", i/200))
			if i%200 == 0 {
				check(os.MkdirAll(d, 0o755))
			}
			fill(b, uint64(i))
			check(os.WriteFile(filepath.Join(d, fmt.Sprintf("f%05d.txt", i)), b, 0o644))
		}
	})
	bench(dir, "large", fmt.Sprintf("%d MiB in 4 files", *large), *rounds, func(src string) {
		check(os.MkdirAll(src, 0o755))
		buf := make([]byte, 4<<20)
		for i := range 4 {
			f, err := os.Create(filepath.Join(src, fmt.Sprintf("part-%d.bin", i)))
			check(err)
			for w := 0; w < *large<<20/4; w += len(buf) {
				fill(buf, uint64(i*1000+w))
				_, err := f.Write(buf)
				check(err)
			}
			check(f.Close())
		}
	})
}

// bench times, per round, a commit and its verification against cp -r +
// sync and cat of every file, each on a fresh copy of the output made by
// gen and synced first.
func bench(dir, name, what string, rounds int, gen func(src string)) {
	var commit, verify, cp, cpSync, cat []time.Duration
	for r := range rounds {
		src := filepath.Join(dir, fmt.Sprintf("%s-src-%d", name, r))
		gen(src)
		check(exec.Command("sync").Run())
		// Baselines first, on the same files (left in place by them).
		cpDst := filepath.Join(dir, fmt.Sprintf("%s-cp-%d", name, r))
		t := time.Now()
		run("cp", "-r", src, cpDst)
		cp = append(cp, time.Since(t))
		run("sync")
		cpSync = append(cpSync, time.Since(t))
		t = time.Now()
		run("sh", "-c", `find "$1" -type f -exec cat {} + > /dev/null`, "sh", src)
		cat = append(cat, time.Since(t))
		check(os.RemoveAll(cpDst))
		run("sync")

		dst := filepath.Join(dir, fmt.Sprintf("%s-out-%d", name, r), "s1")
		check(os.MkdirAll(filepath.Dir(dst), 0o755))
		syncfs := func(string) error {
			f, err := os.Open(dir)
			if err != nil {
				return err
			}
			defer f.Close()
			return unix.Syncfs(int(f.Fd()))
		}
		t = time.Now()
		p, err := checkpoint.Prepare(context.Background(), dst, src, checkpoint.Options{Move: true, Sync: syncfs})
		check(err)
		check(p.Publish(""))
		commit = append(commit, time.Since(t))
		t = time.Now()
		_, err = checkpoint.Verify(dst)
		check(err)
		verify = append(verify, time.Since(t))
		check(os.RemoveAll(src))
		check(os.RemoveAll(filepath.Dir(dst)))
		run("sync")
	}
	fmt.Printf("\n%s output: %s, %d rounds (median, range)\n", name, what, rounds)
	row := func(label string, d []time.Duration) {
		lo, mid, hi := spread(d)
		fmt.Printf("  %-56s %7.3fs (%.3f–%.3f)\n", label, mid, lo, hi)
	}
	row("cp -r", cp)
	row("cp -r then sync", cpSync)
	row("shardpool commit (move, xxh64, syncfs, marker, rename)", commit)
	row("cat of every file", cat)
	row("shardpool verify (reads every byte)", verify)
	_, c, _ := spread(commit)
	_, b, _ := spread(cp)
	_, v, _ := spread(verify)
	_, k, _ := spread(cat)
	fmt.Printf("  speed ratios: commit / cp -r %.2fx (cp -r copies and syncs nothing; the commit moves, checksums and syncs); verify / cat %.2fx\n", b/c, k/v)
}

func spread(d []time.Duration) (lo, mid, hi float64) {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[0].Seconds(), s[len(s)/2].Seconds(), s[len(s)-1].Seconds()
}

// fill writes pseudo-random bytes seeded by seed into b.
func fill(b []byte, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := 0; i < len(b); i += 8 {
		v := rng.Uint64()
		for j := 0; j < 8 && i+j < len(b); j++ {
			b[i+j] = byte(v >> (8 * j))
		}
	}
}

func run(name string, args ...string) {
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v %s\n", name, err, out)
		os.Exit(1)
	}
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
