package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/coordinator/drill"
	"github.com/shardpool/shardpool/stream"
)

// serverFromData finds the coordinator serving the state directory dir
// (for run, when named): the client URL of a `shardpool run` or
// `shardpool coordinator` that holds a store there now. ok is false when
// none does; the caller then reports what the evidence says.
func serverFromData(dir, run string) (url string, acc access, ok bool, err error) {
	lives, err := coordinator.LiveIn(dir)
	if err != nil {
		return "", access{}, false, err
	}
	var pick *coordinator.Live
	switch {
	case run != "":
		pick = liveFor(lives, run)
	case len(lives) == 1:
		pick = &lives[0]
	case len(lives) > 1:
		var names []string
		for _, l := range lives {
			names = append(names, fmt.Sprintf("%s at %s", liveName(l), orStarting(l.URL)))
		}
		return "", access{}, false, exitErr{code: exitUsage, msg: fmt.Sprintf("%d coordinators serve %s: %s; name a run (shardpool status --data %s RUN) or give --server",
			len(lives), dir, strings.Join(names, ", "), shellQuote(dir))}
	}
	if pick == nil {
		return "", access{}, false, nil
	}
	url, acc, err = liveAccess(*pick)
	return url, acc, err == nil, err
}

// liveFor picks the coordinator that serves run among lives: the run's
// own store, else the daemon's (which serves many); nil when neither.
func liveFor(lives []coordinator.Live, run string) *coordinator.Live {
	var pick *coordinator.Live
	for i := range lives {
		if lives[i].Run == run {
			pick = &lives[i]
		}
	}
	if pick == nil && len(lives) > 0 && lives[0].Run == "" {
		pick = &lives[0]
	}
	return pick
}

