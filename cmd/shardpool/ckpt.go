package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/stream"
)

func cmdCkpt(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const syn = "shardpool ckpt commit [--retain N] DIR SRC... | ckpt latest [--json] DIR | ckpt verify [--json] DIR | ckpt replicate DIR DEST"
	if len(args) == 0 {
		fmt.Fprintln(stderr, "Usage:", syn)
		return errUsage
	}
	switch args[0] {
	case "-h", "--help", "help":
		// Asked for: the usage, and exit 0 as every other --help.
		fmt.Fprintln(stderr, "Usage:", syn)
		fmt.Fprintln(stderr, "\nRun 'shardpool ckpt COMMAND --help' for a command's flags.")
		return errHelp
	case "commit":
		fs := newFlags("ckpt commit", "shardpool ckpt commit [--retain N] DIR SRC...", stderr)
		retain := fs.Int("retain", 0, "keep this many verified generations (0 keeps all)")
		pos, err := parse(fs, args[1:])
		if err != nil {
			return err
		}
		if len(pos) < 2 {
			fs.Usage()
			return errUsage
		}
		g, err := checkpoint.Commit(ctx, pos[0], pos[1:], checkpoint.Options{Retain: *retain})
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, g.Path)
		return nil
	case "latest":
		fs := newFlags("ckpt latest", "shardpool ckpt latest [--json] DIR", stderr)
		asJSON := fs.Bool("json", false, "print the generation (and the newer ones skipped) as JSON")
		pos, err := parse(fs, args[1:])
		if err != nil {
			return err
		}
		if len(pos) != 1 {
			fs.Usage()
			return errUsage
		}
		g, rejected, err := checkpoint.Latest(pos[0])
		if err != nil && !errors.Is(err, checkpoint.ErrNoGeneration) {
			return err
		}
		if *asJSON {
			rep := latestReport{Skipped: rejected}
			if err == nil {
				rep.Generation, rep.Path, rep.Time, rep.Files, rep.Bytes, rep.Checksum =
					g.N, g.Path, &g.Marker.Time, g.Marker.Files, g.Marker.Bytes, g.Marker.Manifest
			}
			if rep.Skipped == nil {
				rep.Skipped = []checkpoint.Report{}
			}
			if werr := writeJSON(stdout, rep); werr != nil {
				return werr
			}
		} else {
			for _, r := range rejected {
				fmt.Fprintf(stderr, "shardpool: skipped generation %d: %s\n", r.N, r.Reason)
			}
			if err == nil {
				fmt.Fprintln(stdout, g.Path)
			}
		}
		if err != nil {
			return exitErr{code: exitUnverified, msg: err.Error()}
		}
		return nil
	case "replicate":
		fs := newFlags("ckpt replicate", "shardpool ckpt replicate DIR DEST  (copies DIR's newest verified generation to DEST/gen-N)", stderr)
		pos, err := parse(fs, args[1:])
		if err != nil {
			return err
		}
		if len(pos) != 2 {
			fs.Usage()
			return errUsage
		}
		g, _, err := checkpoint.Latest(pos[0])
		if errors.Is(err, checkpoint.ErrNoGeneration) {
			return exitErr{code: exitUnverified, msg: err.Error()}
		}
		if err != nil {
			return err
		}
		r, err := checkpoint.Replicate(ctx, g.Path, filepath.Join(pos[1], filepath.Base(g.Path)))
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "%s -> %s: %d bytes in %.3fs\n", r.Source, r.Path, r.Bytes, r.Seconds)
		return nil
	case "verify":
		fs := newFlags("ckpt verify", "shardpool ckpt verify [--json] DIR  (checkpoint generations, or a committed output <output>/<id>)", stderr)
		asJSON := fs.Bool("json", false, "print the reports as JSON")
		pos, err := parse(fs, args[1:])
		if err != nil {
			return err
		}
		if len(pos) != 1 {
			fs.Usage()
			return errUsage
		}
		if _, err := os.Stat(filepath.Join(pos[0], checkpoint.MarkerName)); err == nil {
			// A committed output (<output>/<id>/) rather than a directory
			// of checkpoint generations: verify every byte of it.
			return verifyOutput(pos[0], *asJSON, stdout)
		}
		reports, err := checkpoint.VerifyAll(pos[0])
		if err != nil {
			return err
		}
		bad := 0
		for _, r := range reports {
			if !r.OK {
				bad++
			}
		}
		if *asJSON {
			if reports == nil {
				reports = []checkpoint.Report{}
			}
			if err := writeJSON(stdout, reports); err != nil {
				return err
			}
		} else {
			for _, r := range reports {
				status := "ok"
				if !r.OK {
					status = "FAILED " + r.Reason
				}
				fmt.Fprintf(stdout, "gen %d %s\n", r.N, status)
			}
		}
		if bad > 0 {
			return exitErr{code: exitUnverified, msg: fmt.Sprintf("%d of %d generation(s) failed verification", bad, len(reports))}
		}
		if len(reports) == 0 {
			return exitErr{code: exitUnverified, msg: "no generations in " + pos[0]}
		}
		return nil
	}
	fmt.Fprintf(stderr, "shardpool: unknown ckpt command %q\n\nUsage: %s\n", args[0], syn)
	return errUsage
}

// latestReport is `ckpt latest --json`: the newest generation that
// verifies (generation 0 and path "" when none does, with exit 4) and the
// newer ones skipped, each with why.
type latestReport struct {
	Generation int64               `json:"generation"`
	Path       string              `json:"path"`
	Time       *time.Time          `json:"time,omitempty"`
	Files      int                 `json:"files"`
	Bytes      int64               `json:"bytes"`
	Checksum   string              `json:"manifest_xxh64,omitempty"`
	Skipped    []checkpoint.Report `json:"skipped"`
}

// outputReport is `ckpt verify --json` of a committed output.
type outputReport struct {
	Output      string `json:"output"`
	OK          bool   `json:"ok"`
	Reason      string `json:"reason,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	Checksum    string `json:"checksum,omitempty"`
	Files       int    `json:"files"`
	Bytes       int64  `json:"bytes"`
}

// verifyOutput reads back every file of a committed output against its
// COMPLETE marker.
func verifyOutput(dir string, asJSON bool, stdout io.Writer) error {
	mk, err := checkpoint.Verify(dir)
	r := outputReport{Output: dir, OK: err == nil, Fingerprint: mk.Fingerprint, Checksum: mk.Manifest, Files: mk.Files, Bytes: mk.Bytes}
	if err != nil {
		r.Reason = err.Error()
	}
	if asJSON {
		if werr := writeJSON(stdout, r); werr != nil {
			return werr
		}
	} else if err == nil {
		fmt.Fprintf(stdout, "output %s ok: %d file(s), %s, fingerprint %s, checksum %s\n", dir, mk.Files, stream.FormatSize(mk.Bytes), mk.Fingerprint, mk.Manifest)
	}
	if err != nil {
		return exitErr{code: exitUnverified, msg: fmt.Sprintf("output %s failed verification: %v", dir, err)}
	}
	return nil
}
