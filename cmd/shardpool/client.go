package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

func cmdSubmit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("submit", "shardpool submit --server URL [--retry-failed] [--halt N] [--profile FILE] [--wait] [--json] SPEC", stderr)
	server := fs.String("server", nats.DefaultURL, "coordinator `URL`")
	acc := registerAccess(fs)
	retry := fs.Bool("retry-failed", false, "requeue the shards that failed after their retries")
	halt := fs.Int("halt", 5, "the coordinator halts the run (BLOCKED, its queued shards held back until it is submitted again) once `N` shards have failed after their retries with none validated since the count started: the run's first submission, or one that changes --halt, retries failed shards or lifts a halt (0: run every shard whatever fails)")
	profilePath := fs.String("profile", "", "the `FILE` of shardpool profile whose measured peaks the workers admit by (default: runs/<run>/profile.json in the default state directory, where profile writes it, if it is there)")
	wait := fs.Bool("wait", false, "then follow the run until it is COMPLETE or BLOCKED (progress on stderr, a bar on a terminal) and exit as shardpool run does: 0 COMPLETE, 3 BLOCKED; Ctrl-C stops the wait, not the run")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	spec, man, err := parseSpec(fs, args)
	if err != nil {
		return err
	}
	if *halt < 0 {
		return exitErr{code: exitUsage, msg: fmt.Sprintf("submit: --halt %d: want a number of shards, or 0 never to halt", *halt)}
	}
	// The workers run the command on their hosts: what this host lacks
	// they may have (a warning), but a script that no kernel would run
	// fails on every one of them.
	for _, p := range commandProblems(spec) {
		if p.everywhere {
			return p.err
		}
		fmt.Fprintf(stderr, "warning: %v; checked on this host only: the workers' hosts must have it\n", p.err)
	}
	plan.SplitOutliers(spec, man)
	peaks, vram, peaksFrom, err := profiledPeaks(spec, man, *profilePath)
	if err != nil {
		return err
	}
	used := acc.get()
	nc, js, err := connect(ctx, *server, &used, "shardpool-submit", 0, nil)
	if err != nil {
		return err
	}
	defer nc.Close()
	// The plan step: a class that no live worker could ever run blocks the
	// run before anything is queued.
	st, err := coordinator.ReadStatus(ctx, js, "")
	if err != nil {
		return err
	}
	if why := fleetCheck(st.Workers, spec, man); why != "" {
		return exitErr{code: exitBlocked, msg: "run " + spec.Name + " is BLOCKED before queuing: " + why}
	}
	// A store that takes no writes would fail the submission part way,
	// with an error of nats-server's that may not say why ("error
	// creating store for consumer", where its file system is read-only).
	if c := st.Coordinator; c != nil && c.StoreFull != "" {
		state, _ := storeState(c.StoreFull)
		return exitErr{code: exitFailure, msg: fmt.Sprintf("submit %s: nothing published: the coordinator's store %s: %s; %s, then submit again", spec.Name, state, c.StoreFull, storeTodo(c.StoreFull))}
	}
	// The commands go to resume.txt and the run record: never the token
	// itself, only where it is.
	at := shellQuote(redactURL(*server)) + used.flags() + carriedFlags(fs, "halt")
	resume := fmt.Sprintf("shardpool submit --server %s %s", at, shellQuote(spec.SpecPath))
	retryCmd := fmt.Sprintf("shardpool submit --server %s --retry-failed %s", at, shellQuote(spec.SpecPath))
	caps, err := fleetCaps()
	if err != nil {
		return err
	}
	// Outputs are checked again only where this host sees their directory:
	// a submitter elsewhere cannot tell a deleted output from an unmounted one.
	visible := false
	if fi, err := os.Stat(spec.Output); err == nil && fi.IsDir() {
		visible = true
		checkOutput(ctx, spec.Output, stderr)
	}
	checkInputs(ctx, spec, man, stderr)
	on := outputStorage(ctx, spec.Output)
	submitted := time.Now().UTC()
	res, err := coordinator.Submit(ctx, js, spec, man, coordinator.SubmitOptions{RetryFailed: *retry, Resume: resume, Retry: retryCmd, Halt: *halt,
		Hashes: staging.LoadHashes(filepath.Join(worker.DefaultStateDir(), "inputs-cache.json")), ClassCaps: caps, Reverify: visible,
		OutputOn: on, MeasuredMemory: peaks, MeasuredVRAM: vram})
	if err != nil {
		return err
	}
	warnOwnDisk(st.Workers, spec.Output, on, stderr)
	if *asJSON {
		if peaksFrom != "" {
			fmt.Fprintln(stderr, peaksFrom)
		}
		if err := writeJSON(stdout, res); err != nil || !*wait {
			return err
		}
	} else {
		fmt.Fprintf(stdout, "run %s\nfingerprint %s\nstate %s\npublished %d of %d shard(s)\n", res.Run, res.Fingerprint, res.State, res.Published, len(man.Shards))
		if peaksFrom != "" {
			fmt.Fprintln(stdout, peaksFrom)
		}
		printReplaced(stdout, res)
		printRetried(stdout, res)
		printChanged(stdout, res, retryCmd)
		printRedone(stdout, res)
		if !*wait {
			return nil
		}
	}
	follow := fmt.Sprintf("shardpool status --server %s %s", at, shellQuote(spec.Name))
	var since time.Time
	if queuedWork(res) {
		since = submitted
	}
	out := stdout
	if *asJSON {
		out = io.Discard // stdout holds the submission's JSON alone
	}
	return waitVerdict(ctx, js, spec.Name, since, follow, out, stderr)
}

// queuedWork reports whether a submission queued work (published shards,
// requeued failed, redone, held or lost ones): a verdict written before
// it is stale (a BLOCKED run whose shards it queued again is BLOCKED in
// its record until the tracker has seen them).
func queuedWork(res coordinator.SubmitResult) bool {
	return res.Published > 0 || res.Retried > 0 || res.Redone > 0 || res.Restored > 0 || res.Unhalted != ""
}

