package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	"golang.org/x/term"

	"github.com/shardpool/shardpool/checkpoint"
	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/coordinator/plan"
	"github.com/shardpool/shardpool/staging"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
	"github.com/shardpool/shardpool/worker/probe"
)

func cmdRun(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("run", "shardpool run [--data DIR] [--slots N|CLASS=N,...] [flags] SPEC", stderr)
	data := fs.String("data", worker.DefaultStateDir(), "state `DIR`: JetStream store and evidence (runs/<run>/)")
	slots := &slotsFlag{auto: true}
	fs.Var(slots, "slots", "`SLOTS`: auto (from the host's budget and each class's declared or measured peak), N for every class, or CLASS=N,...")
	listen := fs.String("listen", "127.0.0.1:0", "NATS listener (`HOST:PORT`) for the nats CLI and extra workers (port 0: any free port)")
	httpAddr := fs.String("http", "", "serve GET /status and /metrics (Prometheus) on this `HOST:PORT`")
	tlsMode := registerTLS(fs)
	leaseTTL := fs.Duration("lease-ttl", stream.DefaultLeaseTTL, "lease TTL and ack wait")
	grace := fs.Duration("grace", 10*time.Second, "time a child has after SIGTERM before SIGKILL")
	retryFailed := fs.Bool("retry-failed", false, "requeue the shards that failed after their retries")
	halt := fs.Int64("halt", 5, "stop fetching once the first `N` shards this run ends have all failed after their retries, none validated (0: run every shard whatever fails)")
	syncMode := registerSync(fs)
	scratch := fs.String("scratch", "", "local scratch `DIR` (default shardpool-<name>-<uid> in the policy's first scratch directory this host has, or in $TMPDIR)")
	quiet := fs.Bool("quiet", false, "no progress display")
	verbose := fs.Bool("v", false, "debug logs")
	var sf stagingFlags
	sf.register(fs)
	spec, man, err := parseSpec(fs, args)
	if err != nil {
		return err
	}
	if *halt < 0 {
		return exitErr{code: exitUsage, msg: fmt.Sprintf("run: --halt %d: want a number of shards, or 0 never to halt", *halt)}
	}
	plan.SplitOutliers(spec, man)
	if err := slots.coverManifest(spec, man); err != nil {
		return err
	}
	if err := checkCommands(spec); err != nil {
		return err
	}
	if err := checkOutputGone(ctx, spec, *data); err != nil {
		return err
	}
	if err := checkOutputDir(spec); err != nil {
		return err
	}
	warnUnwritableOutput(spec, stderr)
	checkOutput(ctx, spec.Output, stderr)
	checkInputs(ctx, spec, man, stderr)
	// A scratch directory the worker cannot use would fail the run only
	// once it is queued: say so now.
	scratchDir, err := checkScratch(*scratch, worker.DefaultName())
	if err != nil {
		return err
	}
	if *scratch != "" {
		// Absolute in the resume command, which may be typed elsewhere.
		if *scratch, err = filepath.Abs(*scratch); err != nil {
			return err
		}
	}
	absData, err := filepath.Abs(*data)
	if err != nil {
		return err
	}
	// Plan before anything is queued: a shard no host here can ever run
	// makes the run BLOCKED now rather than pending forever.
	pl, err := makePlan(ctx, spec, man, absData)
	if err != nil {
		return err
	}
	if pl.Blocked != "" {
		if err := savePlan(absData, spec.Name, pl); err != nil {
			return err
		}
		printPlan(stdout, pl)
		return blockedErr(stdout, stderr, "run "+spec.Name+" is BLOCKED before queuing", pl.Blocked)
	}
	if why := scratchNeverFits(spec, man, scratchDir); why != "" {
		fmt.Fprintln(stdout, why)
		return blockedErr(stdout, stderr, "run "+spec.Name+" is BLOCKED before queuing", why)
	}
	log := logger(stderr, *verbose, slog.LevelWarn)
	// One store per run (DIR/stores/<run>): runs of other names can share
	// the state directory at the same time; the same run twice cannot.
	useTLS, err := tlsOn(*tlsMode, *listen, *httpAddr)
	if err != nil {
		return err
	}
	coord, err := coordinator.New(coordinator.Config{DataDir: absData, StoreDir: filepath.Join(absData, "stores", spec.Name), Listen: *listen, HTTP: *httpAddr,
		Sync: string(*syncMode), LeaseTTL: *leaseTTL, Auth: true, TLS: useTLS, Logger: log})
	if err != nil {
		return err
	}
	checkStore(ctx, coord.StoreDir(), stderr)
	if err := coord.Start(ctx); err != nil {
		if errors.Is(err, coordinator.ErrDataInUse) {
			return fmt.Errorf("%w; to follow it: shardpool status --data %s %s", err, shellQuote(absData), spec.Name)
		}
		return err
	}
	release, err := claimOutput(spec, absData, stderr)
	if err != nil {
		coord.Close()
		return err
	}
	defer release()
	// The settings of this host's worker and coordinator that the user
	// chose go with the commands; display flags (--quiet, -v) do not.
	host := carriedFlags(fs, "slots", "scratch", "sync", "lease-ttl", "grace", "halt", "listen", "http", "tls",
		"stage-concurrency", "stage-bwlimit", "stage-cache", "stage-fleet")
	resume := fmt.Sprintf("shardpool run --data %s%s %s", shellQuote(absData), host, shellQuote(spec.SpecPath))
	retry := fmt.Sprintf("shardpool run --data %s%s --retry-failed %s", shellQuote(absData), host, shellQuote(spec.SpecPath))
	caps, err := fleetCaps()
	if err != nil {
		coord.Close()
		return err
	}
	// Submit before the tracker starts, so that its first look at the run
	// includes what this submission changed (a retry, or outputs queued
	// again because they no longer verify) rather than judging the run
	// from before it, concurrently.
	submitted := time.Now()
	mem, vram := measured(spec, pl)
	res, err := coordinator.Submit(ctx, coord.JetStream(), spec, man, coordinator.SubmitOptions{RetryFailed: *retryFailed, Resume: resume, Retry: retry,
		Hashes: staging.LoadHashes(filepath.Join(absData, "inputs-cache.json")), MeasuredMemory: mem, MeasuredVRAM: vram, ClassCaps: caps, Reverify: true})
	if err != nil {
		coord.Close()
		if errors.Is(err, coordinator.ErrNothingToRetry) || errors.Is(err, coordinator.ErrRetryNewGeneration) {
			return exitErr{code: exitFailure, msg: err.Error()}
		}
		return err
	}
	// The store took the submission: this run speaks for the evidence now
	// (one it refused, such as another job of the same name, leaves it as
	// it was). A stop recorded by an earlier run no longer holds, nor a
	// forget: the name is this run's now.
	for _, name := range []string{coordinator.StoppedName, coordinator.ForgottenName} {
		if err := os.Remove(filepath.Join(coord.EvidenceDir(spec.Name), name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			log.Warn("remove "+name, "err", err)
		}
	}
	if err := savePlan(absData, spec.Name, pl); err != nil {
		fmt.Fprintf(stderr, "warning: plan.json not written to the run's evidence: %v\n", err)
	}
	recordOutputFS(ctx, spec, coord.EvidenceDir(spec.Name))
	g, gctx := errgroup.WithContext(context.WithoutCancel(ctx))
	coordCtx, stopCoord := context.WithCancel(gctx)
	defer stopCoord()
	g.Go(func() error { return coord.Run(coordCtx) })
	fmt.Fprintf(stdout, "run %s fingerprint %s: %d shard(s), %d published, state %s\n", res.Run, res.Fingerprint, len(man.Shards), res.Published, res.State)
	if pl.ProfileUnused != "" {
		// Before the slots it leaves to one a class: it says why.
		fmt.Fprintln(stdout, pl.ProfileUnused)
	}
	for _, n := range pl.ProfileNotes {
		// The peaks admission goes by may be a sample's that missed the
		// largest shards: said where it starts, not only by profile.
		fmt.Fprintln(stdout, profileNote(n))
	}
	if slots.auto {
		var profile, elsewhere string // the hint, made once, where needed
		for _, c := range pl.Classes {
			if _, one := plan.Unmeasured(c.Slots, c.Peak); one {
				if profile == "" {
					profile, elsewhere = profileCommand(spec, absData), profileElsewhere(spec, absData)
				}
				fmt.Fprintf(stdout, "slots: class %s runs one shard at a time: its memory peak is neither measured nor declared (run `%s`, declare memory in [class.%s], or pass --slots)%s\n",
					c.Class, profile, c.Class, elsewhere)
			}
		}
	}
	printReplaced(stdout, res)
	printRetried(stdout, res)
	printChanged(stdout, res, retry)
	printRedone(stdout, res)
	// The token stays out of what is printed (a terminal's scrollback,
	// a CI log), and out of argv, where every user of the host sees it.
	tlsca, cacert := "", ""
	if ca := coord.CAFile(); ca != "" {
		tlsca, cacert = " --tlsca "+shellQuote(ca), " --cacert "+shellQuote(ca)
		fmt.Fprintf(stdout, "TLS: certificate authority in %s (workers elsewhere: --token-file %s --tls-ca %s)\n", ca, shellQuote(coord.TokenFile()), shellQuote(ca))
	}
	fmt.Fprintf(stdout, "nats: %s, token in %s  (NATS_URL=nats://$(cat %s)@%s nats%s stream info %s)\n", coord.ClientURL(), coord.TokenFile(),
		shellQuote(coord.TokenFile()), urlHost(coord.ClientURL()), tlsca, stream.StreamShards)
	if u := coord.StatusURL(); u != "" {
		fmt.Fprintf(stdout, "status: %s  (curl%s -H \"Authorization: Bearer $(cat %s)\" %s); Prometheus metrics at %s\n", u, cacert, shellQuote(coord.TokenFile()), u, metricsURL(u))
	}
	follow := fmt.Sprintf("shardpool status --data %s %s", shellQuote(absData), spec.Name)
	fmt.Fprintf(stdout, "follow it from another terminal: %s\n", follow)
	if *scratch == "" {
		// Where the policy chose it, say where: not $TMPDIR, as without one.
		if pol, err := probe.LoadPolicy(policyPath("")); err == nil && len(pol.Scratch) > 0 {
			fmt.Fprintf(stdout, "scratch: %s (from the scratch list of %s)\n", scratchDir, pol.Path)
		}
	}

	*grace = graceUnderSlurm(ctx, *grace, stderr)
	wk, err := worker.New(worker.Config{JetStream: coord.JetStream(), AdoptOrphans: true, Slots: slots.forClasses(spec.ClassNames()), Auto: slots.auto,
		Scratch: *scratch, StateDir: absData, Grace: *grace, Staging: sf.config(""), StageFleet: sf.fleet, Logger: log,
		// One worker in the coordinator's process: short pull requests cost
		// nothing here and let it drain at once when the run completes (a
		// pull request in flight ends at its expiry, so that no message is
		// delivered to a fetch that has gone: with 100 ms, exiting took
		// 80 ms after COMPLETE).
		FetchWait: 20 * time.Millisecond})
	if err != nil {
		stopCoord()
		g.Wait()
		return err
	}
	workerCtx, stopWorker := context.WithCancel(gctx)
	defer stopWorker()
	workerDone := make(chan struct{})
	stopDrain, drained := drainOnSignal(stderr, wk)
	defer stopDrain()
	var workerErr error // read once workerDone is closed
	g.Go(func() error {
		defer close(workerDone)
		workerErr = wk.Run(workerCtx)
		return workerErr
	})
	// A drained worker returns before the run's verdict: the wait ends
	// with it.
	waitCtx, endWait := context.WithCancel(ctx)
	defer endWait()
	go func() {
		select {
		case <-workerDone:
			endWait()
		case <-waitCtx.Done():
		}
	}()

	var since time.Time
	if queuedWork(res) {
		since = submitted
	}
	wo := waitOpts{follow: follow, since: since, progress: progressOut(stderr, *quiet), full: coord.StoreFull, cpuLimit: wk.OthersLimit,
		ended: func() (int64, int64) { return wk.Ended(spec.Name) }, haltAt: *halt, committing: wk.Concluding,
		commands: func() []string { return wk.Commands(spec.Name) }}
	final, waitErr := waitRun(waitCtx, coord.JetStream(), spec.Name, wo)
	if errors.As(waitErr, new(errStoreFull)) {
		// What the worker writes on its way out would wait out a timeout
		// each: 12 of the 18 s `run` took to stop after its disk filled.
		wk.StoreRefusesWrites()
	}
	var halted errHalted
	var haltedWhy []string
	haltedMore := 0
	if errors.As(waitErr, &halted) {
		// Like SIGUSR1's drain: no more fetches; the running shards may
		// yet succeed, and end as they would.
		if n := wk.Running(); n > 0 {
			fmt.Fprintf(stderr, "halting: %s; %d running shard(s) end as they would, no more start (Ctrl-C stops them now)\n", halted, n)
		}
		wk.Drain("halted: " + halted.Error())
		select {
		case <-workerDone:
			// Read while the coordinator serves them: after it stops,
			// status --data has the evidence only, and a halted run has
			// no verdict there.
			haltedWhy, haltedMore = failedReasons(ctx, coord.JetStream(), spec.Name, 5)
		case <-ctx.Done():
			waitErr = ctx.Err() // interrupted while halting: as any interrupt
		}
	}
	// The wait ended with the worker's drain, not with a verdict or an
	// interrupt.
	drainedFirst := waitErr != nil && ctx.Err() == nil && (drained() || halted.failed > 0)
	if drainedFirst {
		// The drain's last shards may have been the run's last: the
		// verdict follows their records by a moment.
		vctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		wo.progress, wo.ended = io.Discard, nil
		if f, err := waitRun(vctx, coord.JetStream(), spec.Name, wo); err == nil {
			final, waitErr = f, nil
		}
		cancel()
	}
	if ctx.Err() != nil {
		defer announceDrain(stderr, wk, *grace)()
	}
	stopWorker() // the worker drains: SIGTERM to children, grace, Nak
	<-workerDone // its last records and Naks need the coordinator
	stopCoord()
	if err := g.Wait(); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("shutdown", "err", err)
	}
	evidence := coord.EvidenceDir(spec.Name)
	// Where a run stopped short of its verdict stands, said with its
	// resume command: the counts its coordinator left in progress.json
	// as it stopped, which status --data reports too.
	where := ""
	if waitErr != nil {
		where = stoodAt(evidence)
	}
	// Why the run stopped before its verdict, in its evidence: status
	// --data reads it once no coordinator serves the run.
	stopped := func(why string, failed []string, more int) {
		if err := coordinator.WriteStopped(evidence, coordinator.Stopped{Run: spec.Name, Why: why, Failed: failed, MoreFailed: more}); err != nil {
			log.Warn("write "+coordinator.StoppedName, "err", err)
		}
	}
	var full errStoreFull
	if errors.As(waitErr, &full) {
		state, was := storeState(full.why)
		stopped("its store "+was+": "+full.why, nil, 0)
		fmt.Fprintf(stdout, "stopped: the coordinator's store %s: %s\nstate is kept in %s; %s, then resume with: %s\n", state, full.why, absData, storeTodo(full.why), resume)
		return exitErr{code: exitFailure, msg: "run " + spec.Name + " stopped: its store " + state + ": " + full.why}
	}
	if waitErr != nil && drainedFirst && halted.failed > 0 {
		stopped("halted: "+halted.Error(), haltedWhy, haltedMore)
		fmt.Fprintf(stdout, "halted: %s, so the command may fail for every shard; the rest stay queued and state is kept in %s\n", halted, absData)
		for _, l := range haltedWhy {
			fmt.Fprintf(stdout, "  %s\n", l)
		}
		if haltedMore > 0 {
			fmt.Fprintf(stdout, "  and %d more failed\n", haltedMore)
		}
		fmt.Fprintf(stdout, "once the cause is fixed outside the spec: %s\n"+
			"once the spec is changed (a new generation): %s\n"+
			"(--halt 0 runs every shard whatever fails)\n", retry, resume)
		return blockedErr(stdout, stderr, "run "+spec.Name+" halted", halted.Error())
	}
	if waitErr != nil && drainedFirst {
		stopped("drained on SIGUSR1", nil, 0)
		fmt.Fprintf(stdout, "drained (SIGUSR1)%s: the running shards ended, the rest stay queued; state is kept in %s\nresume with: %s\n", where, absData, resume)
		return exitErr{code: exitInterrupted, msg: "run " + spec.Name + " drained on SIGUSR1 before it completed; resume with: " + resume}
	}
	if waitErr != nil && ctx.Err() == nil && workerErr != nil {
		stopped("its worker stopped: "+workerErr.Error(), nil, 0)
		fmt.Fprintf(stdout, "the worker stopped%s; state is kept in %s\nresume with: %s\n", where, absData, resume)
		return fmt.Errorf("run %s: %w", spec.Name, workerErr)
	}
	if waitErr != nil {
		stopped("interrupted (SIGINT, SIGTERM or SIGHUP)", nil, 0)
		fmt.Fprintf(stdout, "interrupted%s; state is kept in %s\nresume with: %s\n", where, absData, resume)
		return waitErr
	}
	printVerdict(stdout, final)
	fmt.Fprintf(stdout, "outputs:  %s\nevidence: %s\n", spec.Output, evidence)
	for _, msg := range wk.PeaksAbove(spec.Name) {
		// Said on stderr when it happened, among the progress lines: again
		// with the verdict, where it is read.
		fmt.Fprintf(stdout, "memory:   %s (decision=peak-above in %s)\n", msg, filepath.Join(evidence, "admission.log"))
	}
	if n, first := wk.LeftRunning(spec.Name); n > 0 {
		fmt.Fprintf(stdout, "left running: %d attempt(s) left processes running when their command ended, killed then (the first, %s); a job that starts a daemon or a server must stop it before it exits (decision=left-running in %s)\n",
			n, first, filepath.Join(evidence, "admission.log"))
	}
	if final.State == stream.RunBlocked {
		return blockedErr(stdout, stderr, "run "+final.Name+" is BLOCKED", final.Reason)
	}
	return nil
}

