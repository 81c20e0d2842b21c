package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
)

// sizeFlag is a size with units ("100MiB"); 0 means none.
type sizeFlag int64

func (s *sizeFlag) String() string { return fmt.Sprint(int64(*s)) }

func (s *sizeFlag) Set(v string) error {
	n, err := stream.ParseSize(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

// stagingFlags are the per-host staging bounds shared by run, worker and stage.
type stagingFlags struct {
	concurrency int
	bwlimit     sizeFlag
	cache       sizeFlag
	fleet       int
}

func (f *stagingFlags) register(fs *flag.FlagSet) {
	f.concurrency = 2
	fs.Var(atLeast{&f.concurrency, 1, "at least 1"}, "stage-concurrency", "`N` input copies at once on this host, shared by this user's workers and stage commands there (independent of slots)")
	fs.Var(&f.bwlimit, "stage-bwlimit", "`SIZE`: bytes per second for staging on this host, shared by this user's workers and stage commands there, e.g. 200MiB (0: unbounded)")
	fs.Var(&f.cache, "stage-cache", "`SIZE`: bytes of staged inputs kept for later shards, e.g. 20GiB (0: removed after each shard)")
	fs.Var(atLeast{&f.fleet, 0, "a number of copies, or 0 for no fleet-wide bound"}, "stage-fleet", "`N` input copies at once across every worker (0: no fleet-wide bound; set the same on every worker)")
}

// atLeast is an int flag refused below min when parsed (usage, exit 2):
// --stage-concurrency -1 ran with the default, --stage-fleet -2 with no
// bound, and neither said so.
type atLeast struct {
	n    *int
	min  int
	want string
}

func (f atLeast) String() string {
	if f.n == nil {
		return "0"
	}
	return strconv.Itoa(*f.n)
}

func (f atLeast) Set(v string) error {
	n, err := strconv.Atoi(v)
	if err != nil {
		return fmt.Errorf("%q: want a whole number", v)
	}
	if n < f.min {
		return fmt.Errorf("%d: want %s", n, f.want)
	}
	*f.n = n
	return nil
}

func (f *stagingFlags) config(dir string) staging.Config {
	return staging.Config{Dir: dir, Concurrency: f.concurrency, BytesPerSec: int64(f.bwlimit), CacheBytes: int64(f.cache)}
}

// StageReport is staging.json.
type StageReport struct {
	Run     string `json:"run"`
	Scratch string `json:"scratch"`
	Shards  int    `json:"shards"`
	// Skipped counts shards of classes that do not stage (read in place).
	Skipped int           `json:"skipped,omitempty"`
	Total   staging.Stats `json:"total"`
	Written time.Time     `json:"written"`
}

func cmdStage(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("stage", "shardpool stage [--scratch DIR] [--stage-bwlimit SIZE] [--stage-concurrency N] [--json] SPEC", stderr)
	scratch := fs.String("scratch", "", "local scratch `DIR` to stage into (default: the stage directory of the worker's default scratch)")
	data := fs.String("data", worker.DefaultStateDir(), "state `DIR`: input checksum cache and evidence")
	asJSON := fs.Bool("json", false, "print staging.json")
	var sf stagingFlags
	sf.register(fs)
	spec, man, err := parseSpec(fs, args)
	if err != nil {
		return err
	}
	// Refused before anything is made: no scratch directory, no cache.
	stages := 0
	for _, sh := range man.Shards {
		if spec.StageFor(sh.Class) {
			stages++
		}
	}
	if stages == 0 {
		return fmt.Errorf("%s: %w: none of its %d shard(s) stages its inputs (stage is false for the spec and for their classes), so workers read them in place and would not use a copy: set stage = true in the spec, or in a [class.NAME] table, to have them copied to local scratch",
			spec.SpecPath, errNothingToStage, len(man.Shards))
	}
	if *scratch == "" {
		dir, err := worker.PolicyScratch("", worker.DefaultName())
		if err != nil {
			return err
		}
		*scratch = filepath.Join(dir, "stage")
	}
	cfg := sf.config(*scratch)
	// Within the bounds of the workers staging on this host.
	cfg.HostDir = worker.StageHostDir(worker.DefaultLedgerDir())
	if cfg.CacheBytes == 0 {
		// Staging ahead of a run keeps what it staged.
		cfg.CacheBytes = 1 << 62
	}
	st, err := staging.New(cfg)
	if err != nil {
		return err
	}
	if err := st.Check(ctx); err != nil {
		return err
	}
	hashes := staging.LoadHashes(filepath.Join(*data, "inputs-cache.json"))
	rep := StageReport{Run: spec.Name, Scratch: *scratch, Skipped: len(man.Shards) - stages}
	start := time.Now()
	packing := staging.NewPacking(spec.Pack)
	for _, sh := range man.Shards {
		if !spec.StageFor(sh.Class) {
			// Its workers read the inputs in place: a copy would not be
			// used (counted in rep.Skipped above).
			continue
		}
		// What the worker will look for: a shard of many small inputs is
		// staged as the pack submit makes (made here if it is not there).
		files, err := staging.DescribeShard(ctx, hashes, packing, staging.PackDir(spec.Output), sh.ID, sh.Inputs, sh.Cost)
		if err != nil {
			return fmt.Errorf("%s line %d: shard %s: %w", man.Path, sh.Line, sh.ID, err)
		}
		staged, err := st.Stage(ctx, files, 0)
		if err != nil {
			return fmt.Errorf("shard %s: %w", sh.ID, err)
		}
		s := staged.Stats
		rep.Shards++
		rep.Total.Files += s.Files
		rep.Total.Bytes += s.Bytes
		rep.Total.Copied += s.Copied
		rep.Total.Resumed += s.Resumed
		rep.Total.Reused += s.Reused
		rep.Total.Refetched += s.Refetched
		rep.Total.VerifySeconds += s.VerifySeconds
		staged.Release()
	}
	if err := hashes.Save(); err != nil {
		return err
	}
	rep.Total.Seconds = time.Since(start).Seconds()
	if rep.Total.Seconds > 0 {
		rep.Total.BytesPerSec = float64(rep.Total.Copied) / rep.Total.Seconds
		rep.Total.FilesPerSec = float64(rep.Total.Files) / rep.Total.Seconds
	}
	rep.Written = time.Now().UTC()
	b, _ := json.MarshalIndent(rep, "", "  ")
	dir := filepath.Join(*data, "runs", spec.Name)
	if err := os.MkdirAll(dir, 0o755); err == nil {
		_ = checkpoint.WriteFile(filepath.Join(dir, "staging.json"), append(b, '\n'))
	}
	if *asJSON {
		return writeJSON(stdout, rep)
	}
	t := rep.Total
	fmt.Fprintf(stdout, "staged %d shard(s), %d file(s), %s into %s in %.2fs: %s copied (%s resumed), %d reused after verification, %d re-fetched; %.1f MiB/s, %.0f files/s, verify %.2fs\n",
		rep.Shards, t.Files, stream.FormatSize(t.Bytes), *scratch, t.Seconds, stream.FormatSize(t.Copied), stream.FormatSize(t.Resumed), t.Reused, t.Refetched,
		t.BytesPerSec/(1<<20), t.FilesPerSec, t.VerifySeconds)
	if rep.Skipped > 0 {
		fmt.Fprintf(stdout, "skipped %d shard(s) of classes that do not stage: their workers read the inputs in place\n", rep.Skipped)
	}
	return nil
}

var errNothingToStage = errors.New("nothing to stage")