// waitVerdict follows a run until its verdict (submit --wait, status
// --wait), showing progress on stderr, and says the verdict on out as
// `run` does: COMPLETE returns nil, BLOCKED exit 3; an interrupt stops
// the wait and leaves the run to its workers (exit 130).
func waitVerdict(ctx context.Context, js jetstream.JetStream, run string, since time.Time, follow string, out, stderr io.Writer) error {
	final, err := waitRun(ctx, js, run, waitOpts{follow: follow, since: since, progress: stderr})
	if ctx.Err() != nil {
		fmt.Fprintf(stderr, "stopped waiting; the run goes on with its workers: %s\n", follow)
		return exitErr{code: exitInterrupted, msg: "--wait interrupted before run " + run + " had a verdict"}
	}
	if err != nil {
		return fmt.Errorf("wait for run %s: %w", run, err)
	}
	printVerdict(out, final)
	fmt.Fprintf(out, "outputs:  %s\n", final.Spec.Output)
	if final.Evidence != "" {
		fmt.Fprintf(out, "evidence: %s (on the coordinator's host)\n", final.Evidence)
	}
	if final.State == stream.RunBlocked {
		if out == io.Discard { // --json: the reason goes with the error
			return exitErr{code: exitBlocked, msg: "run " + final.Name + " is BLOCKED: " + final.Reason}
		}
		return blockedErr(out, stderr, "run "+final.Name+" is BLOCKED", final.Reason)
	}
	return nil
}

// warnOwnDisk warns, at submit, where the output directory is on this
// host's own disk while live workers run on other hosts: they commit
// nothing there unless they see it on storage shared with this host
// (worker's onAnotherHostsDisk), and the user learns it from the shards'
// failures otherwise. workers are the live workers' reports as status
// read them (Gone set).
func warnOwnDisk(workers []stream.WorkerReport, output string, on *stream.OutputStorage, stderr io.Writer) {
	if on == nil || !on.Local {
		return
	}
	var far []string
	for _, w := range workers {
		if w.Gone == "" && w.BootID != "" && w.BootID != on.BootID {
			far = append(far, fmt.Sprintf("%s (host %s)", w.Name, w.Host))
		}
	}
	if len(far) == 0 {
		return
	}
	fmt.Fprintf(stderr, "warning: the output directory %s is on this host's own disk (%s %s mounted at %s), and worker(s) %s run on other hosts: "+
		"they commit nothing there unless they see it on storage they share with this host (NFS, Lustre), and fail its shards otherwise; put the output on such storage\n",
		output, on.Type, on.Source, on.MountPoint, strings.Join(far, ", "))
}

// cmdForget removes a finished run from the coordinator's store
// (coordinator.Forget); outputs and evidence stay. With --data it finds
// the store itself: through the coordinator serving it now, or, where
// none does (a `shardpool run` that ended), by opening the store.
func cmdForget(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("forget", "shardpool forget [--server URL | --data DIR] [--json] RUN", stderr)
	server := fs.String("server", nats.DefaultURL, "coordinator `URL`")
	acc := registerAccess(fs)
	data := fs.String("data", "", "state `DIR` of a 'shardpool run' or 'shardpool coordinator': forget through the coordinator serving it now, or, when none does, in its store (instead of --server)")
	asJSON := fs.Bool("json", false, "print what was removed as JSON")
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	run := pos[0]
	var f coordinator.Forgotten
	if *data != "" {
		dir, err := dataInstead(fs, *data)
		if err != nil {
			return err
		}
		url, found, store, err := forgetTarget(dir, run)
		if err != nil {
			return err
		}
		if store != "" {
			if f, err = forgetInStore(ctx, dir, store, run); err != nil {
				return err
			}
			return forgotten(stdout, stderr, f, *asJSON)
		}
		*server = url
		acc.fill(fs, found)
	}
	used := acc.get()
	nc, js, err := connect(ctx, *server, &used, "shardpool-forget", 0, nil)
	if defaultUnanswered(fs, *data, err) {
		// Nothing at the default URL: the run may be a `shardpool run` of
		// the default state directory, as for status.
		def := worker.DefaultStateDir()
		url, found, store, ferr := forgetTarget(def, run)
		switch {
		case ferr != nil:
			// Not there either: the first error says what was asked.
		case store != "":
			if f, err = forgetInStore(ctx, def, store, run); err != nil {
				return err
			}
			return forgotten(stdout, stderr, f, *asJSON)
		default:
			acc.fill(fs, found)
			used = acc.get()
			nc, js, err = connect(ctx, url, &used, "shardpool-forget", 0, nil)
		}
	}
	if err != nil {
		return err
	}
	defer nc.Close()
	if f, err = coordinator.Forget(ctx, js, run); err != nil {
		return err
	}
	return forgotten(stdout, stderr, f, *asJSON)
}

// defaultUnanswered reports whether a client given neither --server nor
// --data found nothing it may use at the default URL (nothing listens,
// or another user's coordinator refuses it): a `shardpool run` of the
// default state directory serves on a port of its own choosing instead.
func defaultUnanswered(fs *flag.FlagSet, data string, err error) bool {
	return err != nil && data == "" && !flagSet(fs, "server") &&
		(errors.Is(err, nats.ErrNoServers) || isAuthError(err) || errors.Is(err, errNeedsTLS))
}

// resumeApart reports whether a run's resume command needs a line of its
// own: one that its reason names already (failed shards: "retry them
// with: ...") is not printed twice.
func resumeApart(r coordinator.RunStatus) bool {
	return r.Resume != "" && !strings.Contains(r.Reason, r.Resume)
}

// dataInstead is the absolute path of --data, which a command takes
// instead of --server, not with it.
func dataInstead(fs *flag.FlagSet, data string) (string, error) {
	if flagSet(fs, "server") {
		return "", exitErr{code: exitUsage, msg: fs.Name() + ": give --server or --data, not both"}
	}
	return filepath.Abs(data)
}

// forgetTarget finds where run of the state directory dir is kept: the
// client URL of the coordinator serving it now, or else the store that
// holds it (a `shardpool run`'s own, DIR/stores/<run>, or the daemon's,
// DIR/jetstream), which no coordinator holds. A run's own store is
// preferred to a live daemon's, which does not hold that run.
func forgetTarget(dir, run string) (url string, acc access, store string, err error) {
	lives, err := coordinator.LiveIn(dir)
	if err != nil {
		return "", access{}, "", err
	}
	pick := liveFor(lives, run)
	own := filepath.Join(dir, "stores", run)
	if _, err := os.Stat(own); err == nil && (pick == nil || pick.Run != run) {
		if _, err := os.Stat(filepath.Join(own, "jetstream")); errors.Is(err, os.ErrNotExist) {
			// Made by a run that is starting now, or one that stopped
			// before its server did: no record of it to forget, and
			// holding it would keep a starting run waiting.
			return "", access{}, "", exitErr{code: exitFailure, msg: fmt.Sprintf("forget %s: %v: its store %s holds no records yet (the run is starting, or it stopped before it began)",
				run, coordinator.ErrRunNotFound, own)}
		}
		return "", access{}, own, nil // a `shardpool run` that no longer runs
	}
	if pick != nil {
		url, acc, err := liveAccess(*pick)
		return url, acc, "", err
	}
	daemon := filepath.Join(dir, "jetstream")
	if _, err := os.Stat(daemon); err == nil {
		return "", access{}, daemon, nil
	}
	return "", access{}, "", exitErr{code: exitFailure, msg: fmt.Sprintf("forget %s: %s holds no store of it (neither %s nor %s): is it the --data of the run?",
		run, dir, own, daemon)}
}