// printVerdict prints a run's verdict as run and --wait end with it:
// its state and counts, its reason, and its shards' timing.
func printVerdict(w io.Writer, final *stream.RunRecord) {
	fmt.Fprintf(w, "run %s: %s  (%d validated, %d failed of %d)\n", final.Name, final.State, final.Counts.Validated, final.Counts.Failed, final.Counts.Total)
	if final.Reason != "" {
		fmt.Fprintf(w, "reason: %s\n", final.Reason)
	}
	if t := timingText(final.Timing); t != "" {
		fmt.Fprintln(w, "shards:   "+t)
	}
}

// blockedErr is the error of a command whose run is BLOCKED for reason,
// which it has just printed on stdout. Where stderr is the same file (a
// terminal, or 2>&1) the error points to it instead of repeating a reason
// that can name a dozen shards; where they are apart, stderr alone says why.
func blockedErr(stdout, stderr io.Writer, what, reason string) exitErr {
	if sameFile(stdout, stderr) {
		return exitErr{code: exitBlocked, msg: what + " (the reason is above)"}
	}
	return exitErr{code: exitBlocked, msg: what + ": " + reason}
}

// sameFile reports whether a and b write to the same file: one terminal,
// or both streams redirected to one file or pipe.
func sameFile(a, b io.Writer) bool {
	fa, ok1 := a.(*os.File)
	fb, ok2 := b.(*os.File)
	if !ok1 || !ok2 {
		return false
	}
	sa, err1 := fa.Stat()
	sb, err2 := fb.Stat()
	return err1 == nil && err2 == nil && os.SameFile(sa, sb)
}

