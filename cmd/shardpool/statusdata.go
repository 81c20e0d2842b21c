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
	"time"

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

// fromEvidence is the status document of a state directory that no
// coordinator serves: each run's last verdict (final.json) and, for runs
// that ended without one, how to resume them. With run empty, every run
// in dir.
func fromEvidence(dir, run string) (*coordinator.Status, error) {
	runs := []string{run}
	if run == "" {
		entries, err := os.ReadDir(filepath.Join(dir, "runs"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		runs = runs[:0]
		for _, e := range entries {
			if e.IsDir() {
				runs = append(runs, e.Name())
			}
		}
		if len(runs) == 0 {
			return nil, exitErr{code: exitFailure, msg: fmt.Sprintf("no coordinator serves %s, and it holds no run's evidence (is it the --data of a run?)", dir)}
		}
	} else if _, err := os.Stat(filepath.Join(dir, "runs", run)); err != nil {
		return nil, exitErr{code: exitFailure, msg: fmt.Sprintf("no coordinator serves %s, and it holds no evidence of run %s (%s)", dir, run, filepath.Join(dir, "runs", run))}
	}
	st := &coordinator.Status{V: coordinator.StatusVersion, Time: time.Now().UTC(), From: "evidence",
		Runs: []coordinator.RunStatus{}, Workers: []stream.WorkerReport{}}
	for _, name := range runs {
		evidence := filepath.Join(dir, "runs", name)
		var f coordinator.Final
		b, err := os.ReadFile(filepath.Join(evidence, "final.json"))
		if err == nil {
			err = json.Unmarshal(b, &f)
		}
		if err != nil {
			// Interrupted, killed, or still before its first verdict.
			why := "no verdict recorded: interrupted or killed before it ended"
			if !errors.Is(err, os.ErrNotExist) {
				why = fmt.Sprintf("final.json unreadable: %v", err)
			}
			resume, _ := os.ReadFile(filepath.Join(evidence, "resume.txt"))
			st.NoVerdict = append(st.NoVerdict, coordinator.RunEvidence{Name: name, Evidence: evidence, Why: why, Resume: strings.TrimSpace(string(resume))})
			continue
		}
		rs := coordinator.RunStatus{Name: name, State: f.State, Fingerprint: f.Fingerprint, Counts: f.Counts, Reason: f.Reason,
			Evidence: evidence, Output: f.Output, Updated: f.Written}
		if f.State != stream.RunComplete {
			rs.Resume = f.Resume
		}
		st.Runs = append(st.Runs, rs)
	}
	return st, nil
}

// printStopped prints fromEvidence's document.
func printStopped(w io.Writer, dir string, st *coordinator.Status) {
	fmt.Fprintf(w, "no coordinator serves %s now; from the evidence of each run:\n", dir)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATE\tTOTAL\tVALIDATED\tFAILED\tRECORDED\tFINGERPRINT")
	var notes []string
	for _, r := range st.Runs {
		c := r.Counts
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", r.Name, r.State, c.Total, c.Validated, c.Failed, r.Updated.Local().Format("2006-01-02 15:04:05"), r.Fingerprint)
		if r.Reason != "" {
			notes = append(notes, fmt.Sprintf("%s: %s", r.Name, r.Reason))
		}
		if r.Resume != "" {
			notes = append(notes, fmt.Sprintf("%s: resume with: %s", r.Name, r.Resume))
		}
	}
	for _, n := range st.NoVerdict {
		fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\n", n.Name)
		notes = append(notes, fmt.Sprintf("%s: %s", n.Name, n.Why))
		if n.Resume != "" {
			notes = append(notes, fmt.Sprintf("%s: resume with: %s", n.Name, n.Resume))
		}
	}
	tw.Flush()
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
}