// forgetInStore forgets run in a store that no coordinator serves, through
// a coordinator of this process that holds the store for that moment (and
// keeps any other from opening it meanwhile). Only its in-process
// connection is used; its listener is on loopback, port 0.
func forgetInStore(ctx context.Context, dir, store, run string) (coordinator.Forgotten, error) {
	// Brief: a run of this store that starts meanwhile waits for this
	// command instead of failing because the store is held.
	cfg := coordinator.Config{DataDir: dir, Listen: "127.0.0.1:0", Auth: true, Brief: "shardpool forget"}
	if store != filepath.Join(dir, "jetstream") {
		cfg.StoreDir = store
	}
	c, err := coordinator.New(cfg)
	if err != nil {
		return coordinator.Forgotten{}, err
	}
	defer c.Close()
	if err := c.Start(ctx); err != nil {
		if errors.Is(err, coordinator.ErrDataInUse) {
			return coordinator.Forgotten{}, fmt.Errorf("%w; it started after this command looked: try again", err)
		}
		return coordinator.Forgotten{}, err
	}
	return coordinator.Forget(ctx, c.JetStream(), run)
}

// forgotten notes in the run's evidence that it was forgotten (status
// --data, profile and plan read it), then prints f.
func forgotten(stdout, stderr io.Writer, f coordinator.Forgotten, asJSON bool) error {
	if err := coordinator.WriteForgotten(f); err != nil {
		fmt.Fprintf(stderr, "warning: %s not written to the run's evidence: %v\n", coordinator.ForgottenName, err)
	}
	return printForgotten(stdout, f, asJSON)
}

// printForgotten says what forget removed and what it kept.
func printForgotten(stdout io.Writer, f coordinator.Forgotten, asJSON bool) error {
	if asJSON {
		return writeJSON(stdout, f)
	}
	fmt.Fprintf(stdout, "run %s (%s, fingerprint %s) forgotten: %d shard record(s), %d commit record(s), %d lease(s) and %d queued message(s) removed from the store\n",
		f.Run, f.State, f.Fingerprint, f.Removed.Shards, f.Removed.Checkpoints, f.Removed.Leases, f.Removed.Queued)
	fmt.Fprintf(stdout, "kept: outputs %s", f.Output)
	if f.Evidence != "" {
		fmt.Fprintf(stdout, ", evidence %s", f.Evidence)
	}
	fmt.Fprintln(stdout, "\nsubmitting it again runs nothing already committed: each output is read back in full and recorded")
	return nil
}

// printReplaced says that a submission started a new generation of an
// existing run, what changed, and what that costs: every shard runs again.
func printReplaced(w io.Writer, res coordinator.SubmitResult) {
	if res.Replaced == "" {
		return
	}
	fmt.Fprintf(w, "new generation %s replaces %s; changed: %s\n", res.Fingerprint, res.Replaced, coordinator.DescribeChanges(res.Because))
	if res.ReplacedValidated > 0 {
		fmt.Fprintf(w, "every shard runs again: the %d output(s) committed by generation %s are made again\n", res.ReplacedValidated, res.Replaced)
		if len(res.Because) == 1 && res.Because[0] == stream.ChangeManifest {
			// The usual cause: shards added to a finished run's manifest.
			fmt.Fprintln(w, "only the manifest changed: the fingerprint covers the whole manifest, so added lines make every shard run again. To run only the added shards: put the manifest back as it was and run or submit again (the outputs still committed under it verify and are skipped), then give the added lines a manifest and a run of their own (another name, the same output)")
		}
	}
}

// printRetried says how many failed shards a --retry-failed requeued.
func printRetried(w io.Writer, res coordinator.SubmitResult) {
	if res.Retried > 0 {
		fmt.Fprintf(w, "retried %d failed shard(s)\n", res.Retried)
	}
	if res.AlreadyRetried > 0 {
		fmt.Fprintf(w, "%d failed shard(s) were queued again already, by another submission: not queued twice\n", res.AlreadyRetried)
	}
	switch {
	case res.UnhaltedBy != "":
		fmt.Fprintf(w, "the run was %s\n%d held shard(s) queued again\n", res.Unhalted, res.Restored)
	case res.Unhalted != "":
		fmt.Fprintf(w, "the run had %s\n%d held shard(s) queued again; the count toward --halt starts over\n", res.Unhalted, res.Restored)
	}
}

// printRedone names the committed shards queued again because their
// output was missing or failed verification.
func printRedone(w io.Writer, res coordinator.SubmitResult) {
	if res.Restored > 0 && res.Unhalted == "" {
		fmt.Fprintf(w, "%d unfinished shard(s) had no queued message (a run forgotten and submitted again, or a store that lost messages after a full disk): published again\n", res.Restored)
	}
	if res.Redone == 0 {
		return
	}
	more := ""
	if n := res.Redone - len(res.RedoneIDs); n > 0 {
		more = fmt.Sprintf(" and %d more", n)
	}
	fmt.Fprintf(w, "%d committed output(s) missing, failing verification at the destination, or made from inputs changed since, queued again: %s%s\n",
		res.Redone, strings.Join(res.RedoneIDs, ", "), more)
}