// liveAccess is where and how a client reaches the live coordinator l.
func liveAccess(l coordinator.Live) (string, access, error) {
	if l.URL == "" {
		return "", access{}, fmt.Errorf("the coordinator of %s (%s) has not written where it listens: it is starting (try again in a moment), or it is an older shardpool (give --server with the URL it printed)", liveName(l), l.Holder)
	}
	return l.URL, access{token: l.TokenFile, ca: l.CAFile}, nil
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
	st := &coordinator.Status{V: coordinator.StatusVersion, Time: time.Now().UTC(), From: "evidence",
		Runs: []coordinator.RunStatus{}, Workers: []stream.WorkerReport{}}
	if run == "" || run == drill.RunName {
		st.Drill = drillSummary(dir)
	}
	runs := []string{run}
	if run == "" {
		entries, err := os.ReadDir(filepath.Join(dir, "runs"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		runs = runs[:0]
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			ev := filepath.Join(dir, "runs", e.Name())
			switch files, ran := ranHere(ev); {
			case ran:
				runs = append(runs, e.Name())
			case drillOnly(files):
				// The drill's report, shown as st.Drill.
			default:
				st.NotRuns = append(st.NotRuns, coordinator.NotRun{Name: e.Name(), Evidence: ev, Files: files})
			}
		}
		if len(runs)+len(st.NotRuns) == 0 && st.Drill == nil {
			return nil, exitErr{code: exitFailure, msg: fmt.Sprintf("no coordinator serves %s, and it holds no run's evidence (is it the --data of a run?)", dir)}
		}
	} else if _, err := os.Stat(filepath.Join(dir, "runs", run)); err != nil {
		return nil, exitErr{code: exitFailure, msg: fmt.Sprintf("no coordinator serves %s, and it holds no evidence of run %s (%s)", dir, run, filepath.Join(dir, "runs", run))}
	} else if files, ran := ranHere(filepath.Join(dir, "runs", run)); !ran {
		if !drillOnly(files) || st.Drill == nil {
			return nil, exitErr{code: exitFailure, msg: fmt.Sprintf("no coordinator serves %s, and no run %s was tracked there: %s holds only %s (from shardpool plan, profile or stage, or a worker whose coordinator keeps its state elsewhere)",
				dir, run, filepath.Join(dir, "runs", run), strings.Join(files, ", "))}
		}
		runs = nil // the drill's report, shown as st.Drill
	}
	for _, name := range runs {
		verdict, noVerdict := runFromEvidence(filepath.Join(dir, "runs", name), name, run != "")
		if verdict != nil {
			st.Runs = append(st.Runs, *verdict)
		} else {
			st.NoVerdict = append(st.NoVerdict, *noVerdict)
		}
	}
	return st, nil
}

// ranHere reports whether the evidence folder is that of a run a
// coordinator of the state directory tracked: it writes resume.txt when
// the run is submitted, progress.json while it runs and final.json at its
// verdict. Other commands leave files there too (plan.json, profile.json,
// staging.json, a worker's admission.log and preflight of a coordinator
// that keeps its state elsewhere, the drill's drill.json), of no run
// here. files are the folder's entries.
func ranHere(evidence string) (files []string, ran bool) {
	entries, _ := os.ReadDir(evidence)
	for _, e := range entries {
		switch e.Name() {
		case coordinator.ResumeName, coordinator.ProgressName, coordinator.FinalName:
			ran = true
		}
		files = append(files, e.Name())
	}
	return files, ran
}

// drillOnly reports whether an evidence folder's files are the recovery
// drill's report alone: `shardpool drill` copies its drill.json to
// DIR/runs/drill/ (a run named drill keeps its own files there beside it,
// and is listed).
func drillOnly(files []string) bool {
	return len(files) == 1 && files[0] == drill.ReportName
}

// drillSummary is the gist of the drill report in the state directory
// dir, or nil when no drill ran with it.
func drillSummary(dir string) *coordinator.DrillSummary {
	path := drill.ReportPath(dir)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	sum := &coordinator.DrillSummary{Report: path}
	var rep drill.Report
	if err == nil {
		err = json.Unmarshal(b, &rep)
	}
	if err != nil {
		sum.Unreadable = err.Error()
		return sum
	}
	sum.Started, sum.Seconds, sum.Passed, sum.Checks = rep.Started, rep.Seconds, rep.Passed, len(rep.Checks)
	for _, c := range rep.Checks {
		if c.Status != drill.Pass {
			sum.NotPassed = append(sum.NotPassed, c.Name+": "+c.Status)
		}
	}
	return sum
}

// runFromEvidence reads one run's evidence folder: its verdict, or why
// it has none. A verdict is the newer of final.json and progress.json (the
// coordinator writes the first, then the second); progress.json that is
// newer and holds no verdict means the run was submitted again after the
// verdict, or before any, and stopped before the next: reporting
// final.json then would tell of another generation or an earlier round.
// With shards, a verdict from final.json lists the shards it did not
// validate, as status RUN does of a live run.
func runFromEvidence(evidence, name string, shards bool) (*coordinator.RunStatus, *coordinator.RunEvidence) {
	final, ferr := coordinator.ReadFinal(evidence)
	// An unreadable progress.json is passed over: final.json, written
	// apart from it, still says what it says.
	progress, _ := coordinator.ReadProgress(evidence)
	if progress != nil && final != nil && !progress.Written.After(final.Written) {
		progress = nil // written with the verdict, or older than it
	}
	if progress != nil && (progress.State == stream.RunComplete || progress.State == stream.RunBlocked) {
		// A verdict whose final.json was not written (or not yet), or
		// was and progress.json was written after it (as a run's
		// coordinator does when it stops).
		rs := verdictOf(name, evidence, progress.RunSummary)
		if final != nil && final.Fingerprint == progress.Fingerprint && final.State == progress.State && final.Counts == progress.Counts {
			rs.Timing = final.Timing
			if shards {
				rs.Shards = notValidated(final)
			}
		}
		return &rs, nil
	}
	if progress == nil && final != nil {
		rs := verdictOf(name, evidence, final.RunSummary)
		rs.Timing = final.Timing
		if shards {
			rs.Shards = notValidated(final)
		}
		return &rs, nil
	}
	resume, _ := os.ReadFile(filepath.Join(evidence, coordinator.ResumeName))
	ev := &coordinator.RunEvidence{Name: name, Evidence: evidence, Resume: strings.TrimSpace(string(resume))}
	switch {
	case progress != nil:
		counts := progress.Counts
		ev.State, ev.Fingerprint, ev.Counts, ev.Recorded = progress.State, progress.Fingerprint, &counts, progress.Written
		how := "interrupted or killed"
		if sp, err := coordinator.ReadStopped(evidence); err == nil && sp != nil && !sp.Written.Before(progress.Written) {
			how, ev.Stopped, ev.Failed, ev.MoreFailed = sp.Why, sp.Why, sp.Failed, sp.MoreFailed
		}
		ev.Why = fmt.Sprintf("no verdict recorded: stopped while %s (%s); its counts as recorded %s", progress.State, how,
			progress.Written.Local().Format("2006-01-02 15:04:05"))
		if final != nil {
			prev := verdictOf(name, evidence, final.RunSummary)
			ev.Previous = &prev
		}
	case ferr != nil:
		ev.Why = fmt.Sprintf("final.json unreadable: %v", ferr)
	default:
		// Interrupted, killed, or still before its first verdict, by a
		// shardpool that wrote no progress.json.
		ev.Why = "no verdict recorded: interrupted or killed before it ended"
	}
	return nil, ev
}

// notValidated is the shards of a verdict that were not validated, by
// id: their state and reason (final.json keeps no attempts).
func notValidated(f *coordinator.Final) []stream.ShardRecord {
	var out []stream.ShardRecord
	for _, sh := range f.Shards {
		if sh.State != stream.ShardValidated {
			out = append(out, stream.ShardRecord{V: stream.SchemaVersion, Run: f.Run, ID: sh.ID, Fingerprint: f.Fingerprint, State: sh.State, Reason: sh.Reason})
		}
	}
	slices.SortFunc(out, func(a, b stream.ShardRecord) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// lastLog is the newest attempt log of shard id in evidence: of its
// latest retry round, the attempt numbered highest (attempts/<id>.<n>.log
// in the first round, <id>.r<round>.<n>.log after), or "" when it has
// none (an attempt that printed nothing leaves no log).
func lastLog(evidence, id string) string {
	matches, _ := filepath.Glob(filepath.Join(evidence, "attempts", id+".*.log"))
	best, bestRound, bestN := "", -1, -1
	for _, m := range matches {
		rest := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m), id+"."), ".log")
		round := 0
		if r, n, ok := strings.Cut(rest, "."); ok && strings.HasPrefix(r, "r") {
			var err error
			if round, err = strconv.Atoi(r[1:]); err != nil {
				continue
			}
			rest = n
		}
		n, err := strconv.Atoi(rest)
		if err == nil && (round > bestRound || round == bestRound && n > bestN) {
			best, bestRound, bestN = m, round, n
		}
	}
	return best
}

