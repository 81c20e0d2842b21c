package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shardpool/shardpool/coordinator"
	"github.com/shardpool/shardpool/stream"
	"github.com/shardpool/shardpool/worker"
)

func cmdCoordinator(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("coordinator", "shardpool coordinator --data DIR [--listen HOST:PORT] [--http HOST:PORT]", stderr)
	data := fs.String("data", "", "state directory: JetStream store and evidence (required)")
	listen := fs.String("listen", "127.0.0.1:4222", "NATS listener for workers and the nats CLI")
	httpAddr := fs.String("http", "127.0.0.1:8222", "GET /status listener (empty to disable)")
	leaseTTL := fs.Duration("lease-ttl", stream.DefaultLeaseTTL, "lease TTL and ack wait")
	syncMode := registerSync(fs)
	verbose := fs.Bool("v", false, "debug logs")
	if err := parseNone(fs, args); err != nil {
		return err
	}
	if *data == "" {
		fs.Usage()
		return errUsage
	}
	for {
		c, err := coordinator.New(coordinator.Config{DataDir: *data, Listen: *listen, HTTP: *httpAddr, Sync: string(*syncMode),
			LeaseTTL: *leaseTTL, ReloadOnWriteError: true, Auth: true, Logger: logger(stderr, *verbose, slog.LevelInfo)})
		if err != nil {
			return err
		}
		checkStore(ctx, c.StoreDir(), stderr)
		if err := c.Start(ctx); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "coordinator ready: nats %s", c.ClientURL())
		if a := c.HTTPAddr(); a != "" {
			fmt.Fprintf(stdout, ", status http://%s/status", a)
		}
		fmt.Fprintf(stdout, ", data %s\n", c.DataDir())
		fmt.Fprintf(stdout, "clients present the token in %s: workers, submit and status with --token-file %s; the nats CLI with NATS_URL=nats://$(cat %s)@HOST:PORT\n",
			c.TokenFile(), shellQuote(c.TokenFile()), shellQuote(c.TokenFile()))
		err = c.Run(ctx)
		if !errors.Is(err, coordinator.ErrReload) {
			return err
		}
		// The store met a full disk and has room again: a new server
		// loads it afresh on the same listeners; workers reconnect.
		fmt.Fprintf(stdout, "coordinator: the store met a write error and has room again: reloading it\n")
	}
}

// connect opens a connection to the coordinator at url. With wait > 0 a
// coordinator that does not answer yet is tried again until wait has
// passed (a worker started by a scheduler beside its coordinator), saying
// so once on notice; once connected, a connection outlives coordinator
// restarts.
func connect(ctx context.Context, url, tokenFile, name string, wait time.Duration, notice io.Writer) (*nats.Conn, jetstream.JetStream, error) {
	deadline := time.Now().Add(wait)
	pause := 250 * time.Millisecond
	opts := []nats.Option{nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(500 * time.Millisecond),
		nats.Timeout(5 * time.Second), nats.RetryOnFailedConnect(false)}
	if tokenFile != "" {
		opts = append(opts, nats.TokenHandler(coordinator.TokenReader(tokenFile)))
	}
	var nc *nats.Conn
	for {
		var missing error
		if tokenFile != "" {
			// A coordinator started at the same time (by a scheduler)
			// writes its token when it starts: while nothing answers, a
			// missing file is waited for as the coordinator is.
			if _, err := coordinator.ReadToken(tokenFile); errors.Is(err, os.ErrNotExist) {
				missing = err
			} else if err != nil {
				return nil, nil, fmt.Errorf("--token-file: %w", err)
			}
		}
		var err error
		nc, err = nats.Connect(url, opts...)
		if err == nil {
			break
		}
		if isAuthError(err) {
			why := "pass --token-file FILE (or set SHARDPOOL_TOKEN_FILE): a coordinator keeps its token in DATA/jetstream/token of its --data, a `shardpool run` in DATA/stores/<run>/token, readable by its user alone"
			switch {
			case missing != nil:
				why = fmt.Sprintf("--token-file: %v; is that the file under its --data?", missing)
			case tokenFile != "":
				why = fmt.Sprintf("the token in %s is not this coordinator's", tokenFile)
			}
			return nil, nil, fmt.Errorf("the coordinator at %s refused this connection (%w): %s", redactURL(url), err, why)
		}
		if !errors.Is(err, nats.ErrNoServers) {
			return nil, nil, fmt.Errorf("connect %s: %w", redactURL(url), err)
		}
		if !time.Now().Add(pause).Before(deadline) {
			why := "is `shardpool coordinator` running there? A `shardpool run` serves its coordinator only while it runs; `shardpool status --data DATA` finds a live one, or reports each run's last verdict from DATA/runs/<run>/final.json"
			if wait > 0 {
				why = fmt.Sprintf("waited %s; %s", wait, why)
			}
			return nil, nil, fmt.Errorf("no coordinator answers at %s (%w): %s", redactURL(url), err, why)
		}
		if pause == 250*time.Millisecond && notice != nil {
			fmt.Fprintf(notice, "waiting up to %s for the coordinator at %s\n", wait, redactURL(url))
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(pause):
		}
		pause = min(2*pause, 5*time.Second)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("connect %s: %w", url, err)
	}
	return nc, js, nil
}

