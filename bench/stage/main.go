// Command stage is the staging benchmark behind `make bench`: 2 GiB of
// large files and 20,000 small files from one local directory to another,
// staged with checksums and fsync, against `cp -r` (and a tar pipe for the
// small files) in the same run, plus how closely the bandwidth limit holds.
// It prints numbers; it asserts nothing.
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
)

func main() {
	large := flag.Int("large-mib", 2048, "MiB of large files (256 MiB each)")
	small := flag.Int("small", 20000, "small files (1 KiB each)")
	flag.Parse()
	dir, err := os.MkdirTemp("", "shardpool-stage-bench-")
	check(err)
	defer os.RemoveAll(dir)
	ctx := context.Background()
	fmt.Printf("staging benchmark in %s\n", dir)

	// Large files.
	src := filepath.Join(dir, "large")
	check(os.MkdirAll(src, 0o755))
	var paths []string
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 4<<20)
	for i := 0; i < *large/256; i++ {
		p := filepath.Join(src, fmt.Sprintf("part-%02d.bin", i))
		f, err := os.Create(p)
		check(err)
		for w := 0; w < 256<<20; w += len(buf) {
			for j := 0; j < len(buf); j += 8 {
				buf[j] = byte(rng.Uint32())
			}
			f.Write(buf)
		}
		f.Close()
		paths = append(paths, p)
	}
	exec.Command("sync").Run()
	cpLarge := timeCmd("cp", "-r", src, filepath.Join(dir, "cp-large"))
	cpLargeSync := cpLarge + timeCmd("sync")
	hashes := staging.LoadHashes("")
	t := time.Now()
	files := describeAll(ctx, hashes, paths)
	describe := time.Since(t)
	st, err := staging.New(staging.Config{Dir: filepath.Join(dir, "stage-large"), Concurrency: 2})
	check(err)
	check(st.Check(ctx))
	t = time.Now()
	staged, err := st.Stage(ctx, files, 0)
	check(err)
	stageLarge := time.Since(t)
	staged.Release()
	mib := float64(*large)
	fmt.Printf("\nlarge files: %d MiB in %d files\n", *large, len(paths))
	fmt.Printf("  cp -r:                         %6.2fs  %7.1f MiB/s\n", cpLarge.Seconds(), mib/cpLarge.Seconds())
	fmt.Printf("  cp -r then sync:               %6.2fs  %7.1f MiB/s\n", cpLargeSync.Seconds(), mib/cpLargeSync.Seconds())
	fmt.Printf("  shardpool stage (xxh64, fsync, verify against the recorded checksum): %6.2fs  %7.1f MiB/s\n", stageLarge.Seconds(), mib/stageLarge.Seconds())
	fmt.Printf("  describe (checksums at submit, once per run, cached): %.2fs\n", describe.Seconds())
	fmt.Printf("  ratio stage / cp -r: %.2fx (target >= 0.9x); stage / (cp -r + sync): %.2fx\n", cpLarge.Seconds()/stageLarge.Seconds(), cpLargeSync.Seconds()/stageLarge.Seconds())
	os.RemoveAll(filepath.Join(dir, "cp-large"))
	os.RemoveAll(filepath.Join(dir, "stage-large"))

	// Bandwidth limit: 256 MiB at 64 MiB/s.
	limit := int64(64 << 20)
	st, err = staging.New(staging.Config{Dir: filepath.Join(dir, "stage-bw"), BytesPerSec: limit})
	check(err)
	check(st.Check(ctx))
	t = time.Now()
	staged, err = st.Stage(ctx, files[:1], 0)
	check(err)
	bw := float64(files[0].Size) / time.Since(t).Seconds()
	staged.Release()
	fmt.Printf("\nbandwidth limit 64 MiB/s: measured %.1f MiB/s (%.1f%% of the limit; target within 10%%)\n", bw/(1<<20), 100*bw/float64(limit))
	os.RemoveAll(filepath.Join(dir, "stage-bw"))
	os.RemoveAll(src)

	// Small files.
	srcS := filepath.Join(dir, "small")
	check(os.MkdirAll(srcS, 0o755))
	var spaths []string
	one := make([]byte, 1024)
	for i := 0; i < *small; i++ {
		p := filepath.Join(srcS, fmt.Sprintf("f%06d.txt", i))
		for j := range one {
			one[j] = byte(rng.Uint32())
		}
		check(os.WriteFile(p, one, 0o644))
		spaths = append(spaths, p)
	}
	exec.Command("sync").Run()
	n := float64(*small)
	cpS := timeCmd("cp", "-r", srcS, filepath.Join(dir, "cp-small"))
	check(os.MkdirAll(filepath.Join(dir, "tar-small"), 0o755))
	tarS := timeCmd("sh", "-c", `tar -C "$1" -cf - . | tar -C "$2" -xf -`, "sh", srcS, filepath.Join(dir, "tar-small"))
	sfiles := describeAll(ctx, hashes, spaths)
	st, err = staging.New(staging.Config{Dir: filepath.Join(dir, "stage-small"), Concurrency: 8})
	check(err)
	check(st.Check(ctx))
	t = time.Now()
	staged, err = st.Stage(ctx, sfiles, 0)
	check(err)
	stageS := time.Since(t)
	staged.Release()
	// Packed: one tar per shard made at submit, staged as one file, unpacked locally.
	pack := filepath.Join(dir, "small.tar")
	t = time.Now()
	_, err = staging.Pack(ctx, pack, spaths)
	check(err)
	packT := time.Since(t)
	pf := describeAll(ctx, hashes, []string{pack})
	st, err = staging.New(staging.Config{Dir: filepath.Join(dir, "stage-pack")})
	check(err)
	check(st.Check(ctx))
	t = time.Now()
	staged, err = st.Stage(ctx, pf, 0)
	check(err)
	out := filepath.Join(dir, "unpacked")
	check(os.MkdirAll(out, 0o755))
	_, err = staging.Unpack(ctx, staged.Paths[0], out)
	check(err)
	packStage := time.Since(t)
	staged.Release()
	fmt.Printf("\nsmall files: %d files of 1 KiB\n", *small)
	fmt.Printf("  cp -r:                                %6.2fs  %8.0f files/s\n", cpS.Seconds(), n/cpS.Seconds())
	fmt.Printf("  tar pipe:                             %6.2fs  %8.0f files/s\n", tarS.Seconds(), n/tarS.Seconds())
	fmt.Printf("  shardpool stage, file by file (fsync each): %6.2fs  %8.0f files/s\n", stageS.Seconds(), n/stageS.Seconds())
	fmt.Printf("  shardpool stage of a pack + verified unpack: %6.2fs  %8.0f files/s (packing at submit: %.2fs)\n", packStage.Seconds(), n/packStage.Seconds(), packT.Seconds())
	fmt.Printf("  bytes: %s\n", stream.FormatSize(int64(*small)*1024))
}

func describeAll(ctx context.Context, h *staging.Hashes, paths []string) []stream.InputFile {
	var out []stream.InputFile
	for _, p := range paths {
		f, err := h.Describe(ctx, p)
		check(err)
		out = append(out, f)
	}
	return out
}

func timeCmd(name string, args ...string) time.Duration {
	t := time.Now()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v %s\n", name, err, out)
		os.Exit(1)
	}
	return time.Since(t)
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}