// printChanged reports the settings a resubmission updated, and how to
// rerun failed shards under them.
func printChanged(w io.Writer, res coordinator.SubmitResult, retry string) {
	if len(res.Changed) == 0 {
		return
	}
	fmt.Fprintf(w, "updated for attempts from now on: %s\n", strings.Join(res.Changed, "; "))
	if res.State == stream.RunBlocked && res.Retried == 0 && res.AlreadyRetried == 0 {
		fmt.Fprintf(w, "the failed shards run again with: %s\n", retry)
	}
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("status", "shardpool status [--server URL | --data DIR] [--wait] [--json] [RUN]", stderr)
	server := fs.String("server", nats.DefaultURL, "coordinator `URL`")
	acc := registerAccess(fs)
	data := fs.String("data", "", "state `DIR` of a 'shardpool run' or 'shardpool coordinator': ask the coordinator serving it now, or, when none does, report each run's last verdict from its evidence (instead of --server)")
	wait := fs.Bool("wait", false, "follow RUN until it is COMPLETE or BLOCKED (progress on stderr), print its verdict and exit as shardpool run does: 0 COMPLETE, 3 BLOCKED; Ctrl-C stops the wait, not the run")
	asJSON := fs.Bool("json", false, "print the status document as JSON (see docs/status-json.md); with --wait, once the run has its verdict")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return wrongCount(fs, pos, "at most 1 argument")
	}
	run := ""
	if len(pos) == 1 {
		run = pos[0]
	}
	if *wait && run == "" {
		return exitErr{code: exitUsage, msg: "status --wait: name the RUN to wait for"}
	}
	url := *server
	if *data != "" {
		dir, err := dataInstead(fs, *data)
		if err != nil {
			return err
		}
		found, tf, ok, err := serverFromData(dir, run)
		if err != nil {
			return err
		}
		if !ok {
			st, err := fromEvidence(dir, run)
			if err != nil {
				return err
			}
			return printEvidence(stdout, st, dir, run, "", *asJSON, *wait)
		}
		url = found
		acc.fill(fs, tf)
	}
	used := acc.get()
	nc, js, err := connect(ctx, url, &used, "shardpool-status", 0, nil)
	if defaultUnanswered(fs, *data, err) {
		// The coordinator of a `shardpool run` of the default state
		// directory, or, once it has ended, that directory's evidence.
		def := worker.DefaultStateDir()
		found, tf, ok, ferr := serverFromData(def, run)
		if ferr == nil && ok {
			acc.fill(fs, tf)
			used = acc.get()
			nc, js, err = connect(ctx, found, &used, "shardpool-status", 0, nil)
		} else if ferr == nil {
			// Nor does one serve the default state directory (the `run`
			// ended): its runs' evidence, as --data would report it.
			if st, eerr := fromEvidence(def, run); eerr == nil {
				head := fmt.Sprintf("no coordinator answers at %s, the default URL", redactURL(url))
				return printEvidence(stdout, st, def, run, head, *asJSON, *wait)
			}
		}
	}
	if err != nil {
		return err
	}
	defer nc.Close()
	st, err := coordinator.ReadStatus(ctx, js, run)
	if err != nil {
		return err
	}
	if *wait {
		follow := fmt.Sprintf("shardpool status --server %s%s %s", shellQuote(redactURL(url)), used.flags(), shellQuote(run))
		if *data != "" {
			follow = fmt.Sprintf("shardpool status --data %s %s", shellQuote(*data), shellQuote(run))
		}
		out := stdout
		if *asJSON {
			out = io.Discard // the status document follows the verdict
		}
		werr := waitVerdict(ctx, js, run, time.Time{}, follow, out, stderr)
		if !*asJSON || ctx.Err() != nil {
			return werr
		}
		if st, err = coordinator.ReadStatus(ctx, js, run); err != nil {
			return err
		}
		if err := writeJSON(stdout, st); err != nil {
			return err
		}
		return werr
	}
	if *asJSON {
		return writeJSON(stdout, st)
	}
	printStatus(stdout, st)
	return nil
}

// printEvidence prints the runs' last verdicts from the evidence of the
// state directory dir (st, fromEvidence): as JSON, or as a table after
// the line head (if any); with wait, it exits by run's (lastVerdict).
func printEvidence(stdout io.Writer, st *coordinator.Status, dir, run, head string, asJSON, wait bool) error {
	if asJSON {
		if err := writeJSON(stdout, st); err != nil {
			return err
		}
	} else {
		if head != "" {
			fmt.Fprintln(stdout, head)
		}
		printStopped(stdout, dir, st)
	}
	if !wait {
		return nil
	}
	return lastVerdict(st, dir, run)
}

// lastVerdict is the exit of `status --wait` for a run that no
// coordinator serves now (a `shardpool run` that ended): its last verdict
// from the evidence, as printed above: nil COMPLETE, exit 3 BLOCKED, exit
// 1 for a run that stopped before its verdict.
func lastVerdict(st *coordinator.Status, dir, run string) error {
	for _, r := range st.Runs {
		if r.Name != run {
			continue
		}
		switch r.State {
		case stream.RunComplete:
			return nil
		case stream.RunBlocked:
			return exitErr{code: exitBlocked, msg: fmt.Sprintf("run %s is BLOCKED (its last verdict; no coordinator serves %s now)", run, dir)}
		}
	}
	return exitErr{code: exitFailure, msg: fmt.Sprintf("status --wait: no coordinator serves %s now, and run %s has no verdict there: nothing to wait for (resume it to go on)", dir, run)}
}