func cmdWorker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("worker", "shardpool worker --server URL [--slots CLASS=N,...] [--scratch DIR] [--name NAME]", stderr)
	server := fs.String("server", nats.DefaultURL, "coordinator URL")
	slots := &slotsFlag{auto: true}
	fs.Var(slots, "slots", "auto (from this host's budget and each class's peak; serves every class of the active runs) or CLASS=N,...")
	scratch := fs.String("scratch", "", "local scratch directory (default $TMPDIR/shardpool-<name>-<uid>)")
	name := fs.String("name", worker.DefaultName(), "worker name (unique per worker)")
	data := fs.String("data", worker.DefaultStateDir(), "where this worker writes evidence (runs/<run>/)")
	grace := fs.Duration("grace", 10*time.Second, "time a child has after SIGTERM before SIGKILL")
	token := registerToken(fs)
	connectWait := fs.Duration("connect-wait", 2*time.Minute, "how long to wait for a coordinator that does not answer yet (0: fail at once)")
	verbose := fs.Bool("v", false, "debug logs")
	var sf stagingFlags
	sf.register(fs)
	if err := parseNone(fs, args); err != nil {
		return err
	}
	// Before waiting for a coordinator: a scratch directory this worker
	// cannot use is the user's to fix now.
	if err := checkScratch(*scratch, *name); err != nil {
		return fmt.Errorf("worker %s: %w", *name, err)
	}
	nc, js, err := connect(ctx, *server, *token, "shardpool-worker-"+*name, *connectWait, stderr)
	if err != nil {
		return err
	}
	defer nc.Close()
	w, err := worker.New(worker.Config{JetStream: js, Name: *name, Slots: slots.forClasses(nil), Auto: slots.auto, Scratch: *scratch,
		StateDir: *data, Grace: *grace, Staging: sf.config(""), StageFleet: sf.fleet, Logger: logger(stderr, *verbose, slog.LevelInfo)})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "worker %s serving %s from %s\n", *name, slots.String(), *server)
	ran := make(chan struct{})
	defer close(ran)
	go func() {
		select {
		case <-ctx.Done():
			defer announceDrain(stderr, w, *grace)()
			<-ran
		case <-ran:
		}
	}()
	return w.Run(ctx)
}

// registerToken adds --token-file: where a client reads the coordinator's
// token.
func registerToken(fs *flag.FlagSet) *string {
	return fs.String("token-file", os.Getenv("SHARDPOOL_TOKEN_FILE"),
		"file holding the coordinator's token: DATA/jetstream/token of `shardpool coordinator --data DATA`, DATA/stores/<run>/token of a `shardpool run` (default $SHARDPOOL_TOKEN_FILE; a URL nats://TOKEN@HOST:PORT carries one too)")
}

// isAuthError reports a server's refusal of a connection's credentials.
func isAuthError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) ||
		strings.Contains(strings.ToLower(err.Error()), "authorization violation")
}

// redactURL is url without its user information (a token, or a user and
// password): for messages and for commands written to the evidence.
func redactURL(raw string) string {
	var out []string
	for _, one := range strings.Split(raw, ",") {
		if u, err := neturl.Parse(one); err == nil && u.User != nil {
			u.User = nil
			one = u.String()
		}
		out = append(out, one)
	}
	return strings.Join(out, ",")
}

// absPath is p made absolute, or p where that fails.
func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return p
}

// checkScratch checks the scratch directory a worker named name will use:
// the one given, or its default (worker.CheckScratch).
func checkScratch(scratch, name string) error {
	if scratch != "" {
		return worker.CheckScratch(scratch, false)
	}
	if !stream.ValidWorkerName(name) {
		return exitErr{code: exitUsage, msg: fmt.Sprintf("--name %q must match [A-Za-z0-9_-]{1,64}", name)}
	}
	return worker.CheckScratch(worker.DefaultScratch(name), true)
}