// announceDrain says what an interrupted worker does before it exits,
// which can take the whole grace period, and lets a second SIGINT or
// SIGTERM cut it short (worker.Hurry). Before, a Ctrl-C showed nothing for
// up to --grace, and a second one did nothing. A second signal that came
// before this was called (stopContext keeps it) cuts it short at once.
// The returned func stops listening.
func announceDrain(stderr io.Writer, wk *worker.Worker, grace time.Duration) func() {
	if n := wk.Running(); n > 0 {
		fmt.Fprintf(stderr, "stopping: %d running shard(s) get SIGTERM and %s to end, then SIGKILL; their attempts are not counted (interrupt again to kill them now)\n", n, grace)
	} else {
		fmt.Fprintln(stderr, "stopping")
	}
	var once sync.Once
	stopAgain := onStopAgain(func() {
		once.Do(func() {
			fmt.Fprintln(stderr, "stopping now: SIGKILL to the running shards")
			wk.Hurry()
		})
	})
	// Past the grace, what the stop still waits on: a commit on a hung
	// mount can hold it for as long as the mount does not answer, and
	// nothing else is printed meanwhile.
	done := make(chan struct{})
	go func() {
		began := time.Now()
		t := time.NewTimer(grace + stillStoppingAfter)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
			}
			fmt.Fprintln(stderr, stillStopping(wk, time.Since(began)))
			t.Reset(stillStoppingEvery)
		}
	}()
	return func() {
		stopAgain()
		close(done)
	}
}

