package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"

	"github.com/nats-io/nats.go"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
)

// cmdHalt stops a run by hand: its queued shards go off the queue, its
// running ones end as they would (with --now, their workers stop them),
// and it is BLOCKED until submitted again.
func cmdHalt(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("halt", "shardpool halt [--server URL | --data DIR] [--now] [--json] RUN", stderr)
	server := fs.String("server", nats.DefaultURL, "coordinator `URL`")
	acc := registerAccess(fs)
	data := fs.String("data", "", "state `DIR` of a running 'shardpool run' or 'shardpool coordinator': halt through the coordinator serving it (instead of --server)")
	now := fs.Bool("now", false, "stop the running commands too: SIGTERM, then SIGKILL after the worker's grace period; their shards are held with the queued ones, uncharged (on a run halted already, stops them now)")
	asJSON := fs.Bool("json", false, "print what was halted as JSON")
	pos, err := parseArgs(fs, args, 1)
	if err != nil {
		return err
	}
	run := pos[0]
	if *data != "" {
		dir, err := dataInstead(fs, *data)
		if err != nil {
			return err
		}
		url, found, err := haltTarget(dir, run)
		if err != nil {
			return err
		}
		*server = url
		acc.fill(fs, found)
	}
	used := acc.get()
	nc, js, err := connect(ctx, *server, &used, "shardpool-halt", 0, nil)
	if defaultUnanswered(fs, *data, err) {
		// Nothing at the default URL: a `shardpool run` of the default
		// state directory serves on a port of its own.
		if url, found, ferr := haltTarget(worker.DefaultStateDir(), run); ferr == nil {
			acc.fill(fs, found)
			used = acc.get()
			nc, js, err = connect(ctx, url, &used, "shardpool-halt", 0, nil)
		}
	}
	if err != nil {
		return err
	}
	defer nc.Close()
	h, err := coordinator.Halt(ctx, js, run, whoAsks(), *now)
	if errors.Is(err, coordinator.ErrNothingToHalt) {
		return exitErr{code: exitFailure, msg: err.Error()}
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(stdout, h)
	}
	switch {
	case h.Already != "":
		fmt.Fprintf(stdout, "run %s was halted already (%s): %s\n", h.Run, h.State, h.Already)
	default:
		if h.Stop {
			// The held count includes the shards whose commands were
			// stopped (pending again once their workers handed them back).
			fmt.Fprintf(stdout, "run %s halted (fingerprint %s): %d shard(s) held (taken off the queue, or stopped as they ran, uncharged)", h.Run, h.Fingerprint, h.Held)
		} else {
			fmt.Fprintf(stdout, "run %s halted (fingerprint %s): %d pending shard(s) taken off the queue", h.Run, h.Fingerprint, h.Held)
		}
		switch {
		case h.Running > 0 && h.Stop:
			fmt.Fprintf(stdout, "; %d running are being stopped (SIGTERM, then SIGKILL after the worker's grace period)", h.Running)
		case h.Running > 0:
			fmt.Fprintf(stdout, "; %d running end as they would (`shardpool halt --now %s` stops them; `shardpool status` names their commands' pids)", h.Running, h.Run)
		case h.Stop:
			fmt.Fprintf(stdout, "; none running")
		}
		fmt.Fprintln(stdout)
	}
	if h.State != stream.RunBlocked && h.State != stream.RunComplete {
		// Its counts are the record's from before: the coordinator has
		// not judged the halt yet (it is down, or slow to answer).
		fmt.Fprintf(stdout, "the coordinator has not judged the halted run yet (it is %s there): its counts above may be a moment old\n", h.State)
	}
	fmt.Fprintf(stdout, "it stays BLOCKED until submitted again; to go on: %s\n", h.Resume)
	return nil
}

// haltTarget is the client URL and access of the coordinator that serves
// run of the state directory dir now: a run that nothing serves has no
// worker to stop.
func haltTarget(dir, run string) (string, access, error) {
	lives, err := coordinator.LiveIn(dir)
	if err != nil {
		return "", access{}, err
	}
	pick := liveFor(lives, run)
	if pick == nil {
		return "", access{}, exitErr{code: exitFailure, msg: fmt.Sprintf("halt %s: no coordinator serves %s now, so nothing of the run runs (a `shardpool run` that has ended stopped its shards with it)", run, dir)}
	}
	return liveAccess(*pick)
}

// whoAsks is the user and host a halt is recorded as asked by.
func whoAsks() string {
	name := fmt.Sprintf("uid %d", os.Getuid())
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	host, _ := os.Hostname()
	return name + "@" + host
}