func printStatus(w io.Writer, st *coordinator.Status) {
	// The status's moment (the coordinator's clock), for how long shards
	// have run and how old a pace is; this host, for where logs are.
	now := cmp.Or(st.Time, time.Now())
	here, _ := os.Hostname()
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "RUN\tSTATE\tTOTAL\tPENDING\tRUNNING\tVALIDATED\tFAILED\tFINGERPRINT")
	for _, r := range st.Runs {
		c := r.Counts
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", r.Name, r.State, c.Total, c.Pending, c.Running, c.Validated, c.Failed, r.Fingerprint)
	}
	tw.Flush()
	for _, u := range st.Unreadable {
		fmt.Fprintf(w, "run record unreadable: %s\n", u)
	}
	for _, r := range st.Runs {
		if r.Reason != "" {
			fmt.Fprintf(w, "%s: %s\n", r.Name, r.Reason)
		}
		verdict := r.State == stream.RunComplete || r.State == stream.RunBlocked
		if t := timingText(r.Timing); t != "" {
			if !verdict {
				t = "validated so far, " + t
			}
			fmt.Fprintf(w, "%s: shards %s\n", r.Name, t)
		}
		if p := r.Pace; p != nil && !verdict {
			// As run's progress line has it, from the coordinator's
			// record: as of its last change.
			line := fmt.Sprintf("%s: shards end at %s", r.Name, rate(p.PerSecond))
			if r.Counts.Pending == 0 {
				// The running ones end when they end (as run's progress).
				line += "; none pending, the rest are running"
			} else {
				line += fmt.Sprintf(", about %s left", roughly(time.Duration(p.LeftSeconds*float64(time.Second))))
			}
			if age := now.Sub(r.Updated); age >= 10*time.Second {
				line += fmt.Sprintf(" (as of %s ago, when its counts last changed)", roughly(age))
			}
			fmt.Fprintln(w, line)
		}
		for _, why := range r.Waiting {
			fmt.Fprintf(w, "%s: %s\n", r.Name, why)
		}
		if c := r.Counts; c.Failed >= failingWarnAt && c.Validated == 0 && c.Pending+c.Running > 0 &&
			r.State != stream.RunBlocked && r.State != stream.RunComplete {
			// A `shardpool run` halts by itself (run --halt), a submitted
			// run at its --halt (the coordinator): say what stops the rest.
			next := fmt.Sprintf("the workers go on with the other %d", c.Pending+c.Running)
			if r.Halt > 0 {
				next += fmt.Sprintf(" until %d have failed since it was submitted, when the coordinator halts the run (submit --halt)", r.Halt)
			}
			fmt.Fprintf(w, "%s: warning: %d shard(s) failed after their retries and none has been validated: the command may fail for every shard, "+
				"and %s. SIGUSR1 drains a worker (its running shards end, it fetches no more); "+
				"once the cause is fixed, submit again (--retry-failed for the failed ones)\n", r.Name, c.Failed, next)
		}
		if r.State == stream.RunBlocked && resumeApart(r) {
			fmt.Fprintf(w, "%s: resume with: %s\n", r.Name, r.Resume)
		}
		shards := worstFirst(r.Shards)
		for i, s := range shards {
			if i == maxShardLines {
				fmt.Fprintf(w, "  ... and %d more shard(s) not validated: %s (status --json lists every one)\n", len(shards)-i, countStates(shards[i:]))
				break
			}
			detail := s.Reason
			if s.Owner != nil {
				// The owner's pid is the worker's: killing it ends every
				// shard of that worker. The command's own, where the
				// worker's report has it, is the one to look into.
				who := fmt.Sprintf("worker pid %d on %s", s.Owner.PID, s.Owner.Host)
				var wk *stream.WorkerReport
				if s.State == stream.ShardRunning {
					wk = reportOf(st.Workers, s.Owner)
					if pid := commandPID(wk, s.Owner.Attempt, stream.ShardKey(r.Name, s.ID)); pid > 0 {
						who += fmt.Sprintf(", command pid %d", pid)
					}
				}
				detail = strings.TrimSpace(fmt.Sprintf("attempt %d on %s (%s) %s", s.Owner.Attempt, s.Owner.Worker, who, detail))
				if at, ok := openAttempt(s); ok {
					// How long it has run (a straggler stands out), and the
					// log it writes, which a person tails.
					took := max(now.Sub(at.Start), 0)
					detail += " for " + ranFor(took) + longerThan(took, r.Timing)
					if at.Log != "" {
						detail += " (log as it prints: " + logOn(at, here) + ")"
					}
				}
				if s.State == stream.ShardRunning {
					switch {
					case wk == nil:
						detail += "; that worker is not reporting: the shard is redelivered once its lease expires, or at once when a worker with its state directory starts on its host"
					case wk.Gone != "":
						detail += "; that worker is gone (" + wk.Gone + "): the shard is redelivered once its lease expires, or sooner when a worker of its host with its state directory takes it back"
					case wk.Disconnected != "":
						detail += "; that worker is disconnected (" + wk.Disconnected + "): if it is gone, the shard is redelivered once its lease expires; if it reconnects in time, it carries on"
					}
					if others := awaitedBy(st.Workers, stream.ShardKey(r.Name, s.ID)); len(others) > 0 {
						detail += "; its message came again, to " + strings.Join(others, ", ") + ", which holds a slot for it until this attempt ends (at most 3 lease TTLs)"
					}
				}
			}
			if r.Halted != "" && s.State == stream.ShardPending {
				// Its retry is not due: the halt took its message off the queue.
				detail, _, _ = strings.Cut(detail, "; retry in ")
				detail += "; held: the run is halted"
			}
			if n := len(s.Attempts); n > 0 && s.State != stream.ShardRunning && s.Attempts[n-1].Log != "" {
				// Where the last attempt's output is: on its worker's host.
				detail += " (log: " + logOn(s.Attempts[n-1], here) + ")"
			}
			fmt.Fprintf(w, "  %s %s %s\n", s.ID, s.State, strings.TrimSpace(detail))
		}
	}
	if c := st.Coordinator; c != nil {
		build := ""
		if c.Version != "" {
			build = ", shardpool " + c.Version
		}
		if c.Cluster != "" {
			leader := c.Leader
			if leader == "" {
				leader = "none elected: no majority of the coordinators is up"
			}
			fmt.Fprintf(w, "coordinator %s on %s, one of cluster %s (each stream's copies: nats stream report), sync %s%s; runs tracked by %s\n",
				c.Name, c.Host, c.Cluster, c.Sync, build, leader)
		} else {
			fmt.Fprintf(w, "coordinator on %s, sync %s%s\n", c.Host, c.Sync, build)
		}
		if len(c.Versions) > 0 {
			var each []string
			for _, name := range slices.Sorted(maps.Keys(c.Versions)) {
				v := c.Versions[name]
				if v == "" {
					v = "a build too old to say"
				}
				each = append(each, name+" "+v)
			}
			fmt.Fprintf(w, "the coordinators of cluster %s run different builds of shardpool: %s (mid-upgrade: restart the rest on the new build, one at a time)\n", c.Cluster, strings.Join(each, ", "))
		}
		if c.StoreFull != "" {
			label := "STORE FULL"
			if storeReadOnly(c.StoreFull) {
				label = "STORE READ-ONLY"
			}
			fmt.Fprintf(w, "%s: %s; no shard can be leased or recorded: %s\n", label, c.StoreFull, storeTodo(c.StoreFull))
		}
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tHOST\tSLOTS\tRUNNING\tDONE\tFAILED\tREPORTED\tHEADROOM (binding limit)")
	for _, wk := range st.Workers {
		slots := classMap(wk.Slots)
		if wk.Auto {
			slots = "auto"
			if len(wk.Slots) > 0 {
				slots = "auto, caps " + slots
			}
		}
		reported := wk.Reported.Format("15:04:05")
		if wk.Gone != "" {
			reported += " GONE"
		} else if wk.Disconnected != "" {
			reported += " DISCONNECTED"
		}
		// A run's running shards include those whose command has ended
		// and that their worker still commits, records and acks (up to
		// 256 a worker): with short shards, 60 or more beside 4 slots.
		// The column counts commands; it says the rest, lest the run's
		// count look like a worker over its slots.
		running := classMap(wk.Running)
		if wk.Concluding > 0 {
			running += fmt.Sprintf(" +%d committing", wk.Concluding)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", wk.Name, wk.Host, slots, running, wk.Done, wk.Failed, reported, headroom(wk.Headroom))
	}
	if len(st.Workers) == 0 {
		fmt.Fprintln(tw, "(no live workers)")
	}
	tw.Flush()
	for _, wk := range st.Workers {
		if wk.Gone != "" {
			fmt.Fprintf(w, "%s: gone: %s; its report stays until the workers bucket's TTL\n", wk.Name, wk.Gone)
		}
		if wk.Disconnected != "" {
			fmt.Fprintf(w, "%s: disconnected: %s; killed, or cut off from the coordinator: its report stays until the workers bucket's TTL\n", wk.Name, wk.Disconnected)
		}
		if d := time.Duration(wk.ClockAhead); d != 0 {
			way := "ahead of"
			if d < 0 {
				way, d = "behind", -d
			}
			fmt.Fprintf(w, "%s: its clock is %s %s the coordinator's: the times it writes (its reports, its attempts' starts, its evidence) are off by as much; "+
				"other workers allow for it, but fix the time service on %s (timedatectl, chronyc tracking)\n", wk.Name, d.Round(time.Second), way, wk.Host)
		}
		if wk.Limits != "" {
			fmt.Fprintf(w, "%s: per-shard limits %s\n", wk.Name, wk.Limits)
		}
		if wk.SlurmJob != "" {
			fmt.Fprintf(w, "%s: runs in Slurm job %s (scancel %s ends it, its shards handed back)\n", wk.Name, wk.SlurmJob, wk.SlurmJob)
		}
		if n := len(wk.Awaiting); n > 0 {
			fmt.Fprintf(w, "%s: %d of its running slot(s) hold a shard that another attempt runs (%s): its message came again while that attempt ran; "+
				"the slot runs nothing and is free once that attempt ends (at most 3 lease TTLs)\n", wk.Name, n, strings.Join(wk.Awaiting, ", "))
		}
		if len(wk.Keeping) > 0 {
			fmt.Fprintf(w, "%s: idle past its --idle-exit, it stays while shards of class %s are out (running elsewhere, or due back after a retry's delay or a dead worker's lease), to run them should they come back\n",
				wk.Name, strings.Join(wk.Keeping, ", "))
		}
		printLeaving(w, wk)
		printFailingWorker(w, wk, st.Workers)
		printOtherBuild(w, wk, st.Coordinator)
		if wk.LeftRunning > 0 {
			fmt.Fprintf(w, "%s: %d attempt(s) left processes running when their command ended, killed then (the last: %s)\n", wk.Name, wk.LeftRunning, wk.LastLeft)
		}
		printSlowFS(w, wk)
	}
}

// printLeaving says what a draining or stopping worker still does (its
// report's Draining and Stopping): it exits only once its shards have
// settled. A drain showed only in the waits of classes with shards
// queued; a stop not at all.
func printLeaving(w io.Writer, wk stream.WorkerReport) {
	if wk.Stopping == "" && wk.Draining == "" {
		return
	}
	running := 0
	for _, n := range wk.Running {
		running += n
	}
	var what string
	switch {
	case running == 0:
		what = "no shard holds a slot"
	case wk.Stopping == "":
		what = fmt.Sprintf("%d shard(s) hold a slot and end as they would (to stop them now: kill %d on host %s)", running, wk.PID, wk.Host)
	default:
		what = fmt.Sprintf("%d shard(s) still hold a slot: a command running gets SIGTERM, and SIGKILL after its --grace; what they leave unfinished goes back to the queue, not charged", running)
		if !strings.Contains(wk.Stopping, "SIGKILL") {
			what += fmt.Sprintf(" (to kill them now, stop it again: kill %d on host %s)", wk.PID, wk.Host)
		}
	}
	if wk.Concluding > 0 {
		what += fmt.Sprintf("; %d shard(s) whose command ended are committed, recorded and acked first", wk.Concluding)
	}
	how, why := "draining", wk.Draining
	if wk.Stopping != "" {
		how, why = "stopping", wk.Stopping
		if !wk.StoppingSince.IsZero() {
			how += " since " + wk.StoppingSince.Format(time.TimeOnly)
		}
	}
	fmt.Fprintf(w, "%s: %s (%s): it fetches no more and exits once its shards have settled: %s\n", wk.Name, how, why, what)
}

// printSlowFS names a worker's attempts that wait on a file system that
// does not answer (the worker's slowfs.go).
func printSlowFS(w io.Writer, wk stream.WorkerReport) {
	if len(wk.SlowFS) == 0 {
		return
	}
	more := ""
	if n := wk.SlowFSCount - len(wk.SlowFS); n > 0 {
		more = fmt.Sprintf(", and %d more", n)
	}
	fmt.Fprintf(w, "%s: %d attempt(s) have waited long on a file system (a hung NFS mount, or a slow one? `stat DIR` on host %s tells); "+
		"they carry on once it answers (a shard in its commit stays RUNNING meanwhile, its lease renewed): %s%s\n",
		wk.Name, max(wk.SlowFSCount, len(wk.SlowFS)), wk.Host, strings.Join(wk.SlowFS, "; "), more)
}

// printOtherBuild warns about a worker that runs another build of
// shardpool than the coordinator: one left running from before an
// upgrade, or started from another installation. Records and reports
// keep their schema across builds, but what the worker does (admission,
// recovery, when it stops by itself) is its own build's.
func printOtherBuild(w io.Writer, wk stream.WorkerReport, c *stream.CoordinatorInfo) {
	if c == nil || c.Version == "" || wk.Version == "" || wk.Version == c.Version {
		return
	}
	for _, v := range c.Versions {
		if v == wk.Version {
			return // a cluster mid-upgrade: its coordinators' line says so
		}
	}
	fmt.Fprintf(w, "%s: runs shardpool %s, not the coordinator's %s: left from before an upgrade, or another installation? "+
		"To move it to the coordinator's build, drain it (kill -USR1 %d on %s) and start it again from that binary\n", wk.Name, wk.Version, c.Version, wk.PID, wk.Host)
}

// failingInARow is how many failed attempts in a row make status point
// at a worker.
const failingInARow = 5

// printFailingWorker warns about a worker whose last attempts all failed,
// and says whether other workers validate shards meanwhile: then the
// fault is likely its host's (a missing library, driver or mount), which
// only a person can fix. A worker started with --stop-when-failing-alone
// (the default) holds its fetches meanwhile and stops by itself once the
// shards' records prove it; one without goes on taking shards.
func printFailingWorker(w io.Writer, wk stream.WorkerReport, all []stream.WorkerReport) {
	if wk.FailedInARow < failingInARow {
		return
	}
	healthy := 0
	for _, o := range all {
		if o.Name != wk.Name && o.Done > 0 && o.FailedInARow < failingInARow {
			healthy++
		}
	}
	fmt.Fprintf(w, "%s: its last %d attempts failed, none validated since (the last: %s)\n", wk.Name, wk.FailedInARow, wk.LastFailure)
	if healthy > 0 {
		fmt.Fprintf(w, "%s: %d other worker(s) validate shards meanwhile, so host %s may lack what the command needs (a library, a driver, a mount): "+
			"read its attempt logs there; to stop it taking shards, drain it (kill -USR1 %d on %s) and fix the host "+
			"(a worker started with --stop-when-failing-alone, the default, holds its fetches and stops by itself once other workers validate the shards that failed there)\n", wk.Name, healthy, wk.Host, wk.PID, wk.Host)
	}
}

// maxShardLines bounds the shards status RUN prints per run; --json has
// them all.
const maxShardLines = 50

// longerThan says, for a shard that has run for took, when that is
// longer than every validated shard of timing took, or than 95% of them
// where they are enough for a 95th percentile to mean something ("" where
// neither).
//
// Not under a second: the time counts the commit after the command, and
// most of a run of short shards is concluding at any moment (as many as
// 256 a worker), each a few milliseconds past its command's end: "for
// 0.03s, longer than any of the 20336 validated took (the longest
// 0.02s)" named dozens of shards that were nearly done.
func longerThan(took time.Duration, t *stream.Timing) string {
	if t == nil || took < time.Second {
		return ""
	}
	secs := took.Seconds()
	switch {
	case secs > t.Seconds.Max:
		return fmt.Sprintf(", longer than any of the %d validated took (the longest %s)", t.Shards, shardSeconds(t.Seconds.Max))
	case t.Shards >= 20 && secs > t.Seconds.P95:
		return fmt.Sprintf(", longer than 95%% of the %d validated took (p95 %s)", t.Shards, shardSeconds(t.Seconds.P95))
	}
	return ""
}

// ranFor is how long a running attempt has run: "0.35s" under ten
// seconds ("0s" said nothing of a run of short shards), whole seconds
// after.
func ranFor(d time.Duration) string {
	if d < 10*time.Second {
		return shardSeconds(d.Seconds())
	}
	return d.Round(time.Second).String()
}

// worstFirst orders a run's shards not validated for reading: failed,
// then pending (a retry's delay, a reason to wait), then running, the
// longest running first, otherwise by ID. By ID alone, a run of short shards lists its 50 lines of running
// ones (up to 256 a worker are committing) and the failed shard whose
// reason a person looked for fell among the "... and 80 more".
func worstFirst(shards []stream.ShardRecord) []stream.ShardRecord {
	rank := func(state string) int {
		switch state {
		case stream.ShardFailed:
			return 0
		case stream.ShardPending:
			return 1
		case stream.ShardRunning:
			return 2
		}
		return 3
	}
	started := func(s stream.ShardRecord) time.Time {
		if at, ok := openAttempt(s); ok {
			return at.Start
		}
		return time.Time{}
	}
	out := slices.Clone(shards)
	slices.SortStableFunc(out, func(a, b stream.ShardRecord) int {
		// Running ones longest first: a straggler is what a person looks for.
		return cmp.Or(cmp.Compare(rank(a.State), rank(b.State)), started(a).Compare(started(b)))
	})
	return out
}

// openAttempt is the attempt a running shard's owner runs now, where its
// record holds it with its start.
func openAttempt(s stream.ShardRecord) (stream.Attempt, bool) {
	if !s.OpenAttempt() || s.Owner == nil {
		return stream.Attempt{}, false
	}
	at := s.Attempts[len(s.Attempts)-1]
	if at.N != s.Owner.Attempt || at.Start.IsZero() {
		return stream.Attempt{}, false
	}
	return at, true
}

// logOn is where an attempt's log is: its path, and its worker's host
// when that is not here.
func logOn(at stream.Attempt, here string) string {
	if at.Host != "" && at.Host != here {
		return at.Log + " on " + at.Host
	}
	return at.Log
}

// countStates says how many of shards, in worstFirst's order, are in
// each state, in that order: "3 failed, 80 running".
func countStates(shards []stream.ShardRecord) string {
	n := map[string]int{}
	var states []string
	for _, s := range shards {
		if n[s.State] == 0 {
			states = append(states, s.State)
		}
		n[s.State]++
	}
	parts := make([]string, len(states))
	for i, state := range states {
		parts[i] = fmt.Sprintf("%d %s", n[state], state)
	}
	return strings.Join(parts, ", ")
}

// awaitedBy names the workers that hold a delivery of the shard key while
// another owner's lease of it lives (WorkerReport.Awaiting).
func awaitedBy(workers []stream.WorkerReport, key string) []string {
	var names []string
	for _, wk := range workers {
		if slices.Contains(wk.Awaiting, key) {
			names = append(names, wk.Name)
		}
	}
	return names
}

// reportOf is the report of the worker process that owns a shard (same
// name, host and pid), or nil when none reports.
func reportOf(workers []stream.WorkerReport, o *stream.Owner) *stream.WorkerReport {
	for i := range workers {
		if wk := &workers[i]; wk.Name == o.Worker && wk.Host == o.Host && wk.PID == o.PID {
			return wk
		}
	}
	return nil
}

// commandPID is the pid of the command that the worker of report wk runs
// for the shard key in attempt, as the report lists it; 0 where it does
// not (no report, not started yet, ended, or a report from before).
func commandPID(wk *stream.WorkerReport, attempt int, key string) int {
	if wk == nil {
		return 0
	}
	for _, c := range wk.Commands {
		if c.Key == key && c.Attempt == attempt {
			return c.PID
		}
	}
	return 0
}

func classMap(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

// headroom renders a worker's budget: "mem 23.1GiB (cgroup memory at /x), cpu 2.00 (host online CPUs), ...".
func headroom(h map[string]stream.Resource) string {
	if len(h) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range []string{"memory", "cpu_millicores", "gpus", "vram", "scratch"} {
		r, ok := h[k]
		if !ok {
			continue
		}
		var v string
		switch {
		case r.Unknown != "":
			v = "unknown: " + r.Unknown
		case r.Unlimited:
			v = "unlimited"
		case k == "scratch":
			v = stream.FormatSize(r.Value) + " free"
			if t, ok := h["scratch_hard"]; ok && t.Unknown == "" {
				v += " of " + stream.FormatSize(t.Value)
			}
		case k == "memory" || k == "vram":
			v = stream.FormatSize(r.Value)
		case k == "cpu_millicores":
			v = fmt.Sprintf("%.2f", float64(r.Value)/1000)
		default:
			v = fmt.Sprint(r.Value)
		}
		name := strings.TrimSuffix(k, "_millicores")
		parts = append(parts, fmt.Sprintf("%s %s (%s)", name, v, r.Source))
	}
	return strings.Join(parts, ", ")
}

// fleetCaps reads the [fleet] caps of the user's policy file: the most
// shards of each class in flight across every host.
func fleetCaps() (map[string]int, error) {
	pol, err := probe.LoadPolicy(probe.DefaultPolicyPath(os.Getenv))
	if err != nil {
		return nil, err
	}
	return pol.Fleet, nil
}

// fleetCheck judges the run's classes (declared peaks) against the hard
// limits the live workers report (reports).
func fleetCheck(reports []stream.WorkerReport, spec *stream.Spec, man *stream.Manifest) string {
	var workers []plan.Worker
	for _, w := range reports {
		h := plan.Budget{}
		// "scratch" is no slot resource: FleetBlocked judges a class's
		// declared scratch against it (plan.FitsScratch).
		for res, key := range map[string]string{"cpu": "cpu_hard", "memory": "memory_hard", "gpus": "gpus_hard", "vram": "vram_hard", "scratch": "scratch_hard"} {
			r, ok := w.Headroom[key]
			if !ok && res == "cpu" {
				// Workers before cpu_hard: their CPU budget was capacity.
				r, ok = w.Headroom["cpu_millicores"]
			}
			if !ok {
				continue
			}
			switch {
			case r.Unknown != "":
				h[res] = probe.Unknown(r.Source, "%s", r.Unknown)
			case r.Unlimited:
				h[res] = probe.Unlimited(r.Source)
			default:
				h[res] = probe.Known(r.Value, r.Source)
			}
		}
		workers = append(workers, plan.Worker{Name: w.Name, Hard: h})
	}
	peaks := map[string]plan.Peak{}
	for c, cls := range spec.Classes {
		peaks[c] = plan.Declared(cls)
	}
	return plan.FleetBlocked(spec, man, peaks, workers)
}

// profiledPeaks is each class's memory peak measured by `shardpool
// profile` for this version of the job, which the workers' admission
// takes over the declared one (the run record's measured_memory), each
// GPU class's VRAM where measured above the declared (measured_vram),
// and a line saying where they came from or why a profile is not used. path
// names profile.json; empty, the one profile writes in the default state
// directory, where a missing file is no profile. (Until the fifty-fourth
// session only `run` passed them: a submitted run's workers admitted by
// the declared memory whatever the profile measured.)
func profiledPeaks(spec *stream.Spec, man *stream.Manifest, path string) (mem, vram map[string]int64, note string, err error) {
	named := path != ""
	if !named {
		path = filepath.Join(worker.DefaultStateDir(), "runs", spec.Name, "profile.json")
	}
	prof, err := plan.LoadProfile(path)
	if err != nil {
		return nil, nil, "", err
	}
	if prof == nil {
		if named {
			return nil, nil, "", exitErr{code: exitUsage, msg: fmt.Sprintf("submit: --profile %s: no such file", path)}
		}
		return nil, nil, "", nil
	}
	// The plan's own choice of peaks, budgets aside: the same job only,
	// each class of the manifest (outlier classes included).
	p := plan.Make(spec, man, "", plan.Budget{}, plan.Budget{}, prof, "")
	if p.ProfileUnused != "" {
		// A profile writes DATA/runs/<run>/profile.json: the command that
		// replaces this one, where it is so named, else the default's.
		data := worker.DefaultStateDir()
		if dir := filepath.Dir(path); filepath.Base(dir) == spec.Name && filepath.Base(filepath.Dir(dir)) == "runs" {
			data = filepath.Dir(filepath.Dir(dir))
		}
		return nil, nil, fmt.Sprintf("%s; run `%s` again", strings.Replace(p.ProfileUnused, "profile.json", path, 1), profileCommand(spec, data)), nil
	}
	mem, vram = measured(spec, p)
	maps.DeleteFunc(mem, func(_ string, m int64) bool { return m <= 0 }) // none caught: the declared stays
	var said []string
	for _, c := range slices.Sorted(maps.Keys(mem)) {
		said = append(said, fmt.Sprintf("%s %s", c, stream.FormatSize(mem[c])))
	}
	for _, c := range slices.Sorted(maps.Keys(vram)) {
		said = append(said, fmt.Sprintf("%s VRAM %s", c, stream.FormatSize(vram[c])))
	}
	if len(said) == 0 {
		return nil, nil, "", nil
	}
	note = fmt.Sprintf("measured peaks (%s), which the workers admit by: %s", path, strings.Join(said, ", "))
	for _, n := range p.ProfileNotes {
		note += "\n" + profileNote(n) // as plan and run repeat it
	}
	return mem, vram, note, nil
}

// storeReadOnly reports whether why, a coordinator's StoreFull, is its
// store's file system refusing writes rather than a want of space.
func storeReadOnly(why string) bool { return strings.Contains(why, "read-only file system") }

// storeState says what a coordinator's StoreFull makes of its store, now
// and as a stop's evidence puts it.
func storeState(why string) (is, was string) {
	if storeReadOnly(why) {
		return "cannot be written", "could not be written"
	}
	return "is full", "was full"
}

// storeTodo is what to do about a coordinator's StoreFull.
func storeTodo(why string) string {
	switch {
	case storeReadOnly(why):
		return "make its file system writable again (one remounted read-only after an error lists ro or emergency_ro in /proc/mounts, and needs fsck and a mount; the kernel log says why)"
	case strings.Contains(why, "of its limit of"):
		return "free space on its file system: the coordinator raises the limit by itself, to what the store holds plus three quarters of the free space, once that is 8 MiB more"
	}
	return "free space there"
}