// A stop that outlasts the grace by stillStoppingAfter says what it waits
// on, and again every stillStoppingEvery.
const (
	stillStoppingAfter = 5 * time.Second
	stillStoppingEvery = 30 * time.Second
)

// stillStopping is the line a stop that outlasts its grace prints.
func stillStopping(wk *worker.Worker, took time.Duration) string {
	var what []string
	if n := wk.Running(); n > 0 {
		what = append(what, fmt.Sprintf("%d shard(s) hold a slot", n))
	}
	if n := wk.Concluding(); n > 0 {
		what = append(what, fmt.Sprintf("%d shard(s) whose command ended are committed and recorded", n))
	}
	if waits, n := wk.FSWaits(time.Second); n > 0 {
		more := ""
		if n > len(waits) {
			more = fmt.Sprintf(", and %d more", n-len(waits))
		}
		what = append(what, fmt.Sprintf("%d attempt(s) wait on a file system (a large commit, or a mount that does not answer, such as a hung NFS mount; it exits once they are through): %s%s", n, strings.Join(waits, "; "), more))
	}
	if len(what) == 0 {
		what = append(what, "its last records and hand-backs wait for the coordinator")
	}
	return fmt.Sprintf("still stopping after %s: %s", took.Round(time.Second), strings.Join(what, "; "))
}

// drainOnSignal drains wk on SIGUSR1, which Slurm sends ahead of a job's
// end where the job asks for it (`--signal=USR1@SECONDS`): no more shards
// are fetched, the running ones end as they would, and the worker exits
// once they have settled. Before, Go ignored the signal. The returned func
// stops listening; drained reports whether the signal came.
func drainOnSignal(stderr io.Writer, wk *worker.Worker) (stop func(), drained func() bool) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	done := make(chan struct{})
	var got atomic.Bool
	go func() {
		select {
		case <-sig:
			got.Store(true)
			fmt.Fprintf(stderr, "SIGUSR1: draining: no more shards are fetched; %d running shard(s) end as they would, then this exits (SIGTERM stops them now)\n", wk.Running())
			wk.Drain("SIGUSR1")
		case <-done:
		}
	}()
	return func() {
		signal.Stop(sig)
		close(done)
	}, got.Load
}

// outputFSName, in a run's evidence, names the file system that held
// its output directory when it last ran (probe.PathInfo.Mount).
const outputFSName = "output-fs"

