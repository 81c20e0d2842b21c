// Command shardpool plans, runs and recovers large batches of shards on
// shared machines. See README.md and docs/cli.md; exit codes are in
// exitcodes.go.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	// SIGHUP too: a worker or run started from a terminal that goes away
	// (ssh disconnects) drains as on SIGTERM; by Go's default it would
	// die on the spot, and every shard it ran would wait out its lease
	// and be charged an attempt.
	ctx, stop := stopContext()
	if len(os.Args) > 1 && longLived[os.Args[1]] {
		keepOnBrokenPipe()
	}
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	profStop()
	os.Exit(exitCode(err, os.Stderr))
}

// stopSignals stop a command as Ctrl-C does. SIGINT and SIGHUP are left
// out where the process started with them ignored: under nohup, or as a
// background job of a script. Go would otherwise catch them once asked
// to, and `nohup shardpool run ... &` would drain and stop when the
// terminal closed. (Computed before any signal.Notify, which would make
// them look caught; children inherit the ignored ones, as nohup means.)
var stopSignals = func() []os.Signal {
	sigs := []os.Signal{syscall.SIGTERM}
	for _, s := range []os.Signal{os.Interrupt, syscall.SIGHUP} {
		if !signal.Ignored(s) {
			sigs = append(sigs, s)
		}
	}
	return sigs
}()

// stops counts the stop signals the process got: the first ends the
// command's context, and each one after it calls the hurry that a
// draining command set (onStopAgain).
var stops struct {
	mu    sync.Mutex
	n     int
	again func()
}

// stopContext is signal.NotifyContext for stopSignals, whose handler also
// hears the signals after the first: a second Ctrl-C sent before a
// draining command has said "interrupt again" is kept for it rather than
// lost in a channel nobody reads.
func stopContext() (context.Context, func()) {
	ctx, cancelCause := context.WithCancelCause(context.Background())
	cancel := func() { cancelCause(nil) }
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, stopSignals...)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sig:
				stops.mu.Lock()
				stops.n++
				n, again := stops.n, stops.again
				stops.mu.Unlock()
				if n == 1 {
					// The signal's name is the cause: a worker's
					// reports say why it stops (context.Cause).
					cancelCause(errors.New(signalName(s)))
				} else if again != nil {
					again()
				}
			case <-done:
				return
			}
		}
	}()
	return ctx, func() {
		signal.Stop(sig)
		close(done)
		cancel()
	}
}

// signalName is "SIGTERM" for syscall.SIGTERM, and the signal's own
// words for what has no such name.
func signalName(s os.Signal) string {
	if n, ok := s.(syscall.Signal); ok {
		if name := unix.SignalName(n); name != "" {
			return name
		}
	}
	return s.String()
}

// onStopAgain has every stop signal after the first call f, at once if
// one came already; the returned func stops that.
func onStopAgain(f func()) func() {
	stops.mu.Lock()
	stops.again = f
	late := stops.n > 1
	stops.mu.Unlock()
	if late {
		f()
	}
	return func() {
		stops.mu.Lock()
		stops.again = nil
		stops.mu.Unlock()
	}
}

// longLived are the commands that hold shards, a store or a staging copy
// for as long as they run.
var longLived = map[string]bool{"run": true, "coordinator": true, "worker": true, "stage": true}

// keepOnBrokenPipe lets writes to a standard output or error whose reader
// has gone (`shardpool run ... | head`, a `tee` that died with its
// terminal, a restarted journald) fail with EPIPE instead of killing the
// process, Go's default for file descriptors 1 and 2. A run, coordinator
// or worker killed that way stopped mid-shard without draining. What it
// would have printed is lost; the evidence folder has it all. The signal
// stays at its default in children: only a handler is installed, and
// exec resets handlers.
func keepOnBrokenPipe() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
}

// profStop ends the developer profiles of a devprof build (devprof.go).
var profStop = func() {}

const usage = `shardpool: measured, durable batches of shards on shared machines

Usage:
  shardpool run [flags] SPEC           coordinator + one local worker until COMPLETE or BLOCKED
  shardpool coordinator --data DIR     the embedded JetStream coordinator (distributed form)
  shardpool worker --server URL        one worker per host
  shardpool submit --server URL SPEC   publish a run (idempotent)
  shardpool sbatch --server URL SPEC   ask Slurm for nodes sized to the run, one worker on each
  shardpool status --server URL [RUN]  run and shard states, workers (--data DIR: of a run's state directory; --wait RUN: until its verdict)
  shardpool halt --server URL RUN      stop starting a run's shards (its running ones end as they would; --now stops them) until it is submitted again
  shardpool forget --server URL RUN    remove a COMPLETE or BLOCKED run from the coordinator's store (outputs stay)
  shardpool ckpt commit|latest|verify|replicate  atomic checkpoint generations for jobs
  shardpool profile [--sweep] SPEC     measure the command on small, typical, largest and malformed inputs
  shardpool plan SPEC                  slots per class from measured or declared peaks and this host's budget
  shardpool stage SPEC                 stage a run's inputs to local scratch (checksummed, resumable)
  shardpool preflight [--json]         host snapshot: cgroups, memory, GPUs, mounts, effective budget
  shardpool drill [--data DIR]         the recovery drill; exit 0 only if every check passed
  shardpool version [--json]

Run 'shardpool COMMAND --help' for a command's flags.
Exit codes: 0 ok/COMPLETE, 1 error, 2 usage, 3 BLOCKED or halted, 4 verification failed or nothing verified, 130 interrupted.
`

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return cmdRun(ctx, rest, stdout, stderr)
	case "coordinator":
		return cmdCoordinator(ctx, rest, stdout, stderr)
	case "worker":
		return cmdWorker(ctx, rest, stdout, stderr)
	case "submit":
		return cmdSubmit(ctx, rest, stdout, stderr)
	case "sbatch":
		return cmdSbatch(ctx, rest, stdout, stderr)
	case "status":
		return cmdStatus(ctx, rest, stdout, stderr)
	case "forget":
		return cmdForget(ctx, rest, stdout, stderr)
	case "halt":
		return cmdHalt(ctx, rest, stdout, stderr)
	case "ckpt":
		return cmdCkpt(ctx, rest, stdout, stderr)
	case "profile":
		return cmdProfile(ctx, rest, stdout, stderr)
	case "plan":
		return cmdPlan(ctx, rest, stdout, stderr)
	case "stage":
		return cmdStage(ctx, rest, stdout, stderr)
	case "preflight":
		return cmdPreflight(ctx, rest, stdout, stderr)
	case "drill":
		return cmdDrill(ctx, rest, stdout, stderr)
	case "version", "--version":
		return cmdVersion(rest, stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "shardpool: unknown command %q\n\n%s", cmd, usage)
	return errUsage
}

// exitCode maps an error to the documented exit codes and prints it once.
func exitCode(err error, stderr io.Writer) int {
	var ec exitErr
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		return 2
	case errors.As(err, &ec):
		if ec.msg != "" {
			fmt.Fprintln(stderr, "shardpool:", ec.msg)
		}
		return ec.code
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(stderr, "shardpool: interrupted")
		return 130
	}
	fmt.Fprintln(stderr, "shardpool:", err)
	return 1
}
