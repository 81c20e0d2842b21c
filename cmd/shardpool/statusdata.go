package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
)

// serverFromData finds the coordinator serving the state directory dir
// (for run, when named): the client URL of a `shardpool run` or
// `shardpool coordinator` that holds a store there now. ok is false when
// none does; the caller then reports what the evidence says.
func serverFromData(dir, run string) (url string, ok bool, err error) {
	lives, err := coordinator.LiveIn(dir)
	if err != nil {
		return "", false, err
	}
	var pick *coordinator.Live
	switch {
	case run != "":
		// The run's own store, else the daemon's (which serves many).
		for i := range lives {
			if lives[i].Run == run {
				pick = &lives[i]
			}
		}
		if pick == nil && len(lives) > 0 && lives[0].Run == "" {
			pick = &lives[0]
		}
	case len(lives) == 1:
		pick = &lives[0]
	case len(lives) > 1:
		var names []string
		for _, l := range lives {
			names = append(names, fmt.Sprintf("%s at %s", liveName(l), orStarting(l.URL)))
		}
		return "", false, exitErr{code: exitUsage, msg: fmt.Sprintf("%d coordinators serve %s: %s; name a run (shardpool status --data %s RUN) or give --server",
			len(lives), dir, strings.Join(names, ", "), shellQuote(dir))}
	}
	if pick == nil {
		return "", false, nil
	}
	if pick.URL == "" {
		return "", false, fmt.Errorf("the coordinator of %s (%s) has not written where it listens: it is starting (try again in a moment), or it is an older shardpool (give --server with the URL it printed)", liveName(*pick), pick.Holder)
	}
	return pick.URL, true, nil
}

func liveName(l coordinator.Live) string {
	if l.Run == "" {
		return "shardpool coordinator"
	}
	return "run " + l.Run
}

func orStarting(url string) string {
	if url == "" {
		return "(starting)"
	}
	return url
}

// printStopped says what the evidence under dir records for runs that no
// coordinator serves now: each run's last verdict (final.json) and how to
// resume it. With run empty, every run in dir is listed.
func printStopped(w io.Writer, dir, run string) error {
	runs := []string{run}
	if run == "" {
		entries, err := os.ReadDir(filepath.Join(dir, "runs"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		runs = runs[:0]
		for _, e := range entries {
			if e.IsDir() {
				runs = append(runs, e.Name())
			}
		}
		if len(runs) == 0 {
			return exitErr{code: exitFailure, msg: fmt.Sprintf("no coordinator serves %s, and it holds no run's evidence (is it the --data of a run?)", dir)}
		}
	} else if _, err := os.Stat(filepath.Join(dir, "runs", run)); err != nil {
		return exitErr{code: exitFailure, msg: fmt.Sprintf("no coordinator serves %s, and it holds no evidence of run %s (%s)", dir, run, filepath.Join(dir, "runs", run))}
	}
	fmt.Fprintf(w, "no coordinator serves %s now; from the evidence of each run:\n", dir)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATE\tTOTAL\tVALIDATED\tFAILED\tRECORDED\tFINGERPRINT")
	var notes []string
	for _, name := range runs {
		evidence := filepath.Join(dir, "runs", name)
		var f coordinator.Final
		b, err := os.ReadFile(filepath.Join(evidence, "final.json"))
		if err == nil {
			err = json.Unmarshal(b, &f)
		}
		resume, _ := os.ReadFile(filepath.Join(evidence, "resume.txt"))
		again := strings.TrimSpace(string(resume))
		if err != nil {
			// Interrupted, killed, or still before its first verdict.
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\n", name)
			why := "no verdict recorded: interrupted or killed before it ended"
			if !errors.Is(err, os.ErrNotExist) {
				why = fmt.Sprintf("final.json unreadable: %v", err)
			}
			notes = append(notes, fmt.Sprintf("%s: %s", name, why))
			if again != "" {
				notes = append(notes, fmt.Sprintf("%s: resume with: %s", name, again))
			}
			continue
		}
		c := f.Counts
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", name, f.State, c.Total, c.Validated, c.Failed, f.Written.Local().Format("2006-01-02 15:04:05"), f.Fingerprint)
		if f.Reason != "" {
			notes = append(notes, fmt.Sprintf("%s: %s", name, f.Reason))
		}
		if f.State != stream.RunComplete && f.Resume != "" {
			notes = append(notes, fmt.Sprintf("%s: resume with: %s", name, f.Resume))
		}
	}
	tw.Flush()
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	return nil
}