// checkOutputGone refuses to make again, or to fill again, an output
// directory this run committed outputs to before (its progress.json
// says so) where the directory is missing and would now be made on
// another file system than the one that held it (outputFSName), or is
// there, empty, on another one: that file system is likely not mounted
// (an NFS or sshfs mount point left empty, the output directory or one
// above it), and outputs committed into the mount point would be hidden
// once it is mounted back. Removed from the same file system, the
// directory is made again and the outputs redone; one that holds
// something on another file system (outputs moved there) is taken.
func checkOutputGone(ctx context.Context, spec *stream.Spec, data string) error {
	fi, err := os.Lstat(spec.Output)
	missing := errors.Is(err, fs.ErrNotExist)
	switch {
	case err != nil && !missing:
		return nil // checkOutputDir says why
	case !missing:
		if !fi.IsDir() {
			return nil
		}
		if ents, err := os.ReadDir(spec.Output); err != nil || len(ents) > 0 {
			return nil
		}
	}
	abs, err := filepath.Abs(data)
	if err != nil {
		return nil
	}
	dir := filepath.Join(abs, "runs", spec.Name)
	p, err := coordinator.ReadProgress(dir)
	if err != nil || p == nil || p.Output != spec.Output || p.Counts.Validated == 0 {
		return nil
	}
	record := filepath.Join(dir, outputFSName)
	b, err := os.ReadFile(record)
	was := strings.TrimSpace(string(b))
	if err != nil || was == "" {
		return nil // recorded by no run before this check was
	}
	pr, err := probe.New(probe.Config{})
	if err != nil {
		return nil
	}
	now := pr.Where(ctx, spec.Output).Mount() // missing: of the nearest directory above it
	if now == was {
		return nil
	}
	if missing {
		return exitErr{code: exitFailure, msg: fmt.Sprintf("run %s: the output directory %s does not exist, though this run committed %d shard output(s) there, on %s; made now, it would be on %s. "+
			"If that file system is not mounted here, mount it and run again; to have the outputs made again where the directory would be now, make it (mkdir -p %s) and run again",
			spec.Name, spec.Output, p.Counts.Validated, was, now, shellQuote(spec.Output))}
	}
	return exitErr{code: exitFailure, msg: fmt.Sprintf("run %s: the output directory %s is empty and on %s, though this run committed %d shard output(s) there, on %s. "+
		"If that file system is not mounted here, mount it and run again; to have the outputs made again where the directory is now, remove %s and run again",
		spec.Name, spec.Output, now, p.Counts.Validated, was, shellQuote(record))}
}

// recordOutputFS notes in the run's evidence which file system holds its
// output directory (outputFSName), for checkOutputGone.
func recordOutputFS(ctx context.Context, spec *stream.Spec, evidence string) {
	pr, err := probe.New(probe.Config{})
	if err != nil {
		return
	}
	pi := pr.Where(ctx, spec.Output)
	if pi.Unknown != "" || pi.Missing {
		return
	}
	path := filepath.Join(evidence, outputFSName)
	if b, err := os.ReadFile(path); err == nil && string(b) == pi.Mount()+"\n" {
		return
	}
	if os.MkdirAll(evidence, 0o755) == nil {
		_ = checkpoint.WriteFile(path, []byte(pi.Mount()+"\n"))
	}
}

// checkOutputDir makes the output directory: a `run` commits every shard
// there, and one that cannot be made would run every shard to fail each at
// its commit. (It does not probe for a write: re-running a COMPLETE run
// over outputs made read-only verifies them and writes nothing.)
func checkOutputDir(spec *stream.Spec) error {
	if err := os.MkdirAll(spec.Output, 0o755); err != nil {
		return fmt.Errorf("%s: field %q: %w: %v", spec.At("", "output"), "output", stream.ErrInvalidSpec, err)
	}
	return nil
}

// warnUnwritableOutput says, before anything runs, that the output
// directory cannot be written here: every shard that runs then fails
// without running its command (the worker looks first). Only a warning:
// a COMPLETE run re-run over outputs made read-only writes nothing.
func warnUnwritableOutput(spec *stream.Spec, stderr io.Writer) {
	if err := unix.Access(spec.Output, unix.W_OK); err != nil {
		fmt.Fprintf(stderr, "warning: the output directory %s cannot be written on this host (%v): shards that are not committed yet will fail without running\n", spec.Output, err)
	}
}

// scratchNeverFits names a shard whose class declares more scratch than
// the whole file system of the scratch directory (checkScratch's) holds:
// the worker would fail each of its attempts unrun, so the run is BLOCKED
// before anything is queued, as for a memory no host here has. "" when
// every class fits, or the size cannot be read (the worker's own check
// remains).
func scratchNeverFits(spec *stream.Spec, man *stream.Manifest, scratch string) string {
	st, err := probe.SysStatFS{}.Statfs(scratch)
	if err != nil {
		return ""
	}
	total := probe.Known(st.Total(), "statfs "+scratch)
	for _, sh := range man.Shards {
		if ok, why := plan.FitsScratch(total, spec.Classes[sh.Class].Scratch); !ok {
			return fmt.Sprintf("shard %s (class %s) %s: no worker here can ever run it; lower the class's scratch, or pass --scratch DIR on a larger disk", sh.ID, sh.Class, why)
		}
	}
	return ""
}

// checkCommands refuses a run whose command or validator cannot be found
// here, before anything is queued: every attempt would fail to start, be
// retried and end BLOCKED. `run` executes on this host, so this host's
// answer is the one that counts. A program named through a placeholder
// is not checked.
func checkCommands(spec *stream.Spec) error {
	if probs := commandProblems(spec); len(probs) > 0 {
		return probs[0].err
	}
	return nil
}

// commandProblem is why the command or the validator would not start: on
// this host, or (everywhere) on any host that sees the same file.
type commandProblem struct {
	err        error
	everywhere bool
}

// commandProblems checks the programs of the spec's command and validator
// as exec would find them on this host: on PATH, or relative to the
// spec's directory; then, for a script, its #! line (worker.ScriptProblem).
// The file's own faults (no execute bit, no #! line, Windows line ends)
// fail on every host that sees it; a program or interpreter missing here
// may be on the workers'.
func commandProblems(spec *stream.Spec) []commandProblem {
	var probs []commandProblem
	for _, f := range []struct {
		field string
		argv  []string
	}{{"command", spec.Command}, {"validator", spec.Validator}} {
		if len(f.argv) == 0 || strings.Contains(f.argv[0], "{") {
			continue
		}
		// The spec is read for the field's line only where it has a fault.
		add := func(everywhere bool, format string, args ...any) {
			probs = append(probs, commandProblem{err: fmt.Errorf("%s: field %q: "+format, append([]any{spec.At("", f.field), f.field}, args...)...), everywhere: everywhere})
		}
		prog := f.argv[0]
		path := prog
		if !strings.Contains(prog, "/") {
			p, err := exec.LookPath(prog)
			if err != nil {
				add(false, "%s is not an executable on this host's PATH", prog)
				continue
			}
			path = p
		} else {
			if !filepath.IsAbs(path) {
				path = filepath.Join(spec.Dir, path)
			}
			fi, err := os.Stat(path)
			if err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
				// Not found may be this host's view alone; a file that is
				// there without its execute bit is the file's own fault.
				why := "not found"
				if err == nil {
					why = "not an executable file"
				}
				add(err == nil, "%s: %s (relative paths are taken from the spec's directory)", path, why)
				continue
			}
		}
		// A script the kernel would not run fails every attempt of every
		// shard with an error that names the script ("exec format
		// error", or "no such file or directory" of a file that is there).
		look := exec.LookPath
		if _, own := spec.Env["PATH"]; own {
			look = nil // the command's PATH is not this process's
		}
		if why, anyHost := worker.ScriptProblem(path, look); why != "" {
			add(anyHost, "%s", why)
		}
	}
	return probs
}