// verdictOf is the status of a run from its final.json or progress.json.
func verdictOf(name, evidence string, f coordinator.RunSummary) coordinator.RunStatus {
	rs := coordinator.RunStatus{Name: name, State: f.State, Fingerprint: f.Fingerprint, Counts: f.Counts, Reason: f.Reason,
		Evidence: evidence, Output: f.Output, Updated: f.Written}
	if f.State != stream.RunComplete {
		rs.Resume = f.Resume
	}
	if gone := coordinator.ForgottenSince(evidence, f.Written); gone != nil {
		rs.Forgotten = gone.Written
	}
	return rs
}

// printStopped prints fromEvidence's document.
func printStopped(w io.Writer, dir string, st *coordinator.Status) {
	if len(st.Runs)+len(st.NoVerdict) == 0 {
		fmt.Fprintf(w, "no coordinator serves %s now, and it holds no run's evidence\n", dir)
	} else {
		fmt.Fprintf(w, "no coordinator serves %s now; from the evidence of each run:\n", dir)
	}
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATE\tTOTAL\tVALIDATED\tFAILED\tRECORDED\tFINGERPRINT")
	var notes []string
	for _, r := range st.Runs {
		c := r.Counts
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", r.Name, r.State, c.Total, c.Validated, c.Failed, r.Updated.Local().Format("2006-01-02 15:04:05"), r.Fingerprint)
		if r.Reason != "" {
			notes = append(notes, fmt.Sprintf("%s: %s", r.Name, r.Reason))
		}
		if t := timingText(r.Timing); t != "" {
			notes = append(notes, fmt.Sprintf("%s: shards %s", r.Name, t))
		}
		if resumeApart(r) {
			notes = append(notes, fmt.Sprintf("%s: resume with: %s", r.Name, r.Resume))
		}
		if !r.Forgotten.IsZero() {
			notes = append(notes, fmt.Sprintf("%s: forgotten %s: its records are no longer in the store; its outputs and this evidence stay",
				r.Name, r.Forgotten.Local().Format("2006-01-02 15:04:05")))
		}
		for i, s := range r.Shards {
			if i == maxShardLines {
				notes = append(notes, fmt.Sprintf("  ... and %d more shard(s) not validated (status --json lists every one, as does %s)", len(r.Shards)-i,
					filepath.Join(r.Evidence, coordinator.FinalName)))
				break
			}
			line := strings.TrimSpace(fmt.Sprintf("%s %s %s", s.ID, s.State, s.Reason))
			if log := lastLog(r.Evidence, s.ID); log != "" {
				line += " (log: " + log + ")"
			}
			notes = append(notes, "  "+line)
		}
	}
	for _, n := range st.NoVerdict {
		if n.Counts != nil {
			c := n.Counts
			fmt.Fprintf(tw, "%s\tstopped\t%d\t%d\t%d\t%s\t%s\n", n.Name, c.Total, c.Validated, c.Failed, n.Recorded.Local().Format("2006-01-02 15:04:05"), n.Fingerprint)
		} else {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\n", n.Name)
		}
		notes = append(notes, fmt.Sprintf("%s: %s", n.Name, n.Why))
		for _, f := range n.Failed {
			notes = append(notes, fmt.Sprintf("%s: failed: %s", n.Name, f))
		}
		if n.MoreFailed > 0 {
			notes = append(notes, fmt.Sprintf("%s: and %d more failed", n.Name, n.MoreFailed))
		}
		if p := n.Previous; p != nil {
			what := "an earlier verdict of this generation"
			if p.Fingerprint != n.Fingerprint {
				what = "the verdict of generation " + p.Fingerprint + ", which this one replaced"
			}
			notes = append(notes, fmt.Sprintf("%s: final.json holds %s: %s %d/%d validated, %d failed (%s)", n.Name, what,
				p.State, p.Counts.Validated, p.Counts.Total, p.Counts.Failed, p.Updated.Local().Format("2006-01-02 15:04:05")))
		}
		if n.Resume != "" {
			notes = append(notes, fmt.Sprintf("%s: resume with: %s", n.Name, n.Resume))
		}
	}
	if len(st.Runs)+len(st.NoVerdict) > 0 {
		tw.Flush()
	}
	for _, n := range notes {
		fmt.Fprintln(w, n)
	}
	if len(st.NotRuns) > 0 {
		var names []string
		for _, n := range st.NotRuns {
			names = append(names, fmt.Sprintf("%s (%s)", n.Name, strings.Join(n.Files, ", ")))
		}
		fmt.Fprintf(w, "evidence of no run here (from shardpool plan, profile or stage, or a worker whose coordinator keeps its state elsewhere): %s\n", strings.Join(names, "; "))
	}
	if d := st.Drill; d != nil {
		fmt.Fprintln(w, drillLine(d))
	}
}

// drillLine is the last drill's result in a line.
func drillLine(d *coordinator.DrillSummary) string {
	if d.Unreadable != "" {
		return fmt.Sprintf("last recovery drill: report unreadable (%s): %s", d.Report, d.Unreadable)
	}
	verdict := fmt.Sprintf("passed all %d checks", d.Checks)
	switch {
	case !d.Passed:
		verdict = fmt.Sprintf("FAILED, %d of %d checks not passed (%s)", len(d.NotPassed), d.Checks, strings.Join(d.NotPassed, "; "))
	case len(d.NotPassed) > 0:
		// Passed with checks this host could not make (a power cut
		// without loop devices).
		verdict = fmt.Sprintf("passed, %d of %d checks not made here (%s)", len(d.NotPassed), d.Checks, strings.Join(d.NotPassed, "; "))
	}
	return fmt.Sprintf("last recovery drill: %s, %s in %.1fs (%s)", verdict, d.Started.Local().Format("2006-01-02 15:04:05"), d.Seconds, d.Report)
}