func loadRun(path string) (*stream.Spec, *stream.Manifest, error) {
	spec, err := stream.LoadSpec(path)
	if err != nil {
		return nil, nil, err
	}
	man, err := stream.LoadManifest(spec)
	if err != nil {
		return nil, nil, err
	}
	return spec, man, nil
}

// errStoreFull ends a wait whose coordinator's store has had no room for
// storeFullFor: no shard can be leased or recorded until space is freed.
type errStoreFull struct{ why string }

func (e errStoreFull) Error() string { return "store full: " + e.why }

// storeFullFor is how long the store must stay full before `run` stops.
const storeFullFor = 5 * time.Second

// waitOpts is what waitRun watches besides the run record.
type waitOpts struct {
	follow   string    // the status command of the run, for the notes
	since    time.Time // a verdict last updated before it is stale
	progress io.Writer // nil: no progress display
	// full says why the coordinator's store refuses writes, "" while it
	// takes them; a store full for storeFullFor ends the wait with
	// errStoreFull.
	full func() string
	// cpuLimit is the limit others' CPU use sets on the local worker.
	cpuLimit func() (string, int64)
	// ended is what the local worker concluded of the run since it
	// started (worker.Ended): haltAt shards failed with none validated
	// ends the wait with errHalted (0: never); failingWarnAt of them
	// short of haltAt is warned about.
	ended  func() (validated, failed int64)
	haltAt int64
	// committing is how many shards the local worker concludes now
	// (worker.Concluding), and commands the shards whose command it runs
	// (worker.Commands), for the progress line.
	committing func() int
	commands   func() []string
}

// failedReasons lists up to most failed shards of run with their reasons
// and attempt logs, a line each, from the records the coordinator
// serves, and how many more failed; none when it cannot read them.
func failedReasons(ctx context.Context, js jetstream.JetStream, run string, most int) (lines []string, more int) {
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := coordinator.ReadStatus(rctx, js, run)
	if err != nil || len(st.Runs) != 1 {
		return nil, 0
	}
	n := 0
	for _, r := range st.Runs[0].Shards {
		if r.State != stream.ShardFailed {
			continue
		}
		if n++; n > most {
			continue
		}
		line := r.ID + ": " + r.Reason
		if k := len(r.Attempts); k > 0 && r.Attempts[k-1].Log != "" {
			line += " (log: " + r.Attempts[k-1].Log + ")"
		}
		lines = append(lines, line)
	}
	return lines, max(n-len(lines), 0)
}

// errHalted ends a run's wait when the first failed shards to end all
// failed after their retries (--halt).
type errHalted struct{ failed int64 }

func (e errHalted) Error() string {
	return fmt.Sprintf("the first %d shard(s) to end all failed after their retries and none succeeded", e.failed)
}

// stoodAt is " at 5/20 validated, 1 failed" from the progress.json of a
// run's evidence, or "" where there is none.
func stoodAt(evidence string) string {
	p, err := coordinator.ReadProgress(evidence)
	if err != nil || p == nil || p.Counts.Total == 0 {
		return ""
	}
	s := fmt.Sprintf(" at %d/%d validated", p.Counts.Validated, p.Counts.Total)
	if p.Counts.Failed > 0 {
		s += fmt.Sprintf(", %d failed", p.Counts.Failed)
	}
	return s
}

// waitRun follows the run record until COMPLETE or BLOCKED, ignoring a
// verdict last updated before o.since.
func waitRun(ctx context.Context, js jetstream.JetStream, run string, o waitOpts) (*stream.RunRecord, error) {
	kv, err := js.KeyValue(ctx, stream.BucketRuns)
	if err != nil {
		return nil, err
	}
	w, err := kv.Watch(ctx, run)
	if err != nil {
		return nil, err
	}
	defer stream.StopWatch(w)
	p := newProgress(o.progress)
	p.committing, p.commands = o.committing, o.commands
	defer p.done()
	check := time.NewTicker(time.Second)
	defer check.Stop()
	var fullSince time.Time
	var shown *stream.RunRecord // the last record shown
	var last stream.Counts
	var lastAt time.Time
	stalled := ""                       // the reason last printed for pending shards that do not run
	limited, limitedKey := "", int64(0) // the CPU limit others' use sets, as last printed
	warnedFailing := false
	// judge is the check of what the local worker concluded: the halt, or
	// the warning short of it. It runs often (two atomic loads), so that
	// a command failing in milliseconds halts near haltAt, not at the
	// record's next update.
	judge := func() error {
		switch ok, failed := o.ended(); {
		case ok > 0:
		case o.haltAt > 0 && failed >= o.haltAt:
			return errHalted{failed: failed}
		case !warnedFailing && failed >= failingWarnAt:
			p.note(fmt.Sprintf("warning: the first %d shard(s) to end all failed after their retries and none succeeded: the command may fail for every shard. "+
				"Their reasons: %s; Ctrl-C stops the run and keeps its state", failed, o.follow))
			warnedFailing = true
		}
		return nil
	}
	var judgeC <-chan time.Time // nil, so never ready, without o.ended
	if o.ended != nil {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		judgeC = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-judgeC:
			if err := judge(); err != nil {
				return nil, err
			}
		case <-check.C:
			if shown != nil {
				// A change that came within 2 s of the last plain line,
				// with no record since (the run's tail), is printed now,
				// and a terminal's bar follows the commands that end.
				p.show(shown)
			}
			why := ""
			if o.full != nil {
				why = o.full()
			}
			switch {
			case why == "":
				fullSince = time.Time{}
			case fullSince.IsZero():
				fullSince = time.Now()
			case time.Since(fullSince) >= storeFullFor:
				return nil, errStoreFull{why: why}
			}
			// Fewer shards at once because others keep CPUs busy, and
			// back to the whole host: said when it starts and ends, not
			// as the measured use moves.
			if o.cpuLimit != nil {
				now, key := o.cpuLimit()
				switch {
				case now != "" && (limited == "" || key != limitedKey):
					p.note("cpu: " + now)
				case now == "" && limited != "":
					p.note("cpu: others' use of this host's CPUs no longer limits the shards at once")
				}
				limited, limitedKey = now, key
			}
			// Shards pending and none running for a while: say why (the
			// worker's own words: another run holding the host, memory,
			// a fleet cap), once per reason, not only the counts.
			if last.Pending > 0 && last.Running == 0 && !lastAt.IsZero() && time.Since(lastAt) >= stallAfter {
				if w := waitingReason(ctx, js, run); w != "" && !worker.SameReason(w, stalled) {
					p.note("waiting: " + w)
					stalled = w
				}
			}
		case e, ok := <-w.Updates():
			if !ok {
				if ctx.Err() != nil {
					// nats.go ends the watch when ctx ends: an interrupt,
					// not a lost watch (select picks either when both are
					// ready).
					return nil, ctx.Err()
				}
				return nil, fmt.Errorf("watch of run %s ended", run)
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var r stream.RunRecord
			if err := stream.Decode(e.Value(), &r); err != nil {
				return nil, err
			}
			// A run halted by hand is BLOCKED while its running shards
			// end as they would (shardpool halt): the verdict waits for
			// them, which the worker would otherwise stop and hand back.
			done := r.State == stream.RunComplete || (r.State == stream.RunBlocked && r.Counts.Running == 0)
			if done && r.Updated.Before(o.since) {
				continue
			}
			if r.Counts != last || lastAt.IsZero() {
				last, lastAt = r.Counts, time.Now()
				if r.Counts.Running > 0 {
					stalled = ""
				}
			}
			p.show(&r)
			if done {
				return &r, nil
			}
			shown = &r
		}
	}
}

// failingWarnAt is how many shards must have failed, with none validated,
// before run warns that the command may fail for every shard (where
// --halt does not stop it first).
const failingWarnAt = 5

// stallAfter is how long shards may be pending with none running before
// run says why.
const stallAfter = 2 * time.Second

// waitingReason is why the run's queued shards are not running, as its
// status has it (the workers' reports); "" when it says nothing.
func waitingReason(ctx context.Context, js jetstream.JetStream, run string) string {
	st, err := coordinator.ReadStatus(ctx, js, run)
	if err != nil || len(st.Runs) != 1 {
		return ""
	}
	return strings.Join(st.Runs[0].Waiting, "; ")
}

// progress draws a bar on a terminal and plain lines elsewhere.
type progress struct {
	w     io.Writer
	tty   bool
	last  time.Time
	line  string
	bar   string // the bar last drawn, on a terminal
	drawn bool
	// ending is how fast shards end, for the rate and the time left.
	ending coordinator.Pace
	// committing is how many shards the local worker concludes now, their
	// command ended (worker.Concluding); nil where there is none.
	committing func() int
	// commands names the shards whose command the local worker runs now
	// (worker.Commands); nil where there is none.
	commands func() []string
}

// tailNames is how many running shards, at most, the progress line names
// once none is pending: the tail a run waits for.
const tailNames = 3

// pace is the rate at which shards end and the time the pending and
// running ones need at it (", 12.5/s, about 3m left"), or "" until a few
// seconds of this run have seen shards end, and once none is left. With
// none pending it gives no time left: the running ones end when they
// end, not at the rate of the run (the tail of 2 stragglers was "about
// 0s left" for as long as they ran).
func (p *progress) pace(c stream.Counts, now time.Time) string {
	perSec, left, ok := p.ending.Observe(now, c.Validated+c.Failed, c.Pending+c.Running)
	if !ok {
		return ""
	}
	if c.Pending == 0 {
		return ", " + rate(perSec)
	}
	return fmt.Sprintf(", %s, about %s left", rate(perSec), roughly(left))
}

// rate is a rate of shards a person reads at a glance: "16/s", "1.5/s",
// "2.0/min", "1.0/h".
func rate(perSec float64) string {
	switch {
	case perSec >= 10:
		return fmt.Sprintf("%.0f/s", perSec)
	case perSec >= 1:
		return fmt.Sprintf("%.1f/s", perSec)
	case perSec*60 >= 1:
		return fmt.Sprintf("%.1f/min", perSec*60)
	}
	return fmt.Sprintf("%.1f/h", perSec*3600)
}

// roughly rounds a time left to what a person reads at a glance: "45s",
// "1m30s" (tens of seconds under ten minutes), "13m", "2h05m".
func roughly(d time.Duration) string {
	if r := d.Round(time.Second); r < time.Minute {
		return r.String()
	}
	if r := d.Round(10 * time.Second); r < 10*time.Minute {
		if s := int(r.Seconds()) % 60; s != 0 {
			return fmt.Sprintf("%dm%02ds", int(r.Minutes()), s)
		}
		return fmt.Sprintf("%dm", int(r.Minutes()))
	}
	r := d.Round(time.Minute)
	if r < time.Hour {
		return fmt.Sprintf("%dm", int(r.Minutes()))
	}
	return fmt.Sprintf("%dh%02dm", int(r.Hours()), int(r.Minutes())%60)
}

func progressOut(stderr io.Writer, quiet bool) io.Writer {
	if quiet {
		return nil
	}
	return stderr
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.tty = true
	}
	return p
}

func (p *progress) show(r *stream.RunRecord) {
	if p.w == nil {
		return
	}
	c := r.Counts
	text := p.counts(r)
	pace := ""
	if r.State != stream.RunBlocked {
		// A halted run's pending shards are held: no time left to give.
		pace = p.pace(c, time.Now())
	}
	if p.tty {
		const width = 30
		filled := 0
		if c.Total > 0 {
			filled = width * (c.Validated + c.Failed) / c.Total
		}
		p.bar = fmt.Sprintf("[%s%s] %s%s", strings.Repeat("#", filled), strings.Repeat(".", width-filled), text, pace)
		fmt.Fprintf(p.w, "\r%s\x1b[K", p.bar)
		p.drawn = true
		return
	}
	// Plain lines: on state changes and at most every 2 seconds.
	if text == p.line || (time.Since(p.last) < 2*time.Second && r.State == stateOf(p.line) && r.State != stream.RunComplete && r.State != stream.RunBlocked) {
		return
	}
	p.line, p.last = text, time.Now()
	fmt.Fprintln(p.w, text+pace)
}

// counts is the progress line's text without its pace. A shard counts
// as running from its start until its record concludes it, so the
// shards of a worker that commits aside, their slots free again, can
// outnumber its slots: those the local worker is committing now are said
// ("9 running (6 committing)"), lest "runs one shard at a time" above
// read as broken. Read at another moment than the record's count, the
// number is capped at it. Once none is pending, the last few running are
// named ("1 running: doc-0007").
func (p *progress) counts(r *stream.RunRecord) string {
	c := r.Counts
	running := fmt.Sprintf("%d running", c.Running)
	if p.committing != nil {
		if k := min(p.committing(), c.Running); k > 0 {
			running += fmt.Sprintf(" (%d committing)", k)
		}
	}
	if p.commands != nil && c.Pending == 0 && c.Running > 0 && c.Running <= tailNames {
		// The last shards: which ones the run waits for (status --data
		// says for how long).
		if ids := p.commands(); len(ids) > 0 && len(ids) <= tailNames {
			running += ": " + strings.Join(ids, ", ")
		}
	}
	return fmt.Sprintf("%s %d/%d validated, %s, %d failed, %d pending", r.State, c.Validated, c.Total, running, c.Failed, c.Pending)
}

func stateOf(line string) string { s, _, _ := strings.Cut(line, " "); return s }

// note prints a line of its own (on a terminal, below the bar, which the
// next update draws again).
func (p *progress) note(text string) {
	if p.w == nil {
		return
	}
	if p.tty && p.drawn {
		fmt.Fprintf(p.w, "\r%s\x1b[K\n%s", text, p.bar)
		return
	}
	fmt.Fprintln(p.w, text)
}

func (p *progress) done() {
	if p.tty && p.drawn {
		fmt.Fprintln(p.w)
	}
}

// shardSeconds is f seconds of a shard's command as the timing line
// gives them: under 10 ms in milliseconds, over 10 s as a duration.
func shardSeconds(f float64) string {
	switch {
	case f < 0.01:
		return fmt.Sprintf("%.1fms", f*1000) // /bin/true: 1.2ms, not 0.00s
	case f < 10:
		return fmt.Sprintf("%.2fs", f)
	}
	return time.Duration(f * float64(time.Second)).Round(100 * time.Millisecond).String()
}

// timingText is what a run's validated shards took (its record's timing,
// as final.json has it), for one line: "40 timed: 0.08s p50, 0.12s p95,
// 0.15s max (doc-0007); peak memory 5.1MiB p50, 6.0MiB p95, 7.2MiB max
// (doc-0031)"; "" where no shard was timed. run's verdict prints it as
// its shards: line, status beside the run's reason.
func timingText(t *stream.Timing) string {
	if t == nil {
		return ""
	}
	line := fmt.Sprintf("%d timed: %s p50, %s p95, %s max (%s)", t.Shards,
		shardSeconds(t.Seconds.P50), shardSeconds(t.Seconds.P95), shardSeconds(t.Seconds.Max), t.Seconds.MaxShard)
	switch m := t.PeakMemory; {
	case m == nil:
		// Not a zero: unknown, and why (docs/cli.md).
		line += "; peak memory not measured (each command too short to sample, and below the worker's own size: docs/cli.md)"
	case m.Shards > 0 && m.Shards < t.Shards:
		// Those measured may be the largest (a peak above the worker's
		// own): say they are not all.
		line += fmt.Sprintf("; peak memory %s p50, %s p95, %s max (%s) of the %d measured (the others too short to sample, and below the worker's own size)", stream.FormatSize(m.P50), stream.FormatSize(m.P95), stream.FormatSize(m.Max), m.MaxShard, m.Shards)
	default:
		line += fmt.Sprintf("; peak memory %s p50, %s p95, %s max (%s)", stream.FormatSize(m.P50), stream.FormatSize(m.P95), stream.FormatSize(m.Max), m.MaxShard)
	}
	return line
}

// shellQuote quotes s for the resume command a person pastes into a shell.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '/' || r == '.' || r == '-' || r == '_' || r == ':' || r == '=' || r == ',' || r == '@' ||
			(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// measured is, from a plan built on a profile, each class's measured
// peak memory and each GPU class's VRAM where the profile measured more
// than spec declares (none for declared peaks): the run record's
// measured_memory and measured_vram, which the workers admit and place by.
func measured(spec *stream.Spec, p *plan.Plan) (mem, vram map[string]int64) {
	mem, vram = map[string]int64{}, map[string]int64{}
	for _, c := range p.Classes {
		if !strings.HasPrefix(c.Peak.Source, "measured") {
			continue
		}
		mem[c.Class] = c.Peak.Memory
		if c.Peak.GPUs > 0 && c.Peak.VRAM > spec.Classes[c.Class].VRAM {
			vram[c.Class] = c.Peak.VRAM
		}
	}
	return mem, vram
}

// profileCommand is the profile command that writes what a run with the
// state directory data reads: with --data unless data is the default.
func profileCommand(spec *stream.Spec, data string) string {
	if data == worker.DefaultStateDir() {
		return "shardpool profile " + shellQuote(spec.SpecPath)
	}
	return fmt.Sprintf("shardpool profile --data %s %s", shellQuote(data), shellQuote(spec.SpecPath))
}

// profileElsewhere names a profile of the run in the default state
// directory where the run reads another one (a profile made without the
// run's --data), or is "".
func profileElsewhere(spec *stream.Spec, data string) string {
	def := worker.DefaultStateDir()
	if data == def {
		return ""
	}
	p := filepath.Join(def, "runs", spec.Name, "profile.json")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return fmt.Sprintf("; %s is in the default state directory, which this run does not read: it reads %s", p, filepath.Join(data, "runs", spec.Name, "profile.json"))
}
